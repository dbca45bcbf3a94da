// SimBackend, timed steps: a collective that nothing else on the network can overlap needs no
// parallel tasks. Its aggregated steps' shares (aggregated_tasks()) would run alone on their
// links, each its route latency and then its bytes at the rate of its most loaded link, exactly as
// ptask_L07 runs them when nothing shares their links: L = the largest route latency of its pairs,
// then 1 / r with r = min over its links of bandwidth / load (and TCP-gamma / (2 · max latency ×
// bytes), L07's window bound). The step lasts the longest share's L + 1/r: a SimGrid timer
// (the floors' gate, issue()), no variable in the fair-bottleneck system and no event per share.
// Which collectives are alone is read off the graph before it runs (isolated_network_ops()), so a
// timed step is never overlapped and never has to become tasks half way: the times are those of
// the tasks, to the rounding of the sums.
#include "sim_impl.hpp"

#include <bit>
#include <xbt/config.hpp>

namespace moesim {

// Network ops: collectives and transfers. For each op, the network ops it waits for, as a bitset
// over them: its deps' and the ops' before it on its streams (a Computes op's parts wait for its
// deps and, each, the node before it on its rank's compute stream). Where a wait is a part of an
// earlier Computes op, only that op's own deps count (a subset of what the part waits for), so
// every "precedes" found is true and an op found isolated is. X is isolated when the network ops
// it waits for and those that wait for it are all the others.
std::vector<char> SimBackend::Impl::isolated_network_ops(const TaskGraph& graph, const TaskGraph::Waits& w, std::uint64_t max_bits) {
  const std::size_t N = graph.size();
  std::vector<char> out(N, 0);
  std::vector<std::int64_t> net(N, -1);
  std::size_t M = 0;
  for (const auto& op : graph.ops())
    if (std::holds_alternative<Collective>(op.body) || std::holds_alternative<Transfer>(op.body)) net[op.id] = std::int64_t(M++);
  if (M == 0) return out;
  const std::size_t W = (M + 63) / 64;
  if (std::uint64_t(N) * W * 64 * 2 > max_bits) return out;
  std::vector<std::uint64_t> full(N * W, 0), in(N * W, 0);  // waited for: with the op itself, without
  auto merge = [&](std::uint64_t* into, Node node) {
    const std::uint64_t* from = node < N ? &full[node * W] : &in[std::size_t(w.op_of[node - N]) * W];
    for (std::size_t k = 0; k < W; ++k) into[k] |= from[k];
  };
  std::vector<Node> sources;  // a Computes op's parts' predecessors, as merge() reads them, once each
  for (const auto& op : graph.ops()) {
    std::uint64_t* mine = &in[op.id * W];
    for (Node node : w.of_op[op.id]) merge(mine, node);
    std::uint64_t* all = &full[op.id * W];
    std::copy(mine, mine + W, all);
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      sources.clear();
      for (std::size_t i = c->first_part; i < c->first_part + c->parts(); ++i)
        if (const Node pred = w.stream_pred[i]; pred != kNoNode) sources.push_back(pred < N ? pred : N + w.op_of[pred - N]);
      std::sort(sources.begin(), sources.end());
      sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
      for (Node node : sources) {
        const std::uint64_t* from = node < N ? &full[node * W] : &in[std::size_t(node - N) * W];
        for (std::size_t k = 0; k < W; ++k) all[k] |= from[k];
      }
    }
    if (net[op.id] >= 0) all[std::size_t(net[op.id]) / 64] |= std::uint64_t(1) << (std::size_t(net[op.id]) % 64);
  }
  std::vector<std::size_t> related(M, 0);  // per network op: the network ops before it and after it
  std::vector<OpId> of_net(M);
  for (const auto& op : graph.ops())
    if (net[op.id] >= 0) of_net[std::size_t(net[op.id])] = op.id;
  for (std::size_t y = 0; y < M; ++y) {
    const std::uint64_t* before = &in[std::size_t(of_net[y]) * W];
    for (std::size_t k = 0; k < W; ++k)
      for (std::uint64_t bits = before[k]; bits; bits &= bits - 1) {
        ++related[y];
        ++related[k * 64 + std::size_t(std::countr_zero(bits))];
      }
  }
  for (std::size_t x = 0; x < M; ++x)
    out[of_net[x]] = related[x] == M - 1 && std::holds_alternative<Collective>(graph.op(of_net[x]).body);
  return out;
}

sg4::Link* SimBackend::Impl::group_link(int q) const {
  if (q >= groups.fabric) return groups.fabric_links[std::size_t(q - groups.fabric)];
  const auto [resource, d] = groups.of_node[std::size_t(q % groups.per_node())];
  const std::size_t n = std::size_t(q / groups.per_node()), L = cluster.node_links().size();
  return std::size_t(resource) < L ? node_links[n][std::size_t(resource)] : nic_links[n][std::size_t(resource) - L];
}

}  // namespace moesim
