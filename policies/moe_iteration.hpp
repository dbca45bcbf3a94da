// Building one training iteration's TaskGraph for an MoE transformer, shared by every placement
// and schedule policy. A policy decides, per layer, a LayerPlan (where tokens go, which experts
// are shadowed) and a schedule; this file turns them into ops:
//
//   forward, per layer:  attention -> gate -> encode -> [broadcast of shadowed experts]
//                        -> dispatch all-to-all -> experts -> combine all-to-all -> decode
//   backward, reversed:  decode' -> all-to-all -> experts' (dgrad + wgrad) -> all-to-all
//                        -> encode' -> gate' -> attention'   [-> reduce of shadowed experts' grads]
//   then:                ring all-reduce of the dense gradients -> optimizer
//
// With the smart schedule (FasterMoE §4.2) each layer's all-to-all / experts / all-to-all is split
// into n = G / group_size steps S_j, C_j, R_j on two streams (see smart_layer()).
#pragma once
#include <vector>

#include "policy.hpp"

namespace moesim {

/// One layer's placement decision.
struct LayerPlan {
  RoutingMatrix routing;       // token-slots the gate sends, [source GPU][expert]
  std::vector<int> shadowed;   // experts whose parameters are broadcast to every GPU this iteration:
                               // each GPU computes its own tokens for them (FasterMoE shadowing)
};

struct ScheduleOptions {
  bool smart = false;  // FasterMoE's fine-grained smart schedule
  int group_size = 4;  // workers per group in the smart schedule
};

/// The GPU that owns expert e when E/G experts live on each GPU.
inline int expert_owner(int expert, int experts, int gpus) { return expert / (experts / gpus); }

TaskGraph build_moe_iteration(const IterationInput& in, const std::vector<LayerPlan>& plans,
                              const ScheduleOptions& schedule);

}  // namespace moesim
