#include "collectives/collectives.hpp"

#include <stdexcept>

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;
extern const CollectiveAlgorithm ring_allreduce;
extern const CollectiveAlgorithm ring_broadcast;
extern const CollectiveAlgorithm ring_reduce;
extern const CollectiveAlgorithm ring_allgather;
extern const CollectiveAlgorithm ring_reduce_scatter;

const std::vector<const CollectiveAlgorithm*>& collective_algorithms() {
  static const std::vector<const CollectiveAlgorithm*> all = {&linear_alltoall, &ring_allreduce, &ring_broadcast, &ring_reduce, &ring_allgather,
                                                                  &ring_reduce_scatter};
  return all;
}

const CollectiveAlgorithm* find_collective_algorithm(CollectiveType type, const std::string& name) {
  for (const auto* a : collective_algorithms())
    if (a->type == type && name == a->name) return a;
  return nullptr;
}

std::string collective_algorithm_names(CollectiveType type) {
  std::string names;
  for (const auto* a : collective_algorithms())
    if (a->type == type) names += (names.empty() ? "" : ", ") + std::string(a->name);
  return names;
}

Lowering lower(const Collective& c) {
  const auto* a = find_collective_algorithm(c.type, c.algorithm);
  if (!a) throw std::logic_error(std::string("no ") + collective_type_name(c.type) + " algorithm '" + c.algorithm + "'");
  return a->lower(c);
}

}  // namespace moesim
