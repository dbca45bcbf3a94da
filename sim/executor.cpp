// SimBackend, the executor: a TaskGraph run. Ops are issued as their predecessors end; a compute
// alone on its GPU is a SimGrid timer until an exec joins it; the parts of a Computes op alone on
// their GPUs are chained, with no event each (sim_impl.hpp); an op's end is its exit activity's.
#include "sim_impl.hpp"

#include <limits>
#include <utility>

namespace moesim {

void SimBackend::Impl::issue_op(OpId id) {
  const Op& op = run->graph->op(id);
  const auto* parts = std::get_if<Computes>(&op.body);
  if (!parts && held_by_hosts(id)) return;  // (a Computes op's parts wait for their hosts, each its own)
  const double now = sg4::Engine::get_clock();
  run->timing.start[id] = now;  // its entry starts as it is issued
  if (parts) {  // its deps are done: each part's gate opens
    for (std::size_t i = parts->first_part; i < parts->first_part + parts->parts(); ++i)
      if (--run->part_waiting[i] == 0) schedule_part(i);
    return;
  }
  if (const auto* c = std::get_if<Compute>(&op.body); c && loading[std::size_t(op.rank)] == 0 && !alone[std::size_t(op.rank)].timer) {
    const double end = now + c->seconds(gpu);
    alone[std::size_t(op.rank)] = {simgrid::kernel::timer::Timer::set(end, [this, rank = op.rank] { alone_done(rank); }), id, end};
    return;
  }
  const sg4::ExecPtr exit = issue(op, run->activities[id]);
  run->exit_of[exit.get()] = id;
  if (const auto* c = std::get_if<Collective>(&op.body); c && c->sm_share > 0) reserve_sms(id, *c);
}

void SimBackend::Impl::alone_done(int rank) {
  Alone& a = alone[std::size_t(rank)];
  a.timer = nullptr;
  if (a.copies >= 0) return copy_ended(std::size_t(std::exchange(a.copies, -1)));
  op_done(a.op);
}

// A collective step's copies start (Run::Copies): each alone on its GPU (nothing computes there:
// no exec, no timer, no chained part not over) is a timer, as a compute op alone is; the others
// are execs of the copy's bytes at memory bandwidth, sharing their GPUs.
void SimBackend::Impl::start_copies(std::size_t i) {
  const double now = sg4::Engine::get_clock();
  for (const auto& [rank, seconds] : run->copies[i].copies) {
    const auto& c = chain[std::size_t(rank)];
    const bool chained = std::any_of(c.begin(), c.end(), [&](Node n) { return run->timing.part_end[n - run->parts_from] > now; });
    Alone& a = alone[std::size_t(rank)];
    if (loading[std::size_t(rank)] == 0 && !a.timer && !chained) {
      a = {simgrid::kernel::timer::Timer::set(now + seconds, [this, rank = rank] { alone_done(rank); }), run->copies[i].op,
           now + seconds, std::int64_t(i)};
      continue;
    }
    copy_as_exec(i, rank, seconds);
  }
}

// Copy `i`'s part on `rank`, `seconds` of it left, as an exec that shares the GPU; its end counts
// down the step's copies.
void SimBackend::Impl::copy_as_exec(std::size_t i, int rank, double seconds) {
  auto exec = compute_exec(rank, seconds);
  run->copy_execs[exec.get()] = i;
  run->activities[run->copies[i].op].push_back(exec);
  exec->start();
}

void SimBackend::Impl::copy_ended(std::size_t i) {
  if (--run->copies[i].left > 0) return;
  run->copies[i].gate->start();
  run->copies[i] = {};
}

// What is left at this instant of work that ran alone on `rank` until `end` (an Alone op, a chained
// part): an exec of its remaining flops, loading the GPU, ending `node` (op `op`'s or a part's).
// Not started: the caller starts it.
sg4::ExecPtr SimBackend::Impl::rest_as_exec(int rank, double end, OpId op, Node node) {
  auto exec = sg4::Exec::init();
  exec->set_flops_amount((end - sg4::Engine::get_clock()) * gpu.peak_flops())->set_host(hosts[std::size_t(rank)]);
  loads[exec.get()] = rank;
  run->activities[op].push_back(exec);
  run->exit_of[exec.get()] = node;
  return exec;
}

// An exec of `seconds` at its GPU's peak on `rank`, loading the GPU unless it computes nothing.
sg4::ExecPtr SimBackend::Impl::compute_exec(int rank, double seconds) {
  auto exec = sg4::Exec::init();
  exec->set_flops_amount(seconds * gpu.peak_flops())->set_host(hosts[std::size_t(rank)]);
  if (seconds > 0) loads[exec.get()] = rank;
  return exec;
}

// Part i's seconds alone on its GPU. Each distinct work timed once (the smart schedule's tables:
// one work in a few hundred parts).
double SimBackend::Impl::part_seconds(std::size_t i) {
  Run& R = *run;
  const auto& parts = std::get<Computes>(R.graph->op(R.op_of[i]).body);
  auto*& table = R.op_work_seconds[R.op_of[i]];
  if (!table) table = &R.work_seconds[parts.works.get()];  // (an unordered_map's references stay valid as it grows)
  auto& work_seconds = *table;
  if (work_seconds.empty()) work_seconds.assign(parts.works->size(), std::numeric_limits<double>::quiet_NaN());
  double& seconds = work_seconds[parts.work_of[i - parts.first_part]];
  if (std::isnan(seconds)) seconds = parts.work(i - parts.first_part).seconds(gpu);
  return seconds;
}

// A part whose predecessors are all resolved: chained if nothing else computes on its GPU, an exec
// otherwise.
void SimBackend::Impl::schedule_part(std::size_t i) {
  Run& R = *run;
  const double now = sg4::Engine::get_clock();
  const Node node = R.parts_from + Node(i);
  const int rank = R.rank_of[i];
  // When its host issued it: its first launch, and later where its kernels are shorter than their
  // launches.
  double issued = now;
  if (cpu.on && std::isnan(issued = part_issue(i, R.op_of[i], rank))) {  // not yet: advance_hosts() goes on with it
    cpu.parked[std::size_t(rank)].push_back(node);
    return;
  }
  const auto& parts = std::get<Computes>(R.graph->op(R.op_of[i]).body);
  const double seconds = part_seconds(i);
  if (cpu.on) issued += short_kernels_wait(parts.work(i - parts.first_part).kernels(), seconds);
  const Node before = R.part_pred[i];
  const bool after_chained = before != kNoNode && before >= R.parts_from && R.part_state[before - R.parts_from] == Run::Part::chained;
  if (loading[std::size_t(rank)] > 0 || alone[std::size_t(rank)].timer) {
    if (issued > now) {  // an exec from its issue on
      simgrid::kernel::timer::Timer::set(issued, [this, i] { schedule_part(i); });
      return;
    }
    // A GPU that computes something else has no chain left running (started() unchained it).
    if (after_chained && R.timing.part_end[before - R.parts_from] > now)
      throw std::logic_error("SimBackend: a part would start as an exec before the chained part ahead of it ends");
    R.timing.part_start[i] = now;
    R.part_state[i] = Run::Part::exec;
    auto exec = compute_exec(rank, seconds);
    R.activities[R.op_of[i]].push_back(exec);
    R.exit_of[exec.get()] = R.parts_from + Node(i);
    exec->vetoable_start();
    return;
  }
  double start = std::max(now, issued);  // or, after a chained part, at its end
  if (after_chained) start = std::max(start, R.timing.part_end[before - R.parts_from]);
  const double end = start + seconds;
  R.timing.part_start[i] = start;
  R.timing.part_end[i] = end;
  R.part_state[i] = Run::Part::chained;
  auto& c = chain[std::size_t(rank)];
  while (!c.empty() && R.timing.part_end[c.front() - R.parts_from] <= now) c.pop_front();
  c.push_back(R.parts_from + Node(i));
  if (cpu.on && parts.work(i - parts.first_part).blocks_host)  // its host goes on at its end, if still chained then
    simgrid::kernel::timer::Timer::set(end, [this, i, rank, node] {
      if (run->part_state[i] == Run::Part::chained) host_unblocked(rank, node);
    });
  if (const Node next = R.part_next[i]; next != kNoNode) {
    if (next >= R.parts_from)
      release(next);  // a part: chained after this one when its other predecessors are done
    else
      R.boundary[R.parts_from + Node(i)] = simgrid::kernel::timer::Timer::set(end, [this, i] {
        run->boundary.erase(run->parts_from + Node(i));
        release(run->part_next[i]);
      });
  }
  part_resolved(R.op_of[i]);
}

// A part of `op` is chained or done; when all are, the op ends at the last one's end.
void SimBackend::Impl::part_resolved(OpId op) {
  Run& R = *run;
  if (--R.open[op] > 0) return;
  const auto& parts = std::get<Computes>(R.graph->op(op).body);
  double end = sg4::Engine::get_clock();
  for (std::size_t i = parts.first_part; i < parts.first_part + parts.parts(); ++i) end = std::max(end, R.timing.part_end[i]);
  R.op_timer[op] = simgrid::kernel::timer::Timer::set(end, [this, op] {
    run->op_timer[op] = nullptr;
    op_done(op);
  });
}

// A part that ran as an exec ends.
void SimBackend::Impl::part_done(std::size_t i) {
  Run& R = *run;
  R.timing.part_end[i] = sg4::Engine::get_clock();
  R.part_state[i] = Run::Part::done;
  host_unblocked(R.rank_of[i], R.parts_from + Node(i));
  if (const Node next = R.part_next[i]; next != kNoNode) release(next);
  part_resolved(R.op_of[i]);
}

// An exec that computes starts on `rank`: its chained parts not over stop being chained. The one
// running becomes an exec of its remaining flops (as an Alone op does); the ones after it wait
// again for the part before them, and the ops they resolved are open again.
void SimBackend::Impl::unchain(int rank) {
  auto& c = chain[std::size_t(rank)];
  if (c.empty()) return;
  Run& R = *run;
  const double now = sg4::Engine::get_clock();
  const std::vector<Node> pending(c.begin(), c.end());
  c.clear();
  sg4::ExecPtr running;
  for (const Node n : pending) {
    const std::size_t i = n - R.parts_from;
    if (R.timing.part_end[i] <= now) continue;  // over
    const OpId op = R.op_of[i];
    if (auto*& t = R.op_timer[op]) {
      t->remove();
      t = nullptr;
    }
    ++R.open[op];
    if (const auto b = R.boundary.find(n); b != R.boundary.end()) {
      b->second->remove();
      R.boundary.erase(b);
    } else if (const Node next = R.part_next[i]; next != kNoNode && next >= R.parts_from) {
      ++R.part_waiting[next - R.parts_from];
    }
    if (!running) {  // (one its host issued for later runs from now: its host's wait is lost)
      running = rest_as_exec(rank, R.timing.part_end[i] - std::max(0.0, R.timing.part_start[i] - now), op, n);
      R.part_state[i] = Run::Part::exec;
    } else {
      R.part_state[i] = Run::Part::waiting;
      R.part_waiting[i] = 1;  // the part before it on the stream
      if (cpu.on && cpu.shared_of[op] < 0) {  // its start, its host's issue or later, kept as such: schedule_part() adds the short kernels' wait
        const auto& parts = std::get<Computes>(R.graph->op(op).body);
        R.timing.part_start[i] -= short_kernels_wait(parts.work(i - parts.first_part).kernels(), part_seconds(i));
      }
    }
  }
  if (running) running->vetoable_start();
}

// An exec that computes starts on a GPU: one running alone there becomes an exec that shares it.
void SimBackend::Impl::started(const sg4::Exec& e) {
  const auto it = loads.find(&e);
  if (it == loads.end()) return;
  ++loading[std::size_t(it->second)];
  share_gpu(it->second);
}

// Something else now computes on `rank` (an exec, or SMs held): what ran there alone, a timer or a
// chain, becomes an exec of what is left, sharing the GPU from this instant.
void SimBackend::Impl::share_gpu(int rank) {
  if (run) unchain(rank);
  Alone& a = alone[std::size_t(rank)];
  if (!a.timer) return;
  a.timer->remove();
  a.timer = nullptr;
  if (a.copies < 0) {
    rest_as_exec(rank, a.end, a.op, a.op)->vetoable_start();
    return;
  }
  copy_as_exec(std::size_t(std::exchange(a.copies, -1)), rank, a.end - sg4::Engine::get_clock());
}

void SimBackend::Impl::completed(const sg4::Activity& a) {
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
  if (const auto it = run->copies_at.find(&a); it != run->copies_at.end()) {
    for (const std::size_t i : it->second) start_copies(i);
    run->copies_at.erase(it);
  }
  if (const auto it = run->copy_execs.find(&a); it != run->copy_execs.end()) {
    const std::size_t i = it->second;
    run->copy_execs.erase(it);
    return copy_ended(i);
  }
  const auto it = run->exit_of.find(&a);
  if (it == run->exit_of.end()) return;
  const Node done = it->second;
  run->exit_of.erase(it);
  const OpId op = done < run->parts_from ? OpId(done) : run->op_of[done - run->parts_from];
  // Release the op's activities, all done; `a` itself only at the next completion, since
  // SimGrid is still inside a->complete() and goes on to release its dependencies.
  run->deferred.clear();
  for (auto& x : run->activities[op])
    if (x.get() == &a) run->deferred.push_back(std::move(x));
  if (done < run->parts_from)
    op_done(op);
  else
    part_done(done - run->parts_from);
}

// One of node n's predecessors is resolved.
void SimBackend::Impl::release(Node n) {
  if (n < run->parts_from) {
    if (--run->waiting[n] == 0) issue_op(OpId(n));
  } else if (--run->part_waiting[n - run->parts_from] == 0) {
    schedule_part(n - run->parts_from);
  }
}

// An op's end: recorded; its activities released; its successors counted down.
void SimBackend::Impl::op_done(OpId done) {
  run->timing.end[done] = sg4::Engine::get_clock();
  host_unblocked(run->graph->op(done).rank, done);
  overlaps.end(done);
  run->ended[done] = 1;
  run->activities[done].clear();
  if (const auto r = run->reserved.find(done); r != run->reserved.end()) {  // its kernels leave the GPUs
    for (const auto& [rank, k] : r->second) hold_sms(rank, -k);
    run->reserved.erase(r);
  }
  if (const auto* parts = std::get_if<Computes>(&run->graph->op(done).body)) {  // it started with its first part
    double first = std::numeric_limits<double>::infinity();
    for (std::size_t i = parts->first_part; i < parts->first_part + parts->parts(); ++i) first = std::min(first, run->timing.part_start[i]);
    run->timing.start[done] = first;
  }
  for (Node s : run->successors[done]) release(s);
}

Timing SimBackend::Impl::execute(const TaskGraph& graph) {
  const double t0 = sg4::Engine::get_clock();
  const std::size_t n = graph.size(), parts = graph.num_parts();
  auto w = graph.waits();
  Run r;
  // Which network ops may overlap which, for timed steps (timed_steps.cpp), up to 128 MB of analysis.
  overlaps.words = 0;
  if (options.aggregate) network_overlaps(graph, w, std::uint64_t(1) << 30, overlaps);
  r.graph = &graph;
  r.parts_from = Node(n);
  r.successors.resize(n);
  r.waiting.assign(n, 0);
  r.part_pred = std::move(w.stream_pred);
  r.part_next.assign(parts, kNoNode);
  r.part_waiting.assign(parts, 1);  // the op's deps, as one
  r.op_of = std::move(w.op_of);
  r.rank_of.assign(parts, 0);
  r.part_state.assign(parts, Run::Part::waiting);
  r.open.assign(n, 0);
  r.op_timer.assign(n, nullptr);
  r.op_work_seconds.assign(n, nullptr);
  r.activities.resize(n);
  r.timing.start.assign(n, 0.0);
  r.timing.end.assign(n, 0.0);
  r.timing.part_start.assign(parts, gpu.launch_seconds() > 0 ? std::numeric_limits<double>::quiet_NaN() : 0.0);  // NaN: its host has not issued it (host_issue.cpp)
  r.timing.part_end.assign(parts, 0.0);
  r.ended.assign(n, 0);
  auto precedes = [&](Node from, Node to) {
    if (from < n)
      r.successors[from].push_back(to);
    else
      r.part_next[from - n] = to;
  };
  for (const auto& op : graph.ops()) {
    r.waiting[op.id] = int(w.of_op[op.id].size());
    for (Node p : w.of_op[op.id]) precedes(p, op.id);
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      r.open[op.id] = int(c->parts());
      for (std::size_t i = 0; i < c->parts(); ++i) {
        const std::size_t part = c->first_part + i;
        r.rank_of[part] = c->ranks[i];
        if (const Node before = r.part_pred[part]; before != kNoNode) {
          ++r.part_waiting[part];
          precedes(before, r.parts_from + Node(part));
        }
      }
    }
  }
  w = {};
  run = &r;
  start_hosts(graph, t0);
  for (const auto& op : graph.ops())
    if (r.waiting[op.id] == 0) issue_op(op.id);
  engine->run();
  run = nullptr;
  overlaps.words = 0;
  measured.clear();
  timed_steps.clear();
  for (auto& c : chain) c.clear();
  for (const auto& op : graph.ops()) {
    if (!r.ended[op.id])
      throw std::logic_error("SimBackend: op '" + op.label + "' never ran (a dependency cycle in the TaskGraph?)");
    r.timing.start[op.id] -= t0;
    r.timing.end[op.id] -= t0;
  }
  for (std::size_t i = 0; i < parts; ++i) {
    r.timing.part_start[i] -= t0;
    r.timing.part_end[i] -= t0;
  }
  return std::move(r.timing);
}

SimBackend::SimBackend(const Cluster& cluster, const GpuModel& gpu, SimOptions options)
    : impl_(std::make_unique<Impl>(cluster, gpu, options)) {}
SimBackend::~SimBackend() = default;
Timing SimBackend::execute(const TaskGraph& graph) { return impl_->execute(graph); }
double SimBackend::now() const { return sg4::Engine::get_clock(); }

}  // namespace moesim
