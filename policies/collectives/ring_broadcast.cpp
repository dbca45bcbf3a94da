// Ring broadcast and ring reduce of S bytes over n ranks, pipelined (docs/spec/fastermoe.md §1.3: "also ring
// + pipeline, but each link carries a total of S"). The broadcast runs down a chain from the root
// group[0] (rings(..., rooted): the ring cut at the root, each node left and entered once); the
// reduce runs the same chain backwards into the root. NCCL splits the buffer over its C channels,
// each chain crossing between nodes through its own NIC: one step in which every edge of every
// channel's chain carries S/C.
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_chain(const Collective& c, const Cluster& cluster, bool towards_root) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  const auto chains = rings(c.group, cluster, true);
  const double share = c.bytes[0] / double(chains.size());
  Step step;
  step.transfers.reserve(chains.size() * (n - 1));
  for (const auto& chain : chains)
    for (std::size_t i = 0; i + 1 < n; ++i)
      step.transfers.push_back(towards_root ? Transfer{chain[n - 1 - i], chain[n - 2 - i], share} : Transfer{chain[i], chain[i + 1], share});
  return one_step(std::move(step));
}

Lowering lower_ring_broadcast(const Collective& c, const Cluster& cluster) { return lower_chain(c, cluster, false); }
Lowering lower_ring_reduce(const Collective& c, const Cluster& cluster) { return lower_chain(c, cluster, true); }


}  // namespace

extern const CollectiveAlgorithm ring_broadcast = {
    "ring", CollectiveType::broadcast, "pipelined down C chains from group[0] (channels): every edge carries S/C",
    lower_ring_broadcast};

extern const CollectiveAlgorithm ring_reduce = {
    "ring", CollectiveType::reduce, "pipelined up C chains into group[0] (channels): every edge carries S/C",
    lower_ring_reduce};

}  // namespace moesim
