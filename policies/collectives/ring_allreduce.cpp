// Ring all-reduce of S bytes over n ranks: reduce-scatter then all-gather, 2(n−1) rounds in which
// rank i sends a chunk of S/n to rank i+1 (fastermoe.md §1.3: every ring edge carries 2(n−1)/n·S).
// The rounds are one pipelined step (rounds = 2(n−1)), so the model pays the bandwidth term
// 2(n−1)/n·S/B and one route latency, not 2(n−1) latencies.
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_ring_allreduce(const Collective& c, const Cluster&) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  Step step;
  step.rounds = int(2 * (n - 1));
  const double chunk = c.bytes[0] / double(n);
  for (std::size_t i = 0; i < n; ++i) step.transfers.push_back({c.group[i], c.group[(i + 1) % n], chunk});
  return one_step(std::move(step));
}

double bytes_sent_per_rank(const Collective& c) {
  const double n = double(c.group.size());
  return n < 2 ? 0 : 2 * (n - 1) / n * c.bytes[0];
}

}  // namespace

extern const CollectiveAlgorithm ring_allreduce = {
    "ring", CollectiveType::all_reduce, "reduce-scatter + all-gather around a ring, 2(n-1)/n*S per link",
    lower_ring_allreduce, bytes_sent_per_rank};

}  // namespace moesim
