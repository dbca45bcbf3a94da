// Each GPU's host issuing the kernels of its ops (sim_impl.hpp, Hosts). PyTorch runs the host ahead
// of the GPU: it launches kernel after kernel into the streams' queues, each costing it the launch
// time L (GpuModel::launch_seconds()), and the GPU runs a kernel once it is queued and its inputs
// are ready. The host stays ahead while kernels last longer than their launches, and nothing of
// this shows; it falls behind where kernels are shorter, and after every host sync (.item(),
// .cpu()), where it waited for the GPU and the GPU now waits for its next launches.
//
// An op of k kernels and T seconds on its GPU, its host's clock at c when it starts issuing it,
// stands for k kernels of T / k each issued at c + L, c + 2L, ...: alone on its GPU and ready, it
// ends at c + L + T when T / k >= L (the kernels outlast their launches), at c + kL + T / k when
// they are shorter. It is issued (may start) at c + L + max(0, (k - 1)(L - T / k)), which gives
// that end when it runs alone (short_kernels_wait()); the host's clock goes on to c + kL.
#include "sim_impl.hpp"

#include <limits>
#include <numeric>

namespace moesim {

// What a node's host needs of it: the kernels it launches (a compute's, Compute::kernels(); a
// collective or a transfer is one NCCL call on each of its ranks) and whether it blocks the host.
SimBackend::Impl::Issue SimBackend::Impl::issue_of(Node n) const {
  const Run& R = *run;
  const Compute* c = nullptr;
  if (n >= R.parts_from) {
    const std::size_t part = n - R.parts_from;
    const auto& parts = std::get<Computes>(R.graph->op(R.op_of[part]).body);
    c = &parts.work(part - parts.first_part);
  } else {
    c = std::get_if<Compute>(&R.graph->op(OpId(n)).body);
  }
  return c ? Issue{c->kernels(), c->blocks_host} : Issue{};
}

void SimBackend::Impl::start_hosts(const TaskGraph& graph, double t0) {
  cpu.on = gpu.launch_seconds() > 0;
  if (!cpu.on) return;
  const Run& R = *run;
  const double L = gpu.launch_seconds();
  const std::size_t ranks = std::size_t(graph.num_ranks());
  for (auto* v : {&cpu.order, &cpu.parked}) {
    v->resize(ranks);
    for (auto& o : *v) o.clear();
  }
  cpu.segments.resize(ranks);
  for (auto& s : cpu.segments) s.clear();
  cpu.shared.clear();
  cpu.parked_ops.clear();
  cpu.shared_of.assign(graph.size(), -1);
  cpu.shared_next.assign(ranks, 0);
  cpu.next.assign(ranks, 0);
  cpu.clock.assign(ranks, t0);
  cpu.blocked.assign(ranks, kNoNode);
  cpu.left.assign(graph.size(), 0);
  cpu.at.assign(graph.size(), t0);
  for (const auto& op : graph.ops()) {
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      bool every = c->parts() == ranks;
      for (std::size_t i = 0; every && i < c->parts(); ++i) every = c->ranks[i] == int(i);
      if (!every) {
        for (std::size_t i = 0; i < c->parts(); ++i) cpu.order[std::size_t(c->ranks[i])].push_back(R.parts_from + Node(c->first_part + i));
        continue;
      }
      // Its parts launch as many kernels as its largest work (a GPU that skips an expert with no
      // tokens launches fewer: left out, a few launches at most).
      const auto& works = *c->works;
      Hosts::Shared x{op.id, R.parts_from + Node(c->first_part), 0, works.front().blocks_host, true};
      for (const auto& w : works) {
        x.kernels = std::max(x.kernels, std::uint32_t(w.kernels()));
        if (w.blocks_host != x.blocks) x.kernels = 0;  // each looked up
      }
      // A stop's part keeps its issue in its part_start, as a host's own part does.
      cpu.shared_of[op.id] = x.stop() ? -1 : std::int32_t(cpu.shared.size());
      cpu.shared.push_back(x);
      continue;
    }
    if (std::get_if<Collective>(&op.body) && op.ranks().size() == ranks) {
      cpu.shared_of[op.id] = std::int32_t(cpu.shared.size());
      cpu.shared.push_back({op.id, Node(op.id), 1, false, false});
      continue;
    }
    for (const int r : op.ranks()) {
      cpu.order[std::size_t(r)].push_back(op.id);
      ++cpu.left[op.id];
    }
  }
  const std::size_t S = cpu.shared.size();
  cpu.prefix.assign(S + 1, 0.0);
  cpu.next_stop.assign(S + 1, std::uint32_t(S));
  for (std::size_t x = 0; x < S; ++x)
    cpu.prefix[x + 1] = cpu.prefix[x] + (cpu.shared[x].stop() ? 0.0 : double(cpu.shared[x].kernels) * L);
  for (std::size_t x = S; x-- > 0;) cpu.next_stop[x] = cpu.shared[x].stop() ? std::uint32_t(x) : cpu.next_stop[x + 1];
  cpu.segment_hint.assign(ranks, 0);
  cpu.starting = true;  // nothing is ready yet: execute() issues what has no predecessor
  std::vector<int> all(ranks);
  std::iota(all.begin(), all.end(), 0);
  advance_hosts(all);
  cpu.starting = false;
}

// Node n, `rank`'s next, issued by its host one by one (its own nodes, the shared stops): the
// host's clock moves on by its launches. A part's first launch is kept (schedule_part() adds what
// short kernels add, with the part's seconds).
void SimBackend::Impl::host_issues(int rank, Node n, Issue it) {
  const Run& R = *run;
  const double L = gpu.launch_seconds();
  double& clock = cpu.clock[std::size_t(rank)];
  const double first = clock + L;
  clock += double(it.kernels) * L;
  if (it.blocks) cpu.blocked[std::size_t(rank)] = n;
  if (n >= R.parts_from) {
    run->timing.part_start[n - R.parts_from] = first;
    return;
  }
  const auto* c = std::get_if<Compute>(&R.graph->op(OpId(n)).body);
  cpu.at[n] = std::max(cpu.at[n], first + short_kernels_wait(it.kernels, c ? c->seconds(gpu) : 0.0));
  // Ready before the last of its hosts issued it: it goes on now.
  if (--cpu.left[n] == 0 && !cpu.starting && R.waiting[n] == 0) issue_op(OpId(n));
}

// The hosts of `ranks` issue what they can: each up to the end, or up to a node that blocks it,
// included. A host's nodes are the shared ops' and its own order's, merged by op; it goes through
// a run of shared ops up to its next own node or stop at once, as a segment.
void SimBackend::Impl::advance_hosts(const std::vector<int>& ranks) {
  const Run& R = *run;
  const auto S = std::uint32_t(cpu.shared.size());
  constexpr OpId kEnd = ~OpId(0);
  auto op_of_node = [&](Node n) { return n < R.parts_from ? OpId(n) : R.op_of[n - R.parts_from]; };
  for (const int r : ranks) {
    const auto& order = cpu.order[std::size_t(r)];
    std::size_t& next = cpu.next[std::size_t(r)];
    std::uint32_t& x = cpu.shared_next[std::size_t(r)];
    double& clock = cpu.clock[std::size_t(r)];
    auto& segments = cpu.segments[std::size_t(r)];
    while (cpu.blocked[std::size_t(r)] == kNoNode) {
      const OpId own_op = next < order.size() ? op_of_node(order[next]) : kEnd;
      // The shared ops before its next own node (those of lower op ids), up to the next stop.
      const auto own_x = own_op == kEnd ? S
                                        : std::uint32_t(std::upper_bound(cpu.shared.begin(), cpu.shared.end(), own_op,
                                                                         [](OpId a, const Hosts::Shared& b) { return a < b.op; }) -
                                                        cpu.shared.begin());
      const std::uint32_t end = std::min(own_x, cpu.next_stop[x]);
      if (end > x) {
        const double offset = clock - cpu.prefix[x];
        if (segments.empty() || segments.back().offset != offset) segments.push_back({x, offset});
        clock += cpu.prefix[end] - cpu.prefix[x];
        x = end;
      }
      if (own_op != kEnd && own_x == x) {
        const Node n = order[next++];
        host_issues(r, n, issue_of(n));
      } else if (x < S) {  // a stop
        const Hosts::Shared& s = cpu.shared[x++];
        const Node n = s.first + Node(r);
        host_issues(r, n, s.kernels ? Issue{s.kernels, s.blocks} : issue_of(n));
      } else {
        break;
      }
    }
  }
  // What every host has issued, and the latest segments' bounds (held_by_hosts()).
  cpu.min_next = S;
  cpu.latest_from = 0;
  cpu.latest_offset = -std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < cpu.shared_next.size(); ++r) {
    cpu.min_next = std::min(cpu.min_next, cpu.shared_next[r]);
    if (cpu.segments[r].empty()) continue;
    cpu.latest_from = std::max(cpu.latest_from, cpu.segments[r].back().x);
    cpu.latest_offset = std::max(cpu.latest_offset, cpu.segments[r].back().offset);
  }
  if (cpu.starting) return;
  // What was ready before its hosts issued it and is issued now goes on, in the order it became
  // ready.
  std::vector<Node> now;
  for (const int r : ranks) {
    auto& parked = cpu.parked[std::size_t(r)];
    std::erase_if(parked, [&](Node p) {
      const std::size_t i = p - R.parts_from;
      return !std::isnan(part_issue(i, R.op_of[i], r)) && (now.push_back(p), true);
    });
    for (const Node p : now) schedule_part(p - R.parts_from);
    now.clear();
  }
  std::vector<OpId> ops;
  std::erase_if(cpu.parked_ops, [&](OpId id) { return std::uint32_t(cpu.shared_of[id]) < cpu.min_next && (ops.push_back(id), true); });
  for (const OpId id : ops) issue_op(id);
}

double SimBackend::Impl::clock_before(int rank, std::uint32_t x) {
  const auto& segments = cpu.segments[std::size_t(rank)];
  std::size_t& hint = cpu.segment_hint[std::size_t(rank)];  // parts go on mostly in order: the last one's
  if (hint >= segments.size() || segments[hint].x > x || (hint + 1 < segments.size() && segments[hint + 1].x <= x))
    hint = std::size_t(std::upper_bound(segments.begin(), segments.end(), x, [](std::uint32_t a, const Hosts::Segment& b) { return a < b.x; }) -
                       segments.begin()) - 1;
  return segments[hint].offset + cpu.prefix[x];
}

double SimBackend::Impl::part_issue(std::size_t i, OpId op, int rank) {
  const std::int32_t x = cpu.shared_of[op];
  if (x < 0) return run->timing.part_start[i];  // NaN until issued
  if (std::uint32_t(x) >= cpu.shared_next[std::size_t(rank)]) return std::numeric_limits<double>::quiet_NaN();
  return clock_before(rank, std::uint32_t(x)) + gpu.launch_seconds();
}

bool SimBackend::Impl::held_by_hosts(OpId id) {
  if (!cpu.on) return false;
  const double now = sg4::Engine::get_clock();
  double at = cpu.at[id];
  if (const std::int32_t x = cpu.shared_of[id]; x >= 0) {  // a collective over every rank
    if (std::uint32_t(x) >= cpu.min_next) {  // advance_hosts() goes on with it
      cpu.parked_ops.push_back(id);
      return true;
    }
    // The last of its hosts: where each host's last segment holds it, the largest offset.
    if (std::uint32_t(x) >= cpu.latest_from) {
      at = cpu.latest_offset + cpu.prefix[std::size_t(x)] + gpu.launch_seconds();
    } else {
      // (Stopping at the first host past now: issue_op() comes back then and looks again.)
      at = -std::numeric_limits<double>::infinity();
      for (std::size_t r = 0; r < cpu.shared_next.size() && at <= now; ++r)
        at = std::max(at, clock_before(int(r), std::uint32_t(x)) + gpu.launch_seconds());
    }
  } else if (cpu.left[id] > 0) {
    return true;  // advance_hosts() goes on with it
  }
  if (at <= now) return false;
  simgrid::kernel::timer::Timer::set(at, [this, id] { issue_op(id); });
  return true;
}

// The hosts unblocked at one instant go on together, after the events of that instant (the ends
// of a host sync on every GPU are as many events): by a timer set at the first.
void SimBackend::Impl::host_unblocked(int rank, Node n) {
  if (!cpu.on || cpu.blocked[std::size_t(rank)] != n) return;
  cpu.blocked[std::size_t(rank)] = kNoNode;
  cpu.clock[std::size_t(rank)] = std::max(cpu.clock[std::size_t(rank)], sg4::Engine::get_clock());
  if (cpu.unblocked.empty())
    simgrid::kernel::timer::Timer::set(sg4::Engine::get_clock(), [this] { advance_hosts(std::exchange(cpu.unblocked, {})); });
  cpu.unblocked.push_back(rank);
}

}  // namespace moesim
