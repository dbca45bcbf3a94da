// Building one training iteration's TaskGraph for an MoE transformer, shared by every placement
// and schedule policy. A policy decides, per layer, a LayerPlan (where tokens go, which experts
// are shadowed) and a schedule; this file turns them into ops:
//
//   forward, per layer:  attention -> gate -> encode -> [broadcast of replicated experts]
//                        -> dispatch all-to-all -> experts -> combine all-to-all -> decode
//   backward, reversed:  decode' -> all-to-all -> experts' (dgrad + wgrad) -> all-to-all
//                        -> encode' -> gate' -> attention'   [-> reduce of replicas' gradients]
//   then:                ring all-reduce of the dense gradients -> optimizer
//
// Replicated experts (FasterMoE shadowing, Pro-Prophet, top-k replication) have copies on some
// GPUs for one iteration: their parameters are broadcast from the owner before the layer's experts
// run, each source sends its tokens for them to a copy (its own, else one on its node, else any),
// and the copies' gradients are reduced to the owner before the optimizer. Every expert keeps one
// owner, which alone updates it.
//
// With the smart schedule (FasterMoE §4.2) each layer's all-to-all / experts / all-to-all is split
// into n = G / group_size steps S_j, C_j, R_j on two streams (see smart_layer()). With
// `prefetch_replicas` (Pro-Prophet's block-wise schedule) the broadcasts of layer l run on a second
// communication stream under layer l−1's forward, and the reduces under the rest of the backward.
#pragma once
#include <vector>

#include "policy.hpp"

namespace moesim {

/// Copies of one expert for one iteration, on `holders` (GPUs other than its owner).
struct Replica {
  int expert = 0;
  std::vector<int> holders;
};

/// One layer's placement decision.
struct LayerPlan {
  RoutingMatrix routing;         // token-slots the gate sends, [source GPU][expert]
  std::vector<Replica> replicas;
};

/// Where expert parameters live. `owner`: each expert on one GPU (expert parallelism, replicas
/// copied per iteration). `zero2` / `zero3`: every GPU computes every expert on its own tokens
/// (data parallelism over the experts, no all-to-all) with ZeRO's sharding: stage 3 all-gathers a
/// layer's experts before its forward and again before its backward and reduce-scatters their
/// gradients; stage 2 keeps the parameters, reduce-scatters the gradients and all-gathers the
/// updated parameters after the optimizer step.
enum class ExpertSharding { owner, zero2, zero3 };

struct ScheduleOptions {
  bool smart = false;              // FasterMoE's fine-grained smart schedule
  int group_size = 4;              // workers per group in the smart schedule
  bool prefetch_replicas = false;  // Pro-Prophet's block-wise overlap of replica transfers
  ExpertSharding sharding = ExpertSharding::owner;
};

/// The GPU that owns expert e when E/G experts live on each GPU.
inline int expert_owner(int expert, int experts, int gpus) { return expert / (experts / gpus); }

/// A replica of `expert` on every GPU but its owner (FasterMoE shadowing, top-k replication).
Replica everywhere(int expert, int experts, int gpus);

/// The GPU that computes source `src`'s tokens for expert e under a plan: the source itself if it
/// holds a copy (or owns e), else a holder on its node, else any holder (spread by source).
int expert_target(const LayerPlan& plan, const Cluster& cluster, int src, int expert);

TaskGraph build_moe_iteration(const IterationInput& in, const std::vector<LayerPlan>& plans,
                              const ScheduleOptions& schedule);

}  // namespace moesim
