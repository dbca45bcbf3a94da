// Gating sources: where each iteration's routing comes from. `moesim run` asks one for the routing
// of every MoE layer, iteration after iteration: a seeded distribution (uniform, Zipf), the
// synthetic generator, or the replay of a recorded trace.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model.hpp"
#include "moesim.pb.h"
#include "routing.hpp"

namespace moesim {

class GatingSource {
 public:
  virtual ~GatingSource() = default;
  /// The routing of every layer for the next iteration: `gpus` sources × experts, each row summing
  /// to tokens_per_gpu × top_k.
  virtual std::vector<RoutingMatrix> next() = 0;
  /// The iteration number this routing stands for (the trace's own numbering when replaying).
  virtual std::uint64_t label() const = 0;
  /// Adds bias[l][e] to the gate's logits of expert e in layer l for the next draws, if this source
  /// draws tokens from logits (the generator); false if it cannot (counts are given).
  virtual bool bias_logits(const std::vector<std::vector<double>>& /*bias*/) { return false; }
};

/// Checks the gating spec against the model before any work starts (FieldError with a path
/// relative to the experiment: "gating.trace.path", ...): a trace must exist, match the model's
/// experts (or divide them, with split_experts; or be divided by them, with merge_experts) and
/// top-k (a multiple of it, split), have at least its layers (a deeper
/// trace gives its first layers), and hold records in the selected range.
/// Returns what the run replays, for the console and summary.json, and what the user should know
/// (a deeper trace of which only the first layers are replayed).
struct GatingCheck {
  std::string source;       // uniform, zipf, generator or trace
  std::string description;  // "trace PATH: iterations 1001-1030 of 24-layer records, layers 0-11 replayed"
  std::string note;         // "" when nothing needs saying
};
GatingCheck validate_gating(const spec::GatingSpec& gating, const MoeModel& model, int iterations, std::uint64_t seed);

/// `spread_blocks`: token spreads the uniform and Zipf sources count with each layer's routing
/// (RoutingMatrix::spread()), and the generator under a group limit (it draws token by token then);
/// a trace knows only counts.
std::unique_ptr<GatingSource> make_gating_source(const spec::GatingSpec& gating, const MoeModel& model, int gpus,
                                                 std::uint64_t seed, const std::vector<int>& spread_blocks = {});

/// Scales a row of counts to sum to `total` (largest remainder; deterministic), then enforces
/// `cap` per cell by moving the excess onto the cells below the cap in proportion to their counts.
std::vector<std::int64_t> rescale_row(const std::vector<std::int64_t>& row, std::int64_t total, std::int64_t cap);

/// The path to read for a trace replay: a .trace file as it is, a CSV imported once into a cached
/// .trace in the temp directory (keyed by the CSV's path, size and time).
std::string replay_trace_path(const std::string& path);

/// Splits each expert's counts evenly over experts / trace.experts new experts (remainder first).
RoutingMatrix split_experts(const RoutingMatrix& trace, int experts);

/// Sums each run of trace.experts / experts consecutive experts into one.
RoutingMatrix merge_experts(const RoutingMatrix& trace, int experts);

/// Maps a trace's S sources onto G GPUs and scales each row to `tokens` × `top_k`: when S is a
/// multiple of G, GPU g replays the sum of sources g·S/G .. (g+1)·S/G − 1; otherwise GPU g
/// replays source g mod S.
RoutingMatrix map_sources(const RoutingMatrix& trace, int gpus, std::int64_t tokens, int top_k);

}  // namespace moesim
