// The gate's capacity (GShard, Tutel, DeepSpeed-MoE): each GPU sends at most C tokens to an expert.
//   C = ceil(k · f · T / E)     T tokens per GPU, E experts, k top-k, f the capacity factor
//   f > 0   fixed;  f = 0  dropless (C = the largest need);  f < 0  the smallest f that drops
//   nothing, capped at −f (Tutel's convention, docs/spec/tutel.md §4.2);  unset: dropless.
// Tokens over capacity are dropped (they skip the expert, the residual carries them). Which tokens
// go — the last by position (GShard) or the lowest gate scores (Megatron `probs`) — does not change
// the counts the simulator sees; it matters to a backend that moves real tokens.
#pragma once
#include <cstdint>

#include "moesim.pb.h"
#include "routing.hpp"

namespace moesim {

struct GateOutcome {
  RoutingMatrix kept;      // tokens that reach their expert: min(R, C)
  RoutingMatrix routed;    // what the network carries and the experts compute: `kept`, or C in
                           // every cell when buffers are padded to capacity
  std::int64_t capacity = 0;
  double factor = 0;       // the capacity factor in force (the dynamic one for f <= 0)
  std::int64_t dropped = 0;
};

GateOutcome apply_gate(const spec::GateSpec& gate, const RoutingMatrix& routing, int tokens_per_gpu, int top_k);

/// The smallest capacity factor that drops nothing: the largest count over k·T/E (Tutel's x = 0).
double needed_capacity_factor(const RoutingMatrix& routing, int tokens_per_gpu, int top_k);

/// How the GPUs agree on a layer's dispatch sizes before its forward all-to-all, which the gate
/// decides (IterationInput::sizing).
enum class DispatchSizing {
  /// Buffers padded to a capacity from the gate's factor (f > 0): every size is known beforehand
  /// (Tutel, Fairseq, DeepSpeed-MoE with a capacity factor).
  fixed,
  /// Sized by counts (no padding): each GPU sends every other its per-expert counts and reads them
  /// on the host (FastMoE's prepare_forward, laekov/fastmoe fmoe/functions.py; Megatron-LM's
  /// all-to-all dispatcher does the same).
  counts,
  /// Padded to the group's largest count (f <= 0): the GPUs all-reduce (MAX) that count and read it
  /// on the host to size the buffers: DeepSpeed-MoE with drop_tokens=False (deepspeed/moe/
  /// sharded_moe.py top1gating and top2gating at 38327e07: dist.all_reduce(new_capacity, MAX), then
  /// the capacity as F.one_hot's num_classes) and Tutel with capacity_factor <= 0 (tutel/impls/
  /// fast_dispatch.py at 82af7aa: int(simple_all_reduce(capacity, MAX))).
  group_max,
};

/// The dispatch sizing a gate implies: not padded, `counts`; padded, `fixed` for f > 0 and
/// `group_max` for a dynamic factor.
DispatchSizing dispatch_sizing(const spec::GateSpec& gate);

}  // namespace moesim
