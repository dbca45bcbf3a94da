// libFuzzer target for SmartMoE/FastMoE logs: a directory of one `table_iter0_rank0.log` holding
// the input, imported or refused with an InputError.
#include "fuzz_common.hpp"
#include "trace_import.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moesim::fuzz::quiet_protobuf();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto dir = moesim::fuzz::scratch();
  std::filesystem::create_directories(dir / "logs");
  moesim::fuzz::write_input(dir / "logs" / "table_iter0_rank0.log", data, size);
  return moesim::fuzz::only_input_errors(
      [&] { moesim::import_smartmoe_logs((dir / "logs").string(), (dir / "out.trace").string(), {}); });
}
