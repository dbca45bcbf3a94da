// libFuzzer target for experiment specs: any bytes as a spec file must load (and validate) or give
// an InputError (file, line, field), never a crash, a hang or an internal error.
#include "fuzz_common.hpp"
#include "spec.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moesim::fuzz::quiet_protobuf();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = moesim::fuzz::write_input(moesim::fuzz::scratch() / "spec.textproto", data, size);
  return moesim::fuzz::only_input_errors([&] { moesim::load_experiment(path, {}); });
}
