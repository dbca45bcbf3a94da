// DeepSeek's EPLB (deepseek-ai/EPLB eplb.py), one layer at a time: the placement algorithm the
// `eplb` policy runs (eplb.cpp), exposed for tests. Symbols are eplb.py's.
#pragma once
#include <vector>

namespace moesim::eplb {

/// n weighted items into m packs of exactly n/m items each, as balanced as possible: heaviest
/// first, each into the lightest pack with room.
struct Packing {
  std::vector<int> pack_index;    // per item
  std::vector<int> rank_in_pack;  // per item: its place in its pack
};
Packing balanced_packing(const std::vector<double>& weight, int num_packs);

/// Physical experts and their logical ones: phy2log[p] the logical expert of physical expert p,
/// rank[p] which replica of it p is, logcnt[e] how many replicas expert e has.
struct Replication {
  std::vector<int> phy2log, rank, logcnt;
};
/// num_log logical experts into num_phy replicas, each extra replica to the expert whose load per
/// replica is highest, so that the largest load per replica is as small as this greedy makes it.
Replication replicate_experts(const std::vector<double>& weight, int num_phy);

/// The hierarchical policy: groups packed onto nodes, replicas made within each node, packed onto
/// its GPUs; physical expert p lands on GPU p / (num_physical_experts / num_gpus).
Replication rebalance_experts_hierarchical(const std::vector<double>& weight, int num_physical_experts, int num_groups,
                                           int num_nodes, int num_gpus);
/// eplb.py's choice between its policies: hierarchical when the nodes divide the expert groups.
inline bool hierarchical(int num_groups, int num_nodes) { return num_groups % num_nodes == 0; }
/// eplb.py's entry point: hierarchical() or else the global policy (one group, one node).
Replication rebalance_experts(const std::vector<double>& weight, int num_replicas, int num_groups, int num_nodes, int num_gpus);

/// moesim's addition (eplb.py leaves it): a GPU that got two replicas of one expert gives one of
/// them to another GPU of the same `domain` (consecutive GPUs: a node for the hierarchical policy,
/// all for the global one) in exchange for a replica of an expert it lacks, the one whose load per
/// replica is closest, so that the loads barely move and a slot holds something new. Where no GPU
/// can take it, the pair stays. `load[e]`: expert e's load per replica.
void spread_duplicates(std::vector<int>& phy2log, const std::vector<double>& load, int per_gpu, int domain);

}  // namespace moesim::eplb
