// One training iteration of an MoE transformer, as a policy plans it and as the builder lays it
// out. A policy decides an IterationPlan: per layer a LayerPlan (where tokens go, which experts are
// shadowed or move), one layer schedule (policies/schedule/) and when the replicas' transfers run;
// build_moe_iteration() turns the plan into ops:
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
// What happens between a layer's encode and decode is its LayerSchedule's (sequential, FasterMoE's
// smart schedule, pipelined, Tutel's sharded experts, ZeRO). Where the replicas' broadcasts and
// reduces go is a ReplicaSchedule.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "policy.hpp"
#include "schedule/layer_schedule.hpp"

namespace moesim {

/// Copies of one expert for one iteration, on `holders` (GPUs other than its owner). The last
/// `late` holders get theirs after the layer's gate, on the critical path (Hecate's calibration,
/// docs/spec/hecate.md §4.4); the others as the ReplicaSchedule says.
struct Replica {
  int expert = 0;
  std::vector<int> holders;
  int late = 0;
};

/// An expert that changes owner before the iteration, with its parameters and optimizer states
/// (SmartMoE-style rearrangement), on the critical path.
struct Migration {
  int expert = 0, from = 0, to = 0;
};

/// One layer's placement decision.
struct LayerPlan {
  LayerPlan() = default;
  LayerPlan(RoutingMatrix r, std::vector<Replica> reps = {}) : routing(std::move(r)), replicas(std::move(reps)) {}
  RoutingMatrix routing;         // token-slots the gate sends, [source GPU][expert]
  std::vector<Replica> replicas;
  std::vector<int> owner;        // per expert, the GPU that owns it; empty: expert_owner()
  std::vector<Migration> migrations;
  /// How sources' tokens reach an expert's copies. false: the nearest copy (the source's own GPU,
  /// else one on its node, else one spread by source), the rule of Hecate's topology-aware
  /// dispatcher (§4.4) and of copies on every GPU. true: the copies' loads even (FlexMoE: replica
  /// load = expert load / copies), whole sources given to the least loaded copy, heaviest first,
  /// wherever it is.
  bool even_replica_loads = false;
};

/// Where expert parameters live. `owner`: each expert on one GPU (expert parallelism, replicas
/// copied per iteration). `zero2` / `zero3`: every GPU computes every expert on its own tokens
/// (data parallelism over the experts, no all-to-all) with ZeRO's sharding: stage 3 all-gathers a
/// layer's experts before its forward and again before its backward and reduce-scatters their
/// gradients; stage 2 keeps the parameters, reduce-scatters the gradients and all-gathers the
/// updated parameters after the optimizer step.
enum class ExpertSharding { owner, zero2, zero3 };
/// Where replicas' parameter broadcasts (Pro-Prophet's Trans) and gradient reduces (Agg) go.
enum class ReplicaSchedule : std::uint8_t {
  /// Hecate's FSSDP (docs/spec/hecate.md §2.4): layer l's broadcasts (spAG) start with its attention, on the
  /// comm stream, from a placement predicted before the gate; its reduces (spRS) after its
  /// backward exchange, under the attention backward.
  under_attention,
  /// On the comm stream in program order: layer l's broadcasts after its gate (the choice is made
  /// from this iteration's routing, so nothing can be sent before the gate has counted), its
  /// reduces after layer l's backward exchange, under the rest of the backward (FasterMoE).
  stream_order,
  /// Nothing overlaps: the broadcasts wait for the layer's gate, the backward's next compute waits
  /// for the reduces (Pro-Prophet's planner without its scheduler, the Eq. 6 setting).
  exposed,
  /// Layer l's broadcasts on a second comm stream under layer l−1's forward, reduces under the
  /// rest of the backward.
  second_stream,
  /// Pro-Prophet's block-wise schedule (Algorithm 2 with Partition()), all on the comm stream:
  /// layer l+1's broadcasts after layer l's dispatch, under its experts (SubTrans1), except the
  /// last `trans_under_dense`, which go after its combine, under the non-expert compute up to
  /// layer l+1's dispatch (SubTrans2). Layer l's reduces: the first `agg_under_dense` after its
  /// backward combine, under the non-expert backward (SubAgg1); the rest after layer l−1's
  /// backward dispatch, under its experts (SubAgg2). Layer 0's broadcasts (no earlier block) go
  /// before its dispatch, layer 0's reduces (no later block) all after its backward combine.
  /// Nothing crosses the iteration boundary. With the smart schedule the "under the experts"
  /// parts go after the layer.
  block_wise,
};

/// Where the replicas' transfers go, and what kind of copies they are.
struct ReplicaOptions {
  ReplicaSchedule timing = ReplicaSchedule::stream_order;
  int trans_under_dense = 0;  // block_wise: broadcasts per layer under the non-expert forward
  int agg_under_dense = 0;    // block_wise: reduces per layer under the non-expert backward
  /// FlexMoE: replicas are kept across iterations as full copies with their optimizer states:
  /// nothing is broadcast before a layer, and each replicated expert's gradients are all-reduced
  /// among its copies after the layer's backward (instead of reduced to the owner).
  bool persistent = false;
  /// Copies per layer each GPU holds memory for from the start, used or not (FlexMoE's reserved
  /// slots): a GPU's copies of a layer count as at least this many in its peak memory.
  int reserved_copies = 0;
  /// Hecate's re-materialization (Hecate §6, "Hecate-RM"), with under_attention: a layer's copies
  /// are dropped after its forward and gathered again (a second spAG) before its backward, on the
  /// comm stream after the spRS of the layer after it, under that layer's attention backward. The
  /// last layer keeps its copies (its backward follows its forward at once). Memory: one layer's
  /// copies at a time instead of every layer's.
  bool rematerialize = false;
  /// A layer's broadcasts (and its reduces, and its re-materialization) go as one NCCL group call,
  /// all at the same time, sharing the links (Hecate §5.1: "group calls that schedule a series of
  /// Broadcast and Reduce operations at the same time"), instead of one after another.
  bool grouped = false;
};

/// The expert kernels' shape (Tutel Fig. 23's baselines, TutelSpec).
struct ExpertKernels {
  bool dense_encode = false;      // Fairseq's one-hot einsum encode/decode GEMMs
  /// Without Flexible All-to-All (Tutel v0.1's FusedExpertsNetwork, microsoft/tutel
  /// tutel/impls/moe_layer.py; Fairseq's MOELayer): each expert's input is copied from the
  /// all-to-all's layout (W, ΔE, ΔC, M) into (ΔE, W·ΔC, M) for its one GEMM, and its output back,
  /// a read and a write of each token-slot's d_model values twice, in each pass; with one expert a
  /// GPU the layouts agree and nothing is copied.
  bool layout_copies = false;
};

/// What a policy decides for one iteration; build_moe_iteration() turns it into the TaskGraph and
/// the host data path (hw/data_path.hpp) replays it with real numbers.
struct IterationPlan {
  IterationPlan() = default;
  explicit IterationPlan(std::vector<LayerPlan> l) : layers(std::move(l)) {}
  std::vector<LayerPlan> layers;
  /// The one schedule of every MoE layer (policies/schedule/); null: sequential_schedule().
  std::shared_ptr<const LayerSchedule> schedule;
  ReplicaOptions replicas = {};
  ExpertKernels kernels = {};
  std::string all_to_all;  // the MoE all-to-alls' algorithm instead of policy.all_to_all
  /// FasterMoE's shadowing decision on each layer's forward critical path, before its broadcasts
  /// and dispatch (laekov/fastmoe fmoe/fastermoe/shadow_policy.py global_policy): every GPU's
  /// per-expert counts all-gathered (`count_allgather`), then copied to the host (.cpu(): a
  /// host sync), where the rule runs.
  bool shadow_search = false;
  /// The policy's own dispatch sizing, in place of the run's gate's (IterationInput::sizing):
  /// FasterMoE's is `counts` whatever the gate, since FastMoE's prepare_forward runs on every call,
  /// a capacity or not (laekov/fastmoe fmoe/functions.py), so it pays the exchange in a padded run too.
  std::optional<DispatchSizing> sizing;
  const LayerSchedule& layer_schedule() const;
  ExpertPlacement placement() const { return layer_schedule().placement(); }
};

/// The GPU that owns expert e when E/G experts live on each GPU, in order.
inline int expert_owner(int expert, int experts, int gpus) { return expert / (experts / gpus); }
/// The GPU that owns expert e under a plan (its `owner`, else expert_owner()).
inline int plan_owner(const LayerPlan& plan, int expert, int gpus) {
  return plan.owner.empty() ? expert_owner(expert, plan.routing.experts, gpus) : plan.owner[std::size_t(expert)];
}

/// A replica of `expert` on every GPU but its owner (FasterMoE shadowing, top-k replication).
Replica everywhere(int expert, int experts, int gpus);

/// The GPU that computes source `src`'s tokens for expert e under a plan: the source itself if it
/// holds a copy (or owns e), else a holder on its node, else any holder (spread by source); with
/// LayerPlan::even_replica_loads, the copy whose load stays even (replica_targets()).
int expert_target(const LayerPlan& plan, const Cluster& cluster, int src, int expert);
/// expert_target() of every source for one replicated expert whose owner is `owner`, in O(G + holders).
/// With `even_loads` (the layer's routing), the copies take whole sources, heaviest first, each to
/// the copy with the fewest tokens so far: loads even up to one source's tokens, in O(G log G + G × copies).
std::vector<int> replica_targets(const Replica& rep, const Cluster& cluster, int owner, const RoutingMatrix* even_loads = nullptr);
/// replica_targets() of a replica in `plan`'s layer: its owner and its rule (even_replica_loads) the plan's.
std::vector<int> replica_targets(const LayerPlan& plan, const Replica& rep, const Cluster& cluster);

/// The iteration's TaskGraph from a plan (the PolicyReport's load and memory filled on the way).
TaskGraph build_moe_iteration(const IterationInput& in, const IterationPlan& plan);

}  // namespace moesim
