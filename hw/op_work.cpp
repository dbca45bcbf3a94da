#include "op_work.hpp"

#include <algorithm>

namespace moesim::hw {

std::vector<int> participants(const Op& op) {
  if (const auto* t = std::get_if<Transfer>(&op.body)) {
    if (t->src == t->dst) return {t->src};
    return {std::min(t->src, t->dst), std::max(t->src, t->dst)};
  }
  std::vector<int> ranks = op.ranks();
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

Lowering communication_steps(const Op& op, const Cluster& cluster) {
  if (const auto* t = std::get_if<Transfer>(&op.body)) return {Lane{Step{{*t}, {}, 1, 1}}};
  if (const auto* c = std::get_if<Collective>(&op.body)) return lower(*c, cluster);
  return {};
}

}  // namespace moesim::hw
