#include "taskgraph.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string_view>

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

const PhaseNames& phase_names(Phase p) {
  static constexpr PhaseNames kPhases[kNumPhases] = {  // in Phase's order
      {"dense_compute", "dense", "dense compute"},
      {"routing", "routing", "routing"},
      {"codec", "codec", "encode/decode"},
      {"expert_compute", "experts", "experts"},
      {"compression", "compress", "compression"},
      {"dispatch", "dispatch", "dispatch"},
      {"combine", "combine", "combine"},
      {"sync", "sync", "sync"},
      {"replica_broadcast", "r.bcast", "replica bcast"},
      {"replica_reduce", "r.reduce", "replica reduce"},
      {"parameter_gather", "gather", "param gather"},
      {"expert_moves", "moves", "expert moves"},
      {"dense_allreduce", "allreduce", "dense all-reduce"},
      {"optimizer", "optim", "optimizer"},
      {"stage_send", "pp.send", "stage send"},
      {"tensor_parallel", "tp", "tensor parallel"},
      {"context_parallel", "cp", "context parallel"},
      {"idle", "idle", "idle"},
  };
  return kPhases[static_cast<int>(p)];
}

namespace {

// The names of moesim's ops and their phases. An op's label is [L<layer>.][fwd.|bwd.]<name>[...],
// where <name> may end in a step number (S3, R3, C3) and "..." is a part (.p2), expert (.e5) or
// group (.g0). docs/timeline.md explains each name; a test checks that it lists every one.
struct OpName {
  std::string_view name;
  Phase phase;
};
constexpr OpName kOpNames[] = {
    {"attention", Phase::dense_compute},          {"output", Phase::dense_compute},
    {"gate", Phase::routing},                     {"count_exchange", Phase::routing},
    {"count_allgather", Phase::routing},          {"capacity_allreduce", Phase::routing},
    {"host_sync", Phase::routing},                {"encode", Phase::codec},
    {"decode", Phase::codec},                     {"experts", Phase::expert_compute},
    {"C", Phase::expert_compute},                 {"partial_sum", Phase::expert_compute},
    {"D", Phase::compression},                    {"a2a_dispatch", Phase::dispatch},
    {"S", Phase::dispatch},                       {"a2a_combine", Phase::combine},
    {"R", Phase::combine},                        {"experts_done", Phase::sync},
    {"smart_done", Phase::sync},                  {"pipeline_done", Phase::sync},
    {"sharded_done", Phase::sync},                {"replica_bcast", Phase::replica_broadcast},
    {"replica_calibrate", Phase::replica_broadcast}, {"replica_regather", Phase::replica_broadcast},
    {"replica_reduce", Phase::replica_reduce},    {"replica_allreduce", Phase::replica_reduce},
    {"grads_reduce_scatter", Phase::replica_reduce}, {"grads_reduce", Phase::replica_reduce},
    {"expert_reduce_scatter", Phase::replica_reduce},
    {"expert_allreduce", Phase::replica_reduce},
    {"experts_allgather", Phase::parameter_gather}, {"experts_allgather_updated", Phase::parameter_gather},
    {"expert_allgather", Phase::parameter_gather}, {"migrate", Phase::expert_moves},
    {"migrations_done", Phase::expert_moves},     {"allreduce", Phase::dense_allreduce},
    {"optimizer", Phase::optimizer},              {"dense_blocks", Phase::dense_compute},
    {"shared_experts", Phase::expert_compute},  {"stage_send", Phase::stage_send},
    {"tp_allgather", Phase::tensor_parallel},     {"tp_reduce_scatter", Phase::tensor_parallel},
    {"cp_allgather", Phase::context_parallel},    {"cp_reduce_scatter", Phase::context_parallel},
};

// <name> of a label (see kOpNames), without its step number.
std::string_view op_name(std::string_view label) {
  auto skip = [&](std::string_view prefix) {
    if (label.starts_with(prefix)) label.remove_prefix(prefix.size());
  };
  if (label.size() > 1 && label[0] == 'L' && std::isdigit(static_cast<unsigned char>(label[1]))) {
    const auto dot = label.find('.');
    label.remove_prefix(dot == std::string_view::npos ? label.size() : dot + 1);
  }
  skip("fwd.");
  skip("bwd.");
  label = label.substr(0, label.find('.'));
  while (label.size() > 1 && std::isdigit(static_cast<unsigned char>(label.back()))) label.remove_suffix(1);
  return label;
}

const OpName* find_op_name(std::string_view label) {
  const auto name = op_name(label);
  for (const auto& n : kOpNames)
    if (n.name == name) return &n;
  return nullptr;
}

// An op's phase: from its name, or from its body where the name is not moesim's. A compression op
// is one by its kind (ScheMoE's C1/C2 share the letter with FasterMoE's expert steps C<j>).
Phase phase_of(const std::string& label, const std::variant<Compute, Transfer, Collective, Computes>& body) {
  const auto* parts = std::get_if<Computes>(&body);
  const auto* c = parts && parts->works && !parts->works->empty() ? &parts->works->front() : std::get_if<Compute>(&body);
  if (c && c->kind == ComputeKind::compress) return Phase::compression;
  if (const auto* n = find_op_name(label)) return n->phase;
  if (c) switch (c->kind) {
      case ComputeKind::grouped_gemm: return Phase::expert_compute;
      case ComputeKind::gate: return Phase::routing;
      case ComputeKind::encode:
      case ComputeKind::decode: return Phase::codec;
      case ComputeKind::optimizer: return Phase::optimizer;
      default: return Phase::dense_compute;
    }
  if (const auto* k = std::get_if<Collective>(&body)) switch (k->type) {
      case CollectiveType::all_to_all: return Phase::dispatch;
      case CollectiveType::all_reduce: return Phase::dense_allreduce;
      case CollectiveType::all_gather: return Phase::parameter_gather;
      case CollectiveType::broadcast: return Phase::replica_broadcast;
      default: return Phase::replica_reduce;
    }
  return Phase::expert_moves;  // a point-to-point transfer
}

}  // namespace

bool known_op_name(const std::string& label) { return find_op_name(label) != nullptr; }

std::vector<std::pair<std::string, Phase>> known_op_names() {
  std::vector<std::pair<std::string, Phase>> names;
  for (const auto& n : kOpNames) names.emplace_back(n.name, n.phase);
  return names;
}

int op_layer(const std::string& label) {
  if (label.size() < 2 || label[0] != 'L') return -1;
  int layer = 0;
  std::size_t i = 1;
  for (; i < label.size() && std::isdigit(static_cast<unsigned char>(label[i])); ++i) layer = layer * 10 + (label[i] - '0');
  return i > 1 && i < label.size() && label[i] == '.' ? layer : -1;
}

double Compute::flops() const {
  double f = 0;
  for (const auto& g : gemms) f += g.flops();
  return f;
}

std::uint64_t Compute::kernels() const {
  std::uint64_t k = memory_bytes > 0 || gemms.empty() ? 1 : 0;
  for (const auto& g : gemms) k += g.repeat ? g.repeat : 1;
  return k;
}

Compute host_sync_work(const GpuModel& gpu) {
  Compute sync{ComputeKind::elementwise, {}, 0};
  sync.fixed_seconds = gpu.host_sync_seconds();
  sync.blocks_host = true;
  return sync;
}

double Compute::seconds(const GpuModel& gpu) const {
  // Each kernel that does work takes at least the GPU's floor (GpuSpec.kernel_us): the one for the
  // memory traffic or fixed time, and each run of each GEMM. A GEMM of no tokens is not launched
  // (cuBLAS returns at once for m = 0) and costs nothing.
  const double elementwise = fixed_seconds + gpu.memory_time(memory_bytes);
  double t = elementwise > 0 ? gpu.kernel_time(elementwise) : elementwise;
  for (const auto& g : gemms) {
    const double runs = double(g.repeat ? g.repeat : 1), one = gpu.gemm_time(g) / runs;
    if (one > 0) t += runs * gpu.kernel_time(one);
  }
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
  if (!group_) t.side_ = square_side("transposing");
  t.transposed_ = !transposed_;
  return t;
}

std::size_t CollectiveBytes::view_hash() const {
  std::size_t h = std::hash<const void*>{}(counts_ ? static_cast<const void*>(counts_.get()) : values_.get());
  for (const std::size_t x : {std::size_t(transposed_), group_, step_, std::hash<double>{}(scale_)})
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);  // boost::hash_combine's mix
  return h;
}

CollectiveBytes CollectiveBytes::group_step(std::size_t group, std::size_t step) const {
  const std::size_t n = square_side("a group step");
  if (transposed_ || group_ || group == 0 || n % group != 0 || step >= n / group)
    throw std::logic_error("CollectiveBytes: a group step of a matrix as stored, of a group that divides its side");
  CollectiveBytes t;
  t.side_ = n, t.group_ = group, t.step_ = step, t.scale_ = scale_, t.unit_ = unit_;
  auto copy_out = [&](const auto* all) {  // row p's entries to its group's target group
    std::vector<std::remove_cvref_t<decltype(*all)>> out;
    out.reserve(n * group);
    for (std::size_t p = 0; p < n; ++p) {
      const auto* row = all + p * n + t.to_group(p / group) * group;
      out.insert(out.end(), row, row + group);
    }
    return out;
  };
  if (counts_)
    t.counts_ = counts_->visit([&](const auto* all) { return std::make_shared<const CountVector>(copy_out(all)); });
  else
    t.values_ = std::make_shared<const std::vector<double>>(copy_out(values_->data()));
  return t;
}

std::size_t CollectiveBytes::rounds_possible(std::size_t n) const {
  if (!group_ || n != side_) return n > 0 ? n - 1 : 0;
  // Group a sends to group a − step: d = (−step · group + δ) mod n, δ = j − i in (−group, group).
  std::vector<std::size_t> rounds;  // 2 · group − 1 of them, not a mark per round of n (a call per step)
  for (std::ptrdiff_t delta = 1 - std::ptrdiff_t(group_); delta < std::ptrdiff_t(group_); ++delta)
    rounds.push_back(std::size_t(((delta - std::ptrdiff_t(step_ * group_)) % std::ptrdiff_t(n) + std::ptrdiff_t(n)) % std::ptrdiff_t(n)));
  std::sort(rounds.begin(), rounds.end());
  rounds.erase(std::unique(rounds.begin(), rounds.end()), rounds.end());
  return rounds.size() - std::size_t(rounds.front() == 0);  // not d = 0, a rank to itself
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

Collective group_call(CollectiveType type, std::vector<std::vector<int>> groups, double bytes, std::string algorithm) {
  // By rank, not sorted: ZeRO-2's reduces in turn are a thousand groups of a thousand ranks. A
  // negative rank is left out, for add_collective() to refuse.
  std::vector<char> in;
  for (const auto& g : groups)
    for (const int r : g)
      if (r >= 0) {
        if (r >= int(in.size())) in.resize(std::size_t(r) + 1, 0);
        in[std::size_t(r)] = 1;
      }
  std::vector<int> members;
  for (std::size_t r = 0; r < in.size(); ++r)
    if (in[r]) members.push_back(int(r));
  Collective c{type, std::move(members), {bytes}, std::move(algorithm)};
  c.grouped = std::move(groups);
  return c;
}

Collective calls_in_turn(CollectiveType type, std::vector<std::vector<int>> groups, double bytes, std::string algorithm) {
  Collective c = group_call(type, std::move(groups), bytes, std::move(algorithm));
  c.in_turn = true;
  return c;
}

void TaskGraph::drop_collective_matrices() {
  for (auto& op : ops_)
    if (auto* c = std::get_if<Collective>(&op.body)) {
      if (c->type == CollectiveType::all_to_all && c->bytes.size() > 1) {
        const std::size_t n = c->group.size();
        c->sent.assign(n, 0.0);
        c->bytes.for_each(n, [&](std::size_t i, std::size_t, double b) { return c->sent[i] += b, true; });
      }
      const double total = c->total_bytes();
      c->bytes = {total};
      c->network_bytes = {};
    }
}

OpId TaskGraph::add_shifted(const Op& op, int rank_offset, std::vector<OpId> deps, std::string label, bool swap_comm) {
  Op copy;
  copy.rank = op.rank + rank_offset;
  copy.stream = !swap_comm || op.stream == Stream::compute ? op.stream : op.stream == Stream::comm ? Stream::comm2 : Stream::comm;
  copy.label = std::move(label);
  copy.deps = std::move(deps);
  copy.body = op.body;
  if (auto* t = std::get_if<Transfer>(&copy.body)) t->src += rank_offset, t->dst += rank_offset;
  if (auto* c = std::get_if<Collective>(&copy.body)) {
    for (int& r : c->group) r += rank_offset;
    for (auto& g : c->grouped)
      for (int& r : g) r += rank_offset;
  }
  if (auto* c = std::get_if<Computes>(&copy.body))
    for (int& r : c->ranks) r += rank_offset;
  return add(std::move(copy));  // a Computes op's parts numbered anew there
}

std::span<const int> Op::ranks() const {
  if (const auto* c = std::get_if<Collective>(&body)) return c->group;
  if (const auto* c = std::get_if<Computes>(&body)) return c->ranks;
  return {&rank, 1};
}

OpId TaskGraph::add(Op op) {
  op.id = OpId(ops_.size());
  op.phase = phase_of(op.label, op.body);
  auto bad = [&](const char* what) { return std::logic_error("TaskGraph: op '" + op.label + "' " + what); };
  for (OpId d : op.deps)
    if (d >= op.id) throw bad("depends on a later op");
  for (int r : op.ranks())
    if (r < 0 || r >= num_ranks_) throw bad("on a rank out of range");
  if (auto* c = std::get_if<Computes>(&op.body)) {
    std::vector<char> seen(std::size_t(num_ranks_), 0);
    for (int r : c->ranks)
      if (seen[std::size_t(r)]++) throw bad("has two parts on one rank");
    if (c->work_of.size() != c->parts()) throw bad("has a work for each part but not as many parts");
    for (auto w : c->work_of)
      if (!c->works || w >= c->works->size()) throw bad("names a work it does not have");
    c->first_part = parts_;
    parts_ += c->parts();
  }
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
  if (!c.grouped.empty() && c.type != CollectiveType::broadcast && c.type != CollectiveType::reduce)
    throw std::logic_error("TaskGraph: grouped collective '" + label + "' is not a broadcast or a reduce");
  if (!c.grouped.empty()) {  // a rank set, not a search of the group per member: a group call at 1,024 GPUs has thousands
    std::vector<char> in_group(std::size_t(num_ranks_), 0);
    for (int r : c.group)
      if (r >= 0 && r < num_ranks_) in_group[std::size_t(r)] = 1;
    for (const auto& g : c.grouped)
      for (int r : g)
        if (r < 0 || r >= num_ranks_ || !in_group[std::size_t(r)])
          throw std::logic_error("TaskGraph: grouped collective '" + label + "' has a member outside its group");
  }
  const int first = c.group.front();
  return add(Op{0, first, stream, std::move(label), std::move(deps), std::move(c)});
}

OpId TaskGraph::add_computes(std::string label, Computes c, std::vector<OpId> deps) {
  if (c.ranks.empty()) throw std::logic_error("TaskGraph: Computes op '" + label + "' has no parts");
  const int first = c.ranks.front();
  return add(Op{0, first, Stream::compute, std::move(label), std::move(deps), std::move(c)});
}

TaskGraph::Waits TaskGraph::waits() const {
  Waits w;
  w.of_op.resize(ops_.size());
  w.stream_pred.assign(parts_, kNoNode);
  w.op_of.resize(parts_);
  w.parts_from = Node(ops_.size());
  std::vector<Node> last(std::size_t(num_ranks_) * kNumStreams, kNoNode);
  for (const auto& op : ops_) {
    auto& p = w.of_op[op.id];
    p.assign(op.deps.begin(), op.deps.end());
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      for (std::size_t i = 0; i < c->parts(); ++i) {
        const std::size_t part = c->first_part + i;
        w.op_of[part] = op.id;
        Node& slot = last[std::size_t(c->ranks[i]) * kNumStreams + int(op.stream)];
        w.stream_pred[part] = slot;
        slot = w.parts_from + Node(part);
      }
    } else {
      for (int r : op.ranks()) {
        Node& slot = last[std::size_t(r) * kNumStreams + int(op.stream)];
        if (slot != kNoNode && (p.empty() || p.back() != slot)) p.push_back(slot);  // a run of one op's ranks: once
        slot = op.id;
      }
    }
    w.order(p);
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return w;
}

std::vector<std::vector<OpId>> TaskGraph::predecessors() const {
  const Waits w = waits();
  std::vector<std::vector<OpId>> preds(ops_.size());
  for (const auto& op : ops_) {
    auto& p = preds[op.id];
    for (Node n : w.of_op[op.id]) p.push_back(w.op(n));
    if (const auto* c = std::get_if<Computes>(&op.body)) {
      for (std::size_t i = 0; i < c->parts(); ++i)
        if (const Node n = w.stream_pred[c->first_part + i]; n != kNoNode) p.push_back(w.op(n));
    }
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  return preds;
}

double Timing::makespan() const { return end.empty() ? 0 : *std::max_element(end.begin(), end.end()); }

double Breakdown::total() const { return std::accumulate(std::begin(seconds), std::end(seconds), 0.0); }

Breakdown& Breakdown::operator+=(const Breakdown& o) {
  for (int p = 0; p < kNumPhases; ++p) seconds[p] += o.seconds[p];
  return *this;
}

Breakdown Breakdown::scaled(double f) const {
  Breakdown b = *this;
  for (double& x : b.seconds) x *= f;
  return b;
}

namespace {
void add_per_layer(std::vector<Breakdown>& to, const std::vector<Breakdown>& from) {
  if (to.size() < from.size()) to.resize(from.size());
  for (std::size_t l = 0; l < from.size(); ++l) to[l] += from[l];
}
}  // namespace

Attribution& Attribution::operator+=(const Attribution& o) {
  critical += o.critical;
  busy += o.busy;
  add_per_layer(layer_critical, o.layer_critical);
  add_per_layer(layer_busy, o.layer_busy);
  return *this;
}

Attribution Attribution::scaled(double f) const {
  Attribution a;
  a.critical = critical.scaled(f);
  a.busy = busy.scaled(f);
  for (const auto& b : layer_critical) a.layer_critical.push_back(b.scaled(f));
  for (const auto& b : layer_busy) a.layer_busy.push_back(b.scaled(f));
  return a;
}

double all_to_all_seconds(const Breakdown& b) { return b[Phase::dispatch] + b[Phase::combine]; }

double sparse_collective_seconds(const Breakdown& b) {
  return b[Phase::replica_broadcast] + b[Phase::replica_reduce] + b[Phase::parameter_gather] + b[Phase::expert_moves];
}

Attribution attribute(const TaskGraph& graph, const Timing& timing) {
  Attribution a;
  if (graph.size() == 0) return a;
  std::vector<int> layer(graph.size());
  int layers = 0;
  for (const auto& op : graph.ops()) layers = std::max(layers, (layer[op.id] = op_layer(op.label)) + 1);
  a.layer_critical.resize(std::size_t(layers));
  a.layer_busy.resize(std::size_t(layers));
  auto add = [&](Breakdown& total, std::vector<Breakdown>& per_layer, OpId id, Phase p, double seconds) {
    total.seconds[int(p)] += seconds;
    if (layer[id] >= 0) per_layer[std::size_t(layer[id])].seconds[int(p)] += seconds;
  };

  // Busy: each op's time on each GPU it occupies (a collective: every GPU of its group; a Computes
  // op: each part's on its own).
  const double per_gpu = 1.0 / graph.num_ranks();
  for (const auto& op : graph.ops()) {
    if (const auto* parts = std::get_if<Computes>(&op.body)) {
      for (std::size_t i = parts->first_part; i < parts->first_part + parts->parts(); ++i)
        add(a.busy, a.layer_busy, op.id, op.phase, (timing.part_end[i] - timing.part_start[i]) * per_gpu);
      continue;
    }
    const auto* c = std::get_if<Collective>(&op.body);
    const double gpus = c ? double(c->group.size()) : 1.0;
    add(a.busy, a.layer_busy, op.id, op.phase, (timing.end[op.id] - timing.start[op.id]) * gpus * per_gpu);
  }

  // The critical path, from the op that ends last back to the first, node by node: through a
  // Computes op, the part that ends last (the first of them), which waits for the op's deps and
  // the node before it on its stream.
  const auto w = graph.waits();
  const Node parts_from = w.parts_from;
  auto start_of = [&](Node n) { return n < parts_from ? timing.start[n] : timing.part_start[n - parts_from]; };
  auto end_of = [&](Node n) { return n < parts_from ? timing.end[n] : timing.part_end[n - parts_from]; };
  auto last_part = [&](Node n) {  // a Computes op: its part that ends last
    const auto* parts = n < parts_from ? std::get_if<Computes>(&graph.op(n).body) : nullptr;
    if (!parts) return n;
    std::size_t best = parts->first_part;
    for (std::size_t i = best; i < parts->first_part + parts->parts(); ++i)
      if (timing.part_end[i] > timing.part_end[best]) best = i;
    return parts_from + Node(best);
  };
  std::vector<Node> preds;
  Node cur = last_part(Node(std::max_element(timing.end.begin(), timing.end.end()) - timing.end.begin()));
  while (true) {
    const OpId id = w.op(cur);
    add(a.critical, a.layer_critical, id, graph.op(id).phase, end_of(cur) - start_of(cur));
    if (cur < parts_from) {
      preds = w.of_op[cur];
    } else {
      preds.assign(graph.op(id).deps.begin(), graph.op(id).deps.end());
      if (const Node s = w.stream_pred[cur - parts_from]; s != kNoNode) preds.push_back(s);
      w.order(preds);
    }
    if (preds.empty()) {
      add(a.critical, a.layer_critical, id, Phase::idle, start_of(cur));
      break;
    }
    Node best = preds.front();
    for (Node p : preds)
      if (end_of(p) > end_of(best)) best = p;
    add(a.critical, a.layer_critical, id, Phase::idle, start_of(cur) - end_of(best));
    cur = last_part(best);
  }
  return a;
}

}  // namespace moesim
