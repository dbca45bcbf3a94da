#include "moe_iteration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "cost_model.hpp"
#include "memory_model.hpp"

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
  return replica_targets(*rep, cluster, plan_owner(plan, e, cluster.num_gpus()))[std::size_t(src)];
}

std::vector<int> replica_targets(const Replica& rep, const Cluster& cluster, int owner) {
  const int G = cluster.num_gpus();
  std::vector<int> copies{owner};
  copies.insert(copies.end(), rep.holders.begin(), rep.holders.end());
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

namespace {

// Backward GEMMs of a forward GEMM C[m×n] = A[m×k]·B[k×n]: dA = dC·Bᵀ (m×k, inner n) and
// dB = Aᵀ·dC (k×n, inner m), reading B and A where the forward left them (transposed).
std::vector<Gemm> backward(const std::vector<Gemm>& forward) {
  std::vector<Gemm> out;
  for (const auto& g : forward) {
    out.push_back({g.m, g.k, g.n, g.batch, g.repeat, false, true});
    out.push_back({g.k, g.n, g.m, g.batch, g.repeat, true, false});
  }
  return out;
}

// Population standard deviation.
double stddev(const std::vector<double>& x) {
  if (x.empty()) return 0;
  double mean = 0, var = 0;
  for (double v : x) mean += v / double(x.size());
  for (double v : x) var += (v - mean) * (v - mean) / double(x.size());
  return std::sqrt(var);
}

class Builder {
 public:
  Builder(const IterationInput& in, const std::vector<LayerPlan>& plans, const ScheduleOptions& s)
      : in_(in), plans_(plans), schedule_(s), G_(in.cluster.num_gpus()), E_(in.model.experts()),
        g_(G_), everyone_(G_), ready_(G_), target_(plans.size()), bcast_(plans.size()) {
    for (int r = 0; r < G_; ++r) everyone_[r] = r;
    a2a_ = s.all_to_all.empty() ? collective_algorithm(in.spec, CollectiveType::all_to_all) : s.all_to_all;
    ar_ = collective_algorithm(in.spec, CollectiveType::all_reduce);
    token_bytes_ = in.model.token_bytes();
    const double T = in.model.tokens_per_gpu(), k = in.model.top_k();
    scores_bytes_ = 2 * T * E_ * 4;             // softmax + top-k over fp32 scores
    permute_bytes_ = 2 * T * k * token_bytes_;  // read + write each routed token
    expert_bytes_ = in.model.expert_params() * in.model.dtype_bytes();
    zero_ = s.sharding != ExpertSharding::owner;
    const bool sharded = s.shard_r > 0;
    std::vector<double> activations(std::size_t(G_), 0.0), copies(std::size_t(G_), 0.0);
    owned_.assign(std::size_t(G_), 0.0);
    for (std::size_t l = 0; l < plans.size(); ++l) {
      const bool by_pair = !zero_ && !sharded && !plans[l].replicas.empty();
      if (!zero_) {
        target_[l].resize(by_pair ? std::size_t(G_) * E_ : std::size_t(E_));
        for (std::size_t k = 0; k < target_[l].size(); ++k) {
          const int e = int(k % std::size_t(E_));
          target_[l][k] = sharded ? e * (G_ / E_) : owner(int(l), e);
        }
      }
      if (by_pair)
        for (const auto& rep : plans[l].replicas) {  // as expert_target(), a replica at a time
          const auto t = replica_targets(rep, in.cluster, owner(int(l), rep.expert));
          for (int s = 0; s < G_; ++s) target_[l][std::size_t(s) * E_ + rep.expert] = t[std::size_t(s)];
        }
      // The experts each GPU computes this layer (its own, and copies some source sends it), so
      // that building a GPU's expert op costs its experts × sources, not all experts × sources.
      computes_.emplace_back(G_);
      std::vector<double> H(std::size_t(G_), 0.0);  // token-slots each GPU computes
      const auto& R = plans[l].routing;
      if (!zero_ && target_[l].size() == std::size_t(E_)) {  // one GPU per expert: its whole load
        std::vector<std::int64_t> load(std::size_t(E_), 0);
        for (int s = 0; s < G_; ++s)
          for (int e = 0; e < E_; ++e) load[std::size_t(e)] += R.at(s, e);
        for (int e = 0; e < E_; ++e) {
          const int t = target_[l][std::size_t(e)];
          H[std::size_t(t)] += double(load[std::size_t(e)]);
          if (load[std::size_t(e)] > 0) computes_[l][t].push_back({e, load[std::size_t(e)]});
        }
      } else {
        std::vector<std::int32_t> at(std::size_t(G_) * E_, -1);  // (GPU, expert) -> its place in computes_
        for (int s = 0; s < G_; ++s)
          for (int e = 0; e < E_; ++e) {
            const int t = target(int(l), s, e);
            const std::int64_t x = R.at(s, e);
            H[std::size_t(t)] += double(x);
            if (x == 0) continue;
            auto& k = at[std::size_t(t) * E_ + e];
            if (k < 0) k = std::int32_t(computes_[l][t].size()), computes_[l][t].push_back({e, 0});
            computes_[l][t][std::size_t(k)].tokens += x;
          }
        for (auto& list : computes_[l]) std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.expert < b.expert; });
      }
      for (int t = 0; t < G_; ++t) {  // what GPU t materializes and keeps for this layer
        activations[std::size_t(t)] += layer_activation_bytes(in.model, in.model.tokens_per_gpu(), H[std::size_t(t)]);
        if (zero_ || sharded) continue;
        double layer_copies = 0;
        for (const auto& served : computes_[l][t])
          if (owner(int(l), served.expert) != t) layer_copies += 1;  // a replica, held until its reduce
        layer_copies = std::max(layer_copies, double(s.reserved_copies));
        // Every layer's copies at once, or with re-materialization one layer's at a time.
        copies[std::size_t(t)] = s.rematerialize ? std::max(copies[std::size_t(t)], layer_copies) : copies[std::size_t(t)] + layer_copies;
      }
      if (!zero_ && !sharded)
        for (int e = 0; e < E_; ++e) owned_[std::size_t(owner(int(l), e))] += 1;
      in.report.load_stddev.push_back(stddev(H));
      const double mean_load = std::accumulate(H.begin(), H.end(), 0.0) / double(H.size());
      in.report.load_max_mean.push_back(mean_load > 0 ? *std::max_element(H.begin(), H.end()) / mean_load : 1.0);
      in.report.gpu_load.resize(H.size(), 0.0);
      for (std::size_t g = 0; g < H.size(); ++g) in.report.gpu_load[g] += H[g];
    }
    in.report.memory = peak_memory(activations, copies);
    trans_sent_.assign(plans.size(), 0);
    agg_sent_.assign(plans.size(), 0);
  }

  int owner(int l, int e) const { return plan_owner(plans_[std::size_t(l)], e, G_); }

  // The memory of the GPU that needs the most (memory_model.hpp): dense state, its experts' state
  // as the sharding keeps it, what it gathers or copies, and its activations.
  MemoryUse peak_memory(const std::vector<double>& activations, const std::vector<double>& copies) const {
    const auto b = state_bytes(in_.model.dtype());
    const double P = in_.model.expert_params(), L = double(plans_.size()), E = E_, G = G_;
    MemoryUse experts;  // ZeRO's and Tutel's sharding: the same on every GPU
    if (schedule_.sharding == ExpertSharding::zero3) {  // everything sharded; one layer gathered at a time
      experts = expert_state(in_.model, L * E / G);
      experts.materialized = E * P * (b.param + b.grad);
      experts.materialized_params = E * P * b.param;
    } else if (schedule_.sharding == ExpertSharding::zero2) {  // parameters kept; gradients and states sharded
      experts = expert_state(in_.model, L * E);
      experts.grads /= G;
      experts.optimizer /= G;
      experts.materialized = E * P * b.grad;
    } else if (schedule_.shard_r > 0) {  // 1/s of an expert per GPU; 1/r slices gathered
      // Every layer's gathered slice stays until its backward (autograd keeps it, sharded_layer());
      // a layer's slice of gradients lives until its reduce-scatter. r = s gathers nothing.
      experts = expert_state(in_.model, L / (G / E));
      if (G / E > schedule_.shard_r) {
        experts.materialized_params = L * P / schedule_.shard_r * b.param;
        experts.materialized = experts.materialized_params + P / schedule_.shard_r * b.grad;
      }
    }
    const MemoryUse dense = dense_memory(in_.model);
    MemoryUse peak;
    for (int t = 0; t < G_; ++t) {
      // Owners: the experts GPU t owns over all layers (E/G per layer, or as the plans shard them).
      const MemoryUse own = zero_ || schedule_.shard_r > 0 ? experts : expert_state(in_.model, owned_[std::size_t(t)]);
      const double copy = copies[std::size_t(t)] * P;
      MemoryUse m;
      m.params = dense.params + own.params;
      m.grads = dense.grads + own.grads;
      m.optimizer = dense.optimizer + own.optimizer;
      m.activations = activations[std::size_t(t)];
      m.materialized = experts.materialized + copy * (b.param + b.grad + (schedule_.persistent_replicas ? b.optimizer : 0));
      m.materialized_params = experts.materialized_params + copy * b.param;
      if (m.total() > peak.total()) peak = m;
    }
    return peak;
  }

  // ZeRO: a layer's experts gathered (all-gather) or their gradients scattered (reduce-scatter).
  OpId zero_collective(int l, CollectiveType type, const char* what, std::vector<OpId> deps) {
    return g_.add_collective(Stream::comm, fmt::format("L{}.{}", l, what),
                             {type, everyone_, {expert_bytes_ * E_}, "ring"}, std::move(deps));
  }

  TaskGraph build() {
    const int L = in_.model.layers();
    const auto dense = in_.model.dense_forward_gemms();
    const double dense_bytes = in_.model.dense_forward_memory_bytes();  // softmax, dropout, norms
    const Gemm gate = in_.model.gate_gemm();
    using RS = ReplicaSchedule;
    const RS mode = schedule_.replicas;
    // Experts changing owner move with their parameters and Adam states before anything else runs
    // (SmartMoE's rearrangement is on the critical path).
    std::vector<OpId> migrated;
    const auto states = state_bytes(in_.model.dtype());
    for (int l = 0; l < L; ++l)
      for (const auto& m : plans_[std::size_t(l)].migrations)
        migrated.push_back(g_.add_transfer(Stream::comm, fmt::format("L{}.migrate.e{}", l, m.expert),
                                           {m.from, m.to, in_.model.expert_params() * (states.param + states.optimizer)}));
    const std::vector<OpId> start = migrated.empty() ? std::vector<OpId>{} : std::vector<OpId>{join("migrations_done", migrated)};
    if (mode == RS::second_stream && L > 0) broadcast_replicas(0, Stream::comm2);
    for (int l = 0; l < L; ++l) {
      if (mode == RS::second_stream && l + 1 < L) broadcast_replicas(l + 1, Stream::comm2);  // under layer l
      if (mode == RS::under_attention) broadcast_replicas(l, Stream::comm, l == 0 ? start : std::vector<OpId>{});  // spAG under attention_l
      for (int r = 0; r < G_; ++r) {
        g_.add_compute(r, fmt::format("L{}.fwd.attention", l), {ComputeKind::gemm, dense, dense_bytes}, l == 0 ? start : std::vector<OpId>{});
        g_.add_compute(r, fmt::format("L{}.fwd.gate", l), {ComputeKind::gate, {gate}, scores_bytes_});
        ready_[r] = g_.add_compute(r, fmt::format("L{}.fwd.encode", l), {ComputeKind::encode, codec_gemms(l, r), permute_bytes_});
      }
      if (in_.count_exchange && !zero_ && G_ > 1) exchange_counts(l);  // ready_: after the host has the counts
      if (mode == RS::block_wise && l == 0) broadcast_replicas(l, Stream::comm);
      if (mode == RS::stream_order || mode == RS::exposed) broadcast_replicas(l, Stream::comm, ready_);
      broadcast_late(l);  // Hecate's calibrated copies, after the gate
      const OpId done = moe_layer(l, false);
      if (mode == RS::block_wise && l + 1 < L) broadcast_replicas(l + 1, Stream::comm);  // SubTrans2, the rest
      for (int r = 0; r < G_; ++r)
        g_.add_compute(r, fmt::format("L{}.fwd.decode", l), {ComputeKind::decode, codec_gemms(l, r), permute_bytes_}, {done});
    }
    // The output projection and its loss, forward then backward, between the blocks' two passes
    // (the embedding lookup and its gradient are counted in its bytes).
    const auto output = in_.model.output_forward_gemms();
    if (!output.empty()) {
      auto both = output;
      for (const auto& g : backward(output)) both.push_back(g);
      for (int r = 0; r < G_; ++r) g_.add_compute(r, "output", {ComputeKind::gemm, both, in_.model.output_memory_bytes()});
    }
    for (int l = L - 1; l >= 0; --l) {
      for (int r = 0; r < G_; ++r)
        ready_[r] = g_.add_compute(r, fmt::format("L{}.bwd.decode", l), {ComputeKind::decode, codec_gemms(l, r), permute_bytes_});
      const OpId done = moe_layer(l, true);
      // Replicas' gradients go back to their owners (a reduce each): on the second stream, under
      // the rest of the backward, with second_stream; after the layer otherwise; block_wise keeps
      // part of them for the next layer's experts (see ReplicaSchedule).
      std::vector<OpId> after{done};
      if (mode == RS::block_wise) {
        if (l + 1 < L) reduce_replicas(l + 1, Stream::comm);  // SubAgg2 left over (smart schedule)
        const int n = int(plans_[l].replicas.size());
        reduce_replicas(l, Stream::comm, l == 0 ? n : std::min(n, schedule_.agg_under_dense));  // SubAgg1
      } else {
        reduce_replicas(l, mode == RS::second_stream ? Stream::comm2 : Stream::comm);
        if (mode == RS::exposed) after.insert(after.end(), reduces_.end() - std::ptrdiff_t(plans_[l].replicas.size()), reduces_.end());
      }
      if (schedule_.rematerialize && l > 0) regather_replicas(l - 1);  // under attention_l's backward
      for (int r = 0; r < G_; ++r) {
        g_.add_compute(r, fmt::format("L{}.bwd.encode", l), {ComputeKind::encode, codec_gemms(l, r), permute_bytes_}, after);
        g_.add_compute(r, fmt::format("L{}.bwd.gate", l), {ComputeKind::gate, backward({gate}), scores_bytes_});
        ready_[r] = g_.add_compute(r, fmt::format("L{}.bwd.attention", l), {ComputeKind::gemm, backward(dense), 2 * dense_bytes});
      }
    }
    // Data parallelism over all GPUs for the dense parameters; each expert has one owner.
    const double dense_params = in_.model.dense_params_per_layer() * L + in_.model.embedding_params();
    std::vector<OpId> before_ar(ready_);
    before_ar.insert(before_ar.end(), reduces_.begin(), reduces_.end());
    const OpId allreduce = g_.add_collective(
        Stream::comm, "allreduce.dense",
        {CollectiveType::all_reduce, everyone_, {dense_params * in_.model.dtype_bytes()},
         all_reduce_algorithm(everyone_, dense_params * in_.model.dtype_bytes())},
        before_ar);
    // Adam with fp32 master weights and moments: read p, m, v (fp32) and g; write p, m, v and the
    // low-precision copy.
    const double params = dense_params + double(E_) / G_ * L * in_.model.expert_params();  // E/G experts, or 1/s of one
    const double adam_bytes = params * (6 * 4 + 2 * in_.model.dtype_bytes());
    std::vector<OpId> steps(G_);
    for (int r = 0; r < G_; ++r) steps[r] = g_.add_compute(r, "optimizer", {ComputeKind::optimizer, {}, adam_bytes}, {allreduce});
    // ZeRO-2 keeps full parameters: every GPU gathers the shards the others updated.
    if (schedule_.sharding == ExpertSharding::zero2)
      for (int l = 0; l < L; ++l) zero_collective(l, CollectiveType::all_gather, "experts_allgather_updated", steps);
    return std::move(g_);
  }

 private:
  // The spec's all-reduce algorithm; "nccl" (the default): the one NCCL's tuner would pick for these
  // bytes over this group (CostModel::nccl_all_reduce()).
  std::string all_reduce_algorithm(const std::vector<int>& group, double bytes) const {
    return ar_ == "nccl" ? cost_.nccl_all_reduce(group, bytes) : ar_;
  }
  // The group of a replica's broadcast / reduce: its owner (the root) first, then holders
  // [from, to) (all); the ring algorithm orders them into NCCL's rings (collectives/rings.cpp).
  std::vector<int> group_of(int l, const Replica& rep, std::size_t from = 0, std::size_t to = SIZE_MAX) const {
    std::vector<int> chain{owner(l, rep.expert)};
    to = std::min(to, rep.holders.size());
    chain.insert(chain.end(), rep.holders.begin() + std::ptrdiff_t(std::min(from, to)), rep.holders.begin() + std::ptrdiff_t(to));
    return chain;
  }
  // Holders that get their copy with the replica's first broadcast (the others after the gate).
  static std::size_t early(const Replica& rep) { return rep.holders.size() - std::size_t(rep.late); }

  // The broadcasts of layer l's replicas not yet sent, up to the first `limit` of them.
  void broadcast_replicas(int l, Stream stream, const std::vector<OpId>& deps = {}, int limit = -1) {
    const auto& reps = plans_[l].replicas;
    const int end = limit < 0 ? int(reps.size()) : std::min(limit, int(reps.size()));
    if (schedule_.persistent_replicas) return;  // the copies are already there
    for (int& i = trans_sent_[l]; i < end; ++i)
      if (early(reps[i]) > 0)
        bcast_[l][reps[i].expert] = g_.add_collective(stream, fmt::format("L{}.fwd.replica_bcast.e{}", l, reps[i].expert),
                                                      {CollectiveType::broadcast, group_of(l, reps[i], 0, early(reps[i])), {expert_bytes_}, "ring"},
                                                      deps);
  }

  // Hecate's calibration (hecate.md §4.4): the copies decided from the gate's real counts, sent
  // after the gate on the comm stream, before the dispatch: on the critical path.
  void broadcast_late(int l) {
    for (const auto& rep : plans_[l].replicas)
      if (rep.late > 0)
        late_bcast_[{l, rep.expert}] = g_.add_collective(
            Stream::comm, fmt::format("L{}.fwd.replica_calibrate.e{}", l, rep.expert),
            {CollectiveType::broadcast, group_of(l, rep, early(rep)), {expert_bytes_}, "ring"}, ready_);
  }

  // Re-materialization (hecate.md §6): layer l's copies gathered again for its backward (a second
  // spAG to every holder), on the comm stream after the spRS of layer l + 1.
  void regather_replicas(int l) {
    for (const auto& rep : plans_[l].replicas)
      regather_[{l, rep.expert}] = g_.add_collective(Stream::comm, fmt::format("L{}.bwd.replica_regather.e{}", l, rep.expert),
                                                     {CollectiveType::broadcast, group_of(l, rep), {expert_bytes_}, "ring"}, {});
  }

  // The op that brings GPU `rank` its copy of expert e of layer l for the forward or the backward
  // (none: the copy is still there from the forward).
  std::optional<OpId> copy_arrival(int l, int rank, int e, bool bwd) const {
    if (bwd) {
      const auto it = regather_.find({l, e});
      return it == regather_.end() ? std::nullopt : std::optional<OpId>(it->second);
    }
    if (const auto late = late_bcast_.find({l, e}); late != late_bcast_.end()) {
      const auto& reps = plans_[l].replicas;
      const auto rep = std::find_if(reps.begin(), reps.end(), [e](const Replica& r) { return r.expert == e; });
      if (std::find(rep->holders.begin() + std::ptrdiff_t(early(*rep)), rep->holders.end(), rank) != rep->holders.end())
        return late->second;
    }
    return bcast_[l].at(e);
  }

  // The reduces of layer l's replicas not yet sent, up to the first `limit` of them.
  void reduce_replicas(int l, Stream stream, int limit = -1) {
    const auto& reps = plans_[l].replicas;
    const int end = limit < 0 ? int(reps.size()) : std::min(limit, int(reps.size()));
    const bool all = schedule_.persistent_replicas;  // every copy keeps the summed gradient
    for (int& i = agg_sent_[l]; i < end; ++i) {
      auto group = group_of(l, reps[i]);
      const std::string algorithm = all ? all_reduce_algorithm(group, expert_bytes_) : "ring";  // reduce: ring only
      reduces_.push_back(g_.add_collective(
          stream, fmt::format("L{}.bwd.replica_{}.e{}", l, all ? "allreduce" : "reduce", reps[i].expert),
          {all ? CollectiveType::all_reduce : CollectiveType::reduce, std::move(group), {expert_bytes_}, algorithm},
          users_[{l, reps[i].expert}]));
    }
  }

  // Block-wise schedule, between a layer's dispatch and combine (under its experts): the next
  // layer's SubTrans1 (forward) or the later layer's SubAgg2 (backward).
  void under_experts(int l, bool bwd) {
    if (schedule_.replicas != ReplicaSchedule::block_wise || l + 1 >= int(plans_.size())) return;
    if (bwd) return reduce_replicas(l + 1, Stream::comm);
    const int n = int(plans_[l + 1].replicas.size());
    broadcast_replicas(l + 1, Stream::comm, {}, n - std::min(n, schedule_.trans_under_dense));
  }

  // The GPU that computes source s's tokens for expert e in layer l: s itself under ZeRO, else e's
  // (owner or sharded) GPU, which only replicas make depend on the source.
  int target(int l, int s, int e) const {
    if (zero_) return s;
    const auto& t = target_[std::size_t(l)];
    return t.size() == std::size_t(E_) ? t[std::size_t(e)] : t[std::size_t(s) * E_ + e];
  }

  // FastMoE's prepare_forward (laekov/fastmoe fmoe/functions.py): each GPU sends every other its
  // per-expert counts (expert_exchange: an all-to-all of E/G int64 counts per peer), then reads them
  // on the host (.item(), .cpu()) to size the dispatch: a host sync, after which the GPU waits for the
  // next launches. The layer's dispatch waits for both.
  // Every layer's exchange shares one G × G matrix (1 off the diagonal, times the bytes per peer):
  // at 4,096 GPUs a matrix of doubles per layer would be 128 MiB each.
  void exchange_counts(int l) {
    if (!peers_) {
      auto pairs = std::make_shared<std::vector<std::int32_t>>(std::size_t(G_) * G_, 1);
      for (int r = 0; r < G_; ++r) (*pairs)[std::size_t(r) * G_ + r] = 0;
      peers_ = std::move(pairs);
    }
    const double counts_per_peer = 8.0 * std::max(1, E_ / G_);  // int64 counts of the peer's experts
    const OpId exchanged = g_.add_collective(Stream::comm, fmt::format("L{}.fwd.count_exchange", l),
                                             {CollectiveType::all_to_all, everyone_, CollectiveBytes(peers_, counts_per_peer), "linear"},
                                             ready_);
    for (int r = 0; r < G_; ++r) {
      Compute sync{ComputeKind::elementwise, {}, 0};
      sync.fixed_seconds = in_.gpu.host_sync_seconds();
      ready_[r] = g_.add_compute(r, fmt::format("L{}.fwd.host_sync", l), std::move(sync), {exchanged});
    }
  }

  // One marker op where a layer's ops meet, so that the next ops' dependencies stay short: an
  // empty all-to-all over every rank.
  OpId join(std::string label, std::vector<OpId> deps) {
    return g_.add_collective(Stream::comm, std::move(label),
                             {CollectiveType::all_to_all, everyone_, std::vector<double>(std::size_t(G_) * G_, 0.0), a2a_},
                             std::move(deps));
  }

  // Fairseq's dense encode (or decode) on rank r (tutel.md §4.4): einsum "TEC,TM->ECM" over the
  // one-hot dispatch mask, a GEMM of (E·C) × M × T with C the rank's padded capacity per expert.
  // Tutel's sparse kernels are memory-bound only (permute_bytes_): no GEMM.
  std::vector<Gemm> codec_gemms(int l, int r) const {
    if (!schedule_.dense_encode) return {};
    const auto& R = plans_[std::size_t(l)].routing;
    std::int64_t C = 0;
    for (int e = 0; e < E_; ++e) C = std::max<std::int64_t>(C, R.at(r, e));
    return {{std::uint64_t(E_) * std::uint64_t(C), in_.model.spec().d_model(), std::uint64_t(in_.model.tokens_per_gpu()), 1}};
  }

  // Token-slots GPU `src` sends to GPU `dst` through the all-to-all.
  std::vector<double> exchanged(int l) const {
    const auto& R = plans_[l].routing;
    std::vector<double> tokens(std::size_t(G_) * G_, 0.0);
    if (schedule_.shard_r > 0) {  // r copies of each source's tokens over e's s GPUs: 1/g to each
      const int s = G_ / E_, g = s / schedule_.shard_r;
      for (int src = 0; src < G_; ++src)
        for (int e = 0; e < E_; ++e)
          for (int t = e * s; t < (e + 1) * s; ++t) tokens[std::size_t(src) * G_ + t] += double(R.at(src, e)) / g;
      return tokens;
    }
    for (int s = 0; s < G_; ++s)
      for (int e = 0; e < E_; ++e) tokens[std::size_t(s) * G_ + target(l, s, e)] += double(R.at(s, e));
    return tokens;
  }

  // The expert op of GPU `rank` for the tokens of sources [from, to): one GEMM pair per expert.
  // `deps` gets the broadcasts of the replicas it computes with.
  // With parts > 1, only part `part` of each (source, expert) count: x·(part+1)/parts − x·part/parts.
  Compute expert_work(int l, int rank, int from, int to, bool bwd, std::vector<OpId>& deps, int part = 0, int parts = 1) {
    const auto& R = plans_[l].routing;
    Compute c{ComputeKind::grouped_gemm, {}, 0};
    auto share = [&](int s, int e) {  // this part's slots of source s for expert e
      const auto x = long(R.at(s, e));
      return x * (part + 1) / parts - x * part / parts;
    };
    const bool whole = from == 0 && to == G_ && parts == 1;
    std::map<long, std::uint64_t> experts_of_size;  // ZeRO: tokens -> how many experts have as many
    for (const auto& [e, total] : computes_[l][rank]) {
      long tokens = 0;
      if (whole)  // every source's tokens for e that this GPU computes, summed once (the constructor)
        tokens = long(total);
      else
        for (int s = from; s < to; ++s)
          if (target(l, s, e) == rank) tokens += share(s, e);
      if (tokens == 0) continue;
      if (zero_ && !schedule_.per_source_gemms) {  // every expert on this GPU's own tokens: E of them
        ++experts_of_size[tokens];
        c.tokens += tokens;
        continue;
      }
      std::vector<Gemm> fwd;
      if (schedule_.per_source_gemms) {  // one GEMM pair per source chunk (the all-to-all layout)
        std::map<long, std::uint64_t> chunks;  // chunk size -> how many
        for (int s = from; s < to; ++s)
          if (target(l, s, e) == rank && R.at(s, e) > 0) ++chunks[share(s, e)];
        fwd = repeated_expert_gemms(chunks);
      } else {
        fwd = in_.model.expert_gemms(tokens);
      }
      const auto gemms = bwd ? backward(fwd) : fwd;
      c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
      c.tokens += tokens;
      if (!zero_ && rank != owner(l, e)) {
        if (!schedule_.persistent_replicas)
          if (const auto arrival = copy_arrival(l, rank, e, bwd)) deps.push_back(*arrival);
        computing_.push_back(e);
      }
    }
    if (!experts_of_size.empty()) {
      const auto fwd = repeated_expert_gemms(experts_of_size);
      const auto gemms = bwd ? backward(fwd) : fwd;
      c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
    }
    return c;
  }

  // The expert GEMMs of each size, run `count` times: equal GEMMs are one entry, repeated.
  std::vector<Gemm> repeated_expert_gemms(const std::map<long, std::uint64_t>& count_of_size) const {
    std::vector<Gemm> out;
    for (const auto& [size, count] : count_of_size)
      for (auto g : in_.model.expert_gemms(size)) {
        g.repeat = count;
        out.push_back(g);
      }
    return out;
  }

  OpId add_expert_op(int l, int rank, const std::string& label, int from, int to, bool bwd, std::vector<OpId> deps,
                     int part = 0, int parts = 1) {
    computing_.clear();
    Compute c = expert_work(l, rank, from, to, bwd, deps, part, parts);
    const OpId id = g_.add_compute(rank, label, std::move(c), std::move(deps));
    if (bwd)
      for (int e : computing_) users_[{l, e}].push_back(id);
    return id;
  }

  // Layer l's all-to-all as bytes: source to expert's GPU or, transposed, back; with the smart
  // schedule, its step `stride_group` (group gi sends to group (gi − j) mod n), a group_step() of
  // the whole. Built once per layer, from one pass over its routing, and shared by every step and
  // by its forward and backward ops: the backward's all-to-alls move gradients along the forward's
  // routes.
  Collective exchange(int l, bool transpose, int stride_group = -1) {
    if (!exchanges_.count({l, false, -1})) {
      const auto& R = plans_[std::size_t(l)].routing;
      const auto& t = target_[std::size_t(l)];
      bool expert_e_on_gpu_e = !zero_ && E_ == G_ && t.size() == std::size_t(E_) && schedule_.shard_r == 0;
      for (int e = 0; e < E_ && expert_e_on_gpu_e; ++e) expert_e_on_gpu_e = t[std::size_t(e)] == e;
      CollectiveBytes there;
      if (expert_e_on_gpu_e) {  // the routing's own counts (shared, not copied) × bytes per token
        there = CollectiveBytes(R.shared_counts(), token_bytes_);
      } else if (schedule_.shard_r == 0) {  // whole token-slots, counted by target GPU
        std::vector<std::int32_t> counts(std::size_t(G_) * G_, 0);  // each at most a GPU's tokens × k
        for (int s = 0; s < G_; ++s)
          for (int e = 0; e < E_; ++e) counts[std::size_t(s) * G_ + target(l, s, e)] += R.at(s, e);
        there = CollectiveBytes(std::move(counts), token_bytes_);
      } else {  // shares of token-slots
        auto tokens = exchanged(l);
        for (auto& x : tokens) x *= token_bytes_;
        there = CollectiveBytes(std::move(tokens));
      }
      exchanges_[{l, false, -1}] = there;
      exchanges_[{l, true, -1}] = there.transposed();
    }
    const std::tuple<int, bool, int> key{l, transpose, stride_group};
    if (!exchanges_.count(key)) {
      const CollectiveBytes& whole = exchanges_.at({l, false, -1});
      const int gs = schedule_.group_size;
      for (int step = 0; step < G_ / gs; ++step) {
        const CollectiveBytes there = whole.group_step(std::size_t(gs), std::size_t(step));
        exchanges_[{l, false, step}] = there;
        exchanges_[{l, true, step}] = there.transposed();
      }
    }
    return {CollectiveType::all_to_all, everyone_, exchanges_.at(key), a2a_};
  }

  // One MoE layer, forward or backward, after ready_[r] on every rank; returns the op the layer's
  // next ops wait for.
  OpId moe_layer(int l, bool bwd) {
    const char* dir = bwd ? "bwd" : "fwd";
    if (schedule_.smart) return smart_layer(l, bwd);
    if (zero_) return zero_layer(l, bwd);
    if (schedule_.shard_r > 0) return sharded_layer(l, bwd);
    if (schedule_.partitions > 1 || schedule_.codec.on()) return pipelined_layer(l, bwd);
    const OpId dispatch = g_.add_collective(Stream::comm, fmt::format("L{}.{}.a2a_dispatch", l, dir),
                                            exchange(l, false), ready_);
    std::vector<OpId> experts(G_);
    for (int r = 0; r < G_; ++r)
      experts[r] = add_expert_op(l, r, fmt::format("L{}.{}.experts", l, dir), 0, G_, bwd, {dispatch});
    under_experts(l, bwd);
    return g_.add_collective(Stream::comm, fmt::format("L{}.{}.a2a_combine", l, dir), exchange(l, true), experts);
  }

  // ZeRO over the experts: every GPU runs every expert on its own tokens.
  OpId zero_layer(int l, bool bwd) {
    const char* dir = bwd ? "bwd" : "fwd";
    std::vector<OpId> deps;
    if (schedule_.sharding == ExpertSharding::zero3)
      deps.push_back(zero_collective(l, CollectiveType::all_gather, bwd ? "bwd.experts_allgather" : "fwd.experts_allgather", {}));
    std::vector<OpId> experts(G_);
    for (int r = 0; r < G_; ++r) {
      std::vector<OpId> d(deps);
      d.push_back(ready_[r]);
      experts[r] = add_expert_op(l, r, fmt::format("L{}.{}.experts", l, dir), r, r + 1, bwd, d);
    }
    if (!bwd) return join(fmt::format("L{}.fwd.experts_done", l), experts);
    return zero_collective(l, CollectiveType::reduce_scatter, "bwd.grads_reduce_scatter", experts);
  }

  // FasterMoE's smart schedule (fastermoe.md §3): groups of `group_size` consecutive ranks,
  // n = G / group_size steps. In step j group i sends tokens to group t = (i − j) mod n (S_j),
  // computes the tokens received from group f = (i + j) mod n (C_j), and returns the outputs of
  // its tokens from group t (R_j). Comm stream: S_0..S_{n−1}, then R_0..R_{n−1}; compute stream:
  // C_0..C_{n−1}. Step 0 stays inside the group, step n−1 talks to the ring neighbour: the two
  // cheapest exchanges are the exposed ones. A GPU's own tokens for its replicas are in C_0.
  OpId smart_layer(int l, bool bwd) {
    const char* dir = bwd ? "bwd" : "fwd";
    const int gs = schedule_.group_size, n = G_ / gs;
    std::vector<OpId> S(n), R(n);
    for (int j = 0; j < n; ++j)
      S[j] = g_.add_collective(Stream::comm, fmt::format("L{}.{}.S{}", l, dir, j), exchange(l, false, j),
                               j == 0 ? ready_ : std::vector<OpId>{});
    std::vector<std::vector<OpId>> C(n, std::vector<OpId>(G_));
    for (int j = 0; j < n; ++j)
      for (int r = 0; r < G_; ++r) {
        const int from_group = (r / gs + j) % n;
        C[j][r] = add_expert_op(l, r, fmt::format("L{}.{}.C{}", l, dir, j), from_group * gs, from_group * gs + gs, bwd,
                                {S[j]});
      }
    for (int j = 0; j < n; ++j)
      R[j] = g_.add_collective(Stream::comm, fmt::format("L{}.{}.R{}", l, dir, j), exchange(l, true, j), C[j]);
    return join(fmt::format("L{}.{}.smart_done", l, dir), R);
  }

  // ScheMoE's layer (schemoe.md §2-3): r parts, each the chain C1 → A1 → D1 → E → C2 → A2 → D2,
  // added in OptSche's order (Theorem 1, Eq. 12): on the compute stream C1¹..C1ʳ, then (D1ⁱ Eⁱ C2ⁱ)
  // for each part, then D2¹..D2ʳ; on the comm stream A1¹..A1ʳ then A2¹..A2ʳ, each starting as soon as
  // its input is ready and the stream is free (Eqs. 13-14). Compression scales the all-to-all
  // bytes by wire_ratio and costs payload / throughput on each side; without a compressor the chain
  // is A1 → E → A2 (Tutel's pipelining with the same order). Backward has the same shape.
  OpId pipelined_layer(int l, bool bwd) {
    const auto tokens = exchanged(l);
    const char* dir = bwd ? "bwd" : "fwd";
    const int r = std::max(1, schedule_.partitions);
    const auto& codec_cost = schedule_.codec;
    const bool compress = codec_cost.on();
    std::vector<double> sent(std::size_t(G_), 0.0), received(std::size_t(G_), 0.0);  // token-slots
    for (int i = 0; i < G_; ++i)
      for (int j = 0; j < G_; ++j) {
        sent[std::size_t(i)] += tokens[std::size_t(i) * G_ + j];
        received[std::size_t(j)] += tokens[std::size_t(i) * G_ + j];
      }
    // C1 and C2 compress, D1 and D2 decompress a part's payload on the compute stream.
    auto codec = [&](int rank, const std::string& what, int part, double slots, std::vector<OpId> deps) {
      const double payload = slots / r * token_bytes_;
      Compute c{ComputeKind::compress, {}, 0};
      if (codec_cost.bytes_per_s > 0) c.fixed_seconds = payload / codec_cost.bytes_per_s;
      else c.memory_bytes = payload * (what[0] == 'C' ? codec_cost.compress_traffic : codec_cost.decompress_traffic);
      return g_.add_compute(rank, fmt::format("L{}.{}.{}.p{}", l, dir, what, part), std::move(c), std::move(deps));
    };
    auto wire = [&](bool transpose) {
      Collective c = exchange(l, transpose);
      c.bytes = c.bytes.scaled(schedule_.wire_ratio / r);
      c.messages = schedule_.messages_per_peer;
      return c;
    };
    std::vector<std::vector<OpId>> ready(static_cast<std::size_t>(r), ready_);  // what each part's dispatch waits for
    if (compress)
      for (int p = 0; p < r; ++p)
        for (int k = 0; k < G_; ++k) ready[std::size_t(p)][std::size_t(k)] = codec(k, "C1", p, sent[std::size_t(k)], {ready_[std::size_t(k)]});
    // A part's all-to-all. Pipe-A2A as released (Fragile-azalea/ScheMoE 402975e,
    // schemoe/custom/comm/pipe.cpp: each peer's send/recv on the communicator and stream of its lane,
    // is_intra) is two ops: the intra-node lane on the comm stream, the inter-node lane on comm2, each
    // in order across the parts, so a part's intra-node exchange starts once the previous part's
    // intra-node one is done, whatever the network still carries. Other algorithms: one op.
    // A compressor's side all-to-alls follow the payload's on its stream(s) (INT8's bias and scale:
    // int8.cpp all_to_all, one value of the dtype per token each).
    // Each exchange's lane k waits for lane k of the exchange before it (the same stream).
    auto send = [&](const char* what, bool transpose, int p, const std::vector<OpId>& deps) {
      std::vector<OpId> lanes;
      for (int side = 0; side <= codec_cost.side_all_to_alls; ++side) {
        Collective c = wire(transpose);
        if (side > 0) c.bytes = exchange(l, transpose).bytes.scaled(in_.model.dtype_bytes() / token_bytes_ / r);
        const std::string name = fmt::format("L{}.{}.{}.p{}{}", l, dir, what, p, side == 0 ? "" : side == 1 ? ".bias" : ".scale");
        const bool pipe = c.algorithm == "pipe";
        std::vector<OpId> next;
        for (int lane = 0; lane < (pipe ? 2 : 1); ++lane) {
          Collective one = c;
          if (pipe) one.lane = lane;
          next.push_back(g_.add_collective(lane == 0 ? Stream::comm : Stream::comm2,
                                           pipe ? name + (lane == 0 ? ".intra" : ".inter") : name, std::move(one),
                                           side == 0 ? deps : std::vector<OpId>{lanes[std::size_t(lane)]}));
        }
        lanes = std::move(next);
      }
      return lanes;
    };
    const auto parts = static_cast<std::size_t>(r);
    std::vector<std::vector<OpId>> A1(parts), A2(parts);
    for (int p = 0; p < r; ++p) A1[std::size_t(p)] = send("a2a_dispatch", false, p, ready[std::size_t(p)]);
    std::vector<std::vector<OpId>> done(parts, std::vector<OpId>(static_cast<std::size_t>(G_)));
    for (int p = 0; p < r; ++p)
      for (int k = 0; k < G_; ++k) {
        std::vector<OpId> in = A1[std::size_t(p)];
        if (compress) in = {codec(k, "D1", p, received[std::size_t(k)], in)};
        OpId out = add_expert_op(l, k, fmt::format("L{}.{}.experts.p{}", l, dir, p), 0, G_, bwd, in, p, r);
        if (compress) out = codec(k, "C2", p, received[std::size_t(k)], {out});
        done[std::size_t(p)][std::size_t(k)] = out;
      }
    for (int p = 0; p < r; ++p) A2[std::size_t(p)] = send("a2a_combine", true, p, done[std::size_t(p)]);
    std::vector<OpId> last;
    for (int p = 0; p < r; ++p) {
      if (!compress) last.insert(last.end(), A2[std::size_t(p)].begin(), A2[std::size_t(p)].end());
      else
        for (int k = 0; k < G_; ++k) last.push_back(codec(k, "D2", p, sent[std::size_t(k)], A2[std::size_t(p)]));
    }
    return join(fmt::format("L{}.{}.pipeline_done", l, dir), last);
  }

  // Tutel's sharded experts (ScheduleOptions::shard_r = r ≥ 1, s = G/E): dispatch the repeated
  // tokens, all-gather each subgroup's 1/r slice of its expert (s/r GPUs each holding 1/s), run the
  // slice on the tokens received (the GEMMs' hidden dimension d_ffn/r), combine. Backward as
  // released (microsoft/tutel 82af7aa, tutel/impls/communicate.py PrimAllgather.zero_gather: an
  // autograd function whose backward is a reduce-scatter; the GEMMs keep the gathered weights for
  // their backward): no gather again, only the gradients reduce-scattered back to the 1/s shards.
  OpId sharded_layer(int l, bool bwd) {
    const char* dir = bwd ? "bwd" : "fwd";
    const int s = G_ / E_, r = schedule_.shard_r, g = s / r;
    // Pipelined (tutel-released allows a degree with sharding): d parts along the capacity, each
    // dispatch → experts → combine, the slices gathered once, after the first part's dispatch.
    const int parts = std::max(1, schedule_.partitions);
    auto part_name = [&](const char* what, int p) {
      return parts > 1 ? fmt::format("L{}.{}.{}.p{}", l, dir, what, p) : fmt::format("L{}.{}.{}", l, dir, what);
    };
    auto part_bytes = [&](bool transpose) {
      Collective c = exchange(l, transpose);
      if (parts > 1) c.bytes = c.bytes.scaled(1.0 / parts);
      return c;
    };
    std::vector<OpId> dispatch(static_cast<std::size_t>(parts));
    for (int p = 0; p < parts; ++p)
      dispatch[std::size_t(p)] = g_.add_collective(Stream::comm, part_name("a2a_dispatch", p), part_bytes(false), ready_);
    std::vector<OpId> gathered(static_cast<std::size_t>(G_));
    const double slice = expert_bytes_ / r;  // what a subgroup gathers
    for (int first = 0; first < G_; first += g) {
      std::vector<int> sub(static_cast<std::size_t>(g));
      std::iota(sub.begin(), sub.end(), first);
      OpId id = dispatch.front();
      if (g > 1 && !bwd)
        id = g_.add_collective(Stream::comm, fmt::format("L{}.{}.expert_allgather.g{}", l, dir, first / g),
                               {CollectiveType::all_gather, sub, {slice}, "ring"}, {dispatch.front()});
      for (int t = first; t < first + g; ++t) gathered[std::size_t(t)] = id;
    }
    const auto& R = plans_[l].routing;
    const auto d = std::uint64_t(in_.model.spec().d_model()), h = std::uint64_t(in_.model.spec().d_ffn() / std::uint32_t(r));
    std::vector<double> received(static_cast<std::size_t>(E_), 0.0);  // by each GPU of expert e's subgroup
    for (int e = 0; e < E_; ++e)
      for (int src = 0; src < G_; ++src) received[std::size_t(e)] += double(R.at(src, e)) / g;
    std::vector<std::vector<OpId>> experts(static_cast<std::size_t>(parts), std::vector<OpId>(static_cast<std::size_t>(G_)));
    for (int p = 0; p < parts; ++p)
      for (int t = 0; t < G_; ++t) {
        const auto m = std::uint64_t(std::llround(received[std::size_t(t / s)] / parts));
        Compute c{ComputeKind::grouped_gemm, {}, 0};
        if (m > 0) {
          const std::vector<Gemm> fwd = {{m, h, d, 1}, {m, d, h, 1}};
          c.gemms = bwd ? backward(fwd) : fwd;
          c.tokens = long(m);
        }
        experts[std::size_t(p)][std::size_t(t)] =
            g_.add_compute(t, part_name("experts", p), std::move(c), {dispatch[std::size_t(p)], gathered[std::size_t(t)]});
      }
    std::vector<OpId> combines;
    for (int p = 0; p < parts; ++p)
      combines.push_back(g_.add_collective(Stream::comm, part_name("a2a_combine", p), part_bytes(true), experts[std::size_t(p)]));
    if (bwd && g > 1)
      for (int first = 0; first < G_; first += g) {
        std::vector<int> sub(static_cast<std::size_t>(g));
        std::iota(sub.begin(), sub.end(), first);
        std::vector<OpId> deps;
        for (const auto& part : experts) deps.insert(deps.end(), part.begin() + first, part.begin() + first + g);
        reduces_.push_back(g_.add_collective(Stream::comm, fmt::format("L{}.bwd.expert_reduce_scatter.g{}", l, first / g),
                                             {CollectiveType::reduce_scatter, sub, {slice}, "ring"}, deps));
      }
    // The r partial outputs of each token summed at its source: read r copies, write one.
    std::vector<OpId> sums(static_cast<std::size_t>(G_));
    for (int src = 0; src < G_; ++src) {
      double slots = 0;
      for (int e = 0; e < E_; ++e) slots += double(R.at(src, e));
      sums[std::size_t(src)] = g_.add_compute(src, fmt::format("L{}.{}.partial_sum", l, dir),
                                              {ComputeKind::elementwise, {}, slots * token_bytes_ * (r + 1)}, combines);
    }
    return join(fmt::format("L{}.{}.sharded_done", l, dir), sums);
  }

  const IterationInput& in_;
  std::shared_ptr<const std::vector<std::int32_t>> peers_;  // exchange_counts()' shared pair matrix
  const CostModel cost_{in_.cluster, in_.gpu};
  const std::vector<LayerPlan>& plans_;
  ScheduleOptions schedule_;
  int G_, E_;
  TaskGraph g_;
  std::vector<int> everyone_;
  std::vector<OpId> ready_;
  std::vector<std::vector<int>> target_;           // per layer: [source · E + expert] -> GPU, or [expert] when
                                                   // no replica makes it depend on the source (target())
  std::vector<std::map<int, OpId>> bcast_;         // per layer: expert -> its broadcast
  std::map<std::pair<int, int>, OpId> late_bcast_;  // (layer, expert) -> its calibration broadcast
  std::map<std::pair<int, int>, OpId> regather_;    // (layer, expert) -> its re-materialization
  std::vector<double> owned_;                       // per GPU: experts it owns, all layers
  std::map<std::pair<int, int>, std::vector<OpId>> users_;  // (layer, expert) -> bwd ops on its copies
  std::vector<int> computing_;
  bool zero_ = false;
  struct Served {
    int expert;
    std::int64_t tokens;  // the token-slots of all sources for it that the GPU computes
  };
  std::vector<std::vector<std::vector<Served>>> computes_;  // per layer, per GPU: the experts it computes, in order
  std::vector<int> trans_sent_, agg_sent_;  // per layer: replicas whose broadcast / reduce is added
  std::vector<OpId> reduces_;
  std::map<std::tuple<int, bool, int>, CollectiveBytes> exchanges_;  // (layer, transposed, smart step) -> exchange()'s bytes
  std::string a2a_, ar_;
  double token_bytes_ = 0, scores_bytes_ = 0, permute_bytes_ = 0, expert_bytes_ = 0;
};

}  // namespace

TaskGraph build_moe_iteration(const IterationInput& in, const std::vector<LayerPlan>& plans,
                              const ScheduleOptions& schedule) {
  if (in.report.on_plans) in.report.on_plans(plans, schedule);
  return Builder(in, plans, schedule).build();
}

}  // namespace moesim
