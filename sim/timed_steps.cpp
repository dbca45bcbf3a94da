// SimBackend, timed steps: a collective that nothing else on the network can overlap needs no
// parallel tasks. Its aggregated steps' shares (aggregated_tasks()) would run alone on their
// links, each its route latency and then its bytes at the rate of its most loaded link, exactly as
// ptask_L07 runs them when nothing shares their links: L = the largest route latency of its pairs,
// then 1 / r with r = min over its links of bandwidth / load (and TCP-gamma / (2 · max latency ×
// bytes), L07's window bound). The step lasts the longest share's L + 1/r: a SimGrid timer
// (the floors' gate, issue()), no variable in the fair-bottleneck system and no event per share.
// Which network ops may overlap which is read off the graph before it runs (network_overlaps());
// a collective is timed when, as it is issued, every network op that may overlap it has ended
// (alone()). So a timed step is never overlapped and never has to become tasks half way: the
// times are those of the tasks, to the rounding of the sums.
#include "sim_impl.hpp"

#include <bit>

namespace moesim {
namespace {

// A 64 × 64 bit matrix transposed in place: bit c of a[r] becomes bit r of a[c] (Hacker's Delight
// §7-3, its swaps of ever smaller blocks).
void transpose64(std::uint64_t a[64]) {
  std::uint64_t m = 0x00000000FFFFFFFFull;
  for (int j = 32; j != 0; j >>= 1, m ^= m << j)
    for (int k = 0; k < 64; k = ((k | j) + 1) & ~j) {
      const std::uint64_t t = ((a[k] >> j) ^ a[k | j]) & m;
      a[k] ^= t << j;
      a[k | j] ^= t;
    }
}

}  // namespace

// Network ops: collectives and transfers. For each op, the network ops it waits for, as a bitset
// over them: its deps' and the ops' before it on its streams (a Computes op's parts wait for its
// deps and, each, the node before it on its rank's compute stream). Where a wait is a part of an
// earlier Computes op, only that op's own deps count (a subset of what the part waits for), so
// every "precedes" found is true, and so is every "cannot overlap". Kept per network op: those
// before it and those after it.
void SimBackend::Impl::network_overlaps(const TaskGraph& graph, const TaskGraph::Waits& w, std::uint64_t max_bits, Overlaps& o) const {
  const std::size_t N = graph.size();
  o.words = 0;
  o.index.assign(N, -1);
  std::size_t M = 0;
  for (const auto& op : graph.ops())
    if (std::holds_alternative<Collective>(op.body) || std::holds_alternative<Transfer>(op.body)) o.index[op.id] = std::int64_t(M++);
  const std::size_t W = (M + 63) / 64;
  // Bits a column block holds per op while the ops are swept: 64·B network ops at a time, B as
  // large as fits.
  if (M == 0 || std::uint64_t(M) * W * 64 * 2 + std::uint64_t(N) * 64 * 2 > max_bits) return;
  const std::size_t B = std::max<std::size_t>(
      1, std::min<std::size_t>({W, 32, std::size_t((max_bits - std::uint64_t(M) * W * 64 * 2) / (std::uint64_t(N) * 64 * 2))}));
  // Each network op's nodes, as a range, and whether they span leaf switches.
  o.first_node.assign(M, 0), o.last_node.assign(M, 0), o.spans_leaves.assign(M, 0);
  const int per_leaf = std::max(1, int(cluster.spec().fabric().nodes_per_leaf()));
  for (const auto& op : graph.ops())
    if (const std::int64_t x = o.index[op.id]; x >= 0) {
      int lo = cluster.nodes(), hi = -1;
      auto span = [&](int r) {
        const int node = node_of_rank[std::size_t(r)];
        lo = std::min(lo, node), hi = std::max(hi, node);
      };
      for (const int r : op.ranks()) span(r);
      if (const auto* t = std::get_if<Transfer>(&op.body)) span(t->src), span(t->dst);
      o.first_node[std::size_t(x)] = lo, o.last_node[std::size_t(x)] = hi;
      o.spans_leaves[std::size_t(x)] = cluster.nodes() > per_leaf && lo / per_leaf != hi / per_leaf;
    }
  o.words = W;
  o.before.assign(M * W, 0);
  o.after.assign(M * W, 0);
  o.ended.assign(W, 0);
  auto &full = o.full, &in = o.in;  // waited for: with the op itself, without
  full.resize(N * B), in.resize(N * B);
  // A Computes op's parts' predecessors on their streams, each once (a part as its op), found once
  // for every sweep: by op, [source_from[op], source_from[op + 1]) of `sources`.
  std::vector<Node> sources;
  std::vector<std::size_t> source_from(N + 1, 0);
  for (const auto& op : graph.ops()) {
    source_from[op.id] = sources.size();
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      for (std::size_t i = c->first_part; i < c->first_part + c->parts(); ++i)
        if (const Node pred = w.stream_pred[i]; pred != kNoNode) {
          const Node source = pred < N ? pred : N + w.op_of[pred - N];
          if (sources.size() == source_from[op.id] || sources.back() != source) sources.push_back(source);  // a run: once
        }
      std::sort(sources.begin() + std::ptrdiff_t(source_from[op.id]), sources.end());
      sources.erase(std::unique(sources.begin() + std::ptrdiff_t(source_from[op.id]), sources.end()), sources.end());
    }
  }
  source_from[N] = sources.size();
  for (std::size_t b0 = 0; b0 < W; b0 += B) {  // the network ops [64·b0, 64·(b0 + Wb))
    const std::size_t Wb = std::min(B, W - b0);
    std::fill(full.begin(), full.end(), 0), std::fill(in.begin(), in.end(), 0);
    auto row = [&](Node node) { return node < N ? &full[node * B] : &in[std::size_t(node - N) * B]; };  // node - N: an op
    for (const auto& op : graph.ops()) {
      std::uint64_t* mine = &in[op.id * B];
      for (Node node : w.of_op[op.id]) {
        const std::uint64_t* from = row(node < N ? node : N + w.op_of[node - N]);
        for (std::size_t k = 0; k < Wb; ++k) mine[k] |= from[k];
      }
      std::uint64_t* all = &full[op.id * B];
      std::copy(mine, mine + Wb, all);
      for (std::size_t k0 = source_from[op.id]; k0 < source_from[op.id + 1]; ++k0) {
        const std::uint64_t* from = row(sources[k0]);
        for (std::size_t k = 0; k < Wb; ++k) all[k] |= from[k];
      }
      if (const std::int64_t x = o.index[op.id]; x >= 0) {
        if (const std::size_t word = std::size_t(x) / 64; word >= b0 && word < b0 + Wb) all[word - b0] |= std::uint64_t(1) << (std::size_t(x) % 64);
        std::copy(mine, mine + Wb, &o.before[std::size_t(x) * W + b0]);
      }
    }
  }
  // `after` is `before` transposed (y is after x when x is before y), 64 × 64 bits at a time: bit
  // by bit it cost M²/2 steps, most of the analysis of the smart schedule's 12,288 network ops.
  std::uint64_t block[64];
  for (std::size_t j = 0; j < W; ++j)      // the rows y of [64j, 64j + 64)
    for (std::size_t k = 0; k < W; ++k) {  // by the columns x of [64k, 64k + 64)
      std::uint64_t any = 0;
      for (std::size_t r = 0; r < 64; ++r) any |= block[r] = 64 * j + r < M ? o.before[(64 * j + r) * W + k] : 0;
      if (!any) continue;
      transpose64(block);
      for (std::size_t c = 0; c < 64 && 64 * k + c < M; ++c) o.after[(64 * k + c) * W + j] = block[c];
    }
  // Bits past the last network op count as ended.
  if (M % 64) o.ended[W - 1] = ~std::uint64_t(0) << (M % 64);
  // Each op's words with an op neither before nor after it (ended: none yet, but the bits past the last).
  o.open_from.assign(M + 1, 0), o.open_words.clear();
  for (std::size_t x = 0; x < M; ++x) {
    o.open_from[x] = std::uint32_t(o.open_words.size());
    for (std::size_t k = 0; k < W; ++k) {
      std::uint64_t ordered = o.before[x * W + k] | o.after[x * W + k] | o.ended[k];
      if (k == x / 64) ordered |= std::uint64_t(1) << (x % 64);
      if (~ordered) o.open_words.push_back(std::uint32_t(k));
    }
  }
  o.open_from[M] = std::uint32_t(o.open_words.size());
}

// Whether every network op that may overlap network op `id` (neither before nor after it) has
// ended or shares no link with it. Two ops share none when their nodes are apart and not both span
// leaf switches: inside a leaf, a route between nodes takes its two nodes' cables only (the
// fat-tree's links between a node and its leaf, each way), and a node's links are its own.
bool SimBackend::Impl::Overlaps::alone(OpId id) const {
  if (words == 0) return false;
  const std::size_t x = std::size_t(index[id]), W = words;
  for (std::size_t w = open_from[x]; w < open_from[x + 1]; ++w) {
    const std::size_t k = open_words[w];
    std::uint64_t ordered = before[x * W + k] | after[x * W + k] | ended[k];
    if (k == x / 64) ordered |= std::uint64_t(1) << (x % 64);
    for (std::uint64_t open = ~ordered; open; open &= open - 1) {
      const std::size_t y = k * 64 + std::size_t(std::countr_zero(open));
      const bool apart = last_node[y] < first_node[x] || last_node[x] < first_node[y];
      if (!apart || (spans_leaves[x] && spans_leaves[y])) return false;
    }
  }
  return true;
}

void SimBackend::Impl::Overlaps::end(OpId id) {
  if (words == 0 || index[id] < 0) return;
  const std::size_t x = std::size_t(index[id]);
  ended[x / 64] |= std::uint64_t(1) << (x % 64);
}

sg4::Link* SimBackend::Impl::group_link(int q) const {
  if (q >= groups.fabric) return groups.fabric_links[std::size_t(q - groups.fabric)];
  const auto [resource, d] = groups.of_node[std::size_t(q % groups.per_node())];
  const std::size_t n = std::size_t(q / groups.per_node()), L = cluster.node_links().size();
  return std::size_t(resource) < L ? node_links[n][std::size_t(resource)] : nic_links[n][std::size_t(resource) - L];
}

}  // namespace moesim
