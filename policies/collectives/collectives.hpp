// Collective algorithms: each one file, each filling one small table of hooks (in the manner of
// nccl-tests): its name, the collective it implements, and `lower`, which turns a Collective into
// point-to-point transfers and local copies that every backend executes the same way.
//
// A lowering is a set of lanes that run concurrently (Pipe-A2A's intra- and inter-node streams;
// most algorithms have one). A lane is a sequence of steps; a step's transfers start together and
// the next step starts when all of them (and the step's copies) are done.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "nccl_tuner.hpp"
#include "taskgraph.hpp"

namespace moesim {

/// A local memory copy of `bytes` on a rank (read + write), e.g. 2DH's stride copies.
struct Copy {
  int rank = 0;
  double bytes = 0;
};

/// Transfers that start together, and copies. A step with rounds = r is r back-to-back repetitions
/// of the same transfers, pipelined (as NCCL pipelines chunks around a ring): backends run it as
/// the transfers with r times the bytes. `serial_rounds` = k: the transfers are send/recv rounds of
/// which a channel runs k one after another (rotating_pairs()), so the step lasts at least k route
/// latencies: max(bandwidth term + latency, k · latency). This is what makes message count matter:
/// many small messages are latency-bound.
struct Step {
  std::vector<Transfer> transfers;
  std::vector<Copy> copies;
  int rounds = 1;
  int serial_rounds = 1;
  /// Messages each transfer goes as in a round (Collective::messages), each paying its NIC's
  /// per-message overhead.
  int messages = 1;
  /// The step lasts at least this many seconds whatever its links allow: a kernel's throughput
  /// limit (NCCL's per-channel Tree cap, tree_allreduce.cpp; its channels to a remote send/recv
  /// peer, Cluster::net_peer_bandwidth(), set by lower()). 0: none.
  double min_seconds = 0;
  /// The fraction of its links' rate the step's transfers reach (their bytes take 1/link_rate as
  /// long): NCCL's Tree moves at 0.92 of its links (tree_allreduce.cpp). 1: the links' rate.
  double link_rate = 1;
  /// A chain's pipeline fill (ring_broadcast.cpp, chain_fill()): after its bytes, the step lasts
  /// this many seconds more, as the last slice crosses the chain's other hops. 0: none.
  double fill_seconds = 0;
  /// Set by lower_unlisted() instead of `transfers`: the step sends from every group[i] to every
  /// group[j], i ≠ j, the bytes[i·n + j] > 0 of this all-to-all (rotating_pairs()'s transfers).
  const Collective* all_pairs = nullptr;
  /// The transfers are NCCL send/recv pairs (rotating_pairs(), all_pairs), which NCCL's PXN routes
  /// between nodes through the receiver's rail (Cluster::pxn_proxy()); rings and trees are not.
  bool p2p = false;
  bool sends() const { return all_pairs || !transfers.empty(); }
  /// What the links carry, in the time the step takes, per byte of a transfer: its rounds, at link_rate.
  double load_per_byte() const { return rounds / link_rate; }
};
using Lane = std::vector<Step>;
using Lowering = std::vector<Lane>;

struct CollectiveAlgorithm {
  const char* name;
  CollectiveType type;
  const char* summary;
  /// The steps on `cluster` (its nodes and NCCL's send/recv concurrency matter to some algorithms).
  Lowering (*lower)(const Collective&, const Cluster&);
  /// Optional: the same steps with a step between every pair of the group unlisted
  /// (Step::all_pairs), for lower_unlisted(); null: lower() is used.
  Lowering (*lower_unlisted)(const Collective&, const Cluster&) = nullptr;
};

/// Every algorithm moesim knows.
const std::vector<const CollectiveAlgorithm*>& collective_algorithms();
/// The algorithm of that type and name; nullptr when there is none.
const CollectiveAlgorithm* find_collective_algorithm(CollectiveType type, const std::string& name);
/// Names of the algorithms of a type, for error messages ("linear, 2dh").
std::string collective_algorithm_names(CollectiveType type);

/// Lowers with the collective's own algorithm (std::logic_error if unknown: validated earlier).
Lowering lower(const Collective& c, const Cluster& cluster);
/// lower(), but a step that sends between every pair of the group comes unlisted (Step::all_pairs),
/// for a backend that needs only what crosses each link (the SimGrid backend's aggregated steps):
/// at a thousand GPUs, a million transfers fewer to list per all-to-all.
Lowering lower_unlisted(const Collective& c, const Cluster& cluster);

/// nccl-tests' bus bandwidth over algorithm bandwidth (its doc/PERFORMANCE.md): the factor that makes
/// a collective's bandwidth comparable with the links' speed whatever the rank count: all-reduce
/// 2(n−1)/n; all-gather, reduce-scatter and all-to-all (n−1)/n; broadcast and reduce 1. The size S
/// is nccl-tests' too: the whole buffer (all-gather's output, reduce-scatter's input, an all-to-all's
/// bytes per rank).
double bus_bandwidth_factor(CollectiveType type, int n);
/// The same factor as text, for tables: "2(n-1)/n", "(n-1)/n" or "1".
const char* bus_bandwidth_formula(CollectiveType type);

/// Every channel's ring over c.group as one step of passes·(n−1) pipelined rounds in which each
/// edge carries S/(n·C) (the ring all-reduce: 2 passes; all-gather and reduce-scatter: 1;
/// ring_allreduce.cpp); nothing for fewer than 2 ranks or no bytes.
Lowering lower_rings(const Collective& c, const Cluster& cluster, int passes);

/// Whether `group` is whole nodes in rank order (position p is local GPU p mod m of one node), as
/// the hierarchical algorithms need.
bool whole_nodes(const std::vector<int>& group, const Cluster& cluster);

/// The chain of send/recv rounds of rotating pairs: ⌈busy rounds / peers⌉, at least 1.
inline int serial_rounds(int busy, int peers) { return std::max(1, (busy + std::max(peers, 1) - 1) / std::max(peers, 1)); }

/// Send/recv pairs as NCCL schedules a group of them (NVIDIA/nccl#784: rotating pairs): in round d
/// every rank i of the group sends to rank i + d and receives from rank i − d (positions in the
/// group), and `peers` rounds are in flight at once on separate channels (NCCL's p2p channels /
/// channels per peer, the platform's `p2p_peers`), each channel running its rounds one after
/// another. Returns one step with the transfers bytes(i, j) > 0 of rounds d = 1..group.size() − 1
/// and serial_rounds = ⌈busy rounds / peers⌉ (rounds with nothing to send take no channel: NCCL
/// posts no work for them); an empty step when nothing moves.
template <class Bytes>
Step rotating_pairs(const std::vector<int>& group, int peers, const Bytes& bytes) {
  // A template, not a std::function: at a thousand GPUs an all-to-all's step has a million
  // transfers, and each call through a std::function cost as much as the rest of the loop.
  const std::size_t n = group.size();
  Step step;
  step.p2p = true;
  step.transfers.reserve(n * (n ? n - 1 : 0));  // untouched capacity costs address space, not memory
  int busy = 0;
  for (std::size_t d = 1; d < n; ++d) {
    const std::size_t before = step.transfers.size();
    for (std::size_t i = 0, j = d; i < n; ++i, j = j + 1 == n ? 0 : j + 1)  // j = (i + d) mod n
      if (const double b = bytes(i, j); b > 0) step.transfers.push_back({group[i], group[j], b});
    busy += step.transfers.size() > before ? 1 : 0;
  }
  step.serial_rounds = serial_rounds(busy, peers);
  return step;
}

/// NCCL's rings over `group`, one per channel (Cluster::ring_channels(); rings.cpp): each visits the
/// members node by node from group[0]'s node on, every node once, inside a node in the node's ring
/// order from the channel's entry GPU, so the channels leave and enter nodes through different
/// NICs. `rooted` (a broadcast's or a reduce's chain): each ring cut at group[0], which comes first.
std::vector<std::vector<int>> rings(const std::vector<int>& group, const Cluster& cluster, bool rooted);

/// A node's links in one of the two trees of NCCL's double binary tree over `nodes` nodes
/// (src/graph/trees.cc ncclGetDtree; tree_allreduce.cpp): its parent and children (−1: none), and
/// child_type 0 when it is its parent's first child (a lower index), 1 otherwise.
struct TreeLinks {
  int up = -1;
  int down[2] = {-1, -1};
  int child_type = 0;
};
TreeLinks double_binary_tree(int nodes, int node, int tree);

/// What NCCL's tuner knows of `group` on `cluster` but its bandwidths (CostModel::nccl_tuner_input()
/// adds those): ranks, nodes, channels, the GPU generation, the hosts' CPU, NVLink inside the node,
/// the protocols enabled, the network plugin's latency.
NcclTunerInput nccl_platform_input(const std::vector<int>& group, const Cluster& cluster);

/// The protocol NCCL's tuner runs a ring broadcast or reduce of `c` with (nccl_chain_protocol() on
/// the group's rings: the same ring for every channel when moesim has one); ring_broadcast.cpp.
NcclProtocol chain_protocol(const Collective& c, const Cluster& cluster);

/// For ring broadcasts or reduces one after another on a stream (Collective::in_turn, over
/// `grouped`): each call's pipeline fill once the calls before it are done on each rank, in order;
/// a call alone gets its chain's whole fill (ring_broadcast.cpp).
std::vector<double> chain_fills_in_turn(const Collective& c, const Cluster& cluster);

/// A lowering of one lane of one step (moved, not copied: a step may hold a million transfers).
Lowering one_step(Step step);

}  // namespace moesim
