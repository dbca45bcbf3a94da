// SimBackend, the executor: a TaskGraph run. Ops are issued as their predecessors end; a compute
// alone on its GPU is a SimGrid timer until an exec joins it; an op's end is its exit activity's.
#include "sim_impl.hpp"

namespace moesim {

void SimBackend::Impl::issue_op(OpId id) {
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

void SimBackend::Impl::alone_done(int rank) {
  const OpId id = alone[std::size_t(rank)].op;
  alone[std::size_t(rank)].timer = nullptr;
  op_done(id);
}

// An exec that computes starts on a GPU: one running alone there becomes an exec that shares it.
void SimBackend::Impl::started(const sg4::Exec& e) {
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
void SimBackend::Impl::op_done(OpId done) {
  run->timing.end[done] = sg4::Engine::get_clock();
  run->ended[done] = 1;
  run->activities[done].clear();
  for (OpId s : run->successors[done])
    if (--run->waiting[s] == 0) issue_op(s);
}

Timing SimBackend::Impl::execute(const TaskGraph& graph) {
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

SimBackend::SimBackend(const Cluster& cluster, const GpuModel& gpu, SimOptions options)
    : impl_(std::make_unique<Impl>(cluster, gpu, options)) {}
SimBackend::~SimBackend() = default;
Timing SimBackend::execute(const TaskGraph& graph) { return impl_->execute(graph); }
double SimBackend::now() const { return sg4::Engine::get_clock(); }

}  // namespace moesim
