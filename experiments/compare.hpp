// `moesim compare A B`: two runs side by side — typically the simulated one and a hardware
// backend's, or two variants of one run — phase by phase (the critical path's), op class by op
// class (labels with their layer and part numbers folded: "L#.fwd.experts") and op by op (the same
// iteration, op id and rank in both timelines; only the ops that differ are listed).
#pragma once
#include <string>

namespace moesim {

struct CompareOptions {
  int top_ops = 10;  // the ops with the largest differences to list
  /// One variant of A against one of B (two variants of one run: A and B the same directory);
  /// empty: every variant the two have in common, by name.
  std::string a_variant, b_variant;
};

/// The comparison as text. A and B: results directories or their summary.json files (their
/// timeline.json beside them is read when present). InputError for a missing or foreign file.
std::string compare_runs(const std::string& a, const std::string& b, const CompareOptions& options = {});

}  // namespace moesim
