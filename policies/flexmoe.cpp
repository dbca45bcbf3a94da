// FlexMoE-style replication, one of Hecate's baselines (docs/spec/hecate.md §2 table, §14): expert
// parallelism plus persistent copies of hot experts in reserved memory slots. Copies are full
// replicas with their optimizer states, so nothing is broadcast per iteration; their gradients are
// all-reduced among the copies after each layer's backward (ReplicaOptions::persistent).
// Before each iteration, from the loads predicted for it (an exponential average of the past
// iterations', factor 1/2), the policy changes at most `changes` copies per layer: while the
// predicted max/mean GPU load exceeds `threshold`, the busiest GPU's hottest expert gets a copy on
// the least loaded GPU that has a free slot and no copy yet (parameters and Adam states moved
// from the owner before the iteration, on the critical path); a copy of an expert whose predicted
// load per copy fell below a quarter of the mean GPU load is dropped (no traffic).
//
// The copies share an expert's tokens evenly, wherever the tokens come from: FlexMoE balances
// GPUs by replica counts, each replica taking expert load / replica count (as FineMoE, Zhao et
// al., arXiv 2511.16947 §6.4, describes FlexMoE and SmartMoE), and the topology-aware dispatch that
// keeps tokens on their node is Hecate's own contribution (Hecate §4.4), not its baselines'. Each
// source's tokens for the expert go whole to one copy, the copies taking the sources heaviest first
// so their loads stay even (LayerPlan::even_replica_loads; moe_iteration.cpp replica_targets()).
//
// Chosen where the extract is silent: the slot budget is per layer; the predicted loads split an
// expert's tokens evenly over its copies, as the dispatch does; relocation of owners is not modelled.
#include <algorithm>

#include <fmt/format.h>

#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {
namespace {

class FlexMoe final : public Policy {
 public:

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    for (const auto& [value, field] : {std::pair{spec.flexmoe().slots(), "policy.flexmoe.slots"},
                                       {spec.flexmoe().changes(), "policy.flexmoe.changes"}})
      if (value > std::uint32_t(model.experts()))
        throw FieldError(field, fmt::format("{} is more than the layer's {} experts", value, model.experts()));
    const double threshold = spec.flexmoe().threshold();
    if (threshold != 0 && !(threshold >= 1))
      throw FieldError("policy.flexmoe.threshold",
                       fmt::format("{} is below 1: max/mean load is never below 1, so copies would be added for ever; "
                                   "use e.g. 1.1 (or 0 for that default)", threshold));
  }

  IterationPlan plan(const IterationInput& in) override {
    const auto& f = in.spec.flexmoe();
    const int G = in.cluster.num_gpus(), E = in.model.experts();
    const int slots = int(f.slots() ? f.slots() : 1), changes = int(f.changes() ? f.changes() : 1);
    const double threshold = f.threshold() > 0 ? f.threshold() : 1.1;
    if (holders_.empty()) {
      holders_.assign(in.routing.size(), std::vector<std::vector<int>>(std::size_t(E)));
      load_.assign(in.routing.size(), std::vector<double>(std::size_t(E), 0.0));
    }
    std::vector<LayerPlan> plans;
    for (std::size_t l = 0; l < in.routing.size(); ++l) {
      LayerPlan plan(in.routing[l]);
      plan.even_replica_loads = true;
      if (seen_ > 0) rebalance(l, G, E, slots, changes, threshold, plan.migrations);
      for (int e = 0; e < E; ++e)
        if (!holders_[l][std::size_t(e)].empty()) plan.replicas.push_back({e, holders_[l][std::size_t(e)]});
      const auto loads = in.routing[l].expert_loads();
      for (int e = 0; e < E; ++e) {  // the prediction for the next iteration
        const double tokens = double(loads[std::size_t(e)]);
        load_[l][std::size_t(e)] = seen_ == 0 ? tokens : 0.5 * load_[l][std::size_t(e)] + 0.5 * tokens;
      }
      plans.push_back(std::move(plan));
    }
    ++seen_;
    IterationPlan plan(std::move(plans));
    plan.replicas.persistent = true;
    plan.replicas.reserved_copies = slots;  // the slots are allocated up front (FlexMoE's reserved memory)
    return plan;
  }

 private:
  // Predicted tokens per GPU: each expert's load split evenly over its copies.
  std::vector<double> gpu_load(std::size_t l, int G, int E) const {
    std::vector<double> load(std::size_t(G), 0.0);
    for (int e = 0; e < E; ++e) {
      const auto& h = holders_[l][std::size_t(e)];
      const double share = load_[l][std::size_t(e)] / double(1 + h.size());
      load[std::size_t(expert_owner(e, E, G))] += share;
      for (int g : h) load[std::size_t(g)] += share;
    }
    return load;
  }

  void rebalance(std::size_t l, int G, int E, int slots, int changes, double threshold, std::vector<Migration>& moves) {
    auto& holders = holders_[l];
    std::vector<int> used(std::size_t(G), 0);
    for (const auto& h : holders)
      for (int g : h) ++used[std::size_t(g)];
    for (int c = 0; c < changes; ++c) {
      const auto load = gpu_load(l, G, E);
      double mean = 0;
      for (double x : load) mean += x / G;
      // Drop a copy of an expert gone cold.
      for (int e = 0; e < E; ++e) {
        auto& h = holders[std::size_t(e)];
        if (!h.empty() && load_[l][std::size_t(e)] / double(1 + h.size()) < mean / 4) {
          --used[std::size_t(h.back())];
          h.pop_back();
          break;
        }
      }
      const int busiest = int(std::max_element(load.begin(), load.end()) - load.begin());
      if (mean <= 0 || load[std::size_t(busiest)] / mean <= threshold) break;
      // The busiest GPU's hottest expert (by load per copy), owned or copied there.
      int hot = -1;
      for (int e = 0; e < E; ++e) {
        const auto& h = holders[std::size_t(e)];
        const bool there = expert_owner(e, E, G) == busiest || std::find(h.begin(), h.end(), busiest) != h.end();
        if (there && (hot < 0 || load_[l][std::size_t(e)] / double(1 + h.size()) >
                                     load_[l][std::size_t(hot)] / double(1 + holders[std::size_t(hot)].size())))
          hot = e;
      }
      int to = -1;
      const auto& h = holders[std::size_t(hot)];
      for (int g = 0; g < G; ++g)
        if (used[std::size_t(g)] < slots && g != expert_owner(hot, E, G) && std::find(h.begin(), h.end(), g) == h.end() &&
            (to < 0 || load[std::size_t(g)] < load[std::size_t(to)]))
          to = g;
      if (to < 0) break;  // no slot left
      holders[std::size_t(hot)].push_back(to);
      std::sort(holders[std::size_t(hot)].begin(), holders[std::size_t(hot)].end());
      ++used[std::size_t(to)];
      moves.push_back({hot, expert_owner(hot, E, G), to});
    }
  }

  std::vector<std::vector<std::vector<int>>> holders_;  // per layer and expert: GPUs with a copy
  std::vector<std::vector<double>> load_;                // per layer and expert: predicted tokens
  int seen_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_flexmoe() { return std::make_unique<FlexMoe>(); }

}  // namespace moesim
