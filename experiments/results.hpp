// Result files: summary.json (numbers for tools and plots) and timeline.json (Chrome trace event
// format, one process per GPU and one thread per stream: opens in Perfetto / chrome://tracing).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "collective_sweep.hpp"
#include "runner.hpp"

namespace moesim {

/// Writes `text` to PATH.tmp, then renames it over PATH: a reader never sees half a file.
void write_atomically(const std::string& path, const std::string& text);

/// A JSON file moesim wrote (InputError naming the file when it cannot be read or parsed).
nlohmann::json read_json_file(const std::string& path);

nlohmann::json summary_json(const Experiment& ex, const ExperimentResult& r);
inline constexpr std::size_t kMaxTimelineEvents = 2'000'000;
/// 1, or where the kept graphs have more than `max_events` events (a 2,048-GPU pipeline of 120
/// micro-batches has 24 million, 6 GB of JSON that no viewer opens) the smallest stride that keeps
/// the timeline under it: only GPUs 0, stride, 2·stride, ... are written.
int timeline_stride(const ExperimentResult& r, std::size_t max_events = kMaxTimelineEvents);
/// "every 2nd GPU", "every 3rd GPU", "every 11th GPU": which GPUs a timeline of that stride shows.
std::string every_nth_gpu(int stride);
/// Chrome trace of the first iterations of every run (variants one after another in pid blocks),
/// every timeline_stride()-th GPU of each.
void write_timeline(std::ostream& out, const ExperimentResult& r, std::size_t max_events = kMaxTimelineEvents);
/// The GPU processes of a timeline write_timeline() wrote: pid -> (variant, rank), read from the
/// process names "VARIANT: GPU r" ("GPU r" in a run without variants). InputError naming `path` when
/// a process name is not one moesim writes.
std::map<int, std::pair<std::string, int>> timeline_processes(const nlohmann::json& timeline, const std::string& path);
/// The "claim | paper | simulated | ratio" table of paper values (an experiment's, or a collective
/// sweep's); a row whose simulated value is not finite reads "not run".
std::string paper_table(const std::vector<PaperComparison>& rows);

/// `s` as one CSV field (RFC 4180): as it is, or quoted with its quotes doubled where it holds a
/// comma, a quote or a newline.
std::string csv_field(const std::string& s);

/// Writes DIR/summary.json, DIR/timeline.json and, with paper values, DIR/paper.md, each through
/// a temporary file renamed into place, so a reader never sees half a file.
void write_results(const std::string& dir, const Experiment& ex, const ExperimentResult& r);

/// Writes DIR/collective.json and, when the sweep's file has claims, DIR/paper.md (atomically).
void write_collective_results(const std::string& dir, const CollectiveSweep& sweep,
                              const std::vector<CollectivePoint>& points, const CollectiveSweepFile* file);

/// The short human table `moesim run` prints.
std::string summary_table(const Experiment& ex, const ExperimentResult& r);

}  // namespace moesim
