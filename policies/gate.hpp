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

}  // namespace moesim
