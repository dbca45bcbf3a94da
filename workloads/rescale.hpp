// Rescaling a trace recorded on S sources × E experts to S' × E' (e.g. the 16 × 32 SmartMoE trace
// to 1024 GPUs × 1024 experts), record by record:
//
//   experts  E' = m·E: expert e becomes the m experts e·m .. e·m+m−1, which share its popularity
//            equally. Normalised load distributions (max/mean, CV, Gini) are unchanged by such
//            replication; dead experts stay dead (m dead children each).
//   sources  source s' replays source s' mod S: its expert distribution (split as above) is
//            resampled as Multinomial(T'·k) with the top-k cap, T' the new tokens per source.
//            So sources stay as alike as in the original (up to the sampling noise of T'·k slots),
//            and every record follows its original, which keeps the drift over iterations.
//
// The statistics before and after are compared in tests/test_trace.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "moesim.pb.h"

namespace moesim {

struct RescaleOptions {
  int sources = 0;                     // S'
  int experts = 0;                     // E', a multiple of the trace's E
  std::int64_t tokens_per_source = 0;  // T'; 0 keeps the trace's
  std::uint64_t seed = 1;
};

/// Reads `in`, writes the rescaled trace to `out`; returns its header.
spec::TraceHeader rescale_trace(const std::string& in, const std::string& out, const RescaleOptions& options);

}  // namespace moesim
