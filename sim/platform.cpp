// SimBackend, the platform: the SimGrid engine (one per process) and the cluster built as zones,
// a Full zone per node with the GPUs as hosts and explicit routes, the fabric between the nodes.
#include "sim_impl.hpp"

namespace moesim {

namespace {

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

SimBackend::Impl::Impl(const Cluster& c, const GpuModel& g, SimOptions o) : cluster(c), gpu(g), options(o) {
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
  chain.resize(hosts.size());
  loading.assign(hosts.size(), 0);
  sms_held.assign(hosts.size(), 0);
}

// Every node's links (node_links, nic_links, port_links), in one zone of their own made before the
// nodes' zones, whose routes take them from there (a route may take any zone's links). SimGrid
// 3.32 checks a new link's name against every zone built so far (StandardLinkImpl's constructor
// searches the whole tree): made in each node's zone, a link cost a search of every node before
// it, quadratic in the nodes (a tenth of EP at 4,096 GPUs, 10 s of the platform at 16,384).
void SimBackend::Impl::build_links(sg4::NetZone* world, bool fabric) {
  auto* zone = sg4::create_full_zone("links");
  zone->set_parent(world);
  for (int n = 0; n < cluster.nodes(); ++n) {
    const std::string prefix = fmt::format("n{}", n);
    for (const auto& l : cluster.node_links())
      node_links[std::size_t(n)].push_back(
          zone->create_split_duplex_link(prefix + "-" + l.name, l.bandwidth)->set_latency(l.latency)->seal());
    if (!fabric) continue;
    for (const auto& nic : cluster.nics())
      nic_links[std::size_t(n)].push_back(
          zone->create_split_duplex_link(prefix + "-" + nic.name, nic.bandwidth)->set_latency(nic.latency)->seal());
    // The node's port: port -> gateway is a link that never binds, whose latency is that of the
    // longest GPU -> NIC route, so that port -> port costs the latency of a full GPU -> GPU route
    // (an aggregated task's latency, aggregated_task()); it also gives the fabric's routes.
    double nic_latency = 0;
    for (int i = 0; i < cluster.gpus_per_node(); ++i)
      nic_latency = std::max(nic_latency, cluster.route_latency(cluster.nic_route(i)) + cluster.nics()[cluster.nic_of(i)].latency);
    port_links.push_back(zone->create_split_duplex_link(prefix + "-port", 1e18)->set_latency(nic_latency)->seal());
  }
  zone->seal();
}

// One node: a Full zone with the GPUs as hosts, explicit routes between GPUs over the node's links
// (build_links()) and, when there is a fabric, from each GPU through its NIC to the node's gateway.
std::pair<NetPoint*, NetPoint*> SimBackend::Impl::build_node(const sg4::NetZone* parent, bool fabric, int n) {
  const std::string prefix = fmt::format("n{}", n);
  auto* zone = sg4::create_full_zone(prefix);
  zone->set_parent(parent);
  const int g = cluster.gpus_per_node();
  // A GPU's speed with k of its SMs held by a communication kernel (reserve_sms()): pstate k.
  const int sms = int(cluster.spec().gpu().sms());
  std::vector<double> speeds{gpu.peak_flops()};
  for (int k = 1; k < sms; ++k) speeds.push_back(gpu.peak_flops() * double(sms - k) / sms);
  for (int i = 0; i < g; ++i)
    hosts[n * g + i] = zone->create_host(fmt::format("{}-gpu{}", prefix, i), speeds)->seal();
  const auto& links = node_links[std::size_t(n)];
  for (int i = 0; i < g; ++i)
    for (int j = 0; j < g; ++j)
      if (i != j)
        zone->add_route(hosts[n * g + i]->get_netpoint(), hosts[n * g + j]->get_netpoint(), nullptr, nullptr,
                        to_links(cluster.intra_route(i, j), links, false), false);
  NetPoint* gateway = nullptr;
  if (fabric) {
    gateway = zone->create_router(prefix + "-gw");
    const auto& nics = nic_links[std::size_t(n)];
    ports[n] = zone->create_host(prefix + "-port", 1.0)->seal();
    sg4::Link* const port_link = port_links[std::size_t(n)];
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

void SimBackend::Impl::build_platform(sg4::NetZone* world) {
  build_links(world, cluster.nodes() > 1);
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

}  // namespace moesim
