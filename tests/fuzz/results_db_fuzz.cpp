// libFuzzer target for results databases: any bytes as a results.db are read (points, CSV export)
// or refused with an InputError, and never written to.
#include <sstream>

#include "fuzz_common.hpp"
#include "results_db.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moesim::fuzz::quiet_protobuf();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = moesim::fuzz::write_input(moesim::fuzz::scratch() / "results.db", data, size);
  moesim::fuzz::only_input_errors([&] {
    const moesim::ResultsDb db(path, false);
    (void)db.points();
    std::ostringstream csv;
    db.export_csv(csv, false);
    db.export_csv(csv, true);
  });
  if (std::filesystem::file_size(path) != size) std::abort();  // a reader wrote to it
  return 0;
}
