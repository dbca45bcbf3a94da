// NCCL's rings over a group (src/graph/search.cc builds them per channel; connect.cc links the
// nodes' segments): the group's members node by node, each node entered and left once, inside a
// node in the order of the node's ring (Cluster::ring_order()), one ring per channel, each
// entering the nodes at its own GPU (Cluster::channel_entry()) and so crossing between nodes
// through its own NIC. A broadcast's or reduce's chain is the ring cut at the root, as NCCL runs
// them (the rank before the root in the ring does not forward): from the root to the exit of its
// node, through every other node, then into the root's node again for the GPUs before the root;
// every node is left once and entered once, each NIC carrying its channel's share once each way.
#include <algorithm>
#include <tuple>

#include "collectives/collectives.hpp"

namespace moesim {

std::vector<std::vector<int>> rings(const std::vector<int>& group, const Cluster& cluster, bool rooted) {
  const int g = cluster.gpus_per_node(), N = cluster.nodes();
  if (group.empty()) return {};
  std::vector<int> position(static_cast<std::size_t>(g), 0);  // of each local GPU in the node's ring
  for (int p = 0; p < g; ++p) position[std::size_t(cluster.ring_order()[std::size_t(p)])] = p;
  const int first_node = cluster.node_of(group.front());
  // The members node by node from group[0]'s, inside a node by ring position: sorted once. A
  // channel's ring enters each node at its own GPU, so inside each node it is this order rotated to
  // the first member at or after the entry's position.
  std::vector<std::tuple<int, int, int>> keyed;  // (nodes after group[0]'s, ring position, rank)
  keyed.reserve(group.size());
  auto key = [&](int rank) {
    return std::tuple((cluster.node_of(rank) - first_node + N) % N, position[std::size_t(cluster.local_of(rank))], rank);
  };
  if (group.size() * 8 >= std::size_t(N) * std::size_t(g)) {
    // Most of the cluster (ZeRO's per-owner reduces, 1,024 chains a layer at 1,024 GPUs): each
    // GPU's key is its own slot node · g + position, so the order is read off the slots.
    std::vector<int> slot(std::size_t(N) * std::size_t(g), -1);
    for (const int rank : group) {
      const auto [node, pos, r] = key(rank);
      slot[std::size_t(node) * std::size_t(g) + std::size_t(pos)] = r;
    }
    for (const int rank : slot)
      if (rank >= 0) keyed.push_back(key(rank));
  } else {
    for (const int rank : group) keyed.push_back(key(rank));
    std::sort(keyed.begin(), keyed.end());
  }
  std::vector<std::size_t> node_starts;  // where each node's members begin in `keyed`, and its end
  for (std::size_t i = 0; i < keyed.size(); ++i)
    if (i == 0 || std::get<0>(keyed[i]) != std::get<0>(keyed[i - 1])) node_starts.push_back(i);
  node_starts.push_back(keyed.size());
  std::vector<std::vector<int>> out;
  for (int c = 0; c < cluster.ring_channels(); ++c) {
    const int entry = cluster.channel_entry(c);
    auto& ring = out.emplace_back();
    ring.reserve(group.size());
    for (std::size_t m = 0; m + 1 < node_starts.size(); ++m) {
      const auto node = keyed.begin() + std::ptrdiff_t(node_starts[m]), next = keyed.begin() + std::ptrdiff_t(node_starts[m + 1]);
      const auto from = std::find_if(node, next, [&](const auto& k) { return std::get<1>(k) >= entry; });
      for (auto k = from; k != next; ++k) ring.push_back(std::get<2>(*k));
      for (auto k = node; k != from; ++k) ring.push_back(std::get<2>(*k));
    }
    if (rooted) std::rotate(ring.begin(), std::find(ring.begin(), ring.end(), group.front()), ring.end());
  }
  return out;
}

}  // namespace moesim
