#include "parallel_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "cost_model.hpp"
#include "errors.hpp"
#include "rank_layout.hpp"

namespace moesim {

namespace {

constexpr const char* kDenseAllReduce = "allreduce.dense";  // LayerOps::build()'s label
constexpr int kMaxMicroBatches = 4096;

// Whether an op belongs to the backward pass: "[L<layer>.]bwd.<name>".
bool backward_op(std::string_view label) {
  if (op_layer(std::string(label)) >= 0) label.remove_prefix(label.find('.') + 1);
  return label.starts_with("bwd.");
}

// A cell's op under its name in the merged graph: its layer in the model's numbering, and with
// micro-batches its micro-batch ("L7.fwd.attention.mb3"); -1: once per iteration.
std::string merged_label(const std::string& label, int first_layer, int micro_batch) {
  const int layer = op_layer(label);
  std::string out = first_layer && layer >= 0 ? fmt::format("L{}{}", layer + first_layer, label.substr(label.find('.'))) : label;
  if (micro_batch >= 0) out += fmt::format(".mb{}", micro_batch);
  return out;
}

}  // namespace

std::vector<PipelineStage> pipeline_stages(const MoeModel& model, int pp) {
  const int dense = model.dense_layers(), blocks = dense + model.layers();
  if (pp < 1 || pp > blocks)
    throw FieldError("parallel.pp", fmt::format("{} stages (pp × chunks) for the model's {} blocks: at most one stage a block", pp, blocks));
  std::vector<PipelineStage> stages;
  for (int s = 0, begin = 0; s < pp; ++s) {
    const int end = begin + blocks / pp + (s < blocks % pp ? 1 : 0);
    PipelineStage st;
    st.dense_layers = std::max(0, std::min(end, dense) - begin);
    st.first_layer = std::max(begin, dense) - dense;
    st.layers = end - std::max(begin, dense);
    st.output = s == pp - 1;
    if (st.layers <= 0)
      throw FieldError("parallel.pp", fmt::format("stage {} of {} would hold only dense blocks (blocks {} to {}, the first {} dense): "
                                                  "every stage needs an MoE layer; use fewer stages",
                                                  s, pp, begin, end - 1, dense));
    stages.push_back(st);
    begin = end;
  }
  return stages;
}

MoeModel stage_model(const MoeModel& model, const PipelineStage& stage) {
  return model.blocks(stage.layers, stage.dense_layers, stage.output);
}

std::vector<PipelinePass> one_f_one_b(int stage, int stages, int micro_batches, int chunks) {
  const int p = stages, v = chunks, total = micro_batches * v;
  const int w = v == 1 ? std::min(p - stage - 1, total) : std::min(2 * (p - stage - 1) + (v - 1) * p, total);
  // The k-th forward (backward) pass: its micro-batch and chunk (Megatron's get_model_chunk_id and
  // get_microbatch_id_in_model_chunk).
  auto pass = [&](bool backward, int k) {
    const int chunk = (k % (p * v)) / p;
    return PipelinePass{backward, v == 1 ? k : (k / (p * v)) * p + k % p, backward ? v - 1 - chunk : chunk};
  };
  std::vector<PipelinePass> passes;
  for (int k = 0; k < w; ++k) passes.push_back(pass(false, k));
  for (int k = w; k < total; ++k) passes.push_back(pass(false, k)), passes.push_back(pass(true, k - w));
  for (int k = total - w; k < total; ++k) passes.push_back(pass(true, k));
  return passes;
}

std::vector<PipelinePass> dualpipe(int stage, int stages, int micro_batches) {
  const int ranks = stages, rank = stage, half_ranks = ranks / 2, half_rank = std::min(rank, ranks - 1 - rank);
  const int half_chunks = micro_batches / 2;
  const bool second_half = rank >= half_ranks, middle = rank == half_ranks - 1 || rank == half_ranks;
  std::vector<PipelinePass> passes;
  int next[2][2] = {{0, 0}, {0, 0}};  // [backward][direction]: the next micro-batch of each
  auto pass = [&](bool backward, int phase, bool overlapped = false) {
    const int direction = phase ^ int(second_half);  // "phase 0 means forward direction" in the first half
    passes.push_back({backward, next[backward][direction]++, direction, overlapped});
  };
  auto F = [&](int phase) { pass(false, phase); };
  auto B = [&](int phase) { pass(true, phase); };
  auto FB = [&](int f, int b) { F(f), pass(true, b, true); };    // _forward_backward_chunk(f, b)
  for (int i = 0; i < (half_ranks - half_rank - 1) * 2; ++i) F(0);  // step 1: nF0
  for (int i = 0; i < half_rank + 1; ++i) F(0), F(1);                // step 2: nF0F1
  for (int i = 0; i < half_ranks - half_rank - 1; ++i) B(1), F(1);   // step 3: nB1W1F1 (W inside B)
  for (int i = 0; i < half_chunks - ranks + half_rank + 1; ++i) {   // step 4 (main): nF0B1F1B0
    if (i == 0 && middle) F(0), B(1);                                // "we don't overlap these two chunks"
    else FB(0, 1);
    FB(1, 0);
  }
  for (int i = 0; i < half_ranks - half_rank - 1; ++i) B(1), FB(1, 0);  // step 5: nB1F1B0
  for (int i = 0; i < half_rank + 1; ++i) B(1), B(0);                   // step 6: nB1B0
  for (int i = 0; i < half_ranks - half_rank - 1; ++i) B(0);            // step 7: nWB0 (W inside B)
  return passes;                                                         // step 8: nW, nothing left
}

// Sea AI Lab's cut-in-half: DualPipeV on P stages is the first half of DualPipe on 2P stages with
// 2m micro-batches, each of its stages running one of DualPipe's (the way back its chunk 1).
std::vector<PipelinePass> dualpipe_v(int stage, int stages, int micro_batches) { return dualpipe(stage, 2 * stages, 2 * micro_batches); }

ParallelLayout parallel_layout(const spec::ParallelSpec& parallel, const Cluster& cluster) {
  const int G = cluster.num_gpus(), n = cluster.gpus_per_node();
  ParallelLayout out;
  out.pp = std::max(1, int(std::min<std::uint32_t>(parallel.pp(), 1u << 20)));
  if (G % out.pp != 0) throw FieldError("parallel.pp", fmt::format("{} pipeline stages do not divide the {} GPUs", out.pp, G));
  if (parallel.micro_batches() > kMaxMicroBatches)
    throw FieldError("parallel.micro_batches", fmt::format("{} micro-batches: at most {}", parallel.micro_batches(), kMaxMicroBatches));
  out.micro_batches = std::max(1, int(parallel.micro_batches()));
  out.chunks = std::max(1, int(std::min<std::uint32_t>(parallel.chunks(), 1u << 20)));
  if (const std::string& order = parallel.schedule(); order == "dualpipe" || order == "dualpipev") {
    const char* name = order == "dualpipe" ? "DualPipe" : "DualPipeV";
    if (out.chunks > 2) throw FieldError("parallel.chunks", fmt::format("{} holds 2 chunks a stage, not {}", name, out.chunks));
    if (out.micro_batches < 2 * out.pp)
      throw FieldError("parallel.micro_batches", fmt::format("{} needs at least 2 micro-batches a stage: {} for {} stages, not {}", name,
                                                             2 * out.pp, out.pp, out.micro_batches));
    if (order == "dualpipe" && (out.pp % 2 != 0 || out.micro_batches % 2 != 0))
      throw FieldError(out.pp % 2 ? "parallel.pp" : "parallel.micro_batches",
                       fmt::format("DualPipe feeds half the micro-batches from each end: pp ({}) and micro_batches ({}) even", out.pp,
                                   out.micro_batches));
    out.order = order == "dualpipe" ? ParallelLayout::Order::dualpipe : ParallelLayout::Order::dualpipe_v;
    out.chunks = 2;
  } else if (!order.empty() && order != "1f1b") {
    throw FieldError("parallel.schedule", "'" + order + "' is not a pipeline order: 1f1b (the default), dualpipe or dualpipev");
  }
  if (out.chunks > 1 && !out.dual() && out.micro_batches % out.pp != 0)
    throw FieldError("parallel.chunks", fmt::format("the interleaved order needs micro_batches ({}) a multiple of pp ({})",
                                                    out.micro_batches, out.pp));
  const int stage = G / out.pp;
  out.ep = parallel.ep() == 0 ? stage : int(std::min<std::uint32_t>(parallel.ep(), 1u << 20));
  if (out.ep > stage || stage % out.ep != 0)
    throw FieldError("parallel.ep", fmt::format("{} GPUs per EP group do not divide a stage's {} GPUs", out.ep, stage));
  if (out.ep % n != 0 && n % out.ep != 0)
    throw FieldError("parallel.ep", fmt::format("an EP group is whole nodes or a part of one: a multiple or a divisor of the {} GPUs "
                                                "per node, not {}", n, out.ep));
  out.dp = stage / out.ep;
  out.tp = std::max(1, int(std::min<std::uint32_t>(parallel.tp(), 1u << 20)));
  if (n % out.tp != 0)
    throw FieldError("parallel.tp", fmt::format("{} GPUs per tensor-parallel group do not divide a node's {}: a group is inside a node", out.tp, n));
  out.cp = std::max(1, int(std::min<std::uint32_t>(parallel.cp(), 1u << 20)));
  if (out.cp > 1 && out.ep % (out.tp * out.cp) != 0)
    throw FieldError("parallel.cp", fmt::format("{} GPUs per context-parallel group, {} GPUs with tensor parallelism's {}, do not divide "
                                                "an EP group's {}: a CP group is inside an EP group",
                                                out.cp, out.tp * out.cp, out.tp, out.ep));
  out.distributed_optimizer = parallel.distributed_optimizer();
  const std::string order = parallel.order().empty() ? "tp-cp-ep-dp-pp" : parallel.order();
  try {
    const RankLayout layout = RankLayout::named(order, {{"ep", out.ep}, {"dp", out.dp}, {"pp", out.pp}});
    if (layout.world_size() != G) throw std::invalid_argument("the order must name tp, cp, ep, dp and pp");
    out.groups = layout.groups("ep");
    for (const auto& g : out.groups) {
      out.stage.push_back(layout.coordinate(g.front(), "pp"));
      out.replica.push_back(layout.coordinate(g.front(), "dp"));
    }
  } catch (const std::invalid_argument& e) {
    throw FieldError("parallel.order", e.what());
  }
  for (const auto& g : out.groups)
    for (std::size_t i = 1; i < g.size(); ++i)
      if (g[i] != g[0] + int(i))
        throw FieldError("parallel.order", "'" + order + "' makes EP groups of GPUs that are not consecutive; for now an "
                                           "EP group is consecutive GPUs (ep before dp, as tp-cp-ep-dp-pp)");
  return out;
}

spec::ClusterSpec ep_group_cluster(const spec::ClusterSpec& whole, int ep) {
  spec::ClusterSpec s = whole;
  const int n = int(whole.node().gpus());
  if (ep >= n) {
    s.set_nodes(std::uint32_t(ep / n));
  } else {  // part of a node: its first ep GPUs, as every group of the node is alike
    *s.mutable_node() = first_gpus(whole.node(), ep);
    s.set_nodes(1);
  }
  return s;
}

LayoutIteration::LayoutIteration(const spec::ClusterSpec& whole, const MoeModel& model, ParallelLayout layout,
                                 const spec::PolicySpec& policy)
    : layout_(std::move(layout)) {
  const auto parts = pipeline_stages(model, layout_.model_parts());
  for (int v = 0; v < layout_.pp * layout_.chunks; ++v) stages_.push_back(parts[std::size_t(layout_.part_of(v))]);
  for (const auto& st : stages_) stage_models_.push_back(stage_model(model, st));
  if (layout_.groups.size() > 1 || layout_.micro_batches > 1) cell_cluster_.emplace(ep_group_cluster(whole, layout_.ep));
  cells_.resize(stages_.size() * std::size_t(layout_.dp));
  for (std::size_t g = 0; g < layout_.groups.size(); ++g) {
    const int s = layout_.stage[g], p = layout_.pp, m = layout_.micro_batches;
    orders_.push_back(layout_.order == ParallelLayout::Order::dualpipe     ? dualpipe(s, p, m)
                      : layout_.order == ParallelLayout::Order::dualpipe_v ? dualpipe_v(s, p, m)
                                                                           : one_f_one_b(s, p, m, layout_.chunks));
    std::vector<int> live(std::size_t(layout_.chunks), 0);  // per chunk: forwards not yet backward
    for (int chunk = 0; chunk < layout_.chunks; ++chunk) {
      Cell& cell = cells_[cell_at(layout_.virtual_stage(chunk, layout_.stage[g]), layout_.replica[g])];
      cell.stage = layout_.virtual_stage(chunk, layout_.stage[g]);
      cell.replica = layout_.replica[g];
      cell.gpus = layout_.groups[g];
      cell.policy = make_policy(policy);
    }
    for (const auto& pass : orders_.back()) {
      int& n = live[std::size_t(pass.chunk)];
      n += pass.backward ? -1 : 1;
      Cell& cell = cells_[cell_at(layout_.virtual_stage(pass.chunk, layout_.stage[g]), layout_.replica[g])];
      cell.in_flight = std::max(cell.in_flight, n);
    }
  }
}

TaskGraph LayoutIteration::build_iteration(const IterationInput& whole) {
  IterationInput in = whole;
  if (layout_.distributed_optimizer) in.dense_optimizer_shards = layout_.stage_gpus(), in.expert_optimizer_shards = layout_.dp;
  if (!cell_cluster_) return cells_.front().policy->build_iteration(in);
  const int ep = layout_.ep;
  // Each cell's micro-batch, on its own cluster and tokens, holding the activations of the
  // micro-batches its stage's order keeps in flight.
  std::vector<PolicyReport> reports(cells_.size());
  for (std::size_t c = 0; c < cells_.size(); ++c) {
    Cell& cell = cells_[c];
    const PipelineStage& st = stages_[std::size_t(cell.stage)];
    std::vector<RoutingMatrix> mine;
    for (int l = 0; l < st.layers; ++l) {
      const RoutingMatrix& R = in.routing.at(std::size_t(st.first_layer + l));
      if (R.sources != layout_.stage_gpus()) throw std::logic_error("LayoutIteration: routing not of a stage's GPUs");
      mine.push_back(R.rows(cell.replica * ep, (cell.replica + 1) * ep));
    }
    const IterationInput sub{*cell_cluster_,   stage_models_[std::size_t(cell.stage)], in.gpu, in.spec, mine, reports[c],
                             in.sizing,  cell.in_flight,
                             in.dense_optimizer_shards, in.expert_optimizer_shards};
    cell.last = cell.policy->build_iteration(sub);
    const auto& ops = cell.last.ops();
    OpId i = 0;
    while (i < ops.size() && ops[i].phase == Phase::expert_moves) ++i;
    cell.fwd = i;
    while (i < ops.size() && !backward_op(ops[i].label)) ++i;
    cell.bwd = i;
    while (i < ops.size() && ops[i].label != kDenseAllReduce) ++i;
    if (i == ops.size()) throw std::logic_error("LayoutIteration: a cell's iteration has no " + std::string(kDenseAllReduce));
    cell.reduce = i;
  }
  // The cells' figures; a GPU's chunks add up, and the memory of the GPUs that need the most is
  // the largest sum of an EP group's chunks' peaks.
  PolicyReport& r = in.report;
  r.gpu_load.assign(std::size_t(in.cluster.num_gpus()), 0.0);
  r.gpu_memory.assign(std::size_t(in.cluster.num_gpus()), 0.0);
  std::vector<MemoryUse> group_memory(layout_.groups.size()), group_states(layout_.groups.size());
  for (std::size_t c = 0; c < cells_.size(); ++c) {
    const PolicyReport& sub = reports[c];
    const Cell& cell = cells_[c];
    r.rerouted_tokens += sub.rerouted_tokens;
    r.shadowed_experts += sub.shadowed_experts;
    r.moved_experts += sub.moved_experts;
    r.decision_seconds += sub.decision_seconds;
    for (std::size_t i = 0; i < cell.gpus.size(); ++i) {
      if (i < sub.gpu_load.size()) r.gpu_load[std::size_t(cell.gpus[i])] += sub.gpu_load[i];
      if (i < sub.gpu_memory.size()) r.gpu_memory[std::size_t(cell.gpus[i])] += sub.gpu_memory[i];
    }
    const std::size_t group = std::size_t(layout_.stage_of(cell.stage) * layout_.dp + cell.replica);
    MemoryUse &mine = group_memory[group], &states = group_states[group];
    mine += sub.memory;
    states += sub.state_memory;
    if (mine.total() > r.memory.total()) r.memory = mine;
    if (states.states() > r.state_memory.states()) r.state_memory = states;
    r.parallel_r = std::max(r.parallel_r, sub.parallel_r);
    const std::size_t first = std::size_t(stages_[std::size_t(cell.stage)].first_layer);
    auto most = [&](std::vector<double>& into, const std::vector<double>& from) {
      into.resize(std::max(into.size(), first + from.size()), 0.0);
      for (std::size_t l = 0; l < from.size(); ++l) into[first + l] = std::max(into[first + l], from[l]);
    };
    most(r.load_stddev, sub.load_stddev);
    most(r.load_max_mean, sub.load_max_mean);
  }
  return merge(in);
}

TaskGraph LayoutIteration::merge(const IterationInput& in) {
  // m: the micro-batches through each virtual stage (DualPipe's: half of them each way, its way
  // back's numbered after the way down's in the labels).
  const int pp = layout_.pp, m = layout_.pipeline_micro_batches(), ep = layout_.ep;
  const bool dualpipe = layout_.order == ParallelLayout::Order::dualpipe;
  auto label_of = [&](const Cell& cell, int k) { return k < 0 || layout_.micro_batches == 1 ? -1 : dualpipe && cell.stage >= pp ? k + m : k; };
  // A virtual stage's neighbour in its pipeline, the way of a forward or a backward; -1: none (its
  // pipeline's end: DualPipe's two pipelines are virtual stages [0, pp) and [pp, 2·pp)).
  auto neighbour = [&](int s, bool backward) {
    const int parts = layout_.model_parts(), to = backward ? s - 1 : s + 1;
    return to < 0 || to >= int(stages_.size()) || to / parts != s / parts ? -1 : to;
  };
  TaskGraph out(in.cluster.num_gpus());
  std::size_t ops = 0;
  for (const Cell& cell : cells_) ops += cell.last.size() * std::size_t(m) + std::size_t(2 * m * ep);
  out.reserve(ops);
  // id[c][k][i]: cell c's op i of micro-batch k in the merged graph; its moves and what follows
  // its backward are once per iteration, under k = 0.
  std::vector<std::vector<std::vector<OpId>>> id(cells_.size());
  auto per_micro_batch = [&](const Cell& cell, OpId i) { return i >= cell.fwd && i < cell.reduce; };
  auto merged = [&](std::size_t c, int k, OpId i) { return id[c][std::size_t(per_micro_batch(cells_[c], i) ? k : 0)][i]; };
  // Op i of cell c in the merged graph, each micro-batch's copy of it (once if it is once).
  auto every_copy = [&](std::size_t c, OpId i, std::vector<OpId>& into) {
    for (int k = 0; k < (per_micro_batch(cells_[c], i) ? m : 1); ++k) into.push_back(merged(c, k, i));
  };
  // A pass to copy: cell c's ops [from, to) as micro-batch k's (k < 0: once). `arrived`: what its
  // first compute on each GPU waits for (the activations or gradients sent to it). `swap_comm`:
  // its communication on the other stream (TaskGraph::add_shifted()). As it is copied, `from`
  // moves on, `waiting` clears for each GPU whose first compute is in, and `last` has per place
  // the last compute on that GPU.
  struct Piece {
    std::size_t c;
    int k;
    OpId from, to;
    const std::vector<OpId>* arrived;
    bool swap_comm = false;
    std::vector<char> waiting{};
    std::vector<OpId> last{};
  };
  // Copies the pieces side by side (one, or DualPipe's F&B pair): each in turn up to and with its
  // next op off the compute stream, so that one's compute runs while the other communicates (on
  // each GPU's streams, ops run in the order they are added).
  auto copy = [&](std::vector<Piece>& pieces) {
    for (auto& p : pieces) p.waiting.assign(std::size_t(ep), !p.arrived->empty()), p.last.assign(std::size_t(ep), kNoNode);
    for (bool left = true; left;) {
      left = false;
      for (Piece& p : pieces) {
        const Cell& cell = cells_[p.c];
        const int first = stages_[std::size_t(cell.stage)].first_layer;
        while (p.from < p.to) {
          const Op& op = cell.last.op(p.from);
          std::vector<OpId> deps;
          for (OpId d : op.deps) deps.push_back(merged(p.c, p.k, d));
          const auto ranks = op.stream == Stream::compute ? op.ranks() : std::span<const int>{};
          if (std::any_of(ranks.begin(), ranks.end(), [&](int rank) { return p.waiting[std::size_t(rank)]; })) {
            deps.insert(deps.end(), p.arrived->begin(), p.arrived->end());
            for (int rank : ranks) p.waiting[std::size_t(rank)] = 0;
          }
          const OpId to_id = out.add_shifted(op, cell.gpus.front(), std::move(deps),
                                             merged_label(op.label, first, label_of(cell, p.k)), p.swap_comm);
          id[p.c][std::size_t(std::max(p.k, 0))][p.from++] = to_id;
          for (int rank : ranks) p.last[std::size_t(rank)] = to_id;
          if (op.stream != Stream::compute && pieces.size() > 1) break;  // the other piece's turn
        }
        left |= p.from < p.to;
      }
    }
  };
  for (std::size_t c = 0; c < cells_.size(); ++c) {
    id[c].assign(std::size_t(m), std::vector<OpId>(cells_[c].last.size(), 0));
    const std::vector<OpId> none;
    std::vector<Piece> moves{{c, -1, 0, cells_[c].fwd, &none}};
    copy(moves);  // its expert moves
  }
  // The passes in an order that has every EP group's in its stage's order (orders_) and every
  // transfer before the pass that waits for it. A virtual stage's forward sends to the next one
  // (the next stage, or from the last stage to the first stage's next chunk; at DualPipeV's turn
  // the same GPUs, which send nothing: the next part waits for their last computes), its backward
  // to the one before. Activations (and their gradients) of a micro-batch: a token's hidden vector
  // per token on each GPU.
  const double activation_bytes = double(in.model.tokens_per_gpu()) * in.model.token_bytes();
  std::vector<std::vector<std::vector<OpId>>> arrived_fwd(cells_.size(), std::vector<std::vector<OpId>>(std::size_t(m))),
      arrived_bwd = arrived_fwd;
  std::vector<std::size_t> next(orders_.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t g = 0; g < orders_.size(); ++g) {
      while (next[g] < orders_[g].size()) {
        // The pass, and the one overlapped with it.
        const std::size_t passes = next[g] + 1 < orders_[g].size() && orders_[g][next[g] + 1].overlapped ? 2 : 1;
        std::vector<Piece> pieces;
        bool ready = true;
        for (std::size_t j = 0; j < passes; ++j) {
          const auto [backward, k, chunk, overlapped] = orders_[g][next[g] + j];
          const int s = layout_.virtual_stage(chunk, layout_.stage[g]);
          const std::size_t c = cell_at(s, layout_.replica[g]);
          const Cell& cell = cells_[c];
          const auto& arrived = (backward ? arrived_bwd : arrived_fwd)[c][std::size_t(k)];
          ready &= !arrived.empty() || neighbour(s, !backward) < 0;  // or not yet sent
          pieces.push_back({c, k, backward ? cell.bwd : cell.fwd, backward ? cell.reduce : cell.bwd, &arrived, overlapped});
        }
        if (!ready) break;
        copy(pieces);
        for (std::size_t j = 0; j < passes; ++j) {
          const bool backward = orders_[g][next[g] + j].backward;
          const Piece& p = pieces[j];
          const Cell& cell = cells_[p.c];
          const int s = cell.stage, to_stage = neighbour(s, backward);
          if (to_stage < 0) continue;
          const std::size_t to = cell_at(to_stage, cell.replica);
          auto& into = (backward ? arrived_bwd : arrived_fwd)[to][std::size_t(p.k)];
          const bool turn = cells_[to].gpus == cell.gpus;  // DualPipeV's turn: nothing to send
          for (int place = 0; place < ep; ++place) {
            std::vector<OpId> deps;
            if (p.last[std::size_t(place)] != kNoNode) deps.push_back(p.last[std::size_t(place)]);
            if (turn) {
              into.insert(into.end(), deps.begin(), deps.end());
              continue;
            }
            into.push_back(out.add_transfer(Stream::comm2, fmt::format("stage_send.{}.s{}.mb{}.p{}", backward ? "bwd" : "fwd", s, p.k, place),
                                            {cell.gpus[std::size_t(place)], cells_[to].gpus[std::size_t(place)], activation_bytes},
                                            std::move(deps)));
          }
        }
        next[g] += passes;
        progress = true;
      }
    }
  }
  for (std::size_t g = 0; g < orders_.size(); ++g)
    if (next[g] != orders_[g].size()) throw std::logic_error("LayoutIteration: the pipeline's passes do not all run");
  // Each stage's gradients, once its cells' last backwards are done: the dense part's all-reduce
  // over the stage's GPUs and each place's experts' over the stage's groups, its chunks' together;
  // then each cell's optimizer and what follows it. DualPipe's stages s and pp − 1 − s hold the
  // same two parts (each the other's copy): they reduce together, as twice the groups.
  const CostModel cost(in.cluster, in.gpu);
  const std::string ar = collective_algorithm(in.spec, CollectiveType::all_reduce);
  for (int s = 0; s < (dualpipe ? pp / 2 : pp); ++s) {
    const std::vector<int> twins = dualpipe ? std::vector<int>{s, pp - 1 - s} : std::vector<int>{s};
    std::vector<std::size_t> mine;  // the stage's cells (and its twin's), chunk by chunk
    for (int t : twins)
      for (int chunk = 0; chunk < layout_.chunks; ++chunk)
        for (int d = 0; d < layout_.dp; ++d) mine.push_back(cell_at(layout_.virtual_stage(chunk, t), d));
    std::vector<OpId> backward_done;
    for (std::size_t c : mine)
      for (OpId d : cells_[c].last.op(cells_[c].reduce).deps) every_copy(c, d, backward_done);
    std::vector<int> gpus;  // the stage's: its EP groups'
    for (int t : twins)
      for (int d = 0; d < layout_.dp; ++d) gpus.insert(gpus.end(), cells_[cell_at(t, d)].gpus.begin(), cells_[cell_at(t, d)].gpus.end());
    std::sort(gpus.begin(), gpus.end());
    auto all_reduce = [&](const std::string& label, std::vector<int> group, double bytes) {
      const std::string algorithm = cost.all_reduce_algorithm(ar, group, bytes);
      return out.add_collective(Stream::comm, label, {CollectiveType::all_reduce, std::move(group), {bytes}, algorithm}, backward_done);
    };
    // A GPU's dense gradients and its share of the experts': E/ep experts of each of the stage's
    // MoE layers, every chunk's.
    double dense_bytes = 0, expert_bytes = 0;
    for (int chunk = 0; chunk < layout_.chunks; ++chunk) {
      const Cell& cell = cells_[cell_at(layout_.virtual_stage(chunk, s), 0)];
      dense_bytes += std::get<Collective>(cell.last.op(cell.reduce).body).total_bytes();
      const MoeModel& model = stage_models_[std::size_t(layout_.virtual_stage(chunk, s))];
      expert_bytes += double(model.experts()) / ep * model.layers() * model.expert_params() * model.dtype_bytes();
    }
    const OpId dense_ar = all_reduce(kDenseAllReduce, gpus, dense_bytes);
    std::vector<OpId> gradients;
    for (int place = 0; place < ep && layout_.dp * int(twins.size()) > 1; ++place) {
      std::vector<int> copies;
      for (int t : twins)
        for (int d = 0; d < layout_.dp; ++d) copies.push_back(cells_[cell_at(t, d)].gpus[std::size_t(place)]);
      std::sort(copies.begin(), copies.end());
      gradients.push_back(all_reduce(pp > 1 ? fmt::format("expert_allreduce.s{}.p{}", s, place) : fmt::format("expert_allreduce.p{}", place),
                                     std::move(copies), expert_bytes));
    }
    for (std::size_t c : mine) {
      Cell& cell = cells_[c];
      id[c][0][cell.reduce] = dense_ar;
      const int first = stages_[std::size_t(cell.stage)].first_layer;
      for (OpId i = cell.reduce + 1; i < cell.last.size(); ++i) {
        const Op& op = cell.last.op(i);
        std::vector<OpId> deps;
        for (OpId d : op.deps) {
          every_copy(c, d, deps);
          if (d == cell.reduce) deps.insert(deps.end(), gradients.begin(), gradients.end());
        }
        id[c][0][i] = out.add_shifted(op, cell.gpus.front(), std::move(deps), merged_label(op.label, first, -1));
      }
      cell.merged.resize(cell.last.size());
      for (OpId i = 0; i < cell.last.size(); ++i) cell.merged[i] = merged(c, m - 1, i);
    }
  }
  return out;
}

void LayoutIteration::observe(const TaskGraph& graph, const Timing& timing) {
  if (!cell_cluster_) return cells_.front().policy->observe(graph, timing);
  for (Cell& cell : cells_) {
    const TaskGraph& sub = cell.last;
    Timing mine;
    mine.start.resize(sub.size());
    mine.end.resize(sub.size());
    mine.part_start.resize(sub.num_parts());
    mine.part_end.resize(sub.num_parts());
    for (const Op& op : sub.ops()) {
      const OpId to = cell.merged[op.id];
      mine.start[op.id] = timing.start[to];
      mine.end[op.id] = timing.end[to];
      if (const auto* c = std::get_if<Computes>(&op.body)) {
        const std::size_t at = std::get<Computes>(graph.op(to).body).first_part;
        for (std::size_t k = 0; k < c->parts(); ++k) {
          mine.part_start[c->first_part + k] = timing.part_start[at + k];
          mine.part_end[c->first_part + k] = timing.part_end[at + k];
        }
      }
    }
    cell.policy->observe(sub, mine);
  }
}

}  // namespace moesim
