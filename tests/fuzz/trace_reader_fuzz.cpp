// libFuzzer target for the trace reader: any bytes must give records or an InputError, never a
// crash, a hang or a leak. Built with clang when MOESIM_FUZZ=ON (see docs/untrusted-input.md).
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "errors.hpp"
#include "trace.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf logs every invalid UTF-8 string it parses; the reader reports what matters itself.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    moesim::TraceReader reader(std::make_unique<std::istringstream>(std::string(reinterpret_cast<const char*>(data), size)),
                               "fuzz");
    moesim::spec::TraceRecord record;
    std::int64_t total = 0;
    while (reader.next(record)) {
      const auto m = moesim::record_matrix(reader.header(), record);
      for (auto c : m.counts()) total += c;
    }
    return total < 0;  // never: counts are validated non-negative
  } catch (const moesim::InputError&) {
  }
  return 0;
}
