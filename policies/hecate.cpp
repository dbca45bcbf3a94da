// Hecate's FSSDP as a policy ("hecate"; docs/spec/hecate.md §2-7). Read with hecate.hpp.
//
// Per iteration and layer: F, the load of each expert predicted as the mean of the last w = 5
// iterations' (nothing is materialized before there is one); t = ⌊T_non-MoE · bw / expert_size⌋,
// the experts whose parameters the interconnect moves during the layer's attention forward
// (T_non-MoE: the attention's GEMMs and its memory-bound softmax, dropout and norms, as the graph
// runs them; bw: the node's inter-node bandwidth, all its NICs, as docs/spec/hecate.md §10.2 derives t for
// clusters A and B (12.5 and 50 GB/s); a single node: a GPU's fastest route); m, the experts that
// fit in a GPU's memory beyond its shards' state and the activations of a mean load, per layer
// (without re-materialization every layer's copies stay until its backward, so the free memory is
// shared by L layers; with it by one); then Algorithm 1. `policy.hecate.overlap_degree` and
// `.memory_slots` give t and m directly (the paper profiles them; 0 leaves them computed);
// `materialize = false` makes Hecate EP with heterogeneous shards (Fig. 15a's "Sharding"), and
// Algorithm 2 keeps its t: the top-t experts it leaves to the copies (docs/spec/hecate.md §5.2,
// "materialized anyway") go to the GPUs with the most slots left, copied or not. The paper's own
// numbers ask for that: they put sharding alone at 0.40-0.54x EP (Fig. 15a's 3.32x and 1.27x with
// Fig. 9's 1.34-1.78x), which placing every expert by load (t = 0 there: 1.32x EP) cannot be. The
// builder's under_attention schedule sends the copies (spAG) with the attention forward and
// reduces their gradients to the owners (spRS) under the attention backward, each of a layer's
// spAG and spRS one NCCL group call whose broadcasts (reduces) run at the same time (§5.1,
// ReplicaOptions::grouped); each source's tokens
// go to a copy on its own GPU, else on its node, else to one spread by source (replica_targets(),
// the dispatcher of §7).
//
// Every `reshard_interval` iterations (default 100, §10.3) Algorithm 2 plans the shards anew from
// the same F; experts whose owner changes move with their parameters and Adam states before the
// iteration, on the critical path (nothing moves when the plan is unchanged). With
// `rematerialize` the copies are dropped after each layer's forward and gathered again under the
// attention backward (§6). With `calibrate`, after the gate (§4.4) Algorithm 1 runs again on the
// gate's real counts with the slots left; its extra copies are broadcast on the critical path,
// and kept only when the cost model (policies/cost_model.hpp) estimates the layer with them plus
// their broadcasts faster than without.
//
// Chosen where the paper is silent (docs/spec/hecate.md §13): Algorithm 2 uses Algorithm 1's F (the 5-
// iteration mean), node and GPU loads per layer, and fills the top-t experts' slots in layer
// order, each to the GPU with the most free slots; owners are not relabelled to minimise moves.
// The calibration's m is what the fullest GPU has left (m minus its predicted copies), its t the
// same t; its estimate of a layer is 3 × the slowest GPU's expert time (forward + backward) plus
// 4 all-to-alls (FasterMoE's Lat_e2e), and its broadcasts count as one group call, as they run.
#include "hecate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

#include "cost_model.hpp"
#include "errors.hpp"
#include "memory_model.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {

std::vector<std::vector<int>> sparse_materialize(const std::vector<double>& load, const std::vector<int>& owner, int t,
                                                 int m, const Cluster& cluster) {
  const int E = int(load.size()), G = cluster.num_gpus();
  std::vector<std::vector<int>> copies(load.size());
  t = std::min(t, E);  // t ← min(t, |ℰ|)
  if (t <= 0 || m <= 0) return copies;
  std::vector<int> top(load.size());  // ℰ^topT: the t most loaded experts
  std::iota(top.begin(), top.end(), 0);
  std::stable_sort(top.begin(), top.end(), [&](int a, int b) { return load[std::size_t(a)] > load[std::size_t(b)]; });
  top.resize(std::size_t(t));
  if (m >= t) {  // memory does not bind: the top-t experts on every device
    for (int e : top)
      for (int g = 0; g < G; ++g)
        if (g != owner[std::size_t(e)]) copies[std::size_t(e)].push_back(g);
    return copies;
  }
  // Memory binds: totSlots = |𝒟|·m shared by load among the top-t experts.
  int slots = G * m;
  std::vector<int> free(std::size_t(G), m);
  double total = 0;
  for (int e : top) total += load[std::size_t(e)];
  for (int e : top) {
    if (slots <= 0) break;
    const double share = total > 0 ? double(G * m) * load[std::size_t(e)] / total : 0;
    int n = std::min({std::max(1, int(std::lround(share))), G - 1, slots});  // assignSlotsByLoad
    std::vector<int> on_node(std::size_t(cluster.nodes()), 0);  // copies of e (owner included) per node
    on_node[std::size_t(cluster.node_of(owner[std::size_t(e)]))] = 1;
    auto& mine = copies[std::size_t(e)];
    while (n > 0) {
      // Nodes without e first, then nodes with more free slots; inside, a GPU with a free slot.
      int best = -1, best_node_free = -1;
      for (int g = 0; g < G; ++g) {
        if (g == owner[std::size_t(e)] || free[std::size_t(g)] <= 0 || std::count(mine.begin(), mine.end(), g)) continue;
        const int node = cluster.node_of(g);
        int node_free = 0;
        for (int h = node * cluster.gpus_per_node(); h < (node + 1) * cluster.gpus_per_node(); ++h) node_free += free[std::size_t(h)];
        const bool better = best < 0 || on_node[std::size_t(node)] < on_node[std::size_t(cluster.node_of(best))] ||
                            (on_node[std::size_t(node)] == on_node[std::size_t(cluster.node_of(best))] && node_free > best_node_free);
        if (better) {
          best = g;
          best_node_free = node_free;
        }
      }
      if (best < 0) break;
      mine.push_back(best);
      --free[std::size_t(best)];
      ++on_node[std::size_t(cluster.node_of(best))];
      --slots;
      --n;
    }
    std::sort(mine.begin(), mine.end());
  }
  return copies;
}

std::vector<std::vector<int>> heterogeneous_shard(const std::vector<std::vector<double>>& Fg, int t, const Cluster& cluster) {
  const int L = int(Fg.size()), E = L > 0 ? int(Fg[0].size()) : 0, G = cluster.num_gpus();
  const int nodes = cluster.nodes(), per_node = cluster.gpus_per_node();
  t = std::clamp(t, 0, E);
  std::vector<std::vector<int>> Pg(static_cast<std::size_t>(L), std::vector<int>(std::size_t(E), -1));  // 𝒫^g
  // 𝒥: the top-t experts of each layer by load; 𝒥′ = ℰ^g − 𝒥, both hottest first.
  std::vector<std::vector<int>> J(static_cast<std::size_t>(L)), Jrest(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) {
    const auto& F = Fg[std::size_t(l)];
    std::vector<int> order(static_cast<std::size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return F[std::size_t(a)] > F[std::size_t(b)]; });
    J[std::size_t(l)].assign(order.begin(), order.begin() + t);
    Jrest[std::size_t(l)].assign(order.begin() + t, order.end());
  }
  std::vector<int> S(static_cast<std::size_t>(G), L * E / G);  // S_d: available slots per device (|ℰ^g| / |𝒟|)
  auto node_slots = [&](int n) {
    return std::accumulate(S.begin() + n * per_node, S.begin() + (n + 1) * per_node, 0);
  };
  // ℒ sorted by max load descending: the layer whose hottest underloaded expert is hottest first.
  std::vector<int> layers(static_cast<std::size_t>(L));
  std::iota(layers.begin(), layers.end(), 0);
  auto max_load = [&](int l) {
    const auto& rest = Jrest[std::size_t(l)];
    return rest.empty() ? -1.0 : Fg[std::size_t(l)][std::size_t(rest.front())];
  };
  std::stable_sort(layers.begin(), layers.end(), [&](int a, int b) { return max_load(a) > max_load(b); });
  // Place underloaded experts first.
  for (int l : layers) {
    std::vector<double> node_load(static_cast<std::size_t>(nodes), 0.0), dev_load(static_cast<std::size_t>(G), 0.0);  // this layer's
    for (int e : Jrest[std::size_t(l)]) {  // sortByLoadDescending(ℰ′_l)
      // n ← least-loaded node, prioritizing nodes with less available slots
      int n = -1;
      for (int c = 0; c < nodes; ++c) {
        if (node_slots(c) == 0) continue;
        if (n < 0 || node_load[std::size_t(c)] < node_load[std::size_t(n)] ||
            (node_load[std::size_t(c)] == node_load[std::size_t(n)] && node_slots(c) < node_slots(n)))
          n = c;
      }
      // d ← least-loaded device on node n, prioritizing devices with less available slots
      int d = -1;
      for (int g = n * per_node; g < (n + 1) * per_node; ++g) {
        if (S[std::size_t(g)] == 0) continue;
        if (d < 0 || dev_load[std::size_t(g)] < dev_load[std::size_t(d)] ||
            (dev_load[std::size_t(g)] == dev_load[std::size_t(d)] && S[std::size_t(g)] < S[std::size_t(d)]))
          d = g;
      }
      Pg[std::size_t(l)][std::size_t(e)] = d;  // 𝒫_l ← 𝒫_l ∪ {(d, e)}
      --S[std::size_t(d)];                     // S_d ← S_d − 1
      const double F = Fg[std::size_t(l)][std::size_t(e)];
      node_load[std::size_t(n)] += F;
      dev_load[std::size_t(d)] += F;
    }
  }
  // Place overlappable experts next: 𝒥 to the rest of the slots (here: the GPU with most left).
  for (int l = 0; l < L; ++l)
    for (int e : J[std::size_t(l)]) {
      const int d = int(std::max_element(S.begin(), S.end()) - S.begin());
      Pg[std::size_t(l)][std::size_t(e)] = d;
      --S[std::size_t(d)];
    }
  return Pg;
}

namespace {

// The per-iteration estimate of one layer under a plan (the calibration's, docs/spec/hecate.md §4.4): the
// slowest GPU's experts forward and backward (3×) and four all-to-alls (FasterMoE's Lat_e2e).
double layer_estimate(const LayerPlan& plan, const MoeModel& model, const CostModel& cost) {
  const Cluster& cluster = cost.cluster();
  const int G = cluster.num_gpus(), E = plan.routing.experts;
  std::vector<double> slots(static_cast<std::size_t>(G), 0.0), bytes(static_cast<std::size_t>(G) * std::size_t(G), 0.0);
  std::vector<std::vector<int>> target(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) target[std::size_t(e)].assign(std::size_t(G), plan_owner(plan, e, G));
  for (const auto& rep : plan.replicas) target[std::size_t(rep.expert)] = replica_targets(plan, rep, cluster);
  for (int s = 0; s < G; ++s)
    for (int e = 0; e < E; ++e) {
      const int d = target[std::size_t(e)][std::size_t(s)];
      const double x = double(plan.routing.at(s, e));
      slots[std::size_t(d)] += x;
      if (d != s) bytes[std::size_t(s) * std::size_t(G) + std::size_t(d)] += x * model.token_bytes();
    }
  return 3 * cost.expert_time(model, *std::max_element(slots.begin(), slots.end())) + 4 * cost.alltoall_time(bytes);
}

}  // namespace

bool calibrate(LayerPlan& plan, int t, int m, const MoeModel& model, const CostModel& cost) {
  const Cluster& cluster = cost.cluster();
  const int G = cluster.num_gpus(), E = plan.routing.experts;
  std::vector<int> held(static_cast<std::size_t>(G), 0), owner(static_cast<std::size_t>(E));
  std::vector<std::vector<char>> has(static_cast<std::size_t>(E), std::vector<char>(std::size_t(G), 0));
  for (int e = 0; e < E; ++e) {
    owner[std::size_t(e)] = plan_owner(plan, e, G);
    has[std::size_t(e)][std::size_t(owner[std::size_t(e)])] = 1;
  }
  for (const auto& rep : plan.replicas)
    for (int g : rep.holders) {
      ++held[std::size_t(g)];
      has[std::size_t(rep.expert)][std::size_t(g)] = 1;
    }
  const int m_left = m - *std::max_element(held.begin(), held.end());  // the remaining memory capacity
  const auto loads = plan.routing.expert_loads();
  const std::vector<double> F(loads.begin(), loads.end());  // the real loads
  const auto extra = sparse_materialize(F, owner, t, m_left, cluster);
  LayerPlan calibrated = plan;
  std::vector<std::vector<int>> chains;  // the extra spAG: one group call on the critical path
  for (int e = 0; e < E; ++e) {
    std::vector<int> fresh;
    for (int g : extra[std::size_t(e)])
      if (!has[std::size_t(e)][std::size_t(g)]) fresh.push_back(g);
    if (fresh.empty()) continue;
    auto rep = std::find_if(calibrated.replicas.begin(), calibrated.replicas.end(), [e](const Replica& r) { return r.expert == e; });
    if (rep == calibrated.replicas.end()) rep = calibrated.replicas.insert(calibrated.replicas.end(), Replica{e, {}, 0});
    rep->holders.insert(rep->holders.end(), fresh.begin(), fresh.end());
    rep->late = int(fresh.size());
    std::vector<int> chain{owner[std::size_t(e)]};
    chain.insert(chain.end(), fresh.begin(), fresh.end());
    chains.push_back(std::move(chain));
  }
  if (chains.empty()) return false;
  const double broadcasts =
      cost.collective_time(group_call(CollectiveType::broadcast, std::move(chains), model.expert_params() * model.dtype_bytes(), "ring"));
  if (layer_estimate(calibrated, model, cost) + broadcasts >= layer_estimate(plan, model, cost)) return false;
  plan = std::move(calibrated);
  return true;
}

namespace {

class Hecate final : public Policy {
 public:

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    const auto& h = spec.hecate();  // t and m count experts of a layer: at most E
    for (const auto& [value, field] : {std::pair{h.overlap_degree(), "policy.hecate.overlap_degree"},
                                       {h.memory_slots(), "policy.hecate.memory_slots"}})
      if (value > std::uint32_t(model.experts()))
        throw FieldError(field, fmt::format("{} is more than the layer's {} experts", value, model.experts()));
  }

  IterationPlan plan(const IterationInput& in) override {
    const int G = in.cluster.num_gpus(), E = in.model.experts(), L = in.model.layers();
    const auto b = state_bytes(in.model.dtype());
    const double expert_size = in.model.expert_params() * b.param;
    const auto& spec = in.spec.hecate();
    // t: the experts the interconnect moves under one attention forward.
    const double t_attn =
        Compute{ComputeKind::gemm, in.model.dense_forward_gemms(), in.model.dense_forward_memory_bytes()}.seconds(in.gpu);
    const double bw = in.cluster.nodes() > 1 ? in.cluster.node_uplink_bandwidth()
                                             : in.cluster.route_bandwidth(in.cluster.intra_route(0, 1 % in.cluster.gpus_per_node()));
    const int t = spec.overlap_degree() ? int(spec.overlap_degree()) : int(std::floor(t_attn * bw / expert_size));
    // m: the copies per GPU and layer the memory left beside the shards' state and mean activations
    // holds (the layers whose copies are alive at once share it: all, or one with re-materialization).
    const double activations =
        L * layer_activation_bytes(in.model, in.model.tokens_per_gpu(), double(in.model.tokens_per_gpu()) * in.model.top_k()) +
        outside_layers_activation_bytes(in.model);
    const double left = in.gpu.memory_bytes() - dense_memory(in.model).total() -
                        expert_state(in.model, double(L) * E / G).total() - activations;
    const double alive = spec.rematerialize() ? 1 : L;
    const int m = spec.memory_slots() ? int(spec.memory_slots())
                  : left > 0 ? int(std::floor(left / (alive * in.model.expert_params() * (b.param + b.grad)))) : 0;
    const bool reshard = !spec.has_heterogeneous_sharding() || spec.heterogeneous_sharding();
    const bool materialize = !spec.has_materialize() || spec.materialize();
    const int interval = iterations_as_int(spec.reshard_interval() ? spec.reshard_interval() : 100);

    if (owner_.empty()) {  // initialized with homogeneous sharding
      owner_.assign(std::size_t(L), std::vector<int>(std::size_t(E)));
      for (auto& layer : owner_)
        for (int e = 0; e < E; ++e) layer[std::size_t(e)] = expert_owner(e, E, G);
      history_.resize(std::size_t(L));
    }
    std::vector<std::vector<double>> F(static_cast<std::size_t>(L));  // predicted loads; empty before any iteration
    for (int l = 0; l < L; ++l) F[std::size_t(l)] = predicted(l, E);
    // Heterogeneous sharding every `interval` iterations; moved experts take their Adam states.
    std::vector<std::vector<Migration>> moves(static_cast<std::size_t>(L));
    if (reshard && iteration_ > 0 && iteration_ % interval == 0 && !F.front().empty()) {
      const auto next = heterogeneous_shard(F, t, in.cluster);
      for (int l = 0; l < L; ++l)
        for (int e = 0; e < E; ++e)
          if (next[std::size_t(l)][std::size_t(e)] != owner_[std::size_t(l)][std::size_t(e)])
            moves[std::size_t(l)].push_back({e, owner_[std::size_t(l)][std::size_t(e)], next[std::size_t(l)][std::size_t(e)]});
      owner_ = next;
    }
    const CostModel cost(in.cluster, in.gpu);
    std::vector<LayerPlan> plans;
    for (int l = 0; l < L; ++l) {
      LayerPlan plan(in.routing[std::size_t(l)]);
      plan.owner = owner_[std::size_t(l)];
      plan.migrations = std::move(moves[std::size_t(l)]);
      if (materialize && !F[std::size_t(l)].empty()) {
        const auto copies = sparse_materialize(F[std::size_t(l)], plan.owner, t, m, in.cluster);
        for (int e = 0; e < E; ++e)
          if (!copies[std::size_t(e)].empty()) plan.replicas.push_back({e, copies[std::size_t(e)]});
      }
      if (spec.calibrate()) calibrate(plan, t, m, in.model, cost);
      for (const auto& rep : plan.replicas) in.report.shadowed_experts += rep.holders.empty() ? 0 : 1;
      const auto now = in.routing[std::size_t(l)].expert_loads();
      history_[std::size_t(l)].emplace_back(now.begin(), now.end());
      if (history_[std::size_t(l)].size() > 5) history_[std::size_t(l)].pop_front();  // w = 5
      plans.push_back(std::move(plan));
    }
    ++iteration_;
    IterationPlan plan(std::move(plans));
    plan.replicas.timing = ReplicaSchedule::under_attention;
    plan.replicas.rematerialize = spec.rematerialize();
    plan.replicas.grouped = true;  // §5.1: NCCL group calls, the broadcasts (reduces) at the same time
    return plan;
  }

 private:
  // F of layer l: the mean of the last w iterations' loads per expert (empty before the first).
  std::vector<double> predicted(int l, int E) const {
    const auto& past = history_[std::size_t(l)];
    if (past.empty()) return {};
    std::vector<double> F(static_cast<std::size_t>(E), 0.0);
    for (const auto& loads : past)
      for (int e = 0; e < E; ++e) F[std::size_t(e)] += loads[std::size_t(e)] / double(past.size());
    return F;
  }

  std::vector<std::deque<std::vector<double>>> history_;  // per layer: the last w iterations' loads per expert
  std::vector<std::vector<int>> owner_;                   // per layer, expert -> its shard's GPU
  int iteration_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_hecate() { return std::make_unique<Hecate>(); }

}  // namespace moesim
