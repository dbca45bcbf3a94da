// Statistics of gating: how skewed the expert load is, how fast it drifts, how alike the sources
// are. The measures of docs/spec/gating-traces.md §3, so a trace (real, generated or rescaled)
// can be compared with the notes' table.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

/// Skew of one load vector (tokens per expert).
struct LoadStats {
  double max_mean = 0;    // hottest / mean
  double cv = 0;          // standard deviation / mean
  double gini = 0;        // 0 = even, 1 = all on one expert
  double entropy = 0;     // normalized: 1 = even, 0 = all on one expert
  double top_share[4] = {0, 0, 0, 0};  // share of the 1, 2, 4, 8 hottest experts
  int zero_experts = 0;   // experts with no token
};
LoadStats load_stats(const std::vector<double>& load);

/// The q-quantile of `values` (0 ≤ q ≤ 1), interpolated between ranks; NaN when empty.
double quantile(std::vector<double> values, double q);

double cosine(const std::vector<double>& a, const std::vector<double>& b);
/// Total-variation distance of the two loads as distributions: ½ Σ |a/Σa − b/Σb|.
double total_variation(const std::vector<double>& a, const std::vector<double>& b);
/// max/mean of GPU loads when experts are placed contiguously, E/G per GPU (E % G == 0).
double gpu_max_mean(const std::vector<double>& load, int gpus);

/// Accumulates a trace's statistics record by record. A layer's load at an iteration is its counts
/// summed over sources and micro-batches. Per layer and overall, the per-iteration measures are
/// reported as medians; the drift measures compare a layer's load at iterations t and t + lag.
class TraceStats {
 public:
  /// `gpus` > 0 adds GPU-level max/mean under contiguous placement; records before
  /// `from_iteration` are skipped (e.g. 1001 for the SmartMoE trace's stable phase).
  TraceStats(const spec::TraceHeader& header, int gpus = 0, std::uint64_t from_iteration = 0,
             std::vector<std::uint64_t> lags = {10, 100, 1000});
  ~TraceStats();
  void add(const spec::TraceRecord& record);
  /// The statistics of the records added so far (as JSON, or as a table for people).
  nlohmann::json json();
  std::string text();

 private:
  struct Layer;
  void close_record();
  spec::TraceHeader header_;
  int gpus_;
  std::uint64_t from_;
  std::vector<std::uint64_t> lags_;
  std::vector<Layer> layers_;
  bool open_ = false;
  std::uint64_t iteration_ = 0;
  std::uint32_t layer_ = 0;
  std::vector<double> global_;               // the open record's load per expert
  std::vector<std::vector<double>> source_;  // ... and per source
};

}  // namespace moesim
