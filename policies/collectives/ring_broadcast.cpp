// Ring broadcast and ring reduce of S bytes over n ranks, pipelined (fastermoe.md §1.3: "also ring
// + pipeline, but each link carries a total of S"). The broadcast goes from group[0] around the
// ring group[0] -> group[1] -> ... -> group[n-1]; the reduce runs the same ring backwards into
// group[0]. Modelled as one step in which every ring edge but the closing one carries S.
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_ring_broadcast(const Collective& c, const Cluster&) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  Step step;
  for (std::size_t i = 0; i + 1 < n; ++i) step.transfers.push_back({c.group[i], c.group[i + 1], c.bytes[0]});
  return one_step(std::move(step));
}

Lowering lower_ring_reduce(const Collective& c, const Cluster&) {
  const std::size_t n = c.group.size();
  if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) return {};
  Step step;
  for (std::size_t i = n - 1; i >= 1; --i) step.transfers.push_back({c.group[i], c.group[i - 1], c.bytes[0]});
  return one_step(std::move(step));
}

double bytes_sent_per_rank(const Collective& c) {
  const double n = double(c.group.size());
  return n < 2 ? 0 : (n - 1) / n * c.bytes[0];
}

}  // namespace

extern const CollectiveAlgorithm ring_broadcast = {
    "ring", CollectiveType::broadcast, "pipelined along a chain from group[0]: every edge carries S",
    lower_ring_broadcast, bytes_sent_per_rank};

extern const CollectiveAlgorithm ring_reduce = {
    "ring", CollectiveType::reduce, "pipelined along a chain into group[0]: every edge carries S",
    lower_ring_reduce, bytes_sent_per_rank};

}  // namespace moesim
