// NCCL's Tree all-reduce: a reduce up a tree of the ranks and a broadcast back down it, the two
// pipelined, so every tree edge carries the data once each way. NCCL builds it in two levels
// (src/graph/connect.cc at NVIDIA/nccl 5067397c):
//   - inside a node, a chain of its GPUs (the tree graph's intra order; here the channel's ring
//     segment, see below): GPU i's parent is GPU i−1;
//   - across nodes, a double binary tree of the nodes (src/graph/trees.cc ncclGetDtree): tree 0 a
//     binary tree with leaves and inner nodes alternating, tree 1 its mirror (an even node count) or
//     its shift by one (odd), so that a node that is inner in one tree is a leaf in the other.
// Each of the C graph channels is duplicated, channel c on tree 0 and channel c + C on tree 1
// ("Duplicate channels trees", connectTrees): the buffer is split over 2C trees of S/(2C) each, and
// both copies of channel c use c's chain, hence its NIC. A node's chain head chain[0] links to
// the parent node; a child node links in at the parent's chain[1] when it is the parent's first
// child (childType 0) and at chain[0] otherwise (the BALANCED_TREE pattern's child0Index = 1,
// child1Index = 0: "spread NIC traffic between two GPUs"). moesim's chain is the channel's ring
// segment walked backwards from its entry GPU (entry, the ring's exit GPU, ...): every hop is a hop
// of the node's ring, and chain[0] and chain[1] are the channel's entry and exit GPUs, which share
// its NIC (Cluster::channel_entry()), as NCCL's search keeps a tree channel's traffic on one NIC.
// On two nodes each node sends S per direction over its NICs where a ring sends 2(n−1)/n·S:
// NCCL's reason to pick Tree there.
#include <algorithm>

#include "collectives/collectives.hpp"
#include "nccl_constants.hpp"
#include "nccl_tuner.hpp"

namespace moesim {
namespace {

// ncclGetBtree: rank 0 is the root; bit patterns give parent and children.
TreeLinks btree(int n, int rank) {
  TreeLinks t;
  int bit = 1;
  for (; bit < n; bit <<= 1)
    if (bit & rank) break;
  if (rank == 0) {
    if (n > 1) t.down[1] = bit >> 1;
    return t;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= n) up = rank ^ bit;
  t.child_type = rank < up ? 0 : 1;
  t.up = up;
  int low = bit >> 1;
  t.down[0] = low == 0 ? -1 : rank - low;
  int down1 = low == 0 ? -1 : rank + low;
  while (down1 >= n) {
    down1 = low == 0 ? -1 : rank + low;
    low >>= 1;
  }
  t.down[1] = down1;
  return t;
}

Lowering lower_tree_allreduce(const Collective& c, const Cluster& cluster) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  const auto channels = rings(c.group, cluster, false);
  const double chunk = c.bytes[0] / (2.0 * double(channels.size()));  // per tree of each channel
  Step step;
  int nodes = 0;
  for (const auto& ring : channels) {
    std::vector<std::vector<int>> chain;  // per node, in the ring's node order
    for (std::size_t i = 0; i < n; ++i) {
      if (i == 0 || cluster.node_of(ring[i]) != cluster.node_of(ring[i - 1])) chain.emplace_back();
      chain.back().push_back(ring[i]);
    }
    for (auto& gpus : chain) std::reverse(gpus.begin() + 1, gpus.end());  // entry, exit, ... (see above)
    for (const auto& gpus : chain)  // both trees' reduce and broadcast along the chain
      for (std::size_t i = 0; i + 1 < gpus.size(); ++i) {
        step.transfers.push_back({gpus[i + 1], gpus[i], 2 * chunk});
        step.transfers.push_back({gpus[i], gpus[i + 1], 2 * chunk});
      }
    nodes = int(chain.size());
    for (int tree = 0; tree < 2; ++tree)
      for (int k = 0; k < nodes; ++k) {
        const TreeLinks t = double_binary_tree(nodes, k, tree);
        if (t.up < 0) continue;
        const auto& parent = chain[std::size_t(t.up)];
        const int child = chain[std::size_t(k)].front();
        const int at = parent[t.child_type == 0 && parent.size() > 1 ? 1 : 0];
        step.transfers.push_back({child, at, chunk});  // reduce
        step.transfers.push_back({at, child, chunk});  // broadcast
      }
  }
  // Its bytes move at 0.92 of the links' rate, as NCCL's tuner rates a tree (on 2 p4de nodes the
  // published Tree all-reduce, 76.8-78.3 GB/s busbw, is within 6-8% of it: docs/collectives.md).
  step.link_rate = nccl::treeLinkEfficiency;
  // NCCL's tree kernels move at most perChMaxTreeBws per channel (bus bandwidth; algorithm
  // bandwidth half of it): with C channels the all-reduce takes at least S / (C · cap / 2).
  const double cap = nccl_tree_channel_cap(int(cluster.spec().gpu().compute_capability()), nodes) * 1e9;
  step.min_seconds = c.bytes[0] / (double(channels.size()) * cap / 2);
  return one_step(std::move(step));
}

}  // namespace

TreeLinks double_binary_tree(int nodes, int node, int tree) {
  if (tree == 0) return btree(nodes, node);
  // ncclGetDtree's second tree: shifted by one rank (odd count) or mirrored (even).
  const bool shift = nodes % 2 == 1;
  const auto from = [&](int r) { return r < 0 ? -1 : shift ? (r + 1) % nodes : nodes - 1 - r; };
  TreeLinks t = btree(nodes, shift ? (node - 1 + nodes) % nodes : nodes - 1 - node);
  t.up = from(t.up);
  t.down[0] = from(t.down[0]);
  t.down[1] = from(t.down[1]);
  return t;
}

extern const CollectiveAlgorithm tree_allreduce = {
    "tree", CollectiveType::all_reduce,
    "NCCL's double binary tree: reduce up, broadcast down, pipelined; 2C trees of S/(2C)", lower_tree_allreduce};

}  // namespace moesim
