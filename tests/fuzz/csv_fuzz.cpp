// libFuzzer target for CSV gating traces: imported into a .trace or refused with an InputError;
// and a trace the importer writes must read back (a trace moesim writes and then refuses is a bug).
#include "fuzz_common.hpp"
#include "trace.hpp"
#include "trace_import.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moesim::fuzz::quiet_protobuf();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto dir = moesim::fuzz::scratch();
  const auto path = moesim::fuzz::write_input(dir / "in.csv", data, size);
  bool imported = false;
  moesim::fuzz::only_input_errors([&] {
    moesim::import_csv(path, (dir / "out.trace").string(), {});
    imported = true;
  });
  if (!imported) return 0;
  try {
    moesim::TraceReader reader((dir / "out.trace").string());
    moesim::spec::TraceRecord record;
    while (reader.next(record)) (void)moesim::record_matrix(reader.header(), record);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the imported trace does not read back: %s\n", e.what());
    std::abort();
  }
  return 0;
}
