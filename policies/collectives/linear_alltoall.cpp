// NCCL-style linear all-to-all(v) (docs/spec/tutel.md §3.1, Algorithm 1): every rank posts a send to and a
// receive from every other rank inside one ncclGroupStart/End. NCCL runs them as rotating pairs,
// round d = 1..n−1 sending to rank + d, `p2p_peers` rounds in flight at a time: n−1 messages per
// rank and a chain of ⌈(n−1)/p2p_peers⌉ rounds per channel, each paying a route latency. Small
// messages at scale are latency-bound, which is what 2DH's aggregation saves.
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_linear_alltoall(const Collective& c, const Cluster& cluster) {
  const std::size_t n = c.group.size();
  Step step = rotating_pairs(c.group, cluster.p2p_peers(), [&](std::size_t i, std::size_t j) { return c.bytes.at(i, j, n); });
  if (step.transfers.empty()) return {};
  step.messages = c.messages;
  return one_step(std::move(step));
}

// The same step unlisted (lower_unlisted()): the rounds d = (j − i) mod n that send something, read
// in the matrix's storage order, and no further once every round does.
Lowering lower_linear_alltoall_unlisted(const Collective& c, const Cluster& cluster) {
  const std::size_t n = c.group.size();
  std::vector<char> busy(n, 0);
  int rounds = 0;
  const int possible = int(c.bytes.rounds_possible(n));  // a smart-schedule step's: at most 15 of 1,023
  c.bytes.for_each(n, [&](std::size_t i, std::size_t j, double b) {
    if (char& d = busy[j >= i ? j - i : j + n - i]; j != i && !d && b > 0) d = 1, ++rounds;
    return rounds < possible;
  });
  if (rounds == 0) return {};
  Step step;
  step.all_pairs = &c;
  step.p2p = true;
  step.serial_rounds = serial_rounds(rounds, cluster.p2p_peers());
  step.messages = c.messages;
  return one_step(std::move(step));
}

}  // namespace

extern const CollectiveAlgorithm linear_alltoall = {
    "linear", CollectiveType::all_to_all, "n-1 send/recv rounds, p2p_peers at a time (NCCL grouped send/recv)",
    lower_linear_alltoall, lower_linear_alltoall_unlisted};

}  // namespace moesim
