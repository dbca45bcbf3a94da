// Hecate's FSSDP as a policy ("hecate"; hecate.md §2-4). Read with hecate.hpp.
//
// Per iteration and layer: F, the load of each expert predicted as the mean of the last w = 5
// iterations' (nothing is materialized before there is one); t = ⌊T_attn · bw / expert_size⌋, the
// experts whose parameters the interconnect moves during the layer's attention forward (bw: a
// GPU's NIC bandwidth across nodes, its fastest route inside a single node); m, the experts that
// fit in a GPU's memory beyond the EP state and the activations of a mean load, per layer (without
// re-materialization every layer's copies stay until its backward); then Algorithm 1.
// `policy.hecate.overlap_degree` and `.memory_slots` give t and m directly (the paper profiles
// them; with this model's attention a GPT-MoE-S layer on A100s hides less than one expert, t = 0,
// and then Hecate is EP). The builder's
// under_attention schedule sends the copies (spAG) with the attention forward and reduces their
// gradients to the owners (spRS) under the attention backward; each source's tokens go to a copy
// on its own GPU, else on its node, else to one spread by source (replica_targets()).
//
// Not here yet (issue 6): the calibration stage after the gate, heterogeneous sharding
// (Algorithm 2), re-materialization, and the memory model's materialized parameters counted as
// what m leaves free.
#include "hecate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>

#include "memory_model.hpp"
#include "moe_iteration.hpp"

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

namespace {

class Hecate final : public Policy {
 public:
  std::string name() const override { return "hecate"; }

  TaskGraph build_iteration(const IterationInput& in) override {
    const auto t0 = std::chrono::steady_clock::now();
    const int G = in.cluster.num_gpus(), E = in.model.experts(), L = in.model.layers();
    const auto b = state_bytes(in.model.dtype());
    const double expert_size = in.model.expert_params() * b.param;
    // t: the experts the interconnect moves under one attention forward.
    double t_attn = 0;
    for (const auto& g : in.model.dense_forward_gemms()) t_attn += in.gpu.gemm_time(g);
    const double bw = in.cluster.nodes() > 1 ? in.cluster.rank_nic(0).bandwidth
                                             : in.cluster.route_bandwidth(in.cluster.intra_route(0, 1 % in.cluster.gpus_per_node()));
    const auto& spec = in.spec.hecate();
    const int t = spec.overlap_degree() ? int(spec.overlap_degree()) : int(std::floor(t_attn * bw / expert_size));
    // m: the copies per GPU and layer the memory left beside EP's state and mean activations holds.
    const double activations =
        L * layer_activation_bytes(in.model, in.model.tokens_per_gpu(), double(in.model.tokens_per_gpu()) * in.model.top_k());
    const double left = in.gpu.memory_bytes() - dense_memory(in.model).total() -
                        expert_state(in.model, double(L) * E / G).total() - activations;
    const int m = spec.memory_slots() ? int(spec.memory_slots())
                  : left > 0 ? int(std::floor(left / (L * in.model.expert_params() * (b.param + b.grad)))) : 0;

    std::vector<LayerPlan> plans;
    std::vector<int> owner(in.routing.empty() ? 0 : std::size_t(in.routing.front().experts));
    for (int e = 0; e < E; ++e) owner[std::size_t(e)] = expert_owner(e, E, G);
    history_.resize(in.routing.size());
    for (std::size_t l = 0; l < in.routing.size(); ++l) {
      LayerPlan plan(in.routing[l]);
      if (!history_[l].empty()) {  // F: the mean of the last w iterations' loads
        std::vector<double> F(std::size_t(E), 0.0);
        for (const auto& past : history_[l])
          for (int e = 0; e < E; ++e) F[std::size_t(e)] += past[std::size_t(e)] / double(history_[l].size());
        const auto copies = sparse_materialize(F, owner, t, m, in.cluster);
        for (int e = 0; e < E; ++e)
          if (!copies[std::size_t(e)].empty()) plan.replicas.push_back({e, copies[std::size_t(e)]});
      }
      std::vector<double> now(std::size_t(E), 0.0);
      for (int e = 0; e < E; ++e) now[std::size_t(e)] = double(in.routing[l].expert_load(e));
      history_[l].push_back(std::move(now));
      if (history_[l].size() > 5) history_[l].pop_front();  // w = 5
      plans.push_back(std::move(plan));
    }
    in.report.decision_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ScheduleOptions schedule;
    schedule.replicas = ReplicaSchedule::under_attention;
    return build_moe_iteration(in, plans, schedule);
  }

 private:
  std::vector<std::deque<std::vector<double>>> history_;  // per layer: the last w iterations' loads per expert
};

}  // namespace

std::unique_ptr<Policy> make_hecate() { return std::make_unique<Hecate>(); }

}  // namespace moesim
