#include "taskgraph.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace moesim {

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::comm: return "comm";
    case Stream::comm2: return "comm2";
  }
  return "?";
}

const char* compute_kind_name(ComputeKind k) {
  switch (k) {
    case ComputeKind::gemm: return "gemm";
    case ComputeKind::grouped_gemm: return "grouped_gemm";
    case ComputeKind::elementwise: return "elementwise";
    case ComputeKind::gate: return "gate";
    case ComputeKind::encode: return "encode";
    case ComputeKind::decode: return "decode";
    case ComputeKind::optimizer: return "optimizer";
    case ComputeKind::compress: return "compress";
  }
  return "?";
}

const char* collective_type_name(CollectiveType t) {
  switch (t) {
    case CollectiveType::all_to_all: return "all_to_all";
    case CollectiveType::all_reduce: return "all_reduce";
    case CollectiveType::broadcast: return "broadcast";
    case CollectiveType::reduce: return "reduce";
    case CollectiveType::all_gather: return "all_gather";
    case CollectiveType::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

const char* category_name(Category c) {
  switch (c) {
    case Category::compute: return "compute";
    case Category::moe: return "moe";
    case Category::all_to_all: return "all_to_all";
    case Category::all_reduce: return "all_reduce";
    case Category::other: return "other";
  }
  return "?";
}

double Compute::flops() const {
  double f = 0;
  for (const auto& g : gemms) f += g.flops();
  return f;
}

double Compute::seconds(const GpuModel& gpu) const {
  double t = fixed_seconds + gpu.memory_time(memory_bytes);
  for (const auto& g : gemms) t += gpu.gemm_time(g);
  return t;
}

std::size_t CollectiveBytes::square_side(const char* what) const {
  const auto n = std::size_t(std::llround(std::sqrt(double(size()))));
  if (n * n != size())
    throw std::logic_error(std::string("CollectiveBytes: ") + what + " of values that are not a square matrix");
  return n;
}

CollectiveBytes CollectiveBytes::transposed() const {
  CollectiveBytes t(*this);
  t.side_ = square_side("transposing");
  t.transposed_ = !transposed_;
  return t;
}

CollectiveBytes CollectiveBytes::group_step(std::size_t group, std::size_t step) const {
  CollectiveBytes t(*this);
  t.side_ = square_side("a group step");
  if (transposed_ || group_ || group == 0 || t.side_ % group != 0 || step >= t.side_ / group)
    throw std::logic_error("CollectiveBytes: a group step of a matrix as stored, of a group that divides its side");
  t.group_ = group, t.step_ = step;
  return t;
}

CollectiveBytes CollectiveBytes::scaled(double factor) const {
  CollectiveBytes t(*this);
  t.scale_ *= factor;
  return t;
}

double CollectiveBytes::total() const {
  double sum = 0;
  if (group_)
    for_each(side_, [&](std::size_t, std::size_t, double b) { return sum += b, true; });
  else
    for (std::size_t k = 0; k < size(); ++k) sum += scale_ * stored(k);
  return sum;
}

double Collective::total_bytes() const { return bytes.total(); }

void TaskGraph::drop_collective_matrices() {
  for (auto& op : ops_)
    if (auto* c = std::get_if<Collective>(&op.body)) {
      const double total = c->total_bytes();
      c->bytes = {total};
    }
}

Category Op::category() const {
  if (const auto* c = std::get_if<Compute>(&body))
    return c->kind == ComputeKind::gemm || c->kind == ComputeKind::optimizer ? Category::compute : Category::moe;
  if (const auto* c = std::get_if<Collective>(&body)) {
    if (c->type == CollectiveType::all_to_all) return Category::all_to_all;
    if (c->type == CollectiveType::all_reduce) return Category::all_reduce;
  }
  return Category::other;
}

std::vector<int> Op::ranks() const {
  if (const auto* c = std::get_if<Collective>(&body)) return c->group;
  return {rank};
}

OpId TaskGraph::add(Op op) {
  op.id = OpId(ops_.size());
  for (OpId d : op.deps)
    if (d >= op.id) throw std::logic_error("TaskGraph: op '" + op.label + "' depends on a later op");
  for (int r : op.ranks())
    if (r < 0 || r >= num_ranks_) throw std::logic_error("TaskGraph: op '" + op.label + "' on a rank out of range");
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

OpId TaskGraph::add_compute(int rank, std::string label, Compute c, std::vector<OpId> deps) {
  return add(Op{0, rank, Stream::compute, std::move(label), std::move(deps), std::move(c)});
}

OpId TaskGraph::add_transfer(Stream stream, std::string label, Transfer t, std::vector<OpId> deps) {
  const int src = t.src;
  if (t.dst < 0 || t.dst >= num_ranks_) throw std::logic_error("TaskGraph: transfer '" + label + "' to a bad rank");
  return add(Op{0, src, stream, std::move(label), std::move(deps), t});
}

OpId TaskGraph::add_collective(Stream stream, std::string label, Collective c, std::vector<OpId> deps) {
  if (c.group.empty()) throw std::logic_error("TaskGraph: collective '" + label + "' has an empty group");
  const int first = c.group.front();
  return add(Op{0, first, stream, std::move(label), std::move(deps), std::move(c)});
}

std::vector<std::vector<OpId>> TaskGraph::predecessors() const {
  std::vector<std::vector<OpId>> preds(ops_.size());
  std::vector<long> last(std::size_t(num_ranks_) * kNumStreams, -1);
  for (const auto& op : ops_) {
    auto& p = preds[op.id];
    p = op.deps;
    for (int r : op.ranks()) {
      long& slot = last[std::size_t(r) * kNumStreams + int(op.stream)];
      if (slot >= 0) p.push_back(OpId(slot));
      slot = op.id;
    }
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return preds;
}

double Timing::makespan() const { return end.empty() ? 0 : *std::max_element(end.begin(), end.end()); }

double Breakdown::total() const { return std::accumulate(std::begin(seconds), std::end(seconds), 0.0); }

Breakdown critical_path(const TaskGraph& graph, const Timing& timing) {
  Breakdown b;
  if (graph.size() == 0) return b;
  const auto preds = graph.predecessors();
  OpId cur = OpId(std::max_element(timing.end.begin(), timing.end.end()) - timing.end.begin());
  while (true) {
    const auto& op = graph.op(cur);
    b.seconds[int(op.category())] += timing.end[cur] - timing.start[cur];
    if (preds[cur].empty()) {
      b.seconds[int(Category::other)] += timing.start[cur];
      break;
    }
    OpId best = preds[cur].front();
    for (OpId p : preds[cur])
      if (timing.end[p] > timing.end[best]) best = p;
    b.seconds[int(Category::other)] += timing.start[cur] - timing.end[best];
    cur = best;
  }
  return b;
}

}  // namespace moesim
