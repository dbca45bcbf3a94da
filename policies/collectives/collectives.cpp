#include "collectives/collectives.hpp"

#include <algorithm>
#include <stdexcept>

namespace moesim {

#define COLLECTIVE(ALGORITHM) extern const CollectiveAlgorithm ALGORITHM;
#include "collectives/collectives.def"
#undef COLLECTIVE

const std::vector<const CollectiveAlgorithm*>& collective_algorithms() {
  static const std::vector<const CollectiveAlgorithm*> all = {
#define COLLECTIVE(ALGORITHM) &ALGORITHM,
#include "collectives/collectives.def"
#undef COLLECTIVE
  };
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

namespace {

// The collective's own algorithm (std::logic_error if unknown: validated earlier).
const CollectiveAlgorithm& algorithm_of(const Collective& c) {
  const auto* a = find_collective_algorithm(c.type, c.algorithm);
  if (!a) throw std::logic_error(std::string("no ") + collective_type_name(c.type) + " algorithm '" + c.algorithm + "'");
  return *a;
}

// NCCL's channels to a peer on another node (Cluster::net_peer_bandwidth()): a step of send/recv
// pairs lasts at least its largest message between two nodes (its rounds together) over what those
// channels move. Only where the platform sets the cap (an older NCCL); rings, trees and DeepEP's
// kernels are not send/recv pairs.
Lowering with_net_peer_cap(Lowering lowering, const Cluster& cluster) {
  const double cap = cluster.net_peer_bandwidth();
  if (!(cap > 0) || cluster.nodes() < 2) return lowering;
  for (auto& lane : lowering)
    for (auto& step : lane) {
      if (!step.p2p) continue;
      double largest = 0;
      auto note = [&](int src, int dst, double bytes) {
        if (cluster.node_of(src) != cluster.node_of(dst)) largest = std::max(largest, bytes);
      };
      if (const Collective* c = step.all_pairs) {
        c->bytes.for_each(c->group.size(), [&](std::size_t i, std::size_t j, double b) {
          note(c->group[i], c->group[j], b);
          return true;
        });
      } else {
        for (const auto& t : step.transfers) note(t.src, t.dst, t.bytes);
      }
      step.min_seconds = std::max(step.min_seconds, largest * step.rounds / cap);
    }
  return lowering;
}

}  // namespace

namespace {

// An NCCL group call of one collective over several groups (Collective::grouped): each group's
// lowering, side by side as lanes of their own, which run at the same time and share the links.
Lowering lower_grouped(const Collective& c, const Cluster& cluster, Lowering (*each)(const Collective&, const Cluster&)) {
  Lowering all;
  Collective one = c;
  one.grouped = {};
  for (const auto& g : c.grouped) {
    one.group = g;
    for (auto& lane : each(one, cluster)) all.push_back(std::move(lane));
  }
  return all;
}

// Calls one after another on a stream (Collective::in_turn): each group's chain as one step of a
// single lane, in order, each with the fill left once a rank goes on to the next call as soon as it
// is done with the last (chain_fills_in_turn()), where an op per call would pay each chain's whole
// fill. Every call after the first pays NCCL's per-call latency there too (the backends charge an
// op's first).
Lowering lower_in_turn(const Collective& c, const Cluster& cluster, Lowering (*each)(const Collective&, const Cluster&)) {
  const std::vector<double> fills = chain_fills_in_turn(c, cluster);
  Lowering all(1);
  Collective one{c.type, {}, c.bytes, c.algorithm};
  for (std::size_t i = 0; i < c.grouped.size(); ++i) {
    one.group = c.grouped[i];
    for (auto& lane : each(one, cluster)) {
      if (lane.size() != 1) throw std::logic_error("lower_in_turn: a call in turn is one chain, one step");
      lane.front().fill_seconds = fills[i] + (i > 0 ? cluster.nccl_call_latency() : 0);
      all.front().push_back(std::move(lane.front()));
    }
  }
  return all;
}

}  // namespace

Lowering lower(const Collective& c, const Cluster& cluster) {
  if (c.in_turn && !c.grouped.empty()) return lower_in_turn(c, cluster, lower);
  if (!c.grouped.empty()) return lower_grouped(c, cluster, lower);
  return with_net_peer_cap(algorithm_of(c).lower(c, cluster), cluster);
}

Lowering lower_unlisted(const Collective& c, const Cluster& cluster) {
  if (c.in_turn && !c.grouped.empty()) return lower_in_turn(c, cluster, lower_unlisted);
  if (!c.grouped.empty()) return lower_grouped(c, cluster, lower_unlisted);
  const CollectiveAlgorithm& a = algorithm_of(c);
  return with_net_peer_cap(a.lower_unlisted ? a.lower_unlisted(c, cluster) : a.lower(c, cluster), cluster);
}

const char* bus_bandwidth_formula(CollectiveType type) {
  switch (type) {
    case CollectiveType::all_reduce: return "2(n-1)/n";
    case CollectiveType::broadcast:
    case CollectiveType::reduce: return "1";
    case CollectiveType::all_gather:
    case CollectiveType::reduce_scatter:
    case CollectiveType::all_to_all: return "(n-1)/n";
  }
  return "?";
}

double bus_bandwidth_factor(CollectiveType type, int n) {
  if (n < 2) return 0;
  switch (type) {
    case CollectiveType::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveType::broadcast:
    case CollectiveType::reduce: return 1;
    case CollectiveType::all_gather:
    case CollectiveType::reduce_scatter:
    case CollectiveType::all_to_all: return double(n - 1) / n;
  }
  return 0;
}

bool whole_nodes(const std::vector<int>& group, const Cluster& cluster) {
  const std::size_t m = std::size_t(cluster.gpus_per_node());
  if (group.size() % m != 0) return false;
  for (std::size_t p = 0; p < group.size(); ++p)
    if (cluster.local_of(group[p]) != int(p % m) || cluster.node_of(group[p]) != cluster.node_of(group[p - p % m])) return false;
  return true;
}

Lowering one_step(Step step) {
  Lowering lowering(1);
  lowering.front().push_back(std::move(step));
  return lowering;
}

NcclTunerInput nccl_platform_input(const std::vector<int>& group, const Cluster& cluster) {
  NcclTunerInput in;
  in.ranks = int(group.size());
  std::vector<int> nodes;
  for (const int r : group) nodes.push_back(cluster.node_of(r));
  std::sort(nodes.begin(), nodes.end());
  in.nodes = int(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
  in.channels = cluster.ring_channels();
  if (in.ranks < 2) return in;
  const auto& spec = cluster.spec();
  in.compute_capability = spec.gpu().compute_capability() ? int(spec.gpu().compute_capability()) : 70;
  in.amd_cpu = spec.node().cpu_vendor() == "amd";
  // NVLink inside the node when every hop of the node's ring runs over NVLink or NVSwitch links
  // (NCCL: graph->typeIntra == LINK_NVL).
  const auto& order = cluster.ring_order();
  in.nvlink = order.size() > 1;
  for (std::size_t p = 0; in.nvlink && p < order.size(); ++p)
    for (const Hop& h : cluster.intra_route(order[p], order[(p + 1) % order.size()])) {
      const auto& kind = cluster.node_links()[std::size_t(h.link)].kind;
      in.nvlink = in.nvlink && (kind == "nvlink" || kind == "nvswitch");
    }
  const int k = cluster.nic_of(cluster.local_of(group.front()));
  const auto& nic_spec = k >= 0 ? spec.node().nics(k) : spec::NicSpec::default_instance();
  // LL128: NCCL enables it over NVLink inside nodes and a NIC the GPU reaches directly (tuning.cc:518-536).
  in.ll128 = in.compute_capability >= 70 && in.nvlink && (in.nodes == 1 || nic_spec.staging_memory().empty());
  in.simple_only = in.nodes > 1 && nic_spec.simple_protocol_only();
  in.net_latency_us = in.nodes > 1 ? nic_spec.nccl_latency_us() : 0;
  return in;
}

}  // namespace moesim
