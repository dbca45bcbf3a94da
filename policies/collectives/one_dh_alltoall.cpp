// HetuMoE's one-dimensional hierarchical all-to-all (docs/spec/schemoe.md §4, "1DH-A2A"), for whole nodes (else
// linear): every GPU sends its whole input to its node's leader (local GPU 0), the leader regroups
// it, the leaders exchange per-node aggregates, regroup, and scatter to their GPUs. One message per
// node pair, but everything funnels through one GPU per node (and the leader holds m inputs: the
// paper's out-of-memory at large sizes).
#include "collectives/collectives.hpp"

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;

namespace {

Lowering lower_1dh(const Collective& c, const Cluster& cluster) {
  if (!whole_nodes(c.group, cluster)) return linear_alltoall.lower(c, cluster);
  const std::size_t n = c.group.size(), m = std::size_t(cluster.gpus_per_node()), N = n / m;
  auto bytes = [&](std::size_t s, std::size_t d) { return c.bytes.at(s, d, n); };
  auto node_bytes = [&](std::size_t s) {  // what GPU s holds for everyone
    double b = 0;
    for (std::size_t d = 0; d < n; ++d) b += bytes(s, d);
    return b;
  };
  Lane lane;
  Step gather, regroup, scatter, regroup_back;
  for (std::size_t node = 0; node < N; ++node) {
    const std::size_t leader = node * m;
    double held = 0, incoming = 0;
    for (std::size_t g = 0; g < m; ++g) {
      held += node_bytes(leader + g);
      if (g > 0 && node_bytes(leader + g) > 0) gather.transfers.push_back({c.group[leader + g], c.group[leader], node_bytes(leader + g)});
      double to_g = 0;  // what arrives at the leader for GPU g
      for (std::size_t s = 0; s < n; ++s) to_g += bytes(s, leader + g);
      incoming += to_g;
      if (g > 0 && to_g > 0) scatter.transfers.push_back({c.group[leader], c.group[leader + g], to_g});
    }
    regroup.copies.push_back({c.group[leader], held});
    regroup_back.copies.push_back({c.group[leader], incoming});
  }
  std::vector<int> leaders(N);
  for (std::size_t node = 0; node < N; ++node) leaders[node] = c.group[node * m];
  Step exchange = rotating_pairs(leaders, cluster.p2p_peers(), [&](std::size_t a, std::size_t b) {
    double sum = 0;
    for (std::size_t s = a * m; s < a * m + m; ++s)
      for (std::size_t d = b * m; d < b * m + m; ++d) sum += bytes(s, d);
    return sum;
  });
  if (!gather.transfers.empty()) lane.push_back(std::move(gather));
  lane.push_back(std::move(regroup));
  if (!exchange.transfers.empty()) lane.push_back(std::move(exchange));
  lane.push_back(std::move(regroup_back));
  if (!scatter.transfers.empty()) lane.push_back(std::move(scatter));
  return {lane};
}

}  // namespace

extern const CollectiveAlgorithm one_dh_alltoall = {
    "1dh", CollectiveType::all_to_all, "HetuMoE's 1D-hierarchical: gather to a node leader, leaders exchange, scatter",
    lower_1dh};

}  // namespace moesim
