// `moesim timeline summary RUN`: a timeline.json as a table. Per layer, for the GPU that computes
// the most expert work (hottest) and the median one, each phase in the order it starts, its busy
// time, and how much of it runs while the same GPU computes experts (the overlap a policy buys).
#pragma once
#include <string>

namespace moesim {

struct TimelineSummaryOptions {
  std::string variant;  // which variant (default: the first in the file)
  int layer = -1;       // one layer (default: every layer, then the ops outside the layers)
};

/// The table as text. `run`: a results directory or its timeline.json. InputError for a missing or
/// foreign file, an unknown variant or layer.
std::string timeline_summary(const std::string& run, const TimelineSummaryOptions& options = {});

}  // namespace moesim
