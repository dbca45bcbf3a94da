#include "op_work.hpp"

#include <algorithm>

namespace moesim::hw {

std::vector<int> participants(const Op& op) {
  if (const auto* t = std::get_if<Transfer>(&op.body)) {
    if (t->src == t->dst) return {t->src};
    return {std::min(t->src, t->dst), std::max(t->src, t->dst)};
  }
  std::vector<int> ranks(op.ranks().begin(), op.ranks().end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

const Compute* rank_compute(const Op& op, int rank, std::size_t* part) {
  if (const auto* c = std::get_if<Compute>(&op.body)) return op.rank == rank ? c : nullptr;
  const auto* parts = std::get_if<Computes>(&op.body);
  if (!parts) return nullptr;
  const auto at = std::find(parts->ranks.begin(), parts->ranks.end(), rank);
  if (at == parts->ranks.end()) return nullptr;
  const auto i = std::size_t(at - parts->ranks.begin());
  if (part) *part = parts->first_part + i;
  return &parts->work(i);
}

Lowering communication_steps(const Op& op, const Cluster& cluster) {
  if (const auto* t = std::get_if<Transfer>(&op.body)) return {Lane{Step{{*t}, {}, 1, 1}}};
  if (const auto* c = std::get_if<Collective>(&op.body)) return lower(*c, cluster);
  return {};
}

MemoryKernel memory_kernel(ComputeKind kind, double bytes, const MoeModel& model) {
  const auto floats = std::size_t(bytes / (2 * sizeof(float)));  // read as much as written
  if (floats == 0) return {MemoryKernel::axpy, 0, 1};
  auto at_least_one = [](std::size_t n) { return std::max<std::size_t>(1, n); };
  switch (kind) {
    case ComputeKind::encode:
    case ComputeKind::decode: {
      const std::size_t width = at_least_one(model.spec().d_model());
      return {MemoryKernel::permute, at_least_one(floats / width), width};
    }
    case ComputeKind::gate: {
      const std::size_t width = at_least_one(std::size_t(model.experts()));
      return {MemoryKernel::gate, at_least_one(floats / (2 * width)), width};
    }
    case ComputeKind::optimizer: return {MemoryKernel::adam, at_least_one(2 * floats / 7), 1};
    default: return {MemoryKernel::axpy, at_least_one(2 * floats / 3), 1};
  }
}

}  // namespace moesim::hw
