// Collective algorithms: each one file, each filling one small table of hooks (in the manner of
// nccl-tests): its name, the collective it implements, and `lower`, which turns a Collective into
// steps of point-to-point transfers that every backend executes the same way.
#pragma once
#include <string>
#include <vector>

#include "taskgraph.hpp"

namespace moesim {

/// Transfers that start together. A step with rounds = r is r back-to-back repetitions of the same
/// transfers, pipelined (as NCCL pipelines chunks around a ring): backends run it as the transfers
/// with r times the bytes.
struct Step {
  std::vector<Transfer> transfers;
  int rounds = 1;
};
using Lowering = std::vector<Step>;

struct CollectiveAlgorithm {
  const char* name;
  CollectiveType type;
  const char* summary;
  Lowering (*lower)(const Collective&);
  /// Bytes each rank sends in total, for the "bus bandwidth" figure of the benchmarks.
  double (*bytes_sent_per_rank)(const Collective&);
};

/// Every algorithm moesim knows.
const std::vector<const CollectiveAlgorithm*>& collective_algorithms();
/// The algorithm of that type and name; nullptr when there is none.
const CollectiveAlgorithm* find_collective_algorithm(CollectiveType type, const std::string& name);
/// Names of the algorithms of a type, for error messages ("linear, 2dh").
std::string collective_algorithm_names(CollectiveType type);

/// Lowers with the collective's own algorithm (std::logic_error if unknown: validated earlier).
Lowering lower(const Collective& c);

}  // namespace moesim
