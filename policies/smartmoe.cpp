// SmartMoE-style expert rearrangement, one of Hecate's baselines (docs/spec/hecate.md §2 table, §14):
// expert parallelism whose placement is redone every N iterations (default 25) from the loads of
// the iterations since the last rearrangement, keeping E/G experts on each GPU. The new placement
// pairs hot experts with cold ones: experts in decreasing load, each to the GPU with the least
// load so far that still has a free slot (longest-processing-time first with capacities). Experts
// that change GPU move with their parameters and Adam states before the iteration, on the
// critical path (moe_iteration.cpp: migrations); between rearrangements it is plain EP.
//
// Chosen where the extract is silent: the placement is per layer (each layer's experts shared
// over all GPUs, E/G slots each); the loads are the token-slots routed to each expert, summed
// since the last rearrangement; an expert whose GPU does not change does not move (relabelling
// GPUs to minimise moves is not attempted); ties between equally loaded GPUs of a layer go to the
// GPU the earlier layers loaded least, so that with one expert per GPU (where any placement has
// the same per-layer maximum) the hottest experts of all layers do not pile onto one GPU.
#include <algorithm>
#include <numeric>

#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"
#include "smartmoe.hpp"

namespace moesim {

std::vector<int> balanced_placement(const std::vector<double>& load, int gpus, const std::vector<double>& carry) {
  const int E = int(load.size()), slots = E / gpus;
  std::vector<int> order(load.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return load[std::size_t(a)] > load[std::size_t(b)]; });
  std::vector<double> sum(std::size_t(gpus), 0.0);
  std::vector<int> used(std::size_t(gpus), 0), owner(std::size_t(E), -1);
  for (int e : order) {
    int best = -1;
    auto carried = [&](int g) { return carry.empty() ? 0.0 : carry[std::size_t(g)]; };
    for (int g = 0; g < gpus; ++g)
      if (used[std::size_t(g)] < slots &&
          (best < 0 || sum[std::size_t(g)] < sum[std::size_t(best)] ||
           (sum[std::size_t(g)] == sum[std::size_t(best)] && carried(g) < carried(best))))
        best = g;
    owner[std::size_t(e)] = best;
    sum[std::size_t(best)] += load[std::size_t(e)];
    ++used[std::size_t(best)];
  }
  return owner;
}

namespace {

class SmartMoe final : public Policy {
 public:

  IterationPlan plan(const IterationInput& in) override {
    const int G = in.cluster.num_gpus(), E = in.model.experts();
    const int interval = iterations_as_int(in.spec.smartmoe().interval() ? in.spec.smartmoe().interval() : 25);
    if (owner_.empty()) {  // start from EP's placement
      owner_.assign(in.routing.size(), std::vector<int>(std::size_t(E)));
      for (auto& layer : owner_)
        for (int e = 0; e < E; ++e) layer[std::size_t(e)] = expert_owner(e, E, G);
      load_.assign(in.routing.size(), std::vector<double>(std::size_t(E), 0.0));
    }
    std::vector<LayerPlan> plans;
    const bool rearrange = iteration_ > 0 && iteration_ % interval == 0;
    std::vector<double> carry(std::size_t(G), 0.0);  // the earlier layers' loads per GPU, for ties
    for (std::size_t l = 0; l < in.routing.size(); ++l) {
      LayerPlan plan(in.routing[l]);
      if (rearrange) {  // from the loads seen since the last rearrangement, not this iteration's
        const auto next = balanced_placement(load_[l], G, carry);
        for (int e = 0; e < E; ++e) carry[std::size_t(next[std::size_t(e)])] += load_[l][std::size_t(e)];
        for (int e = 0; e < E; ++e)
          if (next[std::size_t(e)] != owner_[l][std::size_t(e)])
            plan.migrations.push_back({e, owner_[l][std::size_t(e)], next[std::size_t(e)]});
        owner_[l] = next;
        std::fill(load_[l].begin(), load_[l].end(), 0.0);
      }
      plan.owner = owner_[l];
      const auto loads = in.routing[l].expert_loads();
      for (int e = 0; e < E; ++e) load_[l][std::size_t(e)] += double(loads[std::size_t(e)]);
      plans.push_back(std::move(plan));
    }
    ++iteration_;
    return IterationPlan(std::move(plans));
  }

 private:
  std::vector<std::vector<int>> owner_;    // per layer, expert -> GPU
  std::vector<std::vector<double>> load_;  // per layer, expert: token-slots since the last rearrangement
  int iteration_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_smartmoe() { return std::make_unique<SmartMoe>(); }

}  // namespace moesim
