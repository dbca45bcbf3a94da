// Ring all-gather and ring reduce-scatter of a buffer of S bytes (each rank holds or ends with
// S/n of it) over n ranks: n−1 rounds in which rank i sends a chunk of S/n to rank i+1, pipelined
// into one step (rounds = n−1), so every ring edge carries (n−1)/n·S.
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_ring_gather(const Collective& c, const Cluster&) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  Step step;
  step.rounds = int(n - 1);
  for (std::size_t i = 0; i < n; ++i) step.transfers.push_back({c.group[i], c.group[(i + 1) % n], c.bytes[0] / double(n)});
  return one_step(std::move(step));
}

double bytes_sent_per_rank(const Collective& c) {
  const double n = double(c.group.size());
  return n < 2 ? 0 : (n - 1) / n * c.bytes[0];
}

}  // namespace

extern const CollectiveAlgorithm ring_allgather = {
    "ring", CollectiveType::all_gather, "n-1 rounds of S/n around a ring: (n-1)/n*S per link", lower_ring_gather,
    bytes_sent_per_rank};

extern const CollectiveAlgorithm ring_reduce_scatter = {
    "ring", CollectiveType::reduce_scatter, "n-1 rounds of S/n around a ring: (n-1)/n*S per link", lower_ring_gather,
    bytes_sent_per_rank};

}  // namespace moesim
