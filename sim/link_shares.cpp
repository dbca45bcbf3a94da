// SimBackend, link shares: the (link, direction) groups an aggregated collective step can load,
// each the route of a zone of its own between two hosts; per-rank lookups tabulated once; a
// step's bytes measured per group in one pass over its transfers.
#include "sim_impl.hpp"

#include <algorithm>

namespace moesim {

// Fabric hops between two nodes' switches: 2 under one leaf switch, 4 through a spine.
int SimBackend::Impl::fabric_hops(int a, int b) const {
  return groups.between.empty() ||
                 groups.between[std::size_t(a / groups.nodes_per_leaf) * std::size_t(cluster.nodes()) + std::size_t(b)][0] < 0
             ? 2
             : 4;
}

// Which (node link, direction) an aggregated task must enter, by link: (backward, forward).
// Every route inside a node is known (GPU to GPU, GPU to its NIC and back). A link whose every
// route also crosses another link or NIC that is no faster, in its direction, never limits what
// crosses it: under ptask_L07's fair-bottleneck sharing that other link always has as few
// bytes/s left per activity, or fewer (each activity loads both with the same bytes, and it
// carries all the first one's activities). Such a link (DGX-A100's PCIe hop from a GPU to its
// NIC) is left out of aggregated tasks, which then meet fewer links, and nothing changes. Other
// activities (transfers, per-flow collectives) still cross it. A link no route crosses is out too.
std::vector<std::array<bool, 2>> SimBackend::Impl::links_needed() const {
  const int L = int(cluster.node_links().size()), g = cluster.gpus_per_node();
  // A resource-direction: 2 × (link index, or L + NIC index) + (1 forward / up, 0 backward / down).
  auto bandwidth = [&](int rd) {
    return rd / 2 < L ? cluster.node_links()[std::size_t(rd / 2)].bandwidth : cluster.nics()[std::size_t(rd / 2 - L)].bandwidth;
  };
  std::vector<std::vector<int>> routes;
  auto hops = [](const Route& r, bool reverse, std::vector<int>& out) {
    for (const auto& h : r) out.push_back(2 * h.link + (h.forward != reverse ? 1 : 0));
  };
  for (int i = 0; i < g; ++i)
    for (int j = 0; j < g; ++j)
      if (i != j) hops(cluster.intra_route(i, j), false, routes.emplace_back());
  if (cluster.nodes() > 1)
    for (int i = 0; i < g; ++i)
      if (const int nic = cluster.nic_of(i); nic >= 0) {
        auto& up = routes.emplace_back();
        hops(cluster.nic_route(i), false, up);
        up.push_back(2 * (L + nic) + 1);
        auto& down = routes.emplace_back(1, 2 * (L + nic));
        hops(cluster.nic_route(i), true, down);
      }
  for (auto& r : routes) std::sort(r.begin(), r.end());
  std::vector<std::array<bool, 2>> needed(std::size_t(L), {false, false});
  for (int rd = 0; rd < 2 * L; ++rd) {
    std::vector<int> common;  // the resource-directions every route through rd crosses
    bool crossed = false;
    for (const auto& r : routes) {
      if (!std::binary_search(r.begin(), r.end(), rd)) continue;
      if (!crossed) common = r;
      else {
        std::vector<int> both;
        std::set_intersection(common.begin(), common.end(), r.begin(), r.end(), std::back_inserter(both));
        common = std::move(both);
      }
      crossed = true;
    }
    // Ties go to the lower index, so of two links always crossed together one stays.
    const bool dominated = std::any_of(common.begin(), common.end(), [&](int c) {
      return c != rd && (bandwidth(c) < bandwidth(rd) || (bandwidth(c) == bandwidth(rd) && c < rd));
    });
    needed[std::size_t(rd / 2)][std::size_t(rd % 2)] = crossed && !dominated;
  }
  return needed;
}

// The groups and the agg zone. The fabric's links are read off SimGrid's own routes between the
// nodes' ports: node a's route to node b is a's uplink, then links that depend on a's leaf
// switch and on b, then b's downlink (d-mod-k routing on one cable per switch pair), which is
// checked on a sample of pairs.
void SimBackend::Impl::build_groups(const sg4::NetZone* world) {
  const int L = int(cluster.node_links().size()), N = cluster.nodes();
  const auto needed = links_needed();
  groups.link.assign(std::size_t(L), {-1, -1});
  for (int l = 0; l < L; ++l)
    for (int d = 0; d < 2; ++d)
      if (needed[std::size_t(l)][std::size_t(d)]) {
        groups.link[std::size_t(l)][std::size_t(d)] = groups.per_node();
        groups.of_node.emplace_back(l, d);
      }
  if (N > 1)
    for (int k = 0; k < int(cluster.nics().size()); ++k) {
      groups.nic.push_back({groups.per_node(), groups.per_node() + 1});
      groups.of_node.emplace_back(L + k, 0);
      groups.of_node.emplace_back(L + k, 1);
    }
  groups.fabric = N * groups.per_node();
  if (N > 1) {
    std::unordered_map<sg4::Link*, int> index;
    auto group_of = [&](sg4::Link* l) {
      auto [it, added] = index.try_emplace(l, groups.fabric + int(groups.fabric_links.size()));
      if (added) groups.fabric_links.push_back(l);
      return it->second;
    };
    auto fabric_route = [&](int a, int b) {  // the links between the two ports' links
      std::vector<sg4::Link*> links;
      ports[std::size_t(a)]->route_to(ports[std::size_t(b)], links, nullptr);
      if (links.size() < 4) throw std::logic_error("SimBackend: unexpected route between two nodes' ports");
      std::vector<int> out;
      for (std::size_t k = 1; k + 1 < links.size(); ++k) out.push_back(group_of(links[k]));
      return out;
    };
    const int per_leaf = N <= int(cluster.spec().fabric().nodes_per_leaf()) ? N : int(cluster.spec().fabric().nodes_per_leaf());
    groups.nodes_per_leaf = per_leaf;
    groups.up.assign(std::size_t(N), -1);
    groups.down.assign(std::size_t(N), -1);
    groups.between.assign(std::size_t(N / per_leaf) * std::size_t(N), {-1, -1});
    auto split = [](const std::vector<int>& r) {
      if (r.size() != 2 && r.size() != 4) throw std::logic_error("SimBackend: unexpected fabric route length");
      std::array<int, 2> mid = {-1, -1};
      if (r.size() == 4) mid = {r[1], r[2]};
      return std::tuple(r.front(), mid, r.back());
    };
    for (int a = 0; a < N; ++a) {
      const bool first = a % per_leaf == 0;  // the leaf's first node gives the leaf's routes
      for (int b = 0; b < N; ++b) {
        if (b == a || (!first && b != (a + 1) % N)) continue;
        const auto [up, mid, down] = split(fabric_route(a, b));
        groups.up[std::size_t(a)] = up;
        groups.down[std::size_t(b)] = down;
        if (first) groups.between[std::size_t(a / per_leaf) * std::size_t(N) + std::size_t(b)] = mid;
      }
    }
    std::uint64_t x = 88172645463325252ull;  // a fixed sample of pairs (xorshift)
    for (int k = 0; k < std::min(N * N, 4096); ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const int a = int(x % std::uint64_t(N)), b = int((x >> 32) % std::uint64_t(N));
      if (a == b) continue;
      std::vector<int> expected = {groups.up[std::size_t(a)]};
      for (int q : groups.between[std::size_t(a / per_leaf) * std::size_t(N) + std::size_t(b)])
        if (q >= 0) expected.push_back(q);
      expected.push_back(groups.down[std::size_t(b)]);
      if (fabric_route(a, b) != expected)
        throw std::logic_error("SimBackend: the fabric's routes are not per source leaf and destination node");
    }
  }
  // The shares of a step (aggregated_tasks()): blocks of about √N nodes' links (a node's with its
  // cable to its leaf switch, each way), and blocks of as many of the links between switches.
  // (A one-GPU machine has no links to share: at least one per block keeps the arithmetic defined.)
  const int block = int(std::ceil(std::sqrt(double(N)))), share_links = std::max(1, block * groups.per_node());
  groups.share.assign(groups.count(), -1);
  for (std::size_t q = 0; q < std::size_t(groups.fabric); ++q) groups.share[q] = int(q) / groups.per_node() / block;
  for (int n = 0; n < N && N > 1; ++n)
    groups.share[std::size_t(groups.up[std::size_t(n)])] = groups.share[std::size_t(groups.down[std::size_t(n)])] = n / block;
  const int node_shares = (N + block - 1) / block;
  int between = 0;
  for (std::size_t q = std::size_t(groups.fabric); q < groups.count(); ++q)
    if (groups.share[q] < 0) groups.share[q] = node_shares + between++ / share_links;
  share_groups.resize(std::size_t(node_shares + (between + share_links - 1) / share_links));
  // The latency classes (Groups::latencies).
  auto class_of = [&](double latency) {
    const auto it = std::find(groups.latencies.begin(), groups.latencies.end(), latency);
    if (it != groups.latencies.end()) return int(it - groups.latencies.begin());
    groups.latencies.push_back(latency);
    return int(groups.latencies.size()) - 1;
  };
  auto route_latency = [](sg4::Host* a, sg4::Host* b) {
    std::vector<sg4::Link*> links;
    double latency = 0;
    a->route_to(b, links, &latency);
    return latency;
  };
  const int g = cluster.gpus_per_node();
  groups.intra_class.assign(std::size_t(g) * std::size_t(g), -1);
  for (int i = 0; i < g; ++i)
    for (int j = 0; j < g; ++j)
      if (i != j) groups.intra_class[std::size_t(i * g + j)] = class_of(route_latency(hosts[std::size_t(i)], hosts[std::size_t(j)]));
  for (int b = 1; b < N; ++b)
    if (int& c = groups.inter_class[std::size_t(fabric_hops(0, b))]; c < 0) c = class_of(route_latency(ports[0], ports[std::size_t(b)]));
  std::uint64_t y = 0x2545f4914f6cdd1dull;  // routes of the same kind have the same latency everywhere: a sample
  for (int k = 0; k < std::min(N * N, 256) && N > 1; ++k) {
    y ^= y << 13, y ^= y >> 7, y ^= y << 17;
    const int a = int(y % std::uint64_t(N)), b = int((y >> 32) % std::uint64_t(N)), n = a * g;
    if (a == b) continue;
    if (route_latency(ports[std::size_t(a)], ports[std::size_t(b)]) != groups.latencies[std::size_t(groups.inter_class[std::size_t(fabric_hops(a, b))])] ||
        (g > 1 && route_latency(hosts[std::size_t(n)], hosts[std::size_t(n + g - 1)]) !=
                      groups.latencies[std::size_t(groups.intra_class[std::size_t(g - 1)])]))
      throw std::logic_error("SimBackend: routes of one kind with different latencies");
  }
  // A zone per share, so that tasks of different shares share no resource (a task also loads
  // the CPUs of its hosts, with nothing: shared hosts would tie every share's task to the others
  // in the solver's bookkeeping). Group q is the route between a pair of its share's K hosts
  // through that one link; then one route per latency class, through a link of that latency
  // that never binds.
  std::vector<std::vector<std::size_t>> members(share_groups.size());
  for (std::size_t q = 0; q < groups.count(); ++q) members[std::size_t(groups.share[q])].push_back(q);
  groups.ends.resize(groups.count());
  groups.latency_ends.resize(share_groups.size());
  for (std::size_t sh = 0; sh < members.size(); ++sh) {
    const std::size_t routes = members[sh].size() + groups.latencies.size(), first = groups.hosts.size();
    std::size_t K = 2;
    while (K * (K - 1) < routes) ++K;
    auto* zone = sg4::create_full_zone(fmt::format("agg{}", sh));
    zone->set_parent(world);
    for (std::size_t k = 0; k < K; ++k) groups.hosts.push_back(zone->create_host(fmt::format("agg{}-{}", sh, k), 1.0)->seal());
    auto pair = [&](std::size_t r) {  // the r-th ordered pair of the zone's hosts
      const std::size_t u = r / (K - 1), v = r % (K - 1);
      return std::array<std::size_t, 2>{first + u, first + (v >= u ? v + 1 : v)};
    };
    auto add = [&](std::array<std::size_t, 2> ends, sg4::LinkInRoute link) {
      zone->add_route(groups.hosts[ends[0]]->get_netpoint(), groups.hosts[ends[1]]->get_netpoint(), nullptr, nullptr, {link}, false);
    };
    for (std::size_t k = 0; k < members[sh].size(); ++k) {
      const std::size_t q = members[sh][k];
      groups.ends[q] = pair(k);
      if (q >= std::size_t(groups.fabric)) {
        add(groups.ends[q], sg4::LinkInRoute(groups.fabric_links[q - std::size_t(groups.fabric)]));
      } else {
        const auto [resource, d] = groups.of_node[q % std::size_t(groups.per_node())];
        const std::size_t n = q / std::size_t(groups.per_node());
        add(groups.ends[q], sg4::LinkInRoute(resource < L ? node_links[n][std::size_t(resource)] : nic_links[n][std::size_t(resource - L)],
                                             d ? Dir::UP : Dir::DOWN));
      }
    }
    for (std::size_t c = 0; c < groups.latencies.size(); ++c) {
      groups.latency_ends[sh].push_back(pair(members[sh].size() + c));
      add(groups.latency_ends[sh].back(),
          sg4::LinkInRoute(zone->create_link(fmt::format("agg{}-latency{}", sh, c), 1e18)->set_latency(groups.latencies[c])->seal()));
    }
    zone->seal();
  }
  agg_index.assign(groups.hosts.size(), -1);
}

void SimBackend::Impl::tabulate() {
  for (int r = 0; r < cluster.num_gpus(); ++r) node_of_rank.push_back(cluster.node_of(r)), local_of_rank.push_back(cluster.local_of(r));
  const int g = cluster.gpus_per_node();
  for (int l = 0; l < g; ++l) {
    if (cluster.nodes() > 1) {
      const Nic& nic = cluster.rank_nic(l);
      overhead_of_local.push_back(cluster.message_overhead_bytes(l, l + g));
      nic_latency_of_local.push_back(cluster.route_latency(cluster.nic_route(l)) + nic.latency);
      nic_bandwidth_of_local.push_back(nic.bandwidth);
    }
    for (int j = 0; j < g; ++j) intra_latency.push_back(cluster.route_latency(cluster.intra_route(l, j)));
  }
}

const SimBackend::Impl::StepBytes& SimBackend::Impl::measure(const Step& step) {
  auto& s = step_bytes;
  const std::size_t G = std::size_t(cluster.num_gpus()), g = std::size_t(cluster.gpus_per_node()),
                    N = std::size_t(cluster.nodes());
  if (rank_seen.empty()) {
    sum_intra.assign(G * g, 0.0), sum_out.assign(G, 0.0), sum_in.assign(G, 0.0), sum_pairs.assign(N > 1 ? N * N : 0, 0.0);
    rank_seen.assign(G, 0), node_seen.assign(N, 0), node_index.assign(N, -1);
    touched.assign(N > 1 ? N * N + 1 : 0, 0);  // + 1: a step writes one past its last touch
  }
  // NCCL's PXN (Cluster::pxn_proxy()) on a send/recv step: a message between nodes first crosses
  // NVLink to the GPU on the receiver's rail, if that GPU is one of the step's (rank_seen, kept
  // until the pass is over).
  const bool pxn = step.p2p && N > 1 && cluster.spec().node().pxn();
  // The step's ranks and nodes, ascending.
  s.ranks.clear(), s.nodes.clear();
  auto note = [&](int r) {
    if (!rank_seen[std::size_t(r)]) rank_seen[std::size_t(r)] = 1, s.ranks.push_back(r);
  };
  if (const Collective* c = step.all_pairs)
    for (int r : c->group) note(r);
  else
    for (const auto& t : step.transfers) note(t.src), note(t.dst);
  if (!std::is_sorted(s.ranks.begin(), s.ranks.end())) {
    if (s.ranks.size() * 16 >= G) {  // most of the GPUs (a chain over all of them): read them off in order
      s.ranks.clear();
      for (std::size_t r = 0; r < G; ++r)
        if (rank_seen[r]) s.ranks.push_back(int(r));
    } else
      std::sort(s.ranks.begin(), s.ranks.end());
  }
  for (int r : s.ranks) {
    if (!pxn) rank_seen[std::size_t(r)] = 0;
    if (const int n = node_of_rank[std::size_t(r)]; !node_seen[std::size_t(n)]) node_seen[std::size_t(n)] = 1, s.nodes.push_back(n);
  }
  for (int n : s.nodes) node_seen[std::size_t(n)] = 0;
  s.any_intra = s.any_inter = s.crosses = false;
  s.nic_latency = 0;
  s.intra_pair = -1, s.hops = 0;
  const double scale = step.load_per_byte(), messages = step.messages;
  double longest_intra = -1;  // the latency of intra_pair
  // Plain pointers and locals: a million calls a step, and through the vectors' members the
  // compiler reloaded every data pointer at each one.
  const int *node = node_of_rank.data(), *local = local_of_rank.data();
  const char* in_step = rank_seen.data();  // with PXN: the step's GPUs
  const double *overhead = overhead_of_local.data(), *to_nic = nic_latency_of_local.data(), *latency_of = intra_latency.data();
  double *intra = sum_intra.data(), *out = sum_out.data(), *in = sum_in.data(), *pairs = sum_pairs.data();
  std::uint32_t* first_touch = touched.data();
  std::size_t touches = 0;  // entries of pairs made non-zero, listed in first_touch
  bool any_intra = false, any_inter = false, crosses = false;
  double nic_latency = 0;
  int hops = 0;
  // A message of `sent` bytes when `one` is 1; nothing when it is 0 (an empty entry of a matrix).
  // Between nodes without a branch on it: x · one is x or 0 exactly, and adding 0 changes no
  // sum; a skewed routing leaves about half a matrix's entries empty, at random, and a
  // mispredicted branch per entry was most of the pass.
  auto add = [&](int src, int dst, double sent, double one) __attribute__((always_inline)) {
    const int a = node[src], b = node[dst];
    const std::size_t local_src = std::size_t(local[src]);
    if (a == b) {
      const double bytes = sent * scale * one;
      if (src == dst || !(bytes > 0)) return;  // nothing crosses a link
      const std::size_t local_dst = std::size_t(local[dst]);
      intra[std::size_t(src) * g + local_dst] += bytes;
      any_intra = true;
      if (const double latency = latency_of[local_src * g + local_dst]; latency > longest_intra)
        s.intra_pair = int(local_src * g + local_dst), longest_intra = latency;
    } else {
      int from = pxn ? cluster.pxn_proxy(src, dst) : src;  // the GPU whose NIC sends it
      if (from != src && !in_step[from]) from = src;
      const std::size_t local_from = std::size_t(local[from]);
      double hop = 0;  // the latency of its NVLink hop there
      if (const double moved = sent * scale * one; from != src && moved > 0) {
        intra[std::size_t(src) * g + local_from] += moved;
        any_intra = true;
        hop = latency_of[local_src * g + local_from];
        if (hop > longest_intra) s.intra_pair = int(local_src * g + local_from), longest_intra = hop;
      }
      const double bytes = (sent + overhead[local_from] * messages) * scale * one;
      crosses |= one > 0;
      nic_latency = std::max(nic_latency, (hop + to_nic[local_from]) * one);
      out[from] += bytes;
      in[dst] += bytes;
      double& pair = pairs[std::size_t(a) * N + std::size_t(b)];
      first_touch[touches] = std::uint32_t(std::size_t(a) * N + std::size_t(b));  // kept if it is the first
      touches += pair == 0 && bytes > 0;
      pair += bytes;
      any_inter |= bytes > 0;
      if (hops < 4 && bytes > 0) hops = std::max(hops, fabric_hops(a, b));
    }
  };
  // An all-to-all's matrix without PXN, row by row as stored: a row's entries share their source (or,
  // transposed, their destination), and node by node their node pair, so that their sums stay in
  // registers while the row adds to them (added in memory, each entry waited for the last one's
  // store; the same additions, in the same order). Entries inside a node go through add().
  auto add_rows = [&](const int* group, std::size_t n, const auto& row_of, const auto& value, auto transposed) {
    // Everything the loop reads or adds to in locals of its own: measure()'s, reached through
    // this lambda's captures, could be written by any store to a double.
    const int *node_of = node, *local_of = local;
    const double *overhead_of = overhead, *nic_of = to_nic;
    double *outs = out, *ins = in, *pair_sums = pairs;
    const double rounds = scale, per_message = messages;
    std::uint32_t* touch = first_touch;
    std::size_t touch_count = touches;
    bool crossed = false, loaded = false;
    double latency = nic_latency;
    int farthest = hops;
    std::size_t cell = SIZE_MAX;  // the node pair whose sum is `pair`
    double pair = 0;
    bool was_empty = false;  // the pair's sum when the cell moved there was 0
    auto leave = [&] {
      pair_sums[cell] = pair;
      if (was_empty && pair > 0) touch[touch_count++] = std::uint32_t(cell);  // made non-zero: touched
      if (farthest < 4 && pair > 0) farthest = std::max(farthest, fabric_hops(int(cell / N), int(cell % N)));
    };
    for (std::size_t p = 0; p < n; ++p) {
      const auto [row, first, count] = row_of(p);
      const int fixed = group[p];
      double fixed_sum = transposed ? ins[fixed] : outs[fixed];
      const int* others = group + first;
      for (std::size_t k = 0; k < count; ++k) {
        const int src = transposed ? others[k] : fixed, dst = transposed ? fixed : others[k];
        const double sent = value(row[k]), one = sent > 0;  // an empty entry is no message
        const int a = node_of[src], b = node_of[dst];
        if (a == b) [[unlikely]] {
          add(src, dst, sent, one);
          continue;
        }
        const std::size_t local_src = std::size_t(local_of[src]);
        const double bytes = (sent + overhead_of[local_src] * per_message) * rounds * one;
        crossed |= one > 0;
        latency = std::max(latency, nic_of[local_src] * one);
        fixed_sum += bytes;
        (transposed ? outs[src] : ins[dst]) += bytes;
        if (const std::size_t at = std::size_t(a) * N + std::size_t(b); at != cell) {
          if (cell != SIZE_MAX) leave();
          cell = at, pair = pair_sums[at], was_empty = pair == 0;
        }
        pair += bytes;
        loaded |= bytes > 0;
      }
      (transposed ? ins[fixed] : outs[fixed]) = fixed_sum;
    }
    if (cell != SIZE_MAX) leave();
    touches = touch_count, crosses |= crossed, any_inter |= loaded, nic_latency = latency, hops = farthest;
  };
  if (const Collective* c = step.all_pairs; c && !pxn) {
    const int* group = c->group.data();
    c->bytes.with_stored_rows(c->group.size(), [&](const auto& row_of, const auto& value) {
      if (c->bytes.is_transposed())
        add_rows(group, c->group.size(), row_of, value, std::true_type{});
      else
        add_rows(group, c->group.size(), row_of, value, std::false_type{});
    });
  } else if (const Collective* c = step.all_pairs) {  // the matrix read once, in its storage order
    const int* group = c->group.data();
    c->bytes.for_each(c->group.size(), [&](std::size_t i, std::size_t j, double b) __attribute__((always_inline)) {
      add(group[i], group[j], b, b > 0);  // an empty entry is no message
      return true;
    });
  } else {
    for (const auto& t : step.transfers) add(t.src, t.dst, t.bytes, 1);  // each a message, even of 0 bytes
  }
  if (pxn)
    for (int r : s.ranks) rank_seen[std::size_t(r)] = 0;
  s.hops = hops;
  s.any_intra = any_intra, s.any_inter = any_inter, s.crosses = crosses, s.nic_latency = nic_latency;
  // The step's own entries, taken out of the sums (which are zero again after).
  const std::size_t R = s.ranks.size(), M = s.nodes.size();
  s.intra.assign(any_intra ? R * g : 0, 0.0), s.out.assign(R, 0.0), s.in.assign(R, 0.0);
  for (std::size_t i = 0; i < R; ++i) {
    const std::size_t r = std::size_t(s.ranks[i]);
    if (any_intra) std::swap_ranges(intra + r * g, intra + r * g + g, s.intra.begin() + std::ptrdiff_t(i * g));
    std::swap(out[r], s.out[i]), std::swap(in[r], s.in[i]);
  }
  // The loaded node pairs in (a, b) order: the few touched sorted, or, for a step that loads a
  // good part of its M² pairs (an all-to-all's whole matrix), read in order.
  s.pair_at.clear(), s.pair_bytes.clear();
  auto take = [&](std::size_t i, std::size_t k, double& bytes) {
    s.pair_at.push_back(std::uint32_t(i * M + k)), s.pair_bytes.push_back(bytes);
    bytes = 0;
  };
  if (touches * 8 < M * M) {
    for (std::size_t i = 0; i < M; ++i) node_index[std::size_t(s.nodes[i])] = int(i);
    std::sort(first_touch, first_touch + touches);
    for (std::size_t t = 0; t < touches; ++t)
      take(std::size_t(node_index[first_touch[t] / N]), std::size_t(node_index[first_touch[t] % N]), pairs[first_touch[t]]);
  } else {
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t k = 0; k < M; ++k)
        if (double& bytes = pairs[std::size_t(s.nodes[i]) * N + std::size_t(s.nodes[k])]; bytes != 0) take(i, k, bytes);
  }
  return s;
}

const SimBackend::Impl::StepBytes& SimBackend::Impl::measure_once(const Step& step) {
  const Collective* c = step.all_pairs;
  if (!c || c->bytes.is_group_step()) return measure(step);
  const StepView view(step, *c);
  if (const auto it = measured.find(view); it != measured.end()) return it->second;
  return measured.emplace(view, measure(step)).first->second;
}

SimBackend::Impl::TimedStep SimBackend::Impl::timed_step(const Step& step) {
  auto time = [&] {
    const StepBytes& s = measure(step);
    TimedStep t{0, latency_bound(step, s)};
    aggregated_tasks(s, &t.seconds);
    return t;
  };
  const Collective* c = step.all_pairs;
  if (!c) return time();
  const StepView view(step, *c);
  if (const auto it = timed_steps.find(view); it != timed_steps.end()) return it->second;
  return timed_steps.emplace(view, time()).first->second;
}

}  // namespace moesim
