// Result files: summary.json (numbers for tools and plots) and timeline.json (Chrome trace event
// format, one process per GPU and one thread per stream: opens in Perfetto / chrome://tracing).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "runner.hpp"

namespace moesim {

nlohmann::json summary_json(const Experiment& ex, const RunResult& r);
nlohmann::json timeline_json(const RunResult& r);

/// Writes DIR/summary.json and DIR/timeline.json, each through a temporary file renamed into
/// place, so a reader never sees half a file.
void write_results(const std::string& dir, const Experiment& ex, const RunResult& r);

/// The short human table `moesim run` prints.
std::string summary_table(const Experiment& ex, const RunResult& r);

}  // namespace moesim
