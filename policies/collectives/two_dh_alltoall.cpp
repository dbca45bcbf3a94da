// Tutel's two-dimensional hierarchical all-to-all (docs/spec/tutel.md §3.3, Algorithm 3), for a group of whole
// nodes in rank order (anything else is lowered as linear):
//   1. stride copy: chunks with the same local destination become contiguous blocks;
//   2. intra-node all-to-all: block g goes to local GPU g (NVLink / NVSwitch / PCIe);
//   3. stride copy: chunks with the same destination node become contiguous;
//   4. inter-node all-to-all on one rail: block nd goes to the GPU of node nd with my local rank.
// The output layout is linear's. With m GPUs per node and N = n/m nodes, the inter-node step sends
// N − 1 messages of m·S/n instead of n − m messages of S/n: fewer, m× larger messages, for two
// local copies of the buffer and more intra-node traffic.
#include "collectives/collectives.hpp"

#include <algorithm>

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;

namespace {

using Chunk = std::pair<int, int>;  // (source position, destination position) in the group

// Algorithm 3's strideMemcpy with the extract's index fix: out[(i % row)·col + i / row] = in[i].
std::vector<Chunk> stride_memcpy(const std::vector<Chunk>& in, int row, int col) {
  std::vector<Chunk> out(in.size());
  for (int i = 0; i < row * col; ++i) out[std::size_t((i % row) * col + i / row)] = in[std::size_t(i)];
  return out;
}

// The bytes of the chunks in `buffer[from, from + count)`.
double block_bytes(const Collective& c, const std::vector<Chunk>& buffer, int from, int count) {
  const std::size_t n = c.group.size();
  double b = 0;
  for (int k = from; k < from + count; ++k) b += c.bytes.at(std::size_t(buffer[std::size_t(k)].first), std::size_t(buffer[std::size_t(k)].second), n);
  return b;
}

// Several disjoint exchanges (one per node, or one per rail) as one step.
Step side_by_side(const std::vector<Step>& steps) {
  Step out;
  for (const auto& s : steps) {
    out.transfers.insert(out.transfers.end(), s.transfers.begin(), s.transfers.end());
    out.serial_rounds = std::max(out.serial_rounds, s.serial_rounds);
  }
  return out;
}

Lowering lower_2dh(const Collective& c, const Cluster& cluster) {
  if (!whole_nodes(c.group, cluster)) return linear_alltoall.lower(c, cluster);
  const int n = int(c.group.size()), m = cluster.gpus_per_node(), N = n / m;
  // Each rank's buffer as chunks; the input holds chunk (r, d) at slot d.
  std::vector<std::vector<Chunk>> buf(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int d = 0; d < n; ++d) buf[std::size_t(r)].push_back({r, d});
  Lane lane;
  auto copy_step = [&] {
    Step s;
    for (int r = 0; r < n; ++r) s.copies.push_back({c.group[std::size_t(r)], block_bytes(c, buf[std::size_t(r)], 0, n)});
    lane.push_back(std::move(s));
  };
  // 1-2: stride copy, then block g to local GPU g of my node.
  copy_step();
  for (auto& b : buf) b = stride_memcpy(b, m, N);
  std::vector<std::vector<Chunk>> out(buf);
  std::vector<Step> exchanges;
  for (int node = 0; node < N; ++node) {
    std::vector<int> members(static_cast<std::size_t>(m));
    for (int g = 0; g < m; ++g) members[std::size_t(g)] = c.group[std::size_t(node * m + g)];
    exchanges.push_back(rotating_pairs(members, cluster.p2p_peers(), [&](std::size_t i, std::size_t j) {
      return block_bytes(c, buf[std::size_t(node * m) + i], int(j) * N, N);
    }));
    for (int i = 0; i < m; ++i)  // receive block i of every local peer into my slots [g·N, g·N + N)
      for (int g = 0; g < m; ++g)
        for (int k = 0; k < N; ++k)
          out[std::size_t(node * m + i)][std::size_t(g * N + k)] = buf[std::size_t(node * m + g)][std::size_t(i * N + k)];
  }
  if (Step s = side_by_side(exchanges); !s.transfers.empty()) lane.push_back(std::move(s));
  buf = out;
  // 3-4: stride copy, then block nd to the GPU of node nd with my local rank.
  copy_step();
  for (auto& b : buf) b = stride_memcpy(b, N, m);
  exchanges.clear();
  for (int local = 0; local < m; ++local) {
    std::vector<int> rail(static_cast<std::size_t>(N));
    for (int nd = 0; nd < N; ++nd) rail[std::size_t(nd)] = c.group[std::size_t(nd * m + local)];
    exchanges.push_back(rotating_pairs(rail, cluster.p2p_peers(), [&](std::size_t i, std::size_t j) {
      return block_bytes(c, buf[i * std::size_t(m) + std::size_t(local)], int(j) * m, m);
    }));
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
