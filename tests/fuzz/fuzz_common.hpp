// What every libFuzzer target shares: protobuf's log lines silenced, the input as a file in a
// private scratch folder (the loaders read paths), and the rule that a parser may answer bad bytes
// only with an InputError: any other exception is what the command line reports as "internal
// error" (exit 1), so it aborts the run as a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "errors.hpp"

namespace moesim::fuzz {

inline void quiet_protobuf() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
}

/// A scratch folder of this process, emptied for each input.
inline std::filesystem::path scratch() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("moesim-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) std::filesystem::remove_all(f.path(), ec);
  return dir;
}

inline std::string write_input(const std::filesystem::path& path, const std::uint8_t* data, std::size_t size) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path.string();
}

/// Runs `body`; InputError is a fine answer, anything else a finding.
template <class Body>
int only_input_errors(Body&& body) {
  try {
    body();
  } catch (const InputError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error on a bad input: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace moesim::fuzz
