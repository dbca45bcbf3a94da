// Expert parallelism inside data parallelism (Megatron-Core's expert-data-parallel groups;
// DeepSeek-V3's EP 64 beside ZeRO-1 DP, docs/spec/modern.md): the cluster's G GPUs as D = G/ep EP
// groups of ep consecutive GPUs, whole nodes. Each group runs the policy on its own GPUs' tokens
// as if those GPUs were the whole cluster: all E experts, E/ep per GPU, its all-to-alls inside the
// group, its own replicas and decisions (a policy instance per group). The groups' iterations run
// side by side on the real cluster, sharing its fabric. Their gradient all-reduces become:
//   the dense part's, over all G GPUs (data parallelism);
//   each GPU's experts', over the D GPUs that hold the same experts, one per place in a group
//   (expert data parallelism);
// and each group's optimizer waits for both.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "policy.hpp"

namespace moesim {

/// The EP groups of a ParallelSpec on a cluster: FieldError ("parallel.ep", "parallel.order") where
/// ep does not divide the GPUs into whole nodes, or the order makes an EP group other than
/// consecutive GPUs. ep 0 (or G): one group of all the GPUs.
std::vector<std::vector<int>> ep_groups(const spec::ParallelSpec& parallel, const Cluster& cluster);

/// The cluster one EP group sees: the platform with ep / (GPUs per node) nodes.
spec::ClusterSpec ep_group_cluster(const spec::ClusterSpec& whole, int ep);

class EpGroups {
 public:
  /// `whole`: the cluster's spec; `groups`: ep_groups() of it. One group (all the GPUs): the
  /// policy's own iteration, nothing merged.
  EpGroups(const spec::ClusterSpec& whole, std::vector<std::vector<int>> groups, const spec::PolicySpec& policy);
  /// The policy's registered name.
  const std::string& policy_name() const { return policies_.front()->name(); }
  /// The iteration of every group, merged into one graph over the whole cluster. `in.routing` has
  /// the whole cluster's G sources; `in.report` gets the groups' figures (the memory of the GPU
  /// that needs the most, summed counts, per GPU loads in GPU order, per layer the largest balance
  /// figures of any group).
  TaskGraph build_iteration(const IterationInput& in);
  /// Each group's policy observes its own part of the graph and timing.
  void observe(const TaskGraph& graph, const Timing& timing);

 private:
  std::optional<Cluster> group_cluster_;  // with two groups or more
  std::vector<std::vector<int>> groups_;
  std::vector<std::unique_ptr<Policy>> policies_;
  std::vector<TaskGraph> last_;              // each group's graph of the last iteration, for observe()
  std::vector<std::vector<OpId>> merged_id_;  // per group: its op -> the merged graph's
};

}  // namespace moesim
