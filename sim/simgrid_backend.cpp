#include "simgrid_backend.hpp"

#include <fmt/format.h>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "collectives/collectives.hpp"

namespace sg4 = simgrid::s4u;

namespace moesim {
namespace {

using NetPoint = simgrid::kernel::routing::NetPoint;
using Dir = sg4::LinkInRoute::Direction;

bool g_engine_created = false;

std::vector<sg4::LinkInRoute> to_links(const Route& route, const std::vector<sg4::Link*>& links, bool reverse) {
  std::vector<sg4::LinkInRoute> out;
  for (const auto& hop : route) {
    const bool up = hop.forward != reverse;
    out.emplace_back(links[hop.link], up ? Dir::UP : Dir::DOWN);
  }
  if (reverse) std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

struct SimBackend::Impl {
  const Cluster& cluster;
  const GpuModel& gpu;
  SimOptions options;
  std::unique_ptr<sg4::Engine> engine;
  std::vector<sg4::Host*> hosts;  // by rank
  std::vector<sg4::Host*> ports;  // by node: a host at the node's uplink (see build_node)
  std::vector<std::vector<sg4::Link*>> node_links, nic_links;  // by node, then cluster link / NIC index

  // Aggregated collective steps (aggregated_tasks()): each (link, direction) an aggregated task may
  // load is a group, the route between a pair of hosts of its share's own zone ("agg<share>") that
  // crosses that one link. Node groups are numbered node by node, the fabric's after them.
  struct Groups {
    std::vector<std::array<int, 2>> link;  // by node link: the node's group per direction (backward,
                                           // forward), -1 when left out (link_needed())
    std::vector<std::array<int, 2>> nic;   // by NIC: (down, up)
    std::vector<std::pair<int, int>> of_node;  // a node's groups: (link index, or links + NIC index; direction)
    int fabric = 0;                            // the first fabric group
    std::vector<sg4::Link*> fabric_links;      // by fabric group
    int nodes_per_leaf = 1;
    std::vector<int> up, down;                 // by node: its fabric uplink's group, each way
    std::vector<std::array<int, 2>> between;   // by (source leaf, destination node): the groups between the
                                               // leaves' switches (-1: none)
    std::vector<int> share;                    // by group: the step's share it belongs to (aggregated_tasks())
    std::vector<sg4::Host*> hosts;             // the agg zones' hosts, share after share
    std::vector<std::array<std::size_t, 2>> ends;  // by group: its route's two hosts (indices in `hosts`)
    // The latency a step's tasks pay, that of its longest route, as a class: an index in
    // `latencies`, the distinct route latencies SimGrid gives between two GPUs of a node
    // (intra_class, by local source and destination) or two nodes' ports (inter_class, by fabric
    // hops: 2 or 4). Each share's zone has a route of each class, over a link of its own.
    std::vector<double> latencies;
    std::vector<int> intra_class;
    std::array<int, 5> inter_class{-1, -1, -1, -1, -1};
    std::vector<std::vector<std::array<std::size_t, 2>>> latency_ends;  // by share, by class
    std::size_t count() const { return std::size_t(fabric) + fabric_links.size(); }
    int per_node() const { return int(of_node.size()); }
  } groups;
  std::vector<double> intra_latency;  // by (local source, local destination): the route's latency
  std::vector<double> group_load;     // by group, for aggregated_tasks()
  std::vector<std::vector<int>> share_groups;  // by share: its loaded groups, for aggregated_tasks()
  std::vector<int> agg_index;                  // by agg host: its index in the task being built, or -1

  // Fabric hops between two nodes' switches: 2 under one leaf switch, 4 through a spine.
  int fabric_hops(int a, int b) const {
    return groups.between.empty() ||
                   groups.between[std::size_t(a / groups.nodes_per_leaf) * std::size_t(cluster.nodes()) + std::size_t(b)][0] < 0
               ? 2
               : 4;
  }

  Impl(const Cluster& c, const GpuModel& g, SimOptions o) : cluster(c), gpu(g), options(o) {
    if (g_engine_created) throw std::logic_error("SimBackend: SimGrid allows one engine per process");
    g_engine_created = true;
    int argc = 3;
    const char* argv[] = {"moesim", "--cfg=host/model:ptask_L07", "--log=root.thres:critical", nullptr};
    engine = std::make_unique<sg4::Engine>(&argc, const_cast<char**>(argv));
    hosts.resize(cluster.num_gpus());
    node_links.resize(cluster.nodes());
    nic_links.resize(cluster.nodes());
    if (cluster.nodes() > 1) ports.resize(cluster.nodes());
    tabulate();
    auto* world = sg4::create_full_zone("world");
    build_platform(world);
    if (options.aggregate) build_groups(world);
    world->seal();
    sg4::Activity::on_completion_cb([this](const sg4::Activity& a) { completed(a); });
    sg4::Exec::on_start_cb([this](const sg4::Exec& e) { started(e); });
    alone.resize(hosts.size());
    loading.assign(hosts.size(), 0);
  }

  // One node: a Full zone with the GPUs as hosts, the node's links, explicit routes between GPUs
  // and, when there is a fabric, from each GPU through its NIC to the node's gateway.
  std::pair<NetPoint*, NetPoint*> build_node(const sg4::NetZone* parent, bool fabric, int n) {
    const std::string prefix = fmt::format("n{}", n);
    auto* zone = sg4::create_full_zone(prefix);
    zone->set_parent(parent);
    const int g = cluster.gpus_per_node();
    for (int i = 0; i < g; ++i)
      hosts[n * g + i] = zone->create_host(fmt::format("{}-gpu{}", prefix, i), gpu.peak_flops())->seal();
    auto& links = node_links[std::size_t(n)];
    for (const auto& l : cluster.node_links())
      links.push_back(zone->create_split_duplex_link(prefix + "-" + l.name, l.bandwidth)->set_latency(l.latency)->seal());
    for (int i = 0; i < g; ++i)
      for (int j = 0; j < g; ++j)
        if (i != j)
          zone->add_route(hosts[n * g + i]->get_netpoint(), hosts[n * g + j]->get_netpoint(), nullptr, nullptr,
                          to_links(cluster.intra_route(i, j), links, false), false);
    NetPoint* gateway = nullptr;
    if (fabric) {
      gateway = zone->create_router(prefix + "-gw");
      auto& nics = nic_links[std::size_t(n)];
      for (const auto& nic : cluster.nics())
        nics.push_back(
            zone->create_split_duplex_link(prefix + "-" + nic.name, nic.bandwidth)->set_latency(nic.latency)->seal());
      // The node's port: port -> gateway is a link that never binds, whose latency is that of the
      // longest GPU -> NIC route, so that port -> port costs the latency of a full GPU -> GPU route
      // (an aggregated task's latency, aggregated_task()); it also gives the fabric's routes.
      ports[n] = zone->create_host(prefix + "-port", 1.0)->seal();
      double nic_latency = 0;
      for (int i = 0; i < g; ++i)
        nic_latency = std::max(nic_latency, cluster.route_latency(cluster.nic_route(i)) + cluster.nics()[cluster.nic_of(i)].latency);
      auto* port_link = zone->create_split_duplex_link(prefix + "-port", 1e18)->set_latency(nic_latency)->seal();
      zone->add_route(ports[n]->get_netpoint(), gateway, nullptr, nullptr, {{port_link, Dir::UP}}, false);
      zone->add_route(gateway, ports[n]->get_netpoint(), nullptr, nullptr, {{port_link, Dir::DOWN}}, false);
      // Each GPU reaches the gateway through its route to its NIC, then the NIC.
      for (int i = 0; i < g; ++i) {
        auto up = to_links(cluster.nic_route(i), links, false);
        up.emplace_back(nics[cluster.nic_of(i)], Dir::UP);
        auto down = to_links(cluster.nic_route(i), links, true);
        down.insert(down.begin(), sg4::LinkInRoute(nics[cluster.nic_of(i)], Dir::DOWN));
        zone->add_route(hosts[n * g + i]->get_netpoint(), gateway, nullptr, nullptr, up, false);
        zone->add_route(gateway, hosts[n * g + i]->get_netpoint(), nullptr, nullptr, down, false);
      }
    }
    zone->seal();
    return {zone->get_netpoint(), gateway};
  }

  void build_platform(sg4::NetZone* world) {
    if (cluster.nodes() == 1) {
      build_node(world, false, 0);
      return;
    }
    // Fat-tree of nodes; each node's uplink carries its aggregate NIC bandwidth (probe pitfall P3).
    const auto& f = cluster.spec().fabric();
    const unsigned nodes = unsigned(cluster.nodes());
    const sg4::FatTreeParams params =
        nodes <= f.nodes_per_leaf()
            ? sg4::FatTreeParams(1, {nodes}, {1}, {1})
            : sg4::FatTreeParams(2, {f.nodes_per_leaf(), nodes / f.nodes_per_leaf()}, {1, f.spines()}, {1, 1});
    auto node_cb = [this](sg4::NetZone* parent, const std::vector<unsigned long>&, unsigned long id) {
      return build_node(parent, true, int(id));
    };
    sg4::create_fatTree_zone("fabric", world, params, sg4::ClusterCallbacks(node_cb),
                             cluster.node_uplink_bandwidth(), f.latency_us() * 1e-6,
                             sg4::Link::SharingPolicy::SPLITDUPLEX)
        ->seal();
  }

  // Which (node link, direction) an aggregated task must enter, by link: (backward, forward).
  // Every route inside a node is known (GPU to GPU, GPU to its NIC and back). A link whose every
  // route also crosses another link or NIC that is no faster, in its direction, never limits what
  // crosses it: under ptask_L07's fair-bottleneck sharing that other link always has as few
  // bytes/s left per activity, or fewer (each activity loads both with the same bytes, and it
  // carries all the first one's activities). Such a link (DGX-A100's PCIe hop from a GPU to its
  // NIC) is left out of aggregated tasks, which then meet fewer links, and nothing changes. Other
  // activities (transfers, per-flow collectives) still cross it. A link no route crosses is out too.
  std::vector<std::array<bool, 2>> links_needed() const {
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
  void build_groups(const sg4::NetZone* world) {
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

  // A step's bytes, gathered in one pass over its transfers (a step of an all-to-all has G² of
  // them) for aggregated_task() and latency_bound(), in buffers kept from step to step.
  struct StepBytes {
    std::vector<double> intra;            // inside a node, by (source rank, local destination)
    std::vector<double> out, in;          // between nodes, by source rank and by destination rank
    std::vector<double> pairs;            // between nodes, by node pair
    bool any_intra = false, any_inter = false;  // with bytes
    bool crosses = false;                 // a transfer between nodes, even of no bytes
    double nic_latency = 0;               // the longest route to its NIC (and the NIC) of a GPU that sends out
    int intra_pair = -1;                  // the longest route inside a node: local source · g + local destination
    int hops = 0;                         // the longest between nodes: fabric hops (2 or 4)
  } step_bytes;
  // By rank: node and local index; by local GPU: its NIC's per-message overhead in bytes, the
  // latency of its route to the NIC and of the NIC, the NIC's bandwidth (the divisions and lookups
  // of Cluster's accessors, done once: they were a fifth of a large step's cost).
  std::vector<int> node_of_rank, local_of_rank;
  std::vector<double> overhead_of_local, nic_latency_of_local, nic_bandwidth_of_local;

  void tabulate() {
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

  const StepBytes& measure(const Step& step) {
    auto& s = step_bytes;
    const std::size_t G = std::size_t(cluster.num_gpus()), g = std::size_t(cluster.gpus_per_node()),
                      N = std::size_t(cluster.nodes());
    if (s.any_intra) std::fill(s.intra.begin(), s.intra.end(), 0.0);
    if (s.any_inter || s.crosses) {
      std::fill(s.out.begin(), s.out.end(), 0.0);
      std::fill(s.in.begin(), s.in.end(), 0.0);
      std::fill(s.pairs.begin(), s.pairs.end(), 0.0);
    }
    s.intra.resize(G * g, 0.0);
    s.out.resize(G, 0.0);
    s.in.resize(G, 0.0);
    s.pairs.resize(N > 1 ? N * N : 0, 0.0);
    s.any_intra = s.any_inter = s.crosses = false;
    s.nic_latency = 0;
    s.intra_pair = -1, s.hops = 0;
    const double scale = step.rounds, messages = step.messages;
    double longest_intra = -1;  // the latency of intra_pair
    // Plain pointers and locals: a million calls a step, and through the vectors' members the
    // compiler reloaded every data pointer at each one.
    const int *node = node_of_rank.data(), *local = local_of_rank.data();
    const double *overhead = overhead_of_local.data(), *to_nic = nic_latency_of_local.data(), *latency_of = intra_latency.data();
    double *intra = s.intra.data(), *out = s.out.data(), *in = s.in.data(), *pairs = s.pairs.data();
    bool any_intra = false, any_inter = false, crosses = false;
    double nic_latency = 0;
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
        const double bytes = (sent + overhead[local_src] * messages) * scale * one;
        crosses |= one > 0;
        nic_latency = std::max(nic_latency, to_nic[local_src] * one);
        out[src] += bytes;
        in[dst] += bytes;
        pairs[std::size_t(a) * N + std::size_t(b)] += bytes;
        any_inter |= bytes > 0;
        if (s.hops < 4 && bytes > 0) s.hops = std::max(s.hops, fabric_hops(a, b));
      }
    };
    if (const Collective* c = step.all_pairs) {  // the matrix read once, in its storage order
      const int* group = c->group.data();
      c->bytes.for_each(c->group.size(), [&](std::size_t i, std::size_t j, double b) __attribute__((always_inline)) {
        add(group[i], group[j], b, b > 0);  // an empty entry is no message
        return true;
      });
    } else {
      for (const auto& t : step.transfers) add(t.src, t.dst, t.bytes, 1);  // each a message, even of 0 bytes
    }
    s.any_intra = any_intra, s.any_inter = any_inter, s.crosses = crosses, s.nic_latency = nic_latency;
    return s;
  }

  // measure(), but an unlisted step (an all-to-all's whole matrix) is measured once per execute()
  // for each view of each matrix: a layer's forward and backward all-to-alls send the same bytes.
  struct Measured {
    CollectiveBytes bytes;  // held, so that its values outlive the entry
    std::vector<int> group;
    int rounds = 1, messages = 1;
    StepBytes s;
  };
  std::deque<Measured> measured;  // this execute()'s

  const StepBytes& measure_once(const Step& step) {
    const Collective* c = step.all_pairs;
    if (!c) return measure(step);
    for (const auto& m : measured)
      if (m.bytes.same_view(c->bytes) && m.rounds == step.rounds && m.messages == step.messages && m.group == c->group)
        return m.s;
    measured.push_back({c->bytes, c->group, step.rounds, step.messages, measure(step)});
    return measured.back().s;
  }

  // The transfer whose route the chain of send/recv rounds takes: the step's first between two
  // nodes, in rotating_pairs() order; its first transfer if none is.
  Transfer chain_route(const Step& step) const {
    auto between_nodes = [&](const Transfer& t) { return node_of_rank[std::size_t(t.src)] != node_of_rank[std::size_t(t.dst)]; };
    if (const Collective* c = step.all_pairs) {
      const std::size_t n = c->group.size();
      std::optional<Transfer> first;
      for (std::size_t d = 1; d < n; ++d)
        for (std::size_t i = 0, j = d; i < n; ++i, j = j + 1 == n ? 0 : j + 1)
          if (const double b = c->bytes.at(i, j, n); b > 0) {
            const Transfer t{c->group[i], c->group[j], b};
            if (between_nodes(t)) return t;
            if (!first) first = t;
          }
      if (!first) throw std::logic_error("SimBackend: an unlisted step that sends nothing");
      return *first;
    }
    for (const auto& t : step.transfers)
      if (between_nodes(t)) return t;
    return step.transfers.front();
  }

  // A collective step as a few parallel tasks, one per share of its links: a block of about √N
  // nodes' links (NVLink/NVSwitch links, NICs and each node's cable to the fabric, each way) or a
  // block of the fabric's. A task's transfers progress at one rate, so a share ends when its most
  // loaded link has carried its load, and the step when its last share has: max over links of
  // load/bandwidth, plus the largest route latency, exactly what one task for the whole step
  // gives when nothing else loads its links (and what the probe found exact against per-flow
  // max-min). A link another activity slows holds back its own share only, as it would hold back
  // only the messages that cross it. Shares, not one task, because SimGrid 3.32's cost in a task
  // is quadratic in its links: entering each link searches the links already entered, and when
  // the task ends the solver's modified-constraint recursion rescans the task's link list once
  // per link (and would go on into every task that shares a resource with it: hence a zone of
  // hosts per share, and no real route in a task); but each task's end is an event at which the
  // fair-bottleneck solver re-solves every activity: √N blocks of L links cost about
  // L·√N + L²/√N per step where one task cost L².
  // A share has one entry per loaded (link, direction): the bytes every transfer of the step
  // (with its NIC's per-message overhead, × rounds) puts on that link, between the two hosts of
  // the share's zone whose route is that link; the loads are summed in the order SimGrid summed
  // one entry per transfer (GPU -> port -> port -> GPU: ports' rows first, then GPUs' rows, in rank
  // order), to the last bit. Each share's latency, that of the step's longest route (between two
  // ports across the fabric, or two GPUs in a node), comes from one more entry of a negligible
  // 1e-30 bytes over the share's own route of that latency (Groups::latencies).
  std::vector<sg4::ExecPtr> aggregated_tasks(const StepBytes& s) {
    const std::size_t G = std::size_t(cluster.num_gpus()), g = std::size_t(cluster.gpus_per_node()),
                      N = std::size_t(cluster.nodes()), per_node = std::size_t(groups.per_node());
    auto& load = group_load;
    load.assign(groups.count(), 0.0);
    auto add_route = [&](std::size_t rank, const Route& r, bool reverse, double bytes) {
      const std::size_t base = std::size_t(node_of_rank[rank]) * per_node;
      for (const auto& h : r)
        if (const int q = groups.link[std::size_t(h.link)][h.forward != reverse ? 1 : 0]; q >= 0) load[base + std::size_t(q)] += bytes;
    };
    auto nic_group = [&](std::size_t rank, int up) {
      return std::size_t(node_of_rank[rank]) * per_node +
             std::size_t(groups.nic[std::size_t(cluster.nic_of(local_of_rank[rank]))][std::size_t(up)]);
    };
    if (s.any_inter) {
      for (std::size_t a = 0; a < N; ++a)  // port -> port
        for (std::size_t b = 0; b < N; ++b)
          if (const double bytes = s.pairs[a * N + b]; bytes > 0) {
            load[std::size_t(groups.up[a])] += bytes;
            for (int q : groups.between[a / std::size_t(groups.nodes_per_leaf) * N + b])
              if (q >= 0) load[std::size_t(q)] += bytes;
            load[std::size_t(groups.down[b])] += bytes;
          }
      for (std::size_t r = 0; r < G; ++r)  // port -> GPU
        if (const double bytes = s.in[r]; bytes > 0) {
          load[nic_group(r, 0)] += bytes;
          add_route(r, cluster.nic_route(local_of_rank[r]), true, bytes);
        }
    }
    for (std::size_t r = 0; r < G; ++r) {
      if (s.any_inter && s.out[r] > 0) {  // GPU -> port
        add_route(r, cluster.nic_route(local_of_rank[r]), false, s.out[r]);
        load[nic_group(r, 1)] += s.out[r];
      }
      if (s.any_intra)  // GPU -> GPU
        for (std::size_t j = 0; j < g; ++j)
          if (const double bytes = s.intra[r * g + j]; bytes > 0) add_route(r, cluster.intra_route(local_of_rank[r], int(j)), false, bytes);
    }
    int latency = -1;  // the class of the longest route's latency
    auto longer = [&](int c) {
      if (latency < 0 || groups.latencies[std::size_t(c)] > groups.latencies[std::size_t(latency)]) latency = c;
    };
    if (s.any_inter) longer(groups.inter_class[std::size_t(s.hops)]);
    if (s.any_intra) longer(groups.intra_class[std::size_t(s.intra_pair)]);
    for (auto& members : share_groups) members.clear();
    for (std::size_t q = 0; q < load.size(); ++q)
      if (load[q] > 0) share_groups[std::size_t(groups.share[q])].push_back(int(q));
    std::vector<sg4::ExecPtr> tasks;
    for (std::size_t sh = 0; sh < share_groups.size(); ++sh) {
      const auto& members = share_groups[sh];
      if (members.empty()) continue;
      std::vector<sg4::Host*> hs;  // the agg hosts of the share's groups and of its latency route
      std::vector<std::size_t> used;
      auto index = [&](std::size_t agg) {
        if (agg_index[agg] < 0) agg_index[agg] = int(hs.size()), hs.push_back(groups.hosts[agg]), used.push_back(agg);
        return std::size_t(agg_index[agg]);
      };
      std::vector<std::pair<std::size_t, std::size_t>> at;
      for (int q : members) at.emplace_back(index(groups.ends[std::size_t(q)][0]), index(groups.ends[std::size_t(q)][1]));
      const auto& ends = groups.latency_ends[sh][std::size_t(latency)];
      const std::size_t from = index(ends[0]), to = index(ends[1]);
      for (std::size_t agg : used) agg_index[agg] = -1;
      const std::size_t n = hs.size();
      std::vector<double> bytes(n * n, 0.0);
      for (std::size_t k = 0; k < members.size(); ++k) bytes[at[k].first * n + at[k].second] = load[std::size_t(members[k])];
      bytes[from * n + to] = 1e-30;
      auto exec = sg4::Exec::init();
      exec->set_hosts(hs);
      // No flops amounts at all (not zeros): the task computes nothing, and with zeros L07 would
      // enter every host's CPU into it.
      exec->set_bytes_amounts(bytes);
      tasks.push_back(exec);
    }
    return tasks;
  }

  // A transfer (× scale) as a two-host parallel task, with its NIC's per-message overhead for each
  // of its `messages` unless it is a latency `probe`: bytes over the route's narrowest link plus the
  // route's latency, alone.
  sg4::ExecPtr transfer_task(const Transfer& t, double scale, bool probe = false, int messages = 1) {
    const double bytes = (t.bytes + (probe ? 0 : messages * cluster.message_overhead_bytes(t.src, t.dst))) * scale;
    auto exec = sg4::Exec::init();
    if (t.src == t.dst) {
      exec->set_hosts({hosts[std::size_t(t.src)]});
      exec->set_bytes_amounts({bytes});
    } else {
      exec->set_hosts({hosts[std::size_t(t.src)], hosts[std::size_t(t.dst)]});
      exec->set_bytes_amounts({0.0, bytes, 0.0, 0.0});
    }
    return exec;
  }

  // Whether a step's chain of send/recv rounds can outlast its bytes: serial_rounds route latencies
  // against a lower bound of the bandwidth term (the busiest GPU's inter-node bytes, message
  // overheads included, over its NIC). The chain is simulated only then: a bandwidth-bound step
  // would pay for every round's event with a re-solve of the big parallel task for nothing.
  bool latency_bound(const Step& step, const StepBytes& s) const {
    if (cluster.nics().empty() || !s.crosses) return true;
    double busiest = 0;
    for (const auto* side : {&s.out, &s.in})
      for (std::size_t rank = 0; rank < side->size(); ++rank)
        if ((*side)[rank] > 0)
          busiest = std::max(busiest, (*side)[rank] / nic_bandwidth_of_local[std::size_t(local_of_rank[rank])]);
    return step.serial_rounds * 2 * s.nic_latency > busiest;
  }

  sg4::ExecPtr marker(int rank) {
    auto exec = sg4::Exec::init();
    exec->set_flops_amount(0)->set_host(hosts[rank]);
    return exec;
  }

  // Issues an op: creates its activities (the op's own sub-graph: a collective's lanes and steps)
  // and starts them; the entry activity starts now, the others when their dependencies inside
  // the op are done. Returns the activity whose end is the op's end; `all` keeps every one alive
  // until then (probe pitfall P2).
  sg4::ExecPtr issue(const Op& op, std::vector<sg4::ActivityPtr>& all) {
    sg4::ExecPtr entry;
    std::vector<sg4::ExecPtr> created;
    auto keep = [&](const sg4::ExecPtr& a) {
      created.push_back(a);
      return a;
    };
    sg4::ExecPtr exit;
    if (const auto* c = std::get_if<Compute>(&op.body)) {
      const double seconds = c->seconds(gpu);
      auto exec = sg4::Exec::init();
      exec->set_flops_amount(seconds * gpu.peak_flops())->set_host(hosts[op.rank]);
      if (seconds > 0) loads[exec.get()] = op.rank;
      entry = exit = keep(exec);
    } else if (const auto* t = std::get_if<Transfer>(&op.body)) {
      entry = exit = keep(t->src == t->dst || t->bytes <= 0 ? marker(op.rank) : transfer_task(*t, 1.0));
    } else {
      // A collective: its lanes run side by side from a start marker (to a finish marker when
      // there are several); in a lane each step waits for the previous one. A step's copies are
      // memory-bound execs on their GPUs; its transfers one parallel task (aggregate) or one
      // each. Markers only where several activities join: every extra activity is an event,
      // and each event re-solves the sharing of the big parallel tasks then running.
      const auto& coll = std::get<Collective>(op.body);
      auto start = entry = keep(marker(op.rank));
      const Lowering lowering = options.aggregate ? lower_unlisted(coll, cluster) : lower(coll, cluster);
      sg4::ExecPtr finish = lowering.size() == 1 ? nullptr : keep(marker(op.rank));
      if (finish) exit = finish;
      if (lowering.empty()) start->add_successor(finish);
      for (const auto& lane : lowering) {
        sg4::ExecPtr last = start;
        for (const auto& step : lane) {
          const StepBytes* measured = nullptr;  // measure(step), once
          auto bytes = [&]() -> const StepBytes& { return measured ? *measured : *(measured = &measure_once(step)); };
          std::vector<sg4::ExecPtr> ends;  // the activities the step is done with
          for (const auto& copy : step.copies)
            if (copy.bytes > 0) {
              auto exec = sg4::Exec::init();
              exec->set_flops_amount(gpu.memory_time(2 * copy.bytes) * gpu.peak_flops())->set_host(hosts[copy.rank]);
              loads[exec.get()] = copy.rank;
              last->add_successor(exec);
              ends.push_back(keep(exec));
            }
          // The channel's chain of send/recv rounds: serial_rounds tiny messages one after another
          // on the step's longest route (an inter-node pair if there is one), each paying the
          // route latency; the step ends when both the chain and the bytes are done.
          if (step.serial_rounds > 1 && step.sends() && latency_bound(step, bytes())) {
            Transfer probe = chain_route(step);
            probe.bytes = 1;
            sg4::ExecPtr prev = last;
            for (int k = 0; k < step.serial_rounds; ++k) {
              auto round = keep(transfer_task(probe, 1.0, true));
              prev->add_successor(round);
              prev = round;
            }
            ends.push_back(prev);
          }
          std::vector<sg4::ExecPtr> flows;
          if (options.aggregate && step.sends())
            flows = aggregated_tasks(bytes());
          else
            for (const auto& tr : step.transfers) flows.push_back(transfer_task(tr, step.rounds, false, step.messages));
          for (auto& f : flows) {
            last->add_successor(f);
            ends.push_back(keep(f));
          }
          // A kernel's throughput limit: the step also waits for a gate that a timer opens
          // min_seconds after the step starts (floors, completed()); a timer, not an activity,
          // takes nothing from what else runs.
          if (step.min_seconds > 0 && step.sends()) {
            auto gate = marker(op.rank);
            all.push_back(gate);  // started by its timer, not here
            floors[last.get()].push_back({gate, step.min_seconds});
            ends.push_back(gate);
          }
          if (ends.size() == 1) {
            last = ends.front();
            continue;
          }
          auto done = keep(marker(op.rank));
          if (ends.empty()) last->add_successor(done);
          for (auto& e : ends) e->add_successor(done);
          last = done;
        }
        if (finish) last->add_successor(finish);
        else exit = last;
      }
    }
    for (auto& a : created) {
      all.push_back(a);
      a->vetoable_start();
    }
    return exit;
  }

  // Ops are issued when their predecessors have finished, not all at once: SimGrid keeps every
  // started-or-vetoed activity of the maestro in one list that each completion walks
  // (ExecImpl::post), so issuing a whole iteration up front made the run quadratic in its
  // activities. An op's completion (its exit activity's) records its end, releases its
  // activities (a collective step's byte matrix is G² doubles) and counts down its successors.
  struct Run {
    const TaskGraph* graph = nullptr;
    std::vector<std::vector<OpId>> successors;
    std::vector<int> waiting;                                // predecessors not finished, per op
    std::vector<std::vector<sg4::ActivityPtr>> activities;   // per op, until it ends
    std::unordered_map<const sg4::Activity*, OpId> exit_of;  // exit activity -> its op
    Timing timing;                                           // absolute times until the end
    std::vector<char> ended;
    std::vector<sg4::ActivityPtr> deferred;                  // the last exit, released at the next
  };
  Run* run = nullptr;

  // GPU compute that runs alone is not an activity of the solver. A compute op issued on a GPU
  // that runs nothing else (no exec that computes: a compute or a collective's copy) ends
  // `seconds` later whatever the network does, exactly as an exec alone on its host would; it is a
  // SimGrid timer, which costs no variable in the fair-bottleneck system (re-solved whole at every
  // event) and no update at each event. Should an exec start on that GPU while it runs, the op
  // becomes an exec of its remaining flops at that instant (started()), and the two share the GPU
  // as they would have from the start. At 1,024 GPUs an iteration's ~124,000 compute ops made
  // ~1,000 variables live through its ~22,000 events.
  struct Alone {
    simgrid::kernel::timer::Timer* timer = nullptr;  // null: nothing runs alone on this GPU
    OpId op = 0;
    double end = 0;
  };
  std::vector<Alone> alone;                              // by rank
  std::vector<int> loading;                              // by rank: execs that compute, running
  std::unordered_map<const sg4::Activity*, int> loads;   // such an exec -> its rank, until it ends
  // A step's start activity -> the gates of its min_seconds, each with its delay (issue()).
  std::unordered_map<const sg4::Activity*, std::vector<std::pair<sg4::ExecPtr, double>>> floors;

  void issue_op(OpId id) {
    const double now = sg4::Engine::get_clock();
    run->timing.start[id] = now;  // its entry starts as it is issued
    const Op& op = run->graph->op(id);
    if (const auto* c = std::get_if<Compute>(&op.body); c && loading[std::size_t(op.rank)] == 0 && !alone[std::size_t(op.rank)].timer) {
      const double end = now + c->seconds(gpu);
      alone[std::size_t(op.rank)] = {simgrid::kernel::timer::Timer::set(end, [this, rank = op.rank] { alone_done(rank); }), id, end};
      return;
    }
    const sg4::ExecPtr exit = issue(op, run->activities[id]);
    run->exit_of[exit.get()] = id;
  }

  void alone_done(int rank) {
    const OpId id = alone[std::size_t(rank)].op;
    alone[std::size_t(rank)].timer = nullptr;
    op_done(id);
  }

  // An exec that computes starts on a GPU: one running alone there becomes an exec that shares it.
  void started(const sg4::Exec& e) {
    const auto it = loads.find(&e);
    if (it == loads.end()) return;
    const auto rank = std::size_t(it->second);
    ++loading[rank];
    Alone& a = alone[rank];
    if (!a.timer) return;
    a.timer->remove();
    a.timer = nullptr;
    auto exec = sg4::Exec::init();
    exec->set_flops_amount((a.end - sg4::Engine::get_clock()) * gpu.peak_flops())->set_host(hosts[rank]);
    loads[exec.get()] = int(rank);
    run->activities[a.op].push_back(exec);
    run->exit_of[exec.get()] = a.op;
    exec->vetoable_start();
  }

  void completed(const sg4::Activity& a) {
    if (const auto it = floors.find(&a); it != floors.end()) {
      for (auto& [gate, seconds] : it->second)
        simgrid::kernel::timer::Timer::set(sg4::Engine::get_clock() + seconds, [gate = gate] { gate->start(); });
      floors.erase(it);
    }
    if (const auto it = loads.find(&a); it != loads.end()) {
      --loading[std::size_t(it->second)];
      loads.erase(it);
    }
    if (!run) return;
    const auto it = run->exit_of.find(&a);
    if (it == run->exit_of.end()) return;
    const OpId done = it->second;
    run->exit_of.erase(it);
    // Release the op's activities, all done; `a` itself only at the next completion, since
    // SimGrid is still inside a->complete() and goes on to release its dependencies.
    run->deferred.clear();
    for (auto& x : run->activities[done])
      if (x.get() == &a) run->deferred.push_back(std::move(x));
    op_done(done);
  }

  // An op's end: recorded; its activities released; its successors counted down.
  void op_done(OpId done) {
    run->timing.end[done] = sg4::Engine::get_clock();
    run->ended[done] = 1;
    run->activities[done].clear();
    for (OpId s : run->successors[done])
      if (--run->waiting[s] == 0) issue_op(s);
  }

  Timing execute(const TaskGraph& graph) {
    const double t0 = sg4::Engine::get_clock();
    Run r;
    r.graph = &graph;
    r.successors.resize(graph.size());
    r.waiting.assign(graph.size(), 0);
    r.activities.resize(graph.size());
    r.timing.start.assign(graph.size(), 0.0);
    r.timing.end.assign(graph.size(), 0.0);
    r.ended.assign(graph.size(), 0);
    const auto preds = graph.predecessors();
    for (const auto& op : graph.ops()) {
      r.waiting[op.id] = int(preds[op.id].size());
      for (OpId p : preds[op.id]) r.successors[p].push_back(op.id);
    }
    run = &r;
    for (const auto& op : graph.ops())
      if (r.waiting[op.id] == 0) issue_op(op.id);
    engine->run();
    run = nullptr;
    measured.clear();
    for (const auto& op : graph.ops()) {
      if (!r.ended[op.id])
        throw std::logic_error("SimBackend: op '" + op.label + "' never ran (a dependency cycle in the TaskGraph?)");
      r.timing.start[op.id] -= t0;
      r.timing.end[op.id] -= t0;
    }
    return std::move(r.timing);
  }
};

SimBackend::SimBackend(const Cluster& cluster, const GpuModel& gpu, SimOptions options)
    : impl_(std::make_unique<Impl>(cluster, gpu, options)) {}
SimBackend::~SimBackend() = default;
Timing SimBackend::execute(const TaskGraph& graph) { return impl_->execute(graph); }
double SimBackend::now() const { return sg4::Engine::get_clock(); }

}  // namespace moesim
