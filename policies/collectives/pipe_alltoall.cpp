// ScheMoE's Pipe-A2A (docs/spec/schemoe.md §4): the same messages as linear (S/n per peer, no aggregation, no
// extra hop), split by interconnect: the intra-node send/recv pairs on one communicator and stream,
// the inter-node ones on another, running concurrently. Each communicator has its own NCCL
// channels, so each lane keeps `p2p_peers` rounds in flight, and intra-node traffic (PCIe /
// NVLink) no longer waits in the same rounds as the network's: t = max(t_intra, t_inter) (Eq. 16)
// where linear interleaves them. A Collective with `lane` set is that lane alone (the released code's
// lanes are separate streams: schedule/pipelined.cpp runs each as its own op).
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_pipe(const Collective& c, const Cluster& cluster) {
  const std::size_t n = c.group.size();
  Lowering lanes;
  for (const bool intra : {true, false}) {
    if (c.lane >= 0 && intra != (c.lane == 0)) continue;
    Step step = rotating_pairs(c.group, cluster.p2p_peers(), [&](std::size_t i, std::size_t j) {
      const bool same = cluster.node_of(c.group[i]) == cluster.node_of(c.group[j]);
      return same == intra ? c.bytes.at(i, j, n) : 0.0;
    });
    if (!step.transfers.empty()) lanes.push_back({std::move(step)});
  }
  return lanes;
}

}  // namespace

extern const CollectiveAlgorithm pipe_alltoall = {
    "pipe", CollectiveType::all_to_all, "ScheMoE's Pipe-A2A: intra-node and inter-node send/recv on two concurrent streams",
    lower_pipe};

}  // namespace moesim
