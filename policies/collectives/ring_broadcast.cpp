// Ring broadcast and ring reduce of S bytes over n ranks, pipelined (docs/spec/fastermoe.md §1.3: "also ring
// + pipeline, but each link carries a total of S"). The broadcast runs down a chain from the root
// group[0] (rings(..., rooted): the ring cut at the root, each node left and entered once); the
// reduce runs the same chain backwards into the root. NCCL splits the buffer over its C channels,
// each chain crossing between nodes through its own NIC: one step in which every edge of every
// channel's chain carries S/C, then the chain's pipeline fill (chain_fill()).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>

#include "collectives/collectives.hpp"
#include "nccl_constants.hpp"

namespace moesim {
namespace {

// The hops of NCCL's rings over a group, for chain_fill(): each channel's ring as a cycle (its
// chains are the ring cut at a root), each edge's latency and narrowest link, and what NCCL's tuner
// knows of the group. Built once per group and cluster: ZeRO's per-owner reduces lower a thousand
// chains of one group a layer.
struct RingHops {
  std::vector<std::vector<int>> position;  // [channel][rank]: where the rank is on the ring, −1 if absent
  std::vector<std::vector<std::pair<double, double>>> hop;  // [channel][p]: ring[p] -> ring[p + 1], (latency, narrowest link)
  NcclTunerInput tuner;
  // Per channel for one slice (the last asked for): Σ τ over the whole ring, the largest τ and
  // where, the second largest; so that a chain, the ring less one hop, costs O(1) a channel.
  struct Sums {
    double sum = 0, first = 0, second = 0;
    std::size_t at = 0;
  };
  double slice = -1;
  std::vector<Sums> sums;
};

RingHops ring_hops(const std::vector<int>& group, const Cluster& cluster) {
  const int L = int(cluster.node_links().size()), K = int(cluster.nics().size());
  const double fabric_latency = 2 * cluster.spec().fabric().latency_us() * 1e-6;  // up to the leaf and down
  // Directed links, as (node · (L + K) + link or L + NIC) · 2 + direction; edges crossing each
  // (the channels' share of a link, for the tuner's bandwidth).
  std::vector<int> crossing(std::size_t(cluster.nodes()) * std::size_t(L + K) * 2, 0);
  auto id = [&](int node, int link, bool forward) { return (std::size_t(node) * std::size_t(L + K) + std::size_t(link)) * 2 + (forward ? 0 : 1); };
  // f(directed link, its bandwidth) for every link from rank a to rank b; returns the route's latency.
  auto for_each_link = [&](int a, int b, auto&& f) {
    const int na = cluster.node_of(a), nb = cluster.node_of(b), la = cluster.local_of(a), lb = cluster.local_of(b);
    const auto& links = cluster.node_links();
    auto route = [&](int node, const Route& r, bool reverse) {
      for (const auto& h : r) f(id(node, h.link, h.forward != reverse), links[std::size_t(h.link)].bandwidth);
      return cluster.route_latency(r);
    };
    if (na == nb) return route(na, cluster.intra_route(la, lb), false);
    const Nic &out = cluster.rank_nic(a), &in = cluster.rank_nic(b);
    f(id(na, L + cluster.nic_of(la), true), out.bandwidth);
    f(id(nb, L + cluster.nic_of(lb), false), in.bandwidth);
    return route(na, cluster.nic_route(la), false) + out.latency + fabric_latency + in.latency + route(nb, cluster.nic_route(lb), true);
  };
  const auto cycles = rings(group, cluster, false);
  const std::size_t n = group.size();
  for (const auto& ring : cycles)
    for (std::size_t p = 0; p < n; ++p) for_each_link(ring[p], ring[(p + 1) % n], [&](std::size_t l, double) { ++crossing[l]; });
  RingHops out;
  double narrowest = std::numeric_limits<double>::infinity();
  for (const auto& ring : cycles) {
    auto& at = out.position.emplace_back(std::size_t(cluster.num_gpus()), -1);
    auto& hops = out.hop.emplace_back();
    for (std::size_t p = 0; p < n; ++p) {
      at[std::size_t(ring[p])] = int(p);
      double link = std::numeric_limits<double>::infinity(), shared = link;
      const double latency = for_each_link(ring[p], ring[(p + 1) % n], [&](std::size_t l, double bw) {
        link = std::min(link, bw);
        shared = std::min(shared, bw / crossing[l]);
      });
      hops.emplace_back(latency, link);
      narrowest = std::min(narrowest, shared);
    }
  }
  out.tuner = nccl_platform_input(group, cluster);
  out.tuner.ring_bw = narrowest / 1e9;  // what NCCL's search would give a channel: its share of the links
  return out;
}

// ring_hops() of a group, kept per thread (sweeps simulate on several) for the groups lowered last.
RingHops& cached_ring_hops(const std::vector<int>& group, const Cluster& cluster) {
  thread_local std::map<std::pair<std::uint64_t, std::vector<int>>, RingHops> cache;
  thread_local std::vector<char> member;  // the group as a set, in rank order: no sort
  member.assign(std::size_t(cluster.num_gpus()), 0);
  for (const int r : group) member[std::size_t(r)] = 1;
  std::pair<std::uint64_t, std::vector<int>> key{cluster.id(), {}};
  key.second.reserve(group.size());
  for (std::size_t r = 0; r < member.size(); ++r)
    if (member[r]) key.second.push_back(int(r));
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 64) cache.clear();
  return cache.emplace(std::move(key), ring_hops(group, cluster)).first->second;
}

// The protocol NCCL's tuner runs the chain of `c` over these rings with.
NcclProtocol protocol(const RingHops& rings, const Collective& c) {
  return nccl_chain_protocol(rings.tuner, rings.hop.size() == 1, c.bytes.empty() ? 0 : c.bytes[0]);
}

}  // namespace

NcclProtocol chain_protocol(const Collective& c, const Cluster& cluster) { return protocol(cached_ring_hops(c.group, cluster), c); }

namespace {

// A chain's pipeline fill, NCCL's way (docs/collectives.md, "A chain's pipeline fill"). The Simple
// protocol moves a channel's bytes down the chain in slices of s = 512 KiB
// (nccl::simpleChainSlice), and a hop forwards a slice only once it holds all of it
// (prims_simple.h: a receiver waits for the step's tail, the network proxies likewise). With hop
// i taking τ_i = latency_i + s/b_i, the last slice crosses every hop after the narrowest: the
// step's bytes give S/C over the narrowest hop and one latency, and the fill is the rest,
// Σ τ − max τ. b_i is the hop's narrowest link whole, not the channels' share of it: NCCL's
// channels do not cross a hop in lockstep, so the first slice to reach an idle hop crosses it at
// the link's rate (published broadcast_perf on NVSwitch nodes puts the fill at about one slice a
// hop at the link's rate; docs/collectives.md). s is all of a channel's bytes when they are fewer
// (S over NCCL's channels, twice moesim's: nccl::channelDuplication). LL and LL128 forward each
// line as it lands, so with them (NCCL's tuner picks the protocol: nccl_chain_protocol()) only
// the hops' latencies add up. A chain is its ring less the hop into the root; a reduce crosses
// the same hops backwards, at the same latency and bandwidth.
double chain_fill(const Collective& c, double share, const Cluster& cluster) {
  RingHops& rings = cached_ring_hops(c.group, cluster);
  const bool simple = protocol(rings, c) == NcclProtocol::simple;
  const double slice = simple ? std::min(nccl::simpleChainSlice, share / nccl::channelDuplication) : 0;
  if (slice != rings.slice) {
    rings.slice = slice;
    rings.sums.assign(rings.hop.size(), {});
    for (std::size_t k = 0; k < rings.hop.size(); ++k) {
      auto& m = rings.sums[k];
      for (std::size_t p = 0; p < rings.hop[k].size(); ++p) {
        const double tau = rings.hop[k][p].first + slice / rings.hop[k][p].second;
        m.sum += tau;
        if (tau > m.first) m.second = m.first, m.first = tau, m.at = p;
        else m.second = std::max(m.second, tau);
      }
    }
  }
  double fill = 0;
  for (std::size_t k = 0; k < rings.hop.size(); ++k) {
    const auto& hops = rings.hop[k];
    const auto& m = rings.sums[k];
    const std::size_t n = hops.size(), into_root = (std::size_t(rings.position[k][std::size_t(c.group.front())]) + n - 1) % n;
    const double cut = hops[into_root].first + slice / hops[into_root].second;
    fill = std::max(fill, m.sum - cut - (into_root == m.at ? m.second : m.first));
  }
  return fill > 1e-12 ? fill : 0;  // a chain of one hop: the sums' rounding, not a fill
}

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
  step.fill_seconds = chain_fill(c, share, cluster);
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
