// Tutel's two-dimensional hierarchical all-to-all (docs/spec/tutel.md §3.3, Algorithm 3), for a group of whole
// nodes in rank order (anything else is lowered as linear):
//   1. stride copy: chunks with the same local destination become contiguous blocks;
//   2. intra-node all-to-all: block g goes to local GPU g (NVLink / NVSwitch / PCIe);
//   3. stride copy: chunks with the same destination node become contiguous;
//   4. inter-node all-to-all on one rail: block nd goes to the GPU of node nd with my local rank.
// The output layout is linear's. With m GPUs per node and N = n/m nodes, the inter-node step sends
// N − 1 messages of m·S/n instead of n − m messages of S/n: fewer, m× larger messages, for two
// local copies of the buffer and more intra-node traffic.
//
// Where each chunk (source p, destination q) sits after each stride copy follows from Algorithm 3
// (strideMemcpy with the extract's index fix, out[(i % row)·col + i / row] = in[i]):
//   after 1, rank p holds chunk (p, k·m + g) at slot g·N + k, so step 2's block to local GPU g is
//     the chunks (p, q) with local(q) = g;
//   after 2 and 3, rank (node, i) holds chunk (node·m + g, k·m + i) at slot k·m + g, so step 4's
//     block to node k is the chunks from `node`'s GPUs to GPU i of node k.
// So every block's bytes are sums over the matrix, read once in row order: each sum adds its
// chunks in the order of the slots they occupy, as a copy of the buffers would.
#include "collectives/collectives.hpp"

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;

namespace {

Lowering lower_2dh(const Collective& c, const Cluster& cluster) {
  if (!whole_nodes(c.group, cluster)) return linear_alltoall.lower(c, cluster);
  const std::size_t n = c.group.size(), m = std::size_t(cluster.gpus_per_node()), N = n / m;
  std::vector<double> held(n);          // step 1's copy: what rank p holds (its row)
  std::vector<double> to_local(n * m);  // step 2: rank p's block to local GPU g, [p·m + g]
  std::vector<double> to_gpu(N * n);    // step 4: node's GPUs to GPU q, [node·n + q]
  std::vector<double> regathered(n);    // step 3's copy: rank (node, i)'s chunks from node's GPUs to local GPUs i
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t q = 0; q < n; ++q) {
      const double b = c.bytes.at(p, q, n);
      held[p] += b;
      to_local[p * m + q % m] += b;
      to_gpu[(p / m) * n + q] += b;
      regathered[(p / m) * m + q % m] += b;
    }
  auto copy_step = [&](const std::vector<double>& bytes) {
    Step s;
    for (std::size_t r = 0; r < n; ++r) s.copies.push_back({c.group[r], bytes[r]});
    return s;
  };
  // Several disjoint exchanges (one per node, or one per rail) as one step of send/recv pairs.
  auto side_by_side = [](const std::vector<Step>& steps) {
    Step out;
    out.p2p = true;
    for (const auto& s : steps) {
      out.transfers.insert(out.transfers.end(), s.transfers.begin(), s.transfers.end());
      out.serial_rounds = std::max(out.serial_rounds, s.serial_rounds);
    }
    return out;
  };
  Lane lane;
  // 1-2: stride copy, then block g to local GPU g of my node.
  lane.push_back(copy_step(held));
  std::vector<Step> exchanges;
  for (std::size_t node = 0; node < N; ++node) {
    const std::vector<int> members(c.group.begin() + std::ptrdiff_t(node * m), c.group.begin() + std::ptrdiff_t(node * m + m));
    exchanges.push_back(rotating_pairs(members, cluster.p2p_peers(),
                                       [&](std::size_t i, std::size_t j) { return to_local[(node * m + i) * m + j]; }));
  }
  if (Step s = side_by_side(exchanges); !s.transfers.empty()) lane.push_back(std::move(s));
  // 3-4: stride copy, then block nd to the GPU of node nd with my local rank.
  lane.push_back(copy_step(regathered));
  exchanges.clear();
  for (std::size_t local = 0; local < m; ++local) {
    std::vector<int> rail(N);
    for (std::size_t nd = 0; nd < N; ++nd) rail[nd] = c.group[nd * m + local];
    exchanges.push_back(rotating_pairs(rail, cluster.p2p_peers(),
                                       [&](std::size_t i, std::size_t j) { return to_gpu[i * n + j * m + local]; }));
  }
  if (Step s = side_by_side(exchanges); !s.transfers.empty()) lane.push_back(std::move(s));
  return {lane};
}

}  // namespace

extern const CollectiveAlgorithm two_dh_alltoall = {
    "2dh", CollectiveType::all_to_all,
    "Tutel's 2D-hierarchical: stride copy, intra-node exchange, stride copy, inter-node exchange on one rail",
    lower_2dh};

}  // namespace moesim
