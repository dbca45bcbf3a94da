#include "simgrid_backend.hpp"

#include <fmt/format.h>
#include <simgrid/s4u.hpp>

#include <map>
#include <unordered_map>
#include <stdexcept>

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
  std::vector<sg4::Host*> ports;  // by node: a host at the node's uplink (aggregation end-point)

  Impl(const Cluster& c, const GpuModel& g, SimOptions o) : cluster(c), gpu(g), options(o) {
    if (g_engine_created) throw std::logic_error("SimBackend: SimGrid allows one engine per process");
    g_engine_created = true;
    int argc = 3;
    const char* argv[] = {"moesim", "--cfg=host/model:ptask_L07", "--log=root.thres:critical", nullptr};
    engine = std::make_unique<sg4::Engine>(&argc, const_cast<char**>(argv));
    hosts.resize(cluster.num_gpus());
    if (cluster.nodes() > 1) ports.resize(cluster.nodes());
    build_platform();
    sg4::Activity::on_completion_cb([this](const sg4::Activity& a) { completed(a); });
  }

  // One node: a Full zone with the GPUs as hosts, the node's links, explicit routes between GPUs
  // and, when there is a fabric, from each GPU through its NIC to the node's gateway.
  std::pair<NetPoint*, NetPoint*> build_node(const sg4::NetZone* parent, int n) {
    const std::string prefix = fmt::format("n{}", n);
    auto* zone = sg4::create_full_zone(prefix);
    if (parent) zone->set_parent(parent);
    const int g = cluster.gpus_per_node();
    for (int i = 0; i < g; ++i)
      hosts[n * g + i] = zone->create_host(fmt::format("{}-gpu{}", prefix, i), gpu.peak_flops())->seal();
    std::vector<sg4::Link*> links;
    for (const auto& l : cluster.node_links())
      links.push_back(zone->create_split_duplex_link(prefix + "-" + l.name, l.bandwidth)->set_latency(l.latency)->seal());
    for (int i = 0; i < g; ++i)
      for (int j = 0; j < g; ++j)
        if (i != j)
          zone->add_route(hosts[n * g + i]->get_netpoint(), hosts[n * g + j]->get_netpoint(), nullptr, nullptr,
                          to_links(cluster.intra_route(i, j), links, false), false);
    NetPoint* gateway = nullptr;
    if (parent) {
      gateway = zone->create_router(prefix + "-gw");
      std::vector<sg4::Link*> nic_links;
      for (const auto& nic : cluster.nics())
        nic_links.push_back(
            zone->create_split_duplex_link(prefix + "-" + nic.name, nic.bandwidth)->set_latency(nic.latency)->seal());
      // The node's port: the end-point aggregated inter-node traffic is routed through (see
      // ptask()). GPU -> port crosses the GPU's NIC route; port -> gateway is a link that never
      // binds, whose latency is that of the longest GPU -> NIC route, so that port -> port costs
      // the latency of a full GPU -> GPU route.
      ports[n] = zone->create_host(prefix + "-port", 1.0)->seal();
      double nic_latency = 0;
      for (int i = 0; i < g; ++i)
        nic_latency = std::max(nic_latency, cluster.route_latency(cluster.nic_route(i)) + cluster.nics()[cluster.nic_of(i)].latency);
      auto* port_link = zone->create_split_duplex_link(prefix + "-port", 1e18)->set_latency(nic_latency)->seal();
      zone->add_route(ports[n]->get_netpoint(), gateway, nullptr, nullptr, {{port_link, Dir::UP}}, false);
      zone->add_route(gateway, ports[n]->get_netpoint(), nullptr, nullptr, {{port_link, Dir::DOWN}}, false);
      // Each GPU reaches the gateway (per-flow traffic) and the port (aggregated traffic) the same
      // way: its route to its NIC, then the NIC.
      for (int i = 0; i < g; ++i) {
        auto up = to_links(cluster.nic_route(i), links, false);
        up.emplace_back(nic_links[cluster.nic_of(i)], Dir::UP);
        auto down = to_links(cluster.nic_route(i), links, true);
        down.insert(down.begin(), sg4::LinkInRoute(nic_links[cluster.nic_of(i)], Dir::DOWN));
        for (NetPoint* end : {gateway, ports[n]->get_netpoint()}) {
          zone->add_route(hosts[n * g + i]->get_netpoint(), end, nullptr, nullptr, up, false);
          zone->add_route(end, hosts[n * g + i]->get_netpoint(), nullptr, nullptr, down, false);
        }
      }
    }
    zone->seal();
    return {zone->get_netpoint(), gateway};
  }

  void build_platform() {
    if (cluster.nodes() == 1) {
      build_node(nullptr, 0);
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
      return build_node(parent, int(id));
    };
    sg4::create_fatTree_zone("fabric", nullptr, params, sg4::ClusterCallbacks(node_cb),
                             cluster.node_uplink_bandwidth(), f.latency_us() * 1e-6,
                             sg4::Link::SharingPolicy::SPLITDUPLEX)
        ->seal();
  }

  // A parallel task moving the transfers' bytes (× scale), each with its NIC's per-message overhead
  // unless it is a latency `probe`. All its entries progress at one rate, so
  // it ends when its most loaded link has carried its load: the time is max over links of
  // load/bandwidth plus the largest route latency. With `via_ports`, a transfer between nodes is
  // entered as three segments, GPU -> its node's port -> the other node's port -> GPU: they cross
  // exactly the links of the direct route, so every link's load (and so the time) is unchanged,
  // but the entries shrink from one per GPU pair to about one per GPU and per node pair.
  sg4::ExecPtr ptask(const std::vector<Transfer>& transfers, double scale, bool via_ports, bool probe = false) {
    // End-points: GPU r is r, node a's port is G + a. Bytes accumulate in a dense matrix over them
    // (a collective step has up to G² transfers), or in a map for a handful of transfers.
    const int G = cluster.num_gpus(), m = G + (via_ports ? cluster.nodes() : 0);
    const bool dense = transfers.size() > std::size_t(m);
    std::vector<double> matrix(dense ? std::size_t(m) * std::size_t(m) : 0, 0.0);
    std::map<std::pair<int, int>, double> sparse;
    auto add = [&](int i, int j, double b) {
      if (dense) matrix[std::size_t(i) * std::size_t(m) + std::size_t(j)] += b;
      else sparse[{i, j}] += b;
    };
    for (const auto& t : transfers) {
      const int a = cluster.node_of(t.src), b = cluster.node_of(t.dst);
      const double bytes = (t.bytes + (probe ? 0 : cluster.message_overhead_bytes(t.src, t.dst))) * scale;
      if (!via_ports || a == b) {
        add(t.src, t.dst, bytes);
      } else {
        add(t.src, G + a, bytes);
        add(G + a, G + b, bytes);
        add(G + b, t.dst, bytes);
      }
    }
    struct Entry {
      int from, to;
      double bytes;
    };
    std::vector<Entry> entries;  // the non-zero ones
    if (dense) {
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < m; ++j)
          if (const double b = matrix[std::size_t(i) * std::size_t(m) + std::size_t(j)]; b > 0) entries.push_back({i, j, b});
    } else {
      for (const auto& [key, b] : sparse) entries.push_back({key.first, key.second, b});
    }
    // The task's hosts: the end-points that send or receive, the ports first. SimGrid enters the
    // task's entries row by row, and each link it meets is looked up among the links already met
    // (a linear search): the port-to-port rows, which cross the few shared fabric links, go first,
    // so those lookups stay short; each GPU's own links are met once, at the end.
    std::vector<int> local(std::size_t(m), -1);
    for (const auto& e : entries) local[std::size_t(e.from)] = local[std::size_t(e.to)] = 0;
    std::vector<sg4::Host*> hs;
    for (int k = 0; k < m; ++k)
      if (const int id = (k + G) % m; local[std::size_t(id)] >= 0) {  // ports (G..m-1), then GPUs
        local[std::size_t(id)] = int(hs.size());
        hs.push_back(id < G ? hosts[std::size_t(id)] : ports[std::size_t(id - G)]);
      }
    const std::size_t n = hs.size();
    std::vector<double> bytes(n * n, 0.0);
    for (const auto& e : entries) bytes[std::size_t(local[std::size_t(e.from)]) * n + std::size_t(local[std::size_t(e.to)])] = e.bytes;
    auto exec = sg4::Exec::init();
    exec->set_hosts(hs);
    // No flops amounts at all (not zeros): the task computes nothing, and with zeros L07 would enter
    // every host's CPU into it (measured: no difference in time at 256 GPUs).
    exec->set_bytes_amounts(bytes);
    return exec;
  }

  // Whether a step's chain of send/recv rounds can outlast its bytes: serial_rounds route latencies
  // against a lower bound of the bandwidth term (the busiest GPU's inter-node bytes, message
  // overheads included, over its NIC). The chain is simulated only then: a bandwidth-bound step
  // would pay for every round's event with a re-solve of the big parallel task for nothing.
  bool latency_bound(const Step& step) const {
    if (cluster.nics().empty()) return true;
    std::vector<double> out(std::size_t(cluster.num_gpus()), 0.0), in(out.size(), 0.0);
    std::vector<char> seen(std::size_t(cluster.gpus_per_node()), 0);  // local GPUs whose NIC latency is counted
    double latency = 0;
    bool any = false;
    for (const auto& t : step.transfers) {
      if (cluster.node_of(t.src) == cluster.node_of(t.dst)) continue;
      const double b = (t.bytes + cluster.message_overhead_bytes(t.src, t.dst)) * step.rounds;
      out[std::size_t(t.src)] += b;
      in[std::size_t(t.dst)] += b;
      any = true;
      if (const int local = cluster.local_of(t.src); !seen[std::size_t(local)]) {
        seen[std::size_t(local)] = 1;
        latency = std::max(latency, cluster.route_latency(cluster.nic_route(local)) + cluster.rank_nic(t.src).latency);
      }
    }
    if (!any) return true;
    double busiest = 0;
    for (const auto* side : {&out, &in})
      for (std::size_t rank = 0; rank < side->size(); ++rank)
        if ((*side)[rank] > 0) busiest = std::max(busiest, (*side)[rank] / cluster.rank_nic(int(rank)).bandwidth);
    return step.serial_rounds * 2 * latency > busiest;
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
      entry = exit = keep(exec);
    } else if (const auto* t = std::get_if<Transfer>(&op.body)) {
      entry = exit = keep(t->src == t->dst || t->bytes <= 0 ? marker(op.rank) : ptask({*t}, 1.0, false));
    } else {
      // A collective: its lanes run side by side from a start marker (to a finish marker when
      // there are several); in a lane each step waits for the previous one. A step's copies are
      // memory-bound execs on their GPUs; its transfers one parallel task (aggregate) or one
      // each. Markers only where several activities join: every extra activity is an event,
      // and each event re-solves the sharing of the big parallel tasks then running.
      const auto& coll = std::get<Collective>(op.body);
      auto start = entry = keep(marker(op.rank));
      const Lowering lowering = lower(coll, cluster);
      sg4::ExecPtr finish = lowering.size() == 1 ? nullptr : keep(marker(op.rank));
      if (finish) exit = finish;
      if (lowering.empty()) start->add_successor(finish);
      for (const auto& lane : lowering) {
        sg4::ExecPtr last = start;
        for (const auto& step : lane) {
          std::vector<sg4::ExecPtr> ends;  // the activities the step is done with
          for (const auto& copy : step.copies)
            if (copy.bytes > 0) {
              auto exec = sg4::Exec::init();
              exec->set_flops_amount(gpu.memory_time(2 * copy.bytes) * gpu.peak_flops())->set_host(hosts[copy.rank]);
              last->add_successor(exec);
              ends.push_back(keep(exec));
            }
          // The channel's chain of send/recv rounds: serial_rounds tiny messages one after another
          // on the step's longest route (an inter-node pair if there is one), each paying the
          // route latency; the step ends when both the chain and the bytes are done.
          if (step.serial_rounds > 1 && !step.transfers.empty() && latency_bound(step)) {
            Transfer probe = step.transfers.front();
            for (const auto& tr : step.transfers)
              if (cluster.node_of(tr.src) != cluster.node_of(tr.dst)) {
                probe = tr;
                break;
              }
            probe.bytes = 1;
            sg4::ExecPtr prev = last;
            for (int k = 0; k < step.serial_rounds; ++k) {
              auto round = keep(ptask({probe}, 1.0, false, true));
              prev->add_successor(round);
              prev = round;
            }
            ends.push_back(prev);
          }
          std::vector<sg4::ExecPtr> flows;
          if (options.aggregate && !step.transfers.empty())
            flows.push_back(ptask(step.transfers, step.rounds, !ports.empty()));
          else
            for (const auto& tr : step.transfers) flows.push_back(ptask({tr}, step.rounds, false));
          for (auto& f : flows) {
            last->add_successor(f);
            ends.push_back(keep(f));
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

  void issue_op(OpId id) {
    run->timing.start[id] = sg4::Engine::get_clock();  // its entry starts as it is issued
    const sg4::ExecPtr exit = issue(run->graph->op(id), run->activities[id]);
    run->exit_of[exit.get()] = id;
  }

  void completed(const sg4::Activity& a) {
    if (!run) return;
    const auto it = run->exit_of.find(&a);
    if (it == run->exit_of.end()) return;
    const OpId done = it->second;
    run->exit_of.erase(it);
    run->timing.end[done] = sg4::Engine::get_clock();
    run->ended[done] = 1;
    // Release the op's activities, all done; `a` itself only at the next completion, since
    // SimGrid is still inside a->complete() and goes on to release its dependencies.
    run->deferred.clear();
    for (auto& x : run->activities[done])
      if (x.get() == &a) run->deferred.push_back(std::move(x));
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
