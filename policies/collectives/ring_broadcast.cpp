// Ring broadcast and ring reduce of S bytes over n ranks, pipelined (docs/spec/fastermoe.md §1.3: "also ring
// + pipeline, but each link carries a total of S"). The broadcast runs down a chain from the root
// group[0] (rings(..., rooted): the ring cut at the root, each node left and entered once); the
// reduce runs the ring the same way, from the rank after the root round to the root (NCCL's
// reduce.h: the rank whose prev is the root only sends, the root only receives). NCCL splits the
// buffer over its C channels, each chain crossing between nodes through its own NIC: one step in
// which every edge of every channel's chain carries S/C, then the chain's pipeline fill
// (chain_fill()). Calls one after another on a stream overlap their fills (chain_fills_in_turn()).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>

#include "collectives/collectives.hpp"
#include "nccl_constants.hpp"

namespace moesim {
namespace {

// The hops of NCCL's rings over a group, for chain_fill(): each channel's ring as a cycle (its
// chains are the ring cut at a root), each edge's latency and narrowest link, and what NCCL's tuner
// knows of the group. Built once per group and cluster: ZeRO's per-owner reduces lower a thousand
// chains of one group a layer.
struct RingHops {
  std::vector<std::vector<int>> ring;      // [channel][p]: the rank at ring position p
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

// τ of a hop (latency, narrowest link) for a slice: what the slice takes to cross it whole.
double tau_of(const std::pair<double, double>& hop, double slice) { return hop.first + slice / hop.second; }

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
  out.ring = cycles;
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

// What a hop forwards at once of a channel's `share` of c's bytes: a slice with the Simple protocol,
// all of the share when it is less (S over NCCL's channels, twice moesim's); nothing with LL or
// LL128, which forward each line as it lands.
double slice_of(const RingHops& rings, const Collective& c, double share) {
  return protocol(rings, c) == NcclProtocol::simple ? std::min(nccl::simpleChainSlice, share / nccl::channelDuplication) : 0;
}

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
// the hops' latencies add up. A broadcast's chain is its ring less the hop into the root, a
// reduce's its ring less the hop out of it.
double chain_fill(const Collective& c, double share, const Cluster& cluster) {
  RingHops& rings = cached_ring_hops(c.group, cluster);
  const double slice = slice_of(rings, c, share);
  if (slice != rings.slice) {
    rings.slice = slice;
    rings.sums.assign(rings.hop.size(), {});
    for (std::size_t k = 0; k < rings.hop.size(); ++k) {
      auto& m = rings.sums[k];
      for (std::size_t p = 0; p < rings.hop[k].size(); ++p) {
        const double tau = tau_of(rings.hop[k][p], slice);
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
    const std::size_t n = hops.size(), root = std::size_t(rings.position[k][std::size_t(c.group.front())]);
    const std::size_t cut_hop = c.type == CollectiveType::reduce ? root : (root + n - 1) % n;
    const double cut = tau_of(hops[cut_hop], slice);
    fill = std::max(fill, m.sum - cut - (cut_hop == m.at ? m.second : m.first));
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
  for (const auto& chain : chains)  // a reduce: chain[1] ... chain[n − 1], then the root
    for (std::size_t i = 0; i + 1 < n; ++i)
      step.transfers.push_back(towards_root ? Transfer{chain[i + 1], chain[(i + 2) % n], share} : Transfer{chain[i], chain[i + 1], share});
  step.fill_seconds = chain_fill(c, share, cluster);
  return one_step(std::move(step));
}

Lowering lower_ring_broadcast(const Collective& c, const Cluster& cluster) { return lower_chain(c, cluster, false); }
Lowering lower_ring_reduce(const Collective& c, const Cluster& cluster) { return lower_chain(c, cluster, true); }

}  // namespace

// Chains one after another on a stream (Collective::in_turn), each rank starting a call once it is
// done with the one before. On a channel a chain passes its ranks g_0 (where its bytes start: a
// broadcast's root, the far end of a reduce's chain), g_1, ..., g_m; with F(g) when g finished the
// calls before, hop j's τ_j = latency + slice / b (chain_fill()) but 0 for the chain's slowest hop,
// whose slices are in its bytes term B = S/C over it: g_0 has sent the last slice at D_0 = F(g_0) +
// B + τ_0, g_j forwarded it at D_j = max(D_{j−1} + τ_j, F(g_j) + B) (a rank still busy when the
// first slice comes makes the chain wait, then sends it all), and g_m has it at max(D_{m−1}, F(g_m)):
// each rank's new F, the latest over the channels. A call's fill is what the latest F grows by
// beyond B: a chain alone gets chain_fill(); a chain whose root is one hop down the ring from the
// last one's pays a hop's τ, the root's wait to forward the last call's last slice.
namespace {

std::vector<double> fills_in_turn(const Collective& c, const Cluster& cluster) {
  const bool towards_root = c.type == CollectiveType::reduce;
  std::vector<double> finish(std::size_t(cluster.num_gpus()), 0.0), fills;
  double last_end = 0;
  for (const auto& group : c.grouped) {
    const std::size_t n = group.size();
    if (n < 2 || c.bytes.empty() || c.bytes[0] <= 0) {
      fills.push_back(0);
      continue;
    }
    const RingHops& rings = cached_ring_hops(group, cluster);
    const double share = c.bytes[0] / double(rings.hop.size());
    const double slice = slice_of(rings, c, share);  // the protocol reads c's bytes, every call's
    std::vector<double> done = finish;  // this call's F, the latest over its channels
    double bytes_term = 0;              // the step's: its slowest channel's B
    for (std::size_t k = 0; k < rings.hop.size(); ++k) {
      const std::vector<int>& ring = rings.ring[k];
      const std::size_t root = std::size_t(rings.position[k][std::size_t(group.front())]);
      // The chain's ranks in the order its bytes pass them, round the ring (the hop out of ring
      // position p is hop p), and its hops' τ: a broadcast's from the root, a reduce's from the rank
      // after it round to the root.
      std::vector<int> order;
      std::vector<double> tau;
      double narrowest = std::numeric_limits<double>::infinity();
      std::size_t slowest = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t at = (root + j + (towards_root ? 1 : 0)) % n;
        order.push_back(ring[at]);
        if (j + 1 == n) break;
        tau.push_back(tau_of(rings.hop[k][at], slice));
        narrowest = std::min(narrowest, rings.hop[k][at].second);
        if (tau.back() > tau[slowest]) slowest = j;
      }
      tau[slowest] = 0;
      const double B = share / narrowest;
      bytes_term = std::max(bytes_term, B);
      double D = finish[std::size_t(order[0])] + B + tau[0];
      done[std::size_t(order[0])] = std::max(done[std::size_t(order[0])], D);
      for (std::size_t j = 1; j + 1 < n; ++j) {
        D = std::max(D + tau[j], finish[std::size_t(order[j])] + B);
        done[std::size_t(order[j])] = std::max(done[std::size_t(order[j])], D);
      }
      const auto last = std::size_t(order[n - 1]);
      done[last] = std::max(done[last], std::max(D, finish[last]));
    }
    double end = last_end;
    for (const int r : group) end = std::max(end, done[std::size_t(r)]);
    finish = std::move(done);
    fills.push_back(std::max(0.0, end - last_end - bytes_term));
    last_end = end;
  }
  return fills;
}

}  // namespace

// fills_in_turn(), kept per thread for the ops lowered last: every layer's ZeRO-2 reduces are the
// same calls, a thousand chains of a thousand ranks at 1,024 GPUs.
std::vector<double> chain_fills_in_turn(const Collective& c, const Cluster& cluster) {
  using Key = std::tuple<std::uint64_t, CollectiveType, double, std::vector<std::vector<int>>>;
  thread_local std::map<Key, std::vector<double>> cache;
  Key key{cluster.id(), c.type, c.bytes.empty() ? 0.0 : c.bytes[0], c.grouped};
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 64) cache.clear();
  return cache.emplace(std::move(key), fills_in_turn(c, cluster)).first->second;
}

extern const CollectiveAlgorithm ring_broadcast = {
    "ring", CollectiveType::broadcast, "pipelined down C chains from group[0] (channels): every edge carries S/C",
    lower_ring_broadcast};

extern const CollectiveAlgorithm ring_reduce = {
    "ring", CollectiveType::reduce, "pipelined up C chains into group[0] (channels): every edge carries S/C",
    lower_ring_reduce};

}  // namespace moesim
