#include "moe_iteration.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "memory_model.hpp"
#include "schedule/layer_ops.hpp"

namespace moesim {

Replica everywhere(int expert, int experts, int gpus) {
  Replica r{expert, {}};
  for (int g = 0; g < gpus; ++g)
    if (g != expert_owner(expert, experts, gpus)) r.holders.push_back(g);
  return r;
}

int expert_target(const LayerPlan& plan, const Cluster& cluster, int src, int e) {
  const Replica* rep = nullptr;
  for (const auto& r : plan.replicas)
    if (r.expert == e) rep = &r;
  if (!rep) return plan_owner(plan, e, cluster.num_gpus());
  return replica_targets(plan, *rep, cluster)[std::size_t(src)];
}

std::vector<int> replica_targets(const LayerPlan& plan, const Replica& rep, const Cluster& cluster) {
  return replica_targets(rep, cluster, plan_owner(plan, rep.expert, cluster.num_gpus()), plan.even_replica_loads ? &plan.routing : nullptr);
}

std::vector<int> replica_targets(const Replica& rep, const Cluster& cluster, int owner, const RoutingMatrix* even_loads) {
  const int G = cluster.num_gpus();
  std::vector<int> copies{owner};
  copies.insert(copies.end(), rep.holders.begin(), rep.holders.end());
  if (even_loads) {  // longest processing time first: each source to the copy with the fewest tokens
    std::vector<int> sources(static_cast<std::size_t>(G));
    std::iota(sources.begin(), sources.end(), 0);
    auto tokens = [&](int s) { return even_loads->at(s, rep.expert); };
    std::stable_sort(sources.begin(), sources.end(), [&](int a, int b) { return tokens(a) > tokens(b); });
    std::vector<std::int64_t> load(copies.size(), 0);
    std::vector<int> target(static_cast<std::size_t>(G));
    for (int s : sources) {
      const auto c = std::size_t(std::min_element(load.begin(), load.end()) - load.begin());
      load[c] += std::int64_t(tokens(s));
      target[std::size_t(s)] = copies[c];
    }
    return target;
  }
  std::vector<std::vector<int>> near(std::size_t(cluster.nodes()));  // copies per node, in order
  std::vector<int> target(std::size_t(G), -1);
  for (int c : copies) {
    near[std::size_t(cluster.node_of(c))].push_back(c);
    target[std::size_t(c)] = c;
  }
  for (int s = 0; s < G; ++s) {
    if (target[std::size_t(s)] >= 0) continue;
    const auto& on_node = near[std::size_t(cluster.node_of(s))];
    const auto& pool = on_node.empty() ? copies : on_node;
    target[std::size_t(s)] = pool[std::size_t(s) % pool.size()];
  }
  return target;
}

const LayerSchedule& IterationPlan::layer_schedule() const {
  static const auto sequential = sequential_schedule();
  return schedule ? *schedule : *sequential;
}

std::vector<Gemm> backward_gemms(const std::vector<Gemm>& forward) {
  std::vector<Gemm> out;
  for (const auto& g : forward) {
    out.push_back({g.m, g.k, g.n, g.batch, g.repeat, false, true});
    out.push_back({g.k, g.n, g.m, g.batch, g.repeat, true, false});
  }
  return out;
}

std::string LayerOps::label(int l, Pass pass, const std::string& what) { return fmt::format("L{}.{}.{}", l, pass_name(pass), what); }

LayerOps::LayerOps(const IterationInput& in, const IterationPlan& plan)
    : in_(in), plan_(plan), schedule_(plan.layer_schedule()), placement_(schedule_.placement()), replicas_(plan.replicas),
      cost_(in.cluster, in.gpu), gpus_(in.cluster.num_gpus()), experts_(in.model.experts()), graph_(gpus_), everyone_(gpus_),
      target_(plan.layers.size()), bcast_(plan.layers.size()) {
  const auto& plans = plan.layers;
  const int G = gpus_, E = experts_;
  for (int r = 0; r < G; ++r) everyone_[r] = r;
  a2a_ = plan.all_to_all.empty() ? collective_algorithm(in.spec, CollectiveType::all_to_all) : plan.all_to_all;
  ar_ = collective_algorithm(in.spec, CollectiveType::all_reduce);
  token_bytes_ = in.model.token_bytes();
  const double T = in.model.tokens_per_gpu(), k = in.model.top_k();
  scores_bytes_ = 2 * T * E * 4;             // softmax + top-k over fp32 scores
  permute_bytes_ = 2 * T * k * token_bytes_;  // read + write each routed token
  expert_bytes_ = in.model.expert_params() * in.model.dtype_bytes();
  const bool zero = placement_.kind == ExpertPlacement::data_parallel;
  const bool sharded = placement_.kind == ExpertPlacement::sharded;
  for (std::size_t l = 0; l < plans.size(); ++l) {
    // Where each source's tokens for each expert are computed (target()).
    const bool by_pair = !zero && !sharded && !plans[l].replicas.empty();
    if (!zero) {
      target_[l].resize(by_pair ? std::size_t(G) * E : std::size_t(E));
      for (std::size_t k = 0; k < target_[l].size(); ++k) {
        const int e = int(k % std::size_t(E));
        target_[l][k] = sharded ? e * (G / E) : owner(int(l), e);
      }
    }
    // sole_target(): by expert, the GPU every source's tokens go to (ZeRO: each GPU its own), or −1.
    auto& sole = sole_target_.emplace_back(std::size_t(E), G == 1 ? 0 : -1);
    if (!zero)
      for (int e = 0; e < E; ++e) sole[std::size_t(e)] = target_[l][std::size_t(e)];  // source 0's: everyone's until a replica
    if (by_pair)
      for (const auto& rep : plans[l].replicas) {  // as expert_target(), a replica at a time
        const auto t = replica_targets(plans[l], rep, in.cluster);
        for (int s = 0; s < G; ++s) target_[l][std::size_t(s) * E + rep.expert] = t[std::size_t(s)];
        const bool one_gpu = std::all_of(t.begin(), t.end(), [&](int x) { return x == t.front(); });
        sole[std::size_t(rep.expert)] = one_gpu ? t.front() : -1;
      }
    // The experts each GPU computes this layer (its own, and copies some source sends it), so
    // that building a GPU's expert op costs its experts × sources, not all experts × sources.
    computes_.emplace_back(G);
    const auto& R = plans[l].routing;
    auto& on_gpu = computes_[l];
    if (zero) continue;  // every GPU its own tokens, every expert: row s of the routing (expert_work())
    // An expert whose every source's tokens go to one GPU: its column's sum there, all the GPU's
    // own tokens when no other source sends any. Summed row by row, as the counts are stored.
    std::vector<std::int64_t> load(std::size_t(E), 0);
    std::vector<std::uint8_t> others(std::size_t(E), 0);  // a source other than that GPU sends some
    R.counts().visit([&](const auto* row) {
      for (int s = 0; s < G; ++s, row += E)
        for (int e = 0; e < E; ++e) {
          load[std::size_t(e)] += row[e];
          others[std::size_t(e)] |= std::uint8_t((row[e] != 0) & (s != sole[std::size_t(e)]));
        }
    });
    for (int e = 0; e < E; ++e)
      if (const int t = sole[std::size_t(e)]; t >= 0 && load[std::size_t(e)] > 0)
        on_gpu[std::size_t(t)].push_back({e, load[std::size_t(e)], by_pair && !others[std::size_t(e)]});
    // An expert whose copies take some sources' tokens: each GPU's share, down its column.
    std::vector<std::int32_t> at(std::size_t(G), -1);  // GPU -> the expert's place in its list
    for (int e = 0; e < E; ++e) {
      if (sole[std::size_t(e)] >= 0) continue;
      std::fill(at.begin(), at.end(), -1);
      for (int s = 0; s < G; ++s) {
        const std::int64_t x = R.at(s, e);
        if (x == 0) continue;
        const int t = target(int(l), s, e);
        auto& k = at[std::size_t(t)];
        if (k < 0) k = std::int32_t(on_gpu[std::size_t(t)].size()), on_gpu[std::size_t(t)].push_back({e, 0, true});
        auto& share = on_gpu[std::size_t(t)][std::size_t(k)];
        share.tokens += x;
        share.local = share.local && s == t;
      }
    }
    if (by_pair)
      for (auto& list : on_gpu) std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.expert < b.expert; });
  }
  for (const auto& on_gpu : computes_) {
    auto& remote = remote_.emplace_back(on_gpu.size());
    for (std::size_t r = 0; r < on_gpu.size(); ++r)
      for (std::size_t k = 0; k < on_gpu[r].size(); ++k)
        if (!on_gpu[r][k].local) remote[r].push_back(std::uint32_t(k));
  }
  account_iteration(in, plan, computes_);
  trans_sent_.assign(plans.size(), 0);
  agg_sent_.assign(plans.size(), 0);
}

TaskGraph LayerOps::build() {
  const int L = in_.model.layers(), G = gpus_;
  // EP: an expert op per GPU in each layer's forward and backward, and a few dozen ops a layer; others grow it.
  graph_.reserve(std::size_t(G) * std::size_t(2 * L + 1) + 64 * std::size_t(L));
  const auto dense = in_.model.dense_forward_gemms();
  const double dense_bytes = in_.model.dense_forward_memory_bytes();  // softmax, dropout, norms
  // The backward's: each forward GEMM's two, and FlashAttention's recomputed scores.
  auto with_recompute = [&](std::vector<Gemm> gemms) {
    for (const auto& g : in_.model.attention_recompute_gemms()) gemms.push_back(g);
    return gemms;
  };
  const auto dense_backward = with_recompute(backward_gemms(dense));
  const Gemm gate = in_.model.gate_gemm();
  using RS = ReplicaSchedule;
  const RS mode = replicas_.timing;
  const bool zero = placement_.kind == ExpertPlacement::data_parallel;
  // The MoE FFN alone (model.moe_layer_only): no attention, nothing after the backward.
  const bool layer_only = in_.model.spec().moe_layer_only();
  // Experts changing owner move with their parameters and Adam states before anything else runs
  // (SmartMoE's rearrangement is on the critical path).
  std::vector<OpId> migrated;
  const auto states = state_bytes(in_.model.dtype());
  for (int l = 0; l < L; ++l)
    for (const auto& m : plan_.layers[std::size_t(l)].migrations)
      migrated.push_back(graph_.add_transfer(Stream::comm, fmt::format("L{}.migrate.e{}", l, m.expert),
                                             {m.from, m.to, in_.model.expert_params() * (states.param + states.optimizer)}));
  const std::vector<OpId> start = migrated.empty() ? std::vector<OpId>{} : std::vector<OpId>{join("migrations_done", migrated)};
  // Dense blocks (DeepSeek-V3's first three) before the MoE blocks: attention and a dense FFN on
  // each GPU's own tokens, no communication but their gradients' share of the dense all-reduce.
  const auto dense_blocks = in_.model.dense_block_gemms();
  const double dense_block_bytes = in_.model.dense_layers() * dense_bytes;
  auto repeated = [&](std::vector<Gemm> gemms) {
    for (auto& g : gemms) g.repeat *= std::uint64_t(in_.model.dense_layers());
    return gemms;
  };
  // Tensor parallelism (tp > 1, with sequence parallelism): a tensor-parallel op (attention, the
  // dense blocks, the output layer) runs between an all-gather of its group's input and a
  // reduce-scatter of its output, of `tensors` tensors each (a dense block has two TP ops).
  const bool tp = in_.model.tp() > 1;
  std::vector<OpId> scattered;  // the last reduce-scatters, which the next compute waits for
  auto tp_op = [&](const std::string& pass, const std::string& what, int tensors, std::vector<OpId> deps,
                   const std::function<OpId(std::vector<OpId>)>& op) {
    if (!tp) return op(std::move(deps));
    const OpId id = op(tp_collectives(pass + ".tp_allgather" + what, CollectiveType::all_gather, tensors, std::move(deps)));
    scattered = tp_collectives(pass + ".tp_reduce_scatter" + what, CollectiveType::reduce_scatter, tensors, {id});
    return id;
  };
  // Context parallelism (cp > 1): beside each attention (of `blocks` blocks), its keys and values
  // exchanged across the CP group (cp_collectives), issued with what the attention waits for, after
  // its TP all-gather (ring attention overlaps the exchange with the slices' scores); the next
  // compute waits for the exchange too (`exchanged`). The ring's fill and drain, the QKV projection before the first
  // send and the last slice's scores after the last arrival, are not modelled.
  const bool cp = in_.model.cp() > 1;
  std::vector<OpId> exchanged;
  auto cp_beside = [&](const std::string& pass, const std::string& what, int blocks, Pass direction, const std::vector<OpId>& deps) {
    if (cp) exchanged = cp_collectives(pass, what, blocks, direction, deps);
  };
  // What the compute after an attention waits for: its TP reduce-scatters and its CP exchange.
  auto after_attention = [&] {
    std::vector<OpId> deps = tp ? scattered : std::vector<OpId>{};
    deps.insert(deps.end(), exchanged.begin(), exchanged.end());
    return deps;
  };
  std::vector<OpId> before_layer = start;  // with tp: what layer l's all-gather waits for; with cp, its exchange
  if (!dense_blocks.empty()) {
    const OpId blocks = tp_op("fwd", ".blocks", 2 * in_.model.dense_layers(), start, [&](std::vector<OpId> deps) {
      cp_beside("fwd", ".blocks", in_.model.dense_layers(), Pass::forward, deps);
      return every_gpu("fwd.dense_blocks", {ComputeKind::gemm, repeated(dense_blocks), dense_block_bytes}, std::move(deps));
    });
    before_layer = tp ? scattered : std::vector<OpId>{blocks};
    before_layer.insert(before_layer.end(), exchanged.begin(), exchanged.end());
  }
  if (mode == RS::second_stream && L > 0) broadcast_replicas(0, Stream::comm2);
  for (int l = 0; l < L; ++l) {
    if (mode == RS::second_stream && l + 1 < L) broadcast_replicas(l + 1, Stream::comm2);  // under layer l
    if (mode == RS::under_attention) broadcast_replicas(l, Stream::comm, l == 0 ? start : std::vector<OpId>{});  // spAG under attention_l
    if (!layer_only)
      tp_op(fmt::format("L{}.fwd", l), "", 1, tp ? before_layer : l == 0 ? start : std::vector<OpId>{}, [&](std::vector<OpId> deps) {
        cp_beside(fmt::format("L{}.fwd", l), "", 1, Pass::forward, tp ? deps : before_layer);  // not before the last layer's decode
        return every_gpu(fmt::format("L{}.fwd.attention", l), {ComputeKind::gemm, dense, dense_bytes}, std::move(deps));
      });
    every_gpu(fmt::format("L{}.fwd.gate", l), {ComputeKind::gate, {gate}, scores_bytes_}, layer_only && l == 0 ? start : after_attention());
    ready_ = {every_gpu(fmt::format("L{}.fwd.encode", l), [&](int r) { return codec(l, r, ComputeKind::encode, Pass::forward); })};
    if (!zero && G > 1) {  // ready_: after the host has the counts (or the capacity)
      const DispatchSizing sizing = plan_.sizing.value_or(in_.sizing);
      if (sizing == DispatchSizing::counts) exchange_counts(l);
      else if (sizing == DispatchSizing::group_max) agree_capacity(l);
    }
    if (plan_.shadow_search && G > 1) search_shadows(l);           // ready_: after the host has them all
    if (mode == RS::block_wise && l == 0) broadcast_replicas(l, Stream::comm);
    if (mode == RS::stream_order || mode == RS::exposed) broadcast_replicas(l, Stream::comm, ready_);
    broadcast_late(l);  // Hecate's calibrated copies, after the gate
    shared_experts(l, Pass::forward);
    const OpId done = schedule_.emit(*this, l, Pass::forward);
    if (mode == RS::block_wise && l + 1 < L) broadcast_replicas(l + 1, Stream::comm);  // SubTrans2, the rest
    before_layer = {every_gpu(fmt::format("L{}.fwd.decode", l),
                              [&](int r) { return codec(l, r, ComputeKind::decode, Pass::forward); }, {done})};
  }
  // The output projection and its loss, forward then backward, between the blocks' two passes
  // (the embedding lookup and its gradient are counted in its bytes).
  const auto output = in_.model.output_forward_gemms();
  if (!output.empty()) {
    auto both = output;
    for (const auto& g : backward_gemms(output)) both.push_back(g);
    tp_op("fwd", ".output", 1, tp ? before_layer : std::vector<OpId>{}, [&](std::vector<OpId> deps) {
      return every_gpu("output", {ComputeKind::gemm, both, in_.model.output_memory_bytes()}, std::move(deps));
    });
  }
  for (int l = L - 1; l >= 0; --l) {
    ready_ = {every_gpu(fmt::format("L{}.bwd.decode", l), [&](int r) { return codec(l, r, ComputeKind::decode, Pass::backward); },
                        after_attention())};
    shared_experts(l, Pass::backward);
    const OpId done = schedule_.emit(*this, l, Pass::backward);
    // Replicas' gradients go back to their owners (a reduce each): on the second stream, under
    // the rest of the backward, with second_stream; after the layer otherwise; block_wise keeps
    // part of them for the next layer's experts (see ReplicaSchedule).
    std::vector<OpId> after{done};
    if (mode == RS::block_wise) {
      if (l + 1 < L) reduce_replicas(l + 1, Stream::comm);  // SubAgg2 left over (smart schedule)
      const int n = int(plan_.layers[std::size_t(l)].replicas.size());
      reduce_replicas(l, Stream::comm, l == 0 ? n : std::min(n, replicas_.agg_under_dense));  // SubAgg1
    } else {
      const std::size_t before = reduces_.size();
      reduce_replicas(l, mode == RS::second_stream ? Stream::comm2 : Stream::comm);
      if (mode == RS::exposed) after.insert(after.end(), reduces_.begin() + std::ptrdiff_t(before), reduces_.end());
    }
    if (replicas_.rematerialize && l > 0) regather_replicas(l - 1);  // under attention_l's backward
    every_gpu(fmt::format("L{}.bwd.encode", l), [&](int r) { return codec(l, r, ComputeKind::encode, Pass::backward); }, after);
    const OpId gate_done = every_gpu(fmt::format("L{}.bwd.gate", l), {ComputeKind::gate, backward_gemms({gate}), scores_bytes_});
    if (layer_only) {
      ready_ = {gate_done};
      continue;
    }
    ready_ = {tp_op(fmt::format("L{}.bwd", l), "", 1, {gate_done}, [&](std::vector<OpId> deps) {
      cp_beside(fmt::format("L{}.bwd", l), "", 1, Pass::backward, deps);
      return every_gpu(fmt::format("L{}.bwd.attention", l), {ComputeKind::gemm, dense_backward, 2 * dense_bytes}, std::move(deps));
    })};
  }
  if (!dense_blocks.empty()) {
    const std::vector<OpId> after = after_attention();
    std::vector<OpId> issued = after;  // the blocks' backward follows the last attention's
    issued.insert(issued.end(), ready_.begin(), ready_.end());
    ready_ = {tp_op("bwd", ".blocks", 2 * in_.model.dense_layers(), after, [&](std::vector<OpId> deps) {
      cp_beside("bwd", ".blocks", in_.model.dense_layers(), Pass::backward, tp ? deps : issued);
      return every_gpu("bwd.dense_blocks", {ComputeKind::gemm, repeated(with_recompute(backward_gemms(dense_blocks))), 2 * dense_block_bytes},
                       std::move(deps));
    })};
  }
  // A layer benchmark ends with the backward: it neither all-reduces nor steps.
  if (layer_only) return std::move(graph_);
  // Data parallelism over all GPUs for the dense parameters; each expert has one owner. ZeRO
  // reduce-scatters the layers' dense gradients with the experts' (schedule/zero.cpp) and shards
  // their optimizer states: only the parameters outside the layers are all-reduced here.
  const double layered = L * in_.model.layer_dense_params_per_gpu();
  const double dense_params = in_.model.dense_params_per_gpu() - (zero ? layered : 0);
  std::vector<OpId> before_ar(ready_);
  for (const OpId id : after_attention()) before_ar.push_back(id);
  before_ar.insert(before_ar.end(), reduces_.begin(), reduces_.end());
  const OpId allreduce = graph_.add_collective(
      Stream::comm, "allreduce.dense",
      {CollectiveType::all_reduce, everyone_, {dense_params * in_.model.dtype_bytes()},
       all_reduce_algorithm(everyone_, dense_params * in_.model.dtype_bytes())},
      before_ar);
  // Adam with fp32 master weights and moments: read p, m, v (fp32) and g; write p, m, v and the
  // low-precision copy.
  const double params = dense_params / in_.dense_optimizer_shards + (zero ? layered / G : 0) +
                        double(experts_) / G * L * in_.model.expert_params() / in_.expert_optimizer_shards;  // E/G experts, or 1/s of one
  const double adam_bytes = params * (6 * 4 + 2 * in_.model.dtype_bytes());
  const std::vector<OpId> steps{every_gpu("optimizer", {ComputeKind::optimizer, {}, adam_bytes}, {allreduce})};
  schedule_.after_optimizer(*this, steps);
  return std::move(graph_);
}

std::vector<OpId> LayerOps::cp_collectives(const std::string& pass, const std::string& what, int blocks, Pass direction,
                                           const std::vector<OpId>& deps) {
  const int tp = in_.model.tp(), cp = in_.model.cp();
  const double bytes = blocks * in_.model.kv_gathered_bytes();
  std::vector<OpId> ops;
  for (int first = 0; first < gpus_; first += tp * cp)
    for (int j = 0; j < tp; ++j) {
      std::vector<int> group;
      for (int i = 0; i < cp; ++i) group.push_back(first + j + i * tp);
      const int g = first / cp + j;
      ops.push_back(graph_.add_collective(Stream::comm, fmt::format("{}.cp_allgather{}.g{}", pass, what, g),
                                          {CollectiveType::all_gather, group, {bytes}, "ring"}, deps));
      if (direction == Pass::backward)
        ops.push_back(graph_.add_collective(Stream::comm, fmt::format("{}.cp_reduce_scatter{}.g{}", pass, what, g),
                                            {CollectiveType::reduce_scatter, std::move(group), {bytes}, "ring"}, deps));
    }
  return ops;
}

std::vector<OpId> LayerOps::tp_collectives(const std::string& label, CollectiveType type, int tensors, std::vector<OpId> deps) {
  const int tp = in_.model.tp();
  const double bytes = tensors * double(in_.model.group_tokens()) * in_.model.token_bytes();
  std::vector<OpId> ops;
  for (int first = 0; first < gpus_; first += tp) {
    std::vector<int> group(static_cast<std::size_t>(tp));
    std::iota(group.begin(), group.end(), first);
    ops.push_back(graph_.add_collective(Stream::comm, fmt::format("{}.g{}", label, first / tp), {type, std::move(group), {bytes}, "ring"}, deps));
  }
  return ops;
}

OpId LayerOps::collective(Stream stream, std::string label, Collective c, std::vector<OpId> deps) {
  return graph_.add_collective(stream, std::move(label), std::move(c), std::move(deps));
}

OpId LayerOps::compute(int rank, std::string label, Compute c, std::vector<OpId> deps) {
  return graph_.add_compute(rank, std::move(label), std::move(c), std::move(deps));
}

OpId LayerOps::every_gpu(std::string label, const std::function<Compute(int)>& work, std::vector<OpId> deps) {
  Computes c;
  c.ranks = everyone_;
  c.work_of.reserve(std::size_t(gpus_));
  std::map<Compute, std::uint32_t> index;  // a work -> its place in works
  std::vector<Compute> works;
  for (int r = 0; r < gpus_; ++r) {
    Compute w = work(r);
    const auto [it, fresh] = index.try_emplace(w, std::uint32_t(works.size()));
    if (fresh) works.push_back(std::move(w));
    c.work_of.push_back(it->second);
  }
  c.works = make_works(std::move(works));
  return graph_.add_computes(std::move(label), std::move(c), std::move(deps));
}

OpId LayerOps::every_gpu(std::string label, Compute work, std::vector<OpId> deps) {
  return graph_.add_computes(std::move(label), {everyone_, make_works({std::move(work)}), std::vector<std::uint32_t>(std::size_t(gpus_), 0)},
                             std::move(deps));
}

// Shared experts (DeepSeek-V3's): every GPU runs them on all its tokens, on the compute stream after
// the encode, so that they overlap the dispatch as DeepSeek-V3 overlaps them; the layer's routed
// experts follow them on the stream.
void LayerOps::shared_experts(int l, Pass pass) {
  const auto gemms = in_.model.shared_expert_gemms();
  if (gemms.empty()) return;
  // After each GPU's encode (or its host sync, or its backward decode) by its stream's order.
  every_gpu(label(l, pass, "shared_experts"), {ComputeKind::grouped_gemm, pass == Pass::backward ? backward_gemms(gemms) : gemms, 0});
}

// The spec's all-reduce algorithm for these bytes over this group (CostModel::all_reduce_algorithm()).
std::string LayerOps::all_reduce_algorithm(const std::vector<int>& group, double bytes) const {
  return cost_.all_reduce_algorithm(ar_, group, bytes);
}

// The group of a replica's broadcast / reduce: its owner (the root) first, then holders
// [from, to) (all); the ring algorithm orders them into NCCL's rings (collectives/rings.cpp).
std::vector<int> LayerOps::group_of(int l, const Replica& rep, std::size_t from, std::size_t to) const {
  std::vector<int> chain{owner(l, rep.expert)};
  to = std::min(to, rep.holders.size());
  chain.insert(chain.end(), rep.holders.begin() + std::ptrdiff_t(std::min(from, to)), rep.holders.begin() + std::ptrdiff_t(to));
  return chain;
}

namespace {
// Holders that get their copy with the replica's first broadcast (the others after the gate).
std::size_t early(const Replica& rep) { return rep.holders.size() - std::size_t(rep.late); }
}  // namespace

// The replicas' broadcasts or reduces `groups` (each the replica's owner first; experts[i] is
// groups[i]'s), one op for all ("<label>.e<expert>+<expert>+...", the experts in the order of
// Collective::grouped; "<label>.e<expert>" for one) after `deps`: NCCL calls one after another on
// `stream` (Collective::in_turn), or, with ReplicaOptions::grouped, an NCCL group call that runs
// them at the same time. Nothing when there are no groups.
std::optional<OpId> LayerOps::replica_collectives(Stream stream, const std::string& label, CollectiveType type,
                                                  std::vector<std::vector<int>> groups, const std::vector<int>& experts,
                                                  std::vector<OpId> deps) {
  if (groups.empty()) return std::nullopt;
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  Collective c = groups.size() == 1 ? Collective{type, std::move(groups.front()), {expert_bytes_}, "ring"}
                 : replicas_.grouped ? group_call(type, std::move(groups), expert_bytes_, "ring")
                                     : calls_in_turn(type, std::move(groups), expert_bytes_, "ring");
  return graph_.add_collective(stream, fmt::format("{}.e{}", label, fmt::join(experts, "+")), std::move(c), std::move(deps));
}

// The broadcasts of layer l's replicas not yet sent, up to the first `limit` of them.
void LayerOps::broadcast_replicas(int l, Stream stream, const std::vector<OpId>& deps, int limit) {
  const auto& reps = plan_.layers[std::size_t(l)].replicas;
  const int end = limit < 0 ? int(reps.size()) : std::min(limit, int(reps.size()));
  if (replicas_.persistent) return;  // the copies are already there
  std::vector<std::vector<int>> groups;
  std::vector<int> experts;
  for (int& i = trans_sent_[std::size_t(l)]; i < end; ++i)
    if (const Replica& rep = reps[std::size_t(i)]; early(rep) > 0) {
      groups.push_back(group_of(l, rep, 0, early(rep)));
      experts.push_back(rep.expert);
    }
  if (const auto id = replica_collectives(stream, fmt::format("L{}.fwd.replica_bcast", l), CollectiveType::broadcast, std::move(groups), experts, deps))
    for (const int e : experts) bcast_[std::size_t(l)][e] = *id;
}

// Hecate's calibration (docs/spec/hecate.md §4.4): the copies decided from the gate's real counts, sent
// after the gate on the comm stream, before the dispatch: on the critical path.
void LayerOps::broadcast_late(int l) {
  std::vector<std::vector<int>> groups;
  std::vector<int> experts;
  for (const auto& rep : plan_.layers[std::size_t(l)].replicas)
    if (rep.late > 0) {
      groups.push_back(group_of(l, rep, early(rep)));
      experts.push_back(rep.expert);
    }
  if (const auto id = replica_collectives(Stream::comm, fmt::format("L{}.fwd.replica_calibrate", l), CollectiveType::broadcast, std::move(groups), experts, ready_))
    for (const int e : experts) late_bcast_[{l, e}] = *id;
}

// Re-materialization (docs/spec/hecate.md §6): layer l's copies gathered again for its backward (a second
// spAG to every holder), on the comm stream after the spRS of layer l + 1.
void LayerOps::regather_replicas(int l) {
  std::vector<std::vector<int>> groups;
  std::vector<int> experts;
  for (const auto& rep : plan_.layers[std::size_t(l)].replicas) {
    groups.push_back(group_of(l, rep));
    experts.push_back(rep.expert);
  }
  if (const auto id = replica_collectives(Stream::comm, fmt::format("L{}.bwd.replica_regather", l), CollectiveType::broadcast, std::move(groups), experts, {}))
    for (const int e : experts) regather_[{l, e}] = *id;
}

// The op that brings GPU `rank` its copy of expert e of layer l for the forward or the backward
// (none: the copy is still there from the forward).
std::optional<OpId> LayerOps::copy_arrival(int l, int rank, int e, Pass pass) const {
  if (pass == Pass::backward) {
    const auto it = regather_.find({l, e});
    return it == regather_.end() ? std::nullopt : std::optional<OpId>(it->second);
  }
  if (const auto late = late_bcast_.find({l, e}); late != late_bcast_.end()) {
    const auto& reps = plan_.layers[std::size_t(l)].replicas;
    const auto rep = std::find_if(reps.begin(), reps.end(), [e](const Replica& r) { return r.expert == e; });
    if (std::find(rep->holders.begin() + std::ptrdiff_t(early(*rep)), rep->holders.end(), rank) != rep->holders.end())
      return late->second;
  }
  return bcast_[std::size_t(l)].at(e);
}

// The reduces of layer l's replicas not yet sent, up to the first `limit` of them.
void LayerOps::reduce_replicas(int l, Stream stream, int limit) {
  const auto& reps = plan_.layers[std::size_t(l)].replicas;
  const int end = limit < 0 ? int(reps.size()) : std::min(limit, int(reps.size()));
  const bool all = replicas_.persistent;  // every copy keeps the summed gradient
  std::vector<std::vector<int>> groups;
  std::vector<int> experts;
  std::vector<OpId> deps;  // every reduced expert's users: the op waits for all
  for (int& i = agg_sent_[std::size_t(l)]; i < end; ++i) {
    const Replica& rep = reps[std::size_t(i)];
    auto group = group_of(l, rep);
    if (all) {
      const std::string algorithm = all_reduce_algorithm(group, expert_bytes_);
      reduces_.push_back(graph_.add_collective(stream, fmt::format("L{}.bwd.replica_allreduce.e{}", l, rep.expert),
                                               {CollectiveType::all_reduce, std::move(group), {expert_bytes_}, algorithm},
                                               users_[{l, rep.expert}]));
      continue;
    }
    groups.push_back(std::move(group));  // a reduce: ring only
    experts.push_back(rep.expert);
    const auto& users = users_[{l, rep.expert}];
    deps.insert(deps.end(), users.begin(), users.end());
  }
  if (const auto id = replica_collectives(stream, fmt::format("L{}.bwd.replica_reduce", l), CollectiveType::reduce, std::move(groups), experts, std::move(deps)))
    reduces_.push_back(*id);
}

void LayerOps::under_experts(int l, Pass pass) {
  if (replicas_.timing != ReplicaSchedule::block_wise || l + 1 >= int(plan_.layers.size())) return;
  if (pass == Pass::backward) return reduce_replicas(l + 1, Stream::comm);
  const int n = int(plan_.layers[std::size_t(l) + 1].replicas.size());
  broadcast_replicas(l + 1, Stream::comm, {}, n - std::min(n, replicas_.trans_under_dense));
}

// The GPU that computes source s's tokens for expert e in layer l: s itself under ZeRO, else e's
// (owner or sharded) GPU, which only replicas make depend on the source.
int LayerOps::target(int l, int s, int e) const {
  if (placement_.kind == ExpertPlacement::data_parallel) return s;
  const auto& t = target_[std::size_t(l)];
  return t.size() == std::size_t(experts_) ? t[std::size_t(e)] : t[std::size_t(s) * experts_ + e];
}

// FastMoE's prepare_forward (laekov/fastmoe fmoe/functions.py): each GPU sends every other its
// per-expert counts (expert_exchange: an all-to-all of E/G int64 counts per peer), then reads them
// on the host (.item(), .cpu()) to size the dispatch: a host sync, after which the GPU waits for the
// next launches. The layer's dispatch waits for both.
// Every layer's exchange shares one G × G matrix (1 off the diagonal, times the bytes per peer):
// at 4,096 GPUs a matrix of doubles per layer would be 128 MiB each.
void LayerOps::exchange_counts(int l) {
  const int G = gpus_;
  if (!peers_) {
    std::vector<std::uint16_t> pairs(std::size_t(G) * G, 1);
    for (int r = 0; r < G; ++r) pairs[std::size_t(r) * G + r] = 0;
    peers_ = std::make_shared<const CountVector>(std::move(pairs));
  }
  const double counts_per_peer = 8.0 * std::max(1, experts_ / G);  // int64 counts of the peer's experts
  const OpId exchanged = graph_.add_collective(Stream::comm, fmt::format("L{}.fwd.count_exchange", l),
                                               {CollectiveType::all_to_all, everyone_, CollectiveBytes(peers_, counts_per_peer), "linear"},
                                               ready_);
  ready_ = {host_sync(fmt::format("L{}.fwd.host_sync", l), exchanged)};
}

// A dispatch padded to the group's largest count (DispatchSizing::group_max: DeepSpeed-MoE's
// drop_tokens=False, Tutel's capacity_factor <= 0): the GPUs all-reduce (MAX) one int64, then each
// host reads it to size the buffers. The layer's dispatch waits for both.
void LayerOps::agree_capacity(int l) {
  const OpId agreed = graph_.add_collective(Stream::comm, fmt::format("L{}.fwd.capacity_allreduce", l),
                                            {CollectiveType::all_reduce, everyone_, {8.0}, all_reduce_algorithm(everyone_, 8.0)}, ready_);
  ready_ = {host_sync(fmt::format("L{}.fwd.host_sync", l), agreed)};
}

// Every GPU's host reads what `after` produced (.item(), .cpu()): the GPU's host_sync_seconds on
// its compute stream, after which it waits for the host's next launches.
OpId LayerOps::host_sync(std::string label, OpId after) {
  return every_gpu(std::move(label), host_sync_work(in_.gpu), {after});
}

// FasterMoE's shadowing decision (IterationPlan::shadow_search): global_policy all-gathers every
// GPU's local_expert_count (E int64 each) and reads the stack on the host (.cpu()).
void LayerOps::search_shadows(int l) {
  const OpId gathered = graph_.add_collective(Stream::comm, fmt::format("L{}.fwd.count_allgather", l),
                                              {CollectiveType::all_gather, everyone_, {8.0 * experts_ * gpus_}, "ring"}, ready_);
  ready_ = {host_sync(fmt::format("L{}.fwd.host_sync.search", l), gathered)};
}

// An empty all-to-all over every rank.
OpId LayerOps::join(std::string label, std::vector<OpId> deps) {
  if (!nothing_) nothing_ = std::make_shared<const CountVector>(std::vector<std::uint16_t>(std::size_t(gpus_) * gpus_, 0));
  return graph_.add_collective(Stream::comm, std::move(label), {CollectiveType::all_to_all, everyone_, CollectiveBytes(nothing_, 1.0), a2a_},
                               std::move(deps));
}

// GPU r's encode or decode of layer l. Tutel's sparse kernels read and write each routed token
// (permute_bytes_). Fairseq's dense path (fairseq/modules/moe at the moe branch: top2gate.py
// top2gating, moe_layer.py MOELayer.forward; docs/spec/tutel.md §4.4), with s = the GPU's tokens, E
// experts, C its padded capacity per expert, M = d_model and b the dtype's bytes (the gate's
// default precision, moe_gating_use_fp32 off):
//   forward encode: the combine weights built over s × E × C (two bmm "se,sc->sec" written, added,
//     .bool() to the dispatch mask, the mask cast back to b bytes: 7b + 2 bytes an element, and the
//     two one-hot s × C int64 location tensors cast to b bytes), then the einsum "sec,sm->ecm", a
//     GEMM of (E·C) × M × s;
//   forward decode: the einsum "sec,ecm->sm", the same GEMM's FLOPs;
//   backward decode: two of them, the expert outputs' gradient and the combine weights' (the gate's
//     probabilities carry a gradient);
//   backward encode: the input's gradient (the bool mask has none), and the two bmm's backward
//     reading the combine weights' gradient (2b an element).
Compute LayerOps::codec(int l, int r, ComputeKind kind, Pass pass) const {
  if (!plan_.kernels.dense_encode) return {kind, {}, permute_bytes_};
  const auto& R = routing(l);
  std::int64_t C = 0;
  for (int e = 0; e < experts_; ++e) C = std::max<std::int64_t>(C, R.at(r, e));
  const double s = in_.model.tokens_per_gpu(), b = in_.model.dtype_bytes(), sec = s * double(experts_) * double(C);
  Gemm gemm{std::uint64_t(experts_) * std::uint64_t(C), in_.model.spec().d_model(), std::uint64_t(in_.model.tokens_per_gpu()), 1};
  const bool encode = kind == ComputeKind::encode, forward = pass == Pass::forward;
  if (!encode && !forward) gemm.repeat = 2;
  const double bytes = !encode ? 0 : forward ? sec * (7 * b + 2) + 2 * s * double(C) * (8 + 8 + b) : sec * 2 * b;
  return {kind, {gemm}, bytes};
}

std::vector<double> LayerOps::exchanged(int l) const {
  const auto& R = routing(l);
  const int G = gpus_, E = experts_;
  std::vector<double> tokens(std::size_t(G) * G, 0.0);
  if (placement_.kind == ExpertPlacement::sharded) {  // r copies of each source's tokens over e's s GPUs: 1/g to each
    const int s = G / E, g = s / placement_.r;
    for (int src = 0; src < G; ++src)
      for (int e = 0; e < E; ++e)
        for (int t = e * s; t < (e + 1) * s; ++t) tokens[std::size_t(src) * G + t] += double(R.at(src, e)) / g;
    return tokens;
  }
  for (int s = 0; s < G; ++s)
    for (int e = 0; e < E; ++e) tokens[std::size_t(s) * G + target(l, s, e)] += double(R.at(s, e));
  return tokens;
}

// With parts > 1, only part `part` of each (source, expert) count: x·(part+1)/parts − x·part/parts.
// `copies` gets the experts it computes with a copy (not the owner's).
Compute LayerOps::expert_work(int l, int rank, int from, int to, Pass pass, std::vector<OpId>& deps,
                              std::vector<int>& copies, int part, int parts) {
  const auto& R = routing(l);
  const bool bwd = pass == Pass::backward;
  const bool zero = placement_.kind == ExpertPlacement::data_parallel;
  // The copies to and from the all-to-all's layout (ExpertKernels::layout_copies): two of each
  // token-slot, read and written.
  const double copy_bytes = plan_.kernels.layout_copies && experts_ > gpus_ ? 4 * token_bytes_ : 0;
  Compute c{ComputeKind::grouped_gemm, {}, 0};
  auto share = [&](int s, int e) {  // this part's slots of source s for expert e
    const auto x = long(R.at(s, e));
    return x * (part + 1) / parts - x * part / parts;
  };
  const bool whole = from == 0 && to == gpus_ && parts == 1;
  std::vector<long> sizes;  // ZeRO: the distinct token counts of its experts (experts_of_size_ counts each)
  if (zero && from <= rank && rank < to)  // every expert on this GPU's own tokens: E of them
    for (int e = 0; e < experts_; ++e)
      if (const long tokens = share(rank, e); tokens > 0) {
        if (std::size_t(tokens) >= experts_of_size_.size()) experts_of_size_.resize(std::size_t(tokens) + 1, 0);
        if (experts_of_size_[std::size_t(tokens)]++ == 0) sizes.push_back(tokens);
        c.tokens += tokens;
      }
  for (const auto& [e, total, local] : computes_[std::size_t(l)][std::size_t(rank)]) {  // none for ZeRO
    long tokens = 0;
    if (whole)  // every source's tokens for e that this GPU computes, summed once (the constructor)
      tokens = long(total);
    else if (local)  // its own only
      tokens = from <= rank && rank < to ? share(rank, e) : 0;
    else
      for (int s = from; s < to; ++s)
        if (target(l, s, e) == rank) tokens += share(s, e);
    if (tokens == 0) continue;
    const std::vector<Gemm> fwd = in_.model.expert_gemms(tokens);
    c.memory_bytes += copy_bytes * double(tokens);
    const auto gemms = bwd ? backward_gemms(fwd) : fwd;
    c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
    c.tokens += tokens;
    if (rank != owner(l, e)) {
      if (!replicas_.persistent)
        if (const auto arrival = copy_arrival(l, rank, e, pass)) deps.push_back(*arrival);
      copies.push_back(e);
    }
  }
  if (!sizes.empty()) {
    std::sort(sizes.begin(), sizes.end());
    std::vector<std::pair<long, std::uint64_t>> count_of_size;
    for (long size : sizes) count_of_size.emplace_back(size, std::exchange(experts_of_size_[std::size_t(size)], 0));
    const auto fwd = repeated_expert_gemms(count_of_size);
    const auto gemms = bwd ? backward_gemms(fwd) : fwd;
    c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
  }
  return c;
}

// The expert GEMMs of each size, run `count` times: equal GEMMs are one entry, repeated.
std::vector<Gemm> LayerOps::repeated_expert_gemms(const std::vector<std::pair<long, std::uint64_t>>& count_of_size) const {
  std::vector<Gemm> out;
  for (const auto& [size, count] : count_of_size)
    for (auto g : in_.model.expert_gemms(size)) {
      g.repeat = count;
      out.push_back(g);
    }
  return out;
}

OpId LayerOps::expert_op(int l, int rank, const std::string& label, int from, int to, Pass pass, std::vector<OpId> deps,
                         int part, int parts) {
  std::vector<int> copies;
  Compute c = expert_work(l, rank, from, to, pass, deps, copies, part, parts);
  const OpId id = graph_.add_compute(rank, label, std::move(c), std::move(deps));
  if (pass == Pass::backward)
    for (int e : copies) users_[{l, e}].push_back(id);
  return id;
}

// One op of a part per GPU, parts of equal work sharing it: the key of a GPU's work is its experts'
// token counts in order (the expert GEMMs expert_work() builds from them, its only input outside
// the ZeRO and copy cases, which take an op per GPU).
std::vector<OpId> LayerOps::expert_ops(int l, const std::string& label, const std::vector<std::pair<int, int>>& sources,
                                       Pass pass, const std::vector<OpId>& deps) {
  const int G = gpus_;
  const auto& R = routing(l);
  auto per_gpu = [&] {
    std::vector<OpId> ids;
    for (int r = 0; r < G; ++r) ids.push_back(expert_op(l, r, label, sources[std::size_t(r)].first, sources[std::size_t(r)].second, pass, deps));
    return ids;
  };
  if (placement_.kind == ExpertPlacement::data_parallel) return per_gpu();
  Computes c;
  c.ranks = everyone_;
  c.work_of.reserve(std::size_t(G));
  auto& [works, work_of_tokens, work_of_count] = expert_works_[int(pass)];
  std::vector<long> tokens;
  for (int r = 0; r < G; ++r) {
    const auto [from, to] = sources[std::size_t(r)];
    tokens.clear();
    const auto& experts = computes_[std::size_t(l)][std::size_t(r)];
    const auto& remote = remote_[std::size_t(l)][std::size_t(r)];
    // Without the GPU's own tokens, its local copies count nothing: only the others are visited.
    const bool all = (from == 0 && to == G) || (from <= r && r < to);
    for (std::size_t k = 0, n = all ? experts.size() : remote.size(); k < n; ++k) {
      const auto& [e, total, local] = experts[all ? k : remote[k]];
      long t = 0;
      if (from == 0 && to == G)
        t = long(total);
      else if (local)  // its own tokens only (a shadowed expert's copy: the smart schedule's C_0)
        t = from <= r && r < to ? long(R.at(r, e)) : 0;
      else if (const int sole = sole_target(l, e); sole >= 0)  // every source's to one GPU
        t = sole == r ? column_sum(l, from, to, e) : 0;
      else
        for (int s = from; s < to; ++s)
          if (target(l, s, e) == r) t += long(R.at(s, e));
      if (t == 0) continue;
      if (r != owner(l, e)) return per_gpu();  // a copy's
      tokens.push_back(t);
    }
    const auto next = std::uint32_t(works->size());
    const std::uint32_t work = tokens.size() == 1 ? work_of_count.try_emplace(tokens[0], next).first->second
                                                  : work_of_tokens.try_emplace(tokens, next).first->second;
    if (work == next) {  // a new one
      std::vector<OpId> none;
      std::vector<int> copies;
      works->push_back(expert_work(l, r, from, to, pass, none, copies, 0, 1));
    }
    c.work_of.push_back(work);
  }
  c.works = works;
  return {graph_.add_computes(label, std::move(c), deps)};
}

// Σ R(s, e) over the sources s of [from, to): from a table of the layer's column sums by block of
// sources where [from, to) is such a block (the smart schedule's groups, built in one pass over the
// routing), else summed. Read down its column, each R(s, e) was a cache miss of its own.
long LayerOps::column_sum(int l, int from, int to, int e) {
  const auto& R = routing(l);
  const int b = to - from;
  if (b < 2 || gpus_ % b != 0 || from % b != 0 || R.sources != gpus_) {
    long sum = 0;
    for (int s = from; s < to; ++s) sum += long(R.at(s, e));
    return sum;
  }
  if (block_sums_.size() <= std::size_t(l)) block_sums_.resize(std::size_t(l) + 1);
  auto& [size, sums] = block_sums_[std::size_t(l)];
  if (size != b) {
    size = b;
    const std::size_t E = std::size_t(experts_);
    sums.assign(std::size_t(gpus_ / b) * E, 0);
    R.counts().visit([&](const auto* row) {
      for (int s = 0; s < gpus_; ++s, row += E) {
        long* block = sums.data() + std::size_t(s / b) * E;
        for (std::size_t x = 0; x < E; ++x) block[x] += long(row[x]);
      }
    });
  }
  return sums[std::size_t(from / b) * std::size_t(experts_) + std::size_t(e)];
}

// Built once per layer, from one pass over its routing, and shared by every step and by its
// forward and backward ops.
Collective LayerOps::exchange(int l, bool transpose, int step, int group_size) {
  const int G = gpus_, E = experts_;
  const bool sharded = placement_.kind == ExpertPlacement::sharded;
  if (!exchanges_.count({l, false, -1})) {
    const auto& R = routing(l);
    const auto& t = target_[std::size_t(l)];
    bool expert_e_on_gpu_e = placement_.kind == ExpertPlacement::owner && E == G && t.size() == std::size_t(E);
    for (int e = 0; e < E && expert_e_on_gpu_e; ++e) expert_e_on_gpu_e = t[std::size_t(e)] == e;
    // DeepEP's dispatch sends a token once per GPU and once per node over the network, as the
    // routing's token spreads count it, where the experts sit on their GPUs in order and the
    // counts are the sampler's (a policy's change to them drops the spreads): else token-slots.
    const auto blocks = spread_blocks(a2a_, E, G, in_.cluster.gpus_per_node());
    const TokenSpread* per_gpu = blocks.empty() ? nullptr : R.spread(blocks[0]);
    const TokenSpread* per_node = blocks.empty() ? nullptr : R.spread(blocks[1]);
    bool in_order = per_gpu && per_node && placement_.kind == ExpertPlacement::owner && t.size() == std::size_t(E);
    for (int e = 0; e < E && in_order; ++e) in_order = t[std::size_t(e)] == e / blocks[0];
    CollectiveBytes there;
    if (in_order) {
      const int m = in_.cluster.gpus_per_node();
      std::vector<std::int32_t> tokens(std::size_t(G) * G, 0), network(std::size_t(G) * G, 0);
      for (int s = 0; s < G; ++s) {
        for (int q = 0; q < G; ++q) tokens[std::size_t(s) * G + q] = std::int32_t(per_gpu->at(s, q));
        for (int node = 0; node < G / m; ++node)  // to the GPU of each other node with s's local index
          if (node != s / m) network[std::size_t(s) * G + std::size_t(node * m + s % m)] = std::int32_t(per_node->at(s, node));
      }
      there = CollectiveBytes(std::move(tokens), token_bytes_);
      network_[{l, false}] = CollectiveBytes(std::move(network), token_bytes_);
      network_[{l, true}] = network_[{l, false}].transposed();
    } else if (expert_e_on_gpu_e) {  // the routing's own counts (shared, not copied) × bytes per token
      there = CollectiveBytes(R.shared_counts(), token_bytes_);
    } else if (!sharded) {  // whole token-slots, counted by target GPU: at most a source's row sum,
                            // so in 16 bits where every row's sum fits (CountVector)
      const auto& sole = sole_target_[std::size_t(l)];
      auto count = [&]<class T>(std::vector<T> counts) {
        R.counts().visit([&](const auto* row) {
          for (int s = 0; s < G; ++s, row += E) {
            T* to = counts.data() + std::size_t(s) * G;
            for (int e = 0; e < E; ++e) to[sole[std::size_t(e)] >= 0 ? sole[std::size_t(e)] : target(l, s, e)] += T(row[e]);
          }
        });
        return std::make_shared<const CountVector>(std::move(counts));
      };
      std::int64_t widest = 0;
      for (int s = 0; s < G; ++s) widest = std::max(widest, R.row_sum(s));
      const std::size_t cells = std::size_t(G) * G;
      there = CollectiveBytes(widest <= 65535 ? count(std::vector<std::uint16_t>(cells, 0)) : count(std::vector<std::int32_t>(cells, 0)),
                              token_bytes_);
    } else {  // shares of token-slots
      auto tokens = exchanged(l);
      for (auto& x : tokens) x *= token_bytes_;
      there = CollectiveBytes(std::move(tokens));
    }
    exchanges_[{l, false, -1}] = there;
    exchanges_[{l, true, -1}] = there.transposed();
  }
  const std::tuple<int, bool, int> key{l, transpose, step};
  if (!exchanges_.count(key)) {
    const CollectiveBytes& whole = exchanges_.at({l, false, -1});
    for (int j = 0; j < G / group_size; ++j) {
      const CollectiveBytes there = whole.group_step(std::size_t(group_size), std::size_t(j));
      exchanges_[{l, false, j}] = there;
      exchanges_[{l, true, j}] = there.transposed();
    }
  }
  Collective c{CollectiveType::all_to_all, everyone_, exchanges_.at(key), a2a_};
  c.combine = transpose;  // the way back (DeepEP forwards inside the sender's node first)
  if (a2a_ == "deepep") c.sm_share = deepep_sm_share(in_.spec, in_.cluster.spec().gpu());  // its SMs, taken from overlapped compute
  if (const auto it = network_.find({l, transpose}); it != network_.end() && step < 0) c.network_bytes = it->second;
  if (step < 0) c.gathered = in_.model.tokens_per_gpu() * token_bytes_;  // every token, for the all-gather dispatcher
  return c;
}

TaskGraph build_moe_iteration(const IterationInput& in, const IterationPlan& plan) { return LayerOps(in, plan).build(); }

}  // namespace moesim
