// NCCL-style linear all-to-all(v): every rank posts a send to and a receive from every other rank
// inside one ncclGroupStart/End, so all n·(n−1) messages are in flight at once (tutel.md §3.1).
#include "collectives/collectives.hpp"

namespace moesim {
namespace {

Lowering lower_linear_alltoall(const Collective& c) {
  const std::size_t n = c.group.size();
  Step step;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (i != j && c.bytes[i * n + j] > 0) step.transfers.push_back({c.group[i], c.group[j], c.bytes[i * n + j]});
  if (step.transfers.empty()) return {};
  return {step};
}

double bytes_sent_per_rank(const Collective& c) {
  const std::size_t n = c.group.size();
  double off_diagonal = c.total_bytes();
  for (std::size_t i = 0; i < n; ++i) off_diagonal -= c.bytes[i * n + i];
  return off_diagonal / double(n);
}

}  // namespace

extern const CollectiveAlgorithm linear_alltoall = {
    "linear", CollectiveType::all_to_all, "all n(n-1) messages at once (NCCL grouped send/recv)",
    lower_linear_alltoall, bytes_sent_per_rank};

}  // namespace moesim
