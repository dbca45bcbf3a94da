// `moesim compare A B`: two runs of the same spec side by side — typically the simulated one and a
// hardware backend's — phase by phase (the critical path's categories), op class by op class
// (labels with their layer and part numbers folded: "L#.fwd.experts") and op by op (the same
// iteration, op id and rank in both timelines).
#pragma once
#include <string>

namespace moesim {

struct CompareOptions {
  int top_ops = 10;  // the ops with the largest differences to list
};

/// The comparison as text. A and B: results directories or their summary.json files (their
/// timeline.json beside them is read when present). InputError for a missing or foreign file.
std::string compare_runs(const std::string& a, const std::string& b, const CompareOptions& options = {});

}  // namespace moesim
