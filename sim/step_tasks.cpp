// SimBackend, step tasks: an op as SimGrid activities. A collective step as a few parallel tasks,
// one per share of about √N nodes' links (aggregate), or one flow per transfer; a transfer as a
// two-host task; a compute as an exec on its GPU; entry and exit markers around them.
#include "sim_impl.hpp"

#include <limits>
#include <xbt/config.hpp>

namespace moesim {

// The transfer whose route the chain of send/recv rounds takes: the step's first between two
// nodes, in rotating_pairs() order; its first transfer if none is.
Transfer SimBackend::Impl::chain_route(const Step& step) const {
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
std::vector<sg4::ExecPtr> SimBackend::Impl::aggregated_tasks(const StepBytes& s, double* alone) {
  const std::size_t g = std::size_t(cluster.gpus_per_node()), N = std::size_t(cluster.nodes()),
                    per_node = std::size_t(groups.per_node());
  auto& load = group_load;  // zero, but for what this step loads (`loaded`, cleared at the end)
  if (load.size() != groups.count()) load.assign(groups.count(), 0.0);
  auto carry = [&](std::size_t q, double bytes) {  // bytes > 0 each time: a load is 0 until first carried
    if (load[q] == 0) loaded.push_back(int(q));
    load[q] += bytes;
  };
  auto add_route = [&](std::size_t rank, const Route& r, bool reverse, double bytes) {
    const std::size_t base = std::size_t(node_of_rank[rank]) * per_node;
    for (const auto& h : r)
      if (const int q = groups.link[std::size_t(h.link)][h.forward != reverse ? 1 : 0]; q >= 0) carry(base + std::size_t(q), bytes);
  };
  auto nic_group = [&](std::size_t rank, int up) {
    return std::size_t(node_of_rank[rank]) * per_node +
           std::size_t(groups.nic[std::size_t(cluster.nic_of(local_of_rank[rank]))][std::size_t(up)]);
  };
  // In the order of the ranks and nodes (ascending), as SimGrid summed one entry per transfer.
  const std::size_t R = s.ranks.size(), M = s.nodes.size();
  if (s.any_inter) {
    for (std::size_t p = 0; p < s.pair_at.size(); ++p)  // port -> port
      if (const double bytes = s.pair_bytes[p]; bytes > 0) {
        const std::size_t a = std::size_t(s.nodes[s.pair_at[p] / M]), b = std::size_t(s.nodes[s.pair_at[p] % M]);
        carry(std::size_t(groups.up[a]), bytes);
        for (int q : groups.between[a / std::size_t(groups.nodes_per_leaf) * N + b])
          if (q >= 0) carry(std::size_t(q), bytes);
        carry(std::size_t(groups.down[b]), bytes);
      }
    for (std::size_t i = 0; i < R; ++i)  // port -> GPU
      if (const double bytes = s.in[i]; bytes > 0) {
        const std::size_t r = std::size_t(s.ranks[i]);
        carry(nic_group(r, 0), bytes);
        add_route(r, cluster.nic_route(local_of_rank[r]), true, bytes);
      }
  }
  for (std::size_t i = 0; i < R; ++i) {
    const std::size_t r = std::size_t(s.ranks[i]);
    if (s.any_inter && s.out[i] > 0) {  // GPU -> port
      add_route(r, cluster.nic_route(local_of_rank[r]), false, s.out[i]);
      carry(nic_group(r, 1), s.out[i]);
    }
    if (s.any_intra)  // GPU -> GPU
      for (std::size_t j = 0; j < g; ++j)
        if (const double bytes = s.intra[i * g + j]; bytes > 0) add_route(r, cluster.intra_route(local_of_rank[r], int(j)), false, bytes);
  }
  int latency = -1;  // the class of the longest route's latency
  auto longer = [&](int c) {
    if (latency < 0 || groups.latencies[std::size_t(c)] > groups.latencies[std::size_t(latency)]) latency = c;
  };
  if (s.any_inter) longer(groups.inter_class[std::size_t(s.hops)]);
  if (s.any_intra) longer(groups.intra_class[std::size_t(s.intra_pair)]);
  if (alone) {  // each share as ptask_L07 would run it alone (timed_steps.cpp), in any order
    static const double gamma = simgrid::config::get_value<double>("network/TCP-gamma");
    if (group_bandwidth.empty())
      for (int q = 0; q < int(groups.count()); ++q)
        group_bandwidth.push_back(group_link(q)->get_bandwidth()), group_latency.push_back(group_link(q)->get_latency());
    const std::size_t shares = share_groups.size();
    share_rate.assign(shares, std::numeric_limits<double>::infinity());
    share_latency.assign(shares, groups.latencies[std::size_t(latency)]);
    share_window.assign(shares, 0.0);
    for (int q : loaded) {
      const std::size_t sh = std::size_t(groups.share[std::size_t(q)]), k = std::size_t(q);
      share_latency[sh] = std::max(share_latency[sh], group_latency[k]);
      share_rate[sh] = std::min(share_rate[sh], group_bandwidth[k] / load[k]);
      share_window[sh] = std::max(share_window[sh], group_latency[k] * load[k]);
      load[k] = 0;
    }
    loaded.clear();
    *alone = 0;
    for (std::size_t sh = 0; sh < shares; ++sh)
      if (share_rate[sh] < std::numeric_limits<double>::infinity()) {
        const double rate = share_window[sh] > 0 ? std::min(share_rate[sh], gamma / (2 * share_window[sh])) : share_rate[sh];
        *alone = std::max(*alone, share_latency[sh] + 1 / rate);
      }
    return {};
  }
  for (auto& members : share_groups) members.clear();
  std::sort(loaded.begin(), loaded.end());
  for (int q : loaded) share_groups[std::size_t(groups.share[std::size_t(q)])].push_back(q);
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
  for (int q : loaded) load[std::size_t(q)] = 0;
  loaded.clear();
  return tasks;
}

// A transfer (× scale) as a two-host parallel task, with its NIC's per-message overhead for each
// of its `messages` unless it is a latency `probe`: bytes over the route's narrowest link plus the
// route's latency, alone. A `p2p` one (NCCL send/recv) that PXN sends from another GPU of its node
// (Cluster::pxn_proxy()) is a three-host task: over NVLink to that GPU, and on from there, at one
// rate, as NCCL pipelines its chunks through the proxy.
sg4::ExecPtr SimBackend::Impl::transfer_task(const Transfer& t, double scale, bool probe, int messages, bool p2p) {
  const int proxy = p2p && !probe ? cluster.pxn_proxy(t.src, t.dst) : t.src;
  const double bytes = (t.bytes + (probe ? 0 : messages * cluster.message_overhead_bytes(proxy, t.dst))) * scale;
  auto exec = sg4::Exec::init();
  if (proxy != t.src) {
    exec->set_hosts({hosts[std::size_t(t.src)], hosts[std::size_t(proxy)], hosts[std::size_t(t.dst)]});
    exec->set_bytes_amounts({0.0, t.bytes * scale, 0.0, 0.0, 0.0, bytes, 0.0, 0.0, 0.0});
  } else if (t.src == t.dst) {
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
bool SimBackend::Impl::latency_bound(const Step& step, const StepBytes& s) const {
  if (cluster.nics().empty() || !s.crosses) return true;
  double busiest = 0;
  for (const auto* side : {&s.out, &s.in})
    for (std::size_t i = 0; i < side->size(); ++i)
      if ((*side)[i] > 0)
        busiest = std::max(busiest, (*side)[i] / nic_bandwidth_of_local[std::size_t(local_of_rank[std::size_t(s.ranks[i])])]);
  return step.serial_rounds * 2 * s.nic_latency > busiest;
}

sg4::ExecPtr SimBackend::Impl::marker(int rank) {
  auto exec = sg4::Exec::init();
  exec->set_flops_amount(0)->set_host(hosts[rank]);
  return exec;
}

// A collective whose kernels hold a share of each member GPU's SMs for as long as it runs
// (DeepEP's normal kernels: 20 of an H800's 132): the GPU runs at the speed of the SMs left (its
// host's pstate k, k SMs held), so compute overlapping the collective there slows; op_done() gives
// them back (hold_sms()).
void SimBackend::Impl::reserve_sms(OpId id, const Collective& coll) {
  const int sms = int(cluster.spec().gpu().sms());
  const int k = std::clamp(int(std::lround(coll.sm_share * sms)), 0, sms - 1);
  if (k == 0) return;
  auto& held = run->reserved[id];
  for (const int rank : coll.group) {
    held.emplace_back(rank, k);
    hold_sms(rank, k);
  }
}

// `k` more SMs of `rank` held (k < 0: given back): its host at the pstate of the SMs left. Held SMs
// count as load, so that compute on that GPU runs as execs meanwhile.
void SimBackend::Impl::hold_sms(int rank, int k) {
  auto& total = sms_held[std::size_t(rank)];
  total += k;
  hosts[std::size_t(rank)]->set_pstate(std::min(total, int(cluster.spec().gpu().sms()) - 1));
  loading[std::size_t(rank)] += k > 0 ? 1 : -1;
  if (k > 0) share_gpu(rank);
}

// Issues an op: creates its activities (the op's own sub-graph: a collective's lanes and steps)
// and starts them; the entry activity starts now, the others when their dependencies inside
// the op are done. Returns the activity whose end is the op's end; `all` keeps every one alive
// until then (probe pitfall P2).
sg4::ExecPtr SimBackend::Impl::issue(const Op& op, std::vector<sg4::ActivityPtr>& all) {
  sg4::ExecPtr entry;
  std::vector<sg4::ExecPtr> created;
  auto keep = [&](const sg4::ExecPtr& a) {
    created.push_back(a);
    return a;
  };
  sg4::ExecPtr exit;
  if (const auto* c = std::get_if<Compute>(&op.body)) {
    entry = exit = keep(compute_exec(op.rank, c->seconds(gpu)));
  } else if (const auto* t = std::get_if<Transfer>(&op.body)) {
    entry = exit = keep(t->src == t->dst || t->bytes <= 0 ? marker(op.rank) : transfer_task(*t, 1.0, false, 1, true));
  } else {
    // A collective: its lanes run side by side from a start marker (to a finish marker when
    // there are several); in a lane each step waits for the previous one. A step's copies are
    // memory-bound execs on their GPUs; its transfers one parallel task (aggregate) or one
    // each. Markers only where several activities join: every extra activity is an event,
    // and each event re-solves the sharing of the big parallel tasks then running.
    const auto& coll = std::get<Collective>(op.body);
    auto start = entry = keep(marker(op.rank));
    const Lowering lowering = options.aggregate ? lower_unlisted(coll, cluster) : lower(coll, cluster);
    // Nothing else on the network meanwhile, not even another lane of its own.
    const bool timed = options.aggregate && overlaps.alone(op.id) && lowering.size() <= 1;
    // NCCL's per-call latency: the lanes start that long after the call (a timer, as the floors).
    if (!lowering.empty() && cluster.nccl_call_latency() > 0) {
      auto gate = marker(op.rank);
      all.push_back(gate);  // started by its timer
      floors[start.get()].push_back({gate, cluster.nccl_call_latency()});
      start = gate;
    }
    sg4::ExecPtr finish = lowering.size() == 1 ? nullptr : keep(marker(op.rank));
    if (finish) exit = finish;
    if (lowering.empty()) start->add_successor(finish);
    for (const auto& lane : lowering) {
      sg4::ExecPtr last = start;
      for (const auto& step : lane) {
        const StepBytes* measured = nullptr;  // measure(step), once (a timed step: timed_step())
        auto bytes = [&]() -> const StepBytes& { return measured ? *measured : *(measured = &measure_once(step)); };
        const std::optional<TimedStep> alone = timed && step.sends() ? std::optional(timed_step(step)) : std::nullopt;
        std::vector<sg4::ExecPtr> ends;  // the activities the step is done with
        // The step's copies start with it (start_copies()) and end at a gate.
        Run::Copies copies{op.id, {}, 0, nullptr};
        for (const auto& copy : step.copies)
          if (copy.bytes > 0) copies.copies.emplace_back(copy.rank, gpu.memory_time(2 * copy.bytes));
        if (!copies.copies.empty()) {
          copies.left = copies.copies.size();
          copies.gate = marker(op.rank);
          all.push_back(copies.gate);  // started by the last copy's end
          ends.push_back(copies.gate);
          run->copies_at[last.get()].push_back(run->copies.size());
          run->copies.push_back(std::move(copies));
        }
        // The channel's chain of send/recv rounds: serial_rounds tiny messages one after another
        // on the step's longest route (an inter-node pair if there is one), each paying the
        // route latency; the step ends when both the chain and the bytes are done.
        if (step.serial_rounds > 1 && step.sends() && (alone ? alone->latency_bound : latency_bound(step, bytes()))) {
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
        if (alone) {  // a gate its seconds after the step starts (timed_steps.cpp)
          auto gate = marker(op.rank);
          all.push_back(gate);  // started by its timer
          floors[last.get()].push_back({gate, alone->seconds});
          ends.push_back(gate);
        } else if (options.aggregate && step.sends())
          flows = aggregated_tasks(bytes());
        else
          for (const auto& tr : step.transfers) flows.push_back(transfer_task(tr, step.load_per_byte(), false, step.messages, step.p2p));
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
        } else {
          auto done = keep(marker(op.rank));
          if (ends.empty()) last->add_successor(done);
          for (auto& e : ends) e->add_successor(done);
          last = done;
        }
        // A chain's pipeline fill: the step ends that long after its bytes (a timer, as the floors).
        if (step.fill_seconds > 0 && step.sends()) {
          auto gate = marker(op.rank);
          all.push_back(gate);  // started by its timer
          floors[last.get()].push_back({gate, step.fill_seconds});
          last = gate;
        }
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

}  // namespace moesim
