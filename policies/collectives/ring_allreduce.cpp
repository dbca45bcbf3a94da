// Ring all-reduce of S bytes over n ranks: reduce-scatter then all-gather, 2(n−1) rounds in which
// each rank sends a chunk to its ring successor (docs/spec/fastermoe.md §1.3: every ring edge carries
// 2(n−1)/n·S). NCCL runs C rings at once (its channels, rings()), each on an even share S/C of the
// buffer and crossing between nodes through its own NIC. The rounds are one pipelined step
// (rounds = 2(n−1)), so the model pays the bandwidth term and one route latency, not 2(n−1).
#include "collectives/collectives.hpp"

namespace moesim {

Lowering lower_rings(const Collective& c, const Cluster& cluster, int passes) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  Step step;
  step.rounds = passes * int(n - 1);
  const auto all = rings(c.group, cluster, false);
  const double chunk = c.bytes[0] / double(n) / double(all.size());
  for (const auto& ring : all)
    for (std::size_t i = 0; i < n; ++i) step.transfers.push_back({ring[i], ring[(i + 1) % n], chunk});
  return one_step(std::move(step));
}

namespace {

Lowering lower_ring_allreduce(const Collective& c, const Cluster& cluster) { return lower_rings(c, cluster, 2); }


}  // namespace

extern const CollectiveAlgorithm ring_allreduce = {
    "ring", CollectiveType::all_reduce, "reduce-scatter + all-gather around C rings (channels), 2(n-1)/n*S per rank",
    lower_ring_allreduce};

}  // namespace moesim
