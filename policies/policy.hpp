// The policy interface: a policy turns one iteration's routing into an IterationPlan (placement,
// gate, replicas, the layer schedule; moe_iteration.hpp), from which one function builds the
// iteration's TaskGraph, and may learn from the timings the backend returns. Policies are registered by name and chosen in the experiment spec (`policy { name: }`).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "gate.hpp"
#include "memory_model.hpp"
#include "model.hpp"
#include "routing.hpp"
#include "taskgraph.hpp"

namespace moesim {

struct IterationPlan;  // moe_iteration.hpp

/// What a policy did in an iteration, for the results.
struct PolicyReport {
  std::int64_t rerouted_tokens = 0;  // token-slots a topology-aware gate sent elsewhere
  int shadowed_experts = 0;          // experts replicated this iteration (all layers)
  int moved_experts = 0;             // experts moved before it with their optimizer states, to a new owner or
                                     // (FlexMoE) a new copy (all layers)
  double decision_seconds = 0;       // wall time of the policy's decisions (not of graph building)
  /// Per MoE layer, the std-dev over GPUs of the token-slots each GPU's experts compute (Pro-Prophet's
  /// "balance degree", §6.9); filled by build_moe_iteration().
  std::vector<double> load_stddev;
  /// Per GPU, the token-slots its experts compute, summed over the MoE layers (same source as above).
  std::vector<double> gpu_load;
  /// Per MoE layer, the most token-slots any GPU's experts compute over the mean over GPUs (1: even).
  std::vector<double> load_max_mean;
  int parallel_r = -1;  // Tutel's adaptive parallelism: the r in force (-1: not used)
  /// The memory of the GPU that needs the most this iteration (filled by build_moe_iteration()).
  MemoryUse memory;
  /// The memory of the GPU whose model states (all but its activations) need the most: what a
  /// memory figure that leaves activations out plots (Hecate Fig. 13). A policy's copies go where
  /// the load is, often not to the GPU with the most activations.
  MemoryUse state_memory;
  /// Per GPU, the memory it needs this iteration (MemoryUse::total(), bytes; same source).
  std::vector<double> gpu_memory;
};

/// Everything a policy sees when it builds an iteration.
struct IterationInput {
  const Cluster& cluster;
  const MoeModel& model;
  const GpuModel& gpu;
  const spec::PolicySpec& spec;
  /// Per MoE layer, the source-GPU × expert token counts (sources = the cluster's GPUs).
  const std::vector<RoutingMatrix>& routing;
  PolicyReport& report;
  /// How the GPUs agree on each layer's dispatch sizes (dispatch_sizing() of the run's gate): the
  /// collective and host sync it takes go before the layer's forward all-to-all.
  DispatchSizing sizing = DispatchSizing::fixed;
  /// Micro-batches whose activations a GPU keeps at once: a pipeline stage under 1F1B holds those
  /// of the micro-batches in flight (parallel_layout.cpp). The memory model multiplies by it.
  int activation_copies = 1;
  /// ZeRO-1 (Megatron's distributed optimizer, parallel.distributed_optimizer): the GPUs each
  /// dense parameter's optimizer states are sharded over (a stage's GPUs), and each expert's (its
  /// copies in the stage's EP groups). A GPU keeps and updates its 1/N; 1: not sharded.
  int dense_optimizer_shards = 1, expert_optimizer_shards = 1;
};

class Policy {
 public:
  virtual ~Policy() = default;
  /// The registered name (policies.def), which results and errors use.
  const std::string& name() const { return name_; }
  /// Rejects a model/cluster/spec combination the policy cannot run, before any work starts
  /// (FieldError with the field path in the experiment spec). By default: what every E/G-per-GPU
  /// placement needs (validate_expert_placement()).
  virtual void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const;
  /// The policy's decisions for one iteration (placement, replicas, the layer schedule).
  virtual IterationPlan plan(const IterationInput& in) = 0;
  /// The iteration's TaskGraph: build_moe_iteration() of plan().
  TaskGraph build_iteration(const IterationInput& in);
  /// Called with each iteration's graph and timing (for policies that adapt).
  virtual void observe(const TaskGraph&, const Timing&) {}

 private:
  friend std::unique_ptr<Policy> make_policy(const spec::PolicySpec& spec);
  std::string name_;
};

/// A uint32 count of iterations (an interval, a period) as an int: past INT_MAX, like any count past
/// the run's iterations, it means "never".
inline int iterations_as_int(std::uint32_t v) { return int(std::min<std::uint32_t>(v, 0x7fffffff)); }

/// The policy named in `spec.name` (FieldError "policy.name" listing the known ones otherwise).
std::unique_ptr<Policy> make_policy(const spec::PolicySpec& spec);
std::vector<std::string> policy_names();
/// The one-line summary policies.def gives a policy ("" for an unknown name).
std::string policy_summary(const std::string& name);

/// Checks what every E/G-per-GPU placement needs: E a multiple of G, known collective algorithms.
void validate_expert_placement(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec);

/// The token spreads (RoutingMatrix::spread()) a dispatch by `algorithm` sends by: DeepEP's
/// (collectives/deepep_alltoall.cpp) a GPU's experts and a node's, where the experts spread evenly
/// over the GPUs; none for another algorithm, or fewer experts than GPUs.
std::vector<int> spread_blocks(const std::string& algorithm, int experts, int gpus, int gpus_per_node);

/// The collective algorithm the spec selects for a type ("linear" / "nccl" when unset; "nccl", for an
/// all-reduce, is resolved per call by CostModel::nccl_all_reduce()); FieldError "policy.all_to_all" /
/// "policy.all_reduce" for an unknown one.
std::string collective_algorithm(const spec::PolicySpec& spec, CollectiveType type);

/// The share of a GPU's compute DeepEP's kernels hold while they run (Collective::sm_share): `sms`
/// (unset: 20, DeepEP's Buffer.num_sms) over gpu.sms; 0 for a GPU whose SMs are unknown.
/// FieldError `field` (where `sms` was set) for 0 or more than the GPU has.
double deepep_sm_share(std::optional<std::uint32_t> sms, const spec::GpuSpec& gpu, const std::string& field);
/// The same for policy.deepep.sms.
double deepep_sm_share(const spec::PolicySpec& spec, const spec::GpuSpec& gpu);

}  // namespace moesim
