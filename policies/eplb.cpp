// DeepSeek's expert-parallel load balancer, EPLB (deepseek-ai/EPLB eplb.py at d52c72d, MIT; the
// DeepSeek-V3 report §3.4 "redundant experts"): each layer keeps E logical experts in P = E + R
// physical slots, P/G on every GPU. From the experts' recent loads the hottest get more replicas,
// and the replicas are packed onto GPUs so that every GPU's predicted load is about the same:
//
//   rebalance_experts(weight, P, groups, nodes, gpus)
//     hierarchical, when the nodes divide the expert groups (group-limited routing keeps a token's
//     experts on few nodes, so a group should stay on one node):
//       1. balanced_packing(tokens per group, nodes)        groups onto nodes
//       2. replicate_experts(tokens per expert, P / nodes)  replicas, inside each node
//       3. balanced_packing(tokens per replica, gpus/nodes) replicas onto the node's GPUs
//     global otherwise: the same with one group and one node.
//
// The functions below follow eplb.py line for line (its names, one layer at a time); ties go to the
// lowest index, as torch's max and Python's min do, and the sort is by weight then index.
//
// As a policy (`eplb`): the placement is redone every `interval` iterations from the mean load of
// the last `window` iterations, starting at the first iteration that has seen one (before that,
// plain expert parallelism in the slots). A replica keeps its Adam states (a persistent copy, as
// FlexMoE's); a copy on a GPU that held none of that expert moves there with them from one that
// did, before the iteration, on the critical path, and copies' gradients are all-reduced among them.
// Chosen where eplb.py is silent, since it only places: each expert's owner (the copy the optimizer
// of ZeRO-less EP updates) is the replica on the GPU that owns fewest experts so far, keeping E/G
// owners per GPU where it can; a source sends an expert's tokens to a copy on its own GPU, else
// one on its node, else one of all, by its rank (moe_iteration.cpp replica_targets()). Two replicas
// of one expert on one GPU, which eplb.py's packing gives now and then (17% of GPUs in random
// skewed cases, 16 experts and 8 redundant on 2 nodes of 4), are spread first: one goes to another
// GPU of its node for a replica of similar load (spread_duplicates()); where none can take it, they
// are one copy there.
#include "eplb.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>

#include <fmt/format.h>

#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {
namespace eplb {

Packing balanced_packing(const std::vector<double>& weight, int num_packs) {
  const int n = int(weight.size()), per_pack = n / num_packs;
  if (num_packs <= 0 || n % num_packs != 0) throw std::logic_error("balanced_packing: packs must divide the items");
  Packing p{std::vector<int>(std::size_t(n)), std::vector<int>(std::size_t(n), 0)};
  if (per_pack == 1) {
    std::iota(p.pack_index.begin(), p.pack_index.end(), 0);
    return p;
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[std::size_t(a)] > weight[std::size_t(b)]; });
  std::vector<double> pack_weights(static_cast<std::size_t>(num_packs), 0.0);
  std::vector<int> pack_items(static_cast<std::size_t>(num_packs), 0);
  for (const int item : order) {
    int pack = -1;  // the lightest pack with room, the first of equals
    for (int k = 0; k < num_packs; ++k)
      if (pack_items[std::size_t(k)] < per_pack && (pack < 0 || pack_weights[std::size_t(k)] < pack_weights[std::size_t(pack)])) pack = k;
    p.pack_index[std::size_t(item)] = pack;
    p.rank_in_pack[std::size_t(item)] = pack_items[std::size_t(pack)]++;
    pack_weights[std::size_t(pack)] += weight[std::size_t(item)];
  }
  return p;
}

Replication replicate_experts(const std::vector<double>& weight, int num_phy) {
  const int num_log = int(weight.size());
  if (num_phy < num_log) throw std::logic_error("replicate_experts: fewer physical experts than logical ones");
  Replication r{std::vector<int>(std::size_t(num_phy)), std::vector<int>(std::size_t(num_phy), 0),
                std::vector<int>(std::size_t(num_log), 1)};
  std::iota(r.phy2log.begin(), r.phy2log.begin() + num_log, 0);
  for (int i = num_log; i < num_phy; ++i) {  // the replica goes to the expert with the most load per replica
    int hot = 0;
    for (int e = 1; e < num_log; ++e)
      if (weight[std::size_t(e)] / r.logcnt[std::size_t(e)] > weight[std::size_t(hot)] / r.logcnt[std::size_t(hot)]) hot = e;
    r.phy2log[std::size_t(i)] = hot;
    r.rank[std::size_t(i)] = r.logcnt[std::size_t(hot)]++;
  }
  return r;
}

namespace {

std::vector<int> inverse(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[std::size_t(perm[i])] = int(i);
  return inv;
}

}  // namespace

Replication rebalance_experts_hierarchical(const std::vector<double>& weight, int num_physical_experts, int num_groups,
                                           int num_nodes, int num_gpus) {
  const int num_logical = int(weight.size()), group_size = num_logical / num_groups, groups_per_node = num_groups / num_nodes;
  const int phy_per_gpu = num_physical_experts / num_gpus, log_per_node = num_logical / num_nodes,
            phy_per_node = num_physical_experts / num_nodes;
  // Step 1: pack groups to nodes. log2mlog: an expert's index once the groups are in node order.
  std::vector<double> tokens_per_group(static_cast<std::size_t>(num_groups), 0.0);
  for (int e = 0; e < num_logical; ++e) tokens_per_group[std::size_t(e / group_size)] += weight[std::size_t(e)];
  const Packing groups = balanced_packing(tokens_per_group, num_nodes);
  std::vector<int> log2mlog(static_cast<std::size_t>(num_logical));
  for (int e = 0; e < num_logical; ++e) {
    const int g = e / group_size;
    log2mlog[std::size_t(e)] = (groups.pack_index[std::size_t(g)] * groups_per_node + groups.rank_in_pack[std::size_t(g)]) * group_size + e % group_size;
  }
  const std::vector<int> mlog2log = inverse(log2mlog);

  Replication out{std::vector<int>(std::size_t(num_physical_experts)), std::vector<int>(std::size_t(num_physical_experts)),
                  std::vector<int>(std::size_t(num_logical))};
  for (int node = 0; node < num_nodes; ++node) {
    // Step 2: construct redundant experts within the node.
    std::vector<double> tokens_per_mlog(static_cast<std::size_t>(log_per_node));
    for (int i = 0; i < log_per_node; ++i) tokens_per_mlog[std::size_t(i)] = weight[std::size_t(mlog2log[std::size_t(node * log_per_node + i)])];
    const Replication rep = replicate_experts(tokens_per_mlog, phy_per_node);
    // Step 3: pack the physical experts to the node's GPUs.
    std::vector<double> tokens_per_phy(static_cast<std::size_t>(phy_per_node));
    for (int p = 0; p < phy_per_node; ++p) {
      const int m = rep.phy2log[std::size_t(p)];
      tokens_per_phy[std::size_t(p)] = tokens_per_mlog[std::size_t(m)] / rep.logcnt[std::size_t(m)];
    }
    const Packing gpus = balanced_packing(tokens_per_phy, num_gpus / num_nodes);
    std::vector<int> phy2pphy(static_cast<std::size_t>(phy_per_node));
    for (int p = 0; p < phy_per_node; ++p)
      phy2pphy[std::size_t(p)] = gpus.pack_index[std::size_t(p)] * phy_per_gpu + gpus.rank_in_pack[std::size_t(p)];
    const std::vector<int> pphy2phy = inverse(phy2pphy);
    for (int q = 0; q < phy_per_node; ++q) {
      const int p = pphy2phy[std::size_t(q)];
      out.phy2log[std::size_t(node * phy_per_node + q)] = mlog2log[std::size_t(rep.phy2log[std::size_t(p)] + node * log_per_node)];
      out.rank[std::size_t(node * phy_per_node + q)] = rep.rank[std::size_t(p)];
    }
    for (int i = 0; i < log_per_node; ++i) out.logcnt[std::size_t(mlog2log[std::size_t(node * log_per_node + i)])] = rep.logcnt[std::size_t(i)];
  }
  return out;
}

Replication rebalance_experts(const std::vector<double>& weight, int num_replicas, int num_groups, int num_nodes, int num_gpus) {
  if (hierarchical(num_groups, num_nodes)) return rebalance_experts_hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus);
  return rebalance_experts_hierarchical(weight, num_replicas, 1, 1, num_gpus);  // the global policy
}

void spread_duplicates(std::vector<int>& phy2log, const std::vector<double>& load, int per_gpu, int domain) {
  const int gpus = int(phy2log.size()) / per_gpu;
  auto holds = [&](int g, int e) {
    for (int q = g * per_gpu; q < (g + 1) * per_gpu; ++q)
      if (phy2log[std::size_t(q)] == e) return true;
    return false;
  };
  for (int g = 0; g < gpus; ++g)
    for (int q = g * per_gpu; q < (g + 1) * per_gpu; ++q) {
      const int e = phy2log[std::size_t(q)];
      bool second = false;  // an earlier slot of g has e
      for (int p = g * per_gpu; p < q; ++p) second = second || phy2log[std::size_t(p)] == e;
      if (!second) continue;
      int best = -1;
      const int first = g / domain * domain;
      for (int other = first; other < first + domain; ++other) {
        if (other == g || holds(other, e)) continue;
        for (int r = other * per_gpu; r < (other + 1) * per_gpu; ++r) {
          const int f = phy2log[std::size_t(r)];
          if (holds(g, f)) continue;
          if (best < 0 || std::abs(load[std::size_t(f)] - load[std::size_t(e)]) <
                              std::abs(load[std::size_t(phy2log[std::size_t(best)])] - load[std::size_t(e)]))
            best = r;
        }
      }
      if (best >= 0) std::swap(phy2log[std::size_t(q)], phy2log[std::size_t(best)]);
    }
}

}  // namespace eplb

namespace {

class Eplb final : public Policy {
 public:
  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    const int G = cluster.num_gpus(), E = model.experts();
    if (spec.eplb().has_redundant() && spec.eplb().redundant() > 8u * std::uint32_t(E))
      throw FieldError("policy.eplb.redundant",
                       fmt::format("{} is more than 8 copies of each of the {} experts", spec.eplb().redundant(), E));
    const int R = redundant(spec, G);
    if ((E + R) % G != 0)
      throw FieldError("policy.eplb.redundant",
                       fmt::format("{} experts and {} redundant ones do not fill the {} GPUs evenly: E + redundant must be a "
                                   "multiple of the GPUs (e.g. {})", E, R, G, (E + R + G - 1) / G * G - E));
    if (spec.eplb().interval() > 1'000'000 || spec.eplb().window() > 1'000'000)
      throw FieldError(spec.eplb().window() > 1'000'000 ? "policy.eplb.window" : "policy.eplb.interval", "must be at most 1000000");
  }

  IterationPlan plan(const IterationInput& in) override {
    const auto& s = in.spec.eplb();
    const int G = in.cluster.num_gpus(), E = in.model.experts(), P = E + redundant(in.spec, G);
    const int interval = int(s.interval() ? s.interval() : 10), window = int(s.window() ? s.window() : std::uint32_t(interval));
    const std::size_t L = in.routing.size();
    std::vector<std::vector<Migration>> moves(L);
    if (seen_ % interval == 0 && !history_.empty()) {
      const int groups = in.model.spec().expert_groups() ? int(in.model.spec().expert_groups()) : 1;
      const int nodes = s.global() ? 1 : in.cluster.nodes();
      const int domain = eplb::hierarchical(groups, nodes) ? G / nodes : G;  // where a replica may move: its node, or anywhere
      for (std::size_t l = 0; l < L; ++l) {
        std::vector<double> weight(static_cast<std::size_t>(E), 0.0);
        for (const auto& past : history_)
          for (int e = 0; e < E; ++e) weight[std::size_t(e)] += past[l][std::size_t(e)] / double(history_.size());
        auto r = eplb::rebalance_experts(weight, P, groups, nodes, G);
        std::vector<double> per_replica(static_cast<std::size_t>(E));
        for (int e = 0; e < E; ++e) per_replica[std::size_t(e)] = weight[std::size_t(e)] / r.logcnt[std::size_t(e)];
        eplb::spread_duplicates(r.phy2log, per_replica, P / G, domain);
        place(l, r.phy2log, P / G, G, E, moves[l]);
      }
    }
    std::vector<LayerPlan> plans;
    for (std::size_t l = 0; l < L; ++l) {
      LayerPlan plan(in.routing[l]);
      if (!holders_.empty()) {
        plan.owner = owner_[l];
        for (int e = 0; e < E; ++e) {
          std::vector<int> copies;
          for (int g : holders_[l][std::size_t(e)])
            if (g != owner_[l][std::size_t(e)]) copies.push_back(g);
          if (!copies.empty()) plan.replicas.push_back({e, std::move(copies)});
        }
        plan.migrations = std::move(moves[l]);
      }
      plans.push_back(std::move(plan));
    }
    std::vector<std::vector<double>> loads;
    for (std::size_t l = 0; l < L; ++l) {
      const auto layer = in.routing[l].expert_loads();
      loads.emplace_back(layer.begin(), layer.end());
    }
    history_.push_back(std::move(loads));
    if (int(history_.size()) > window) history_.pop_front();
    ++seen_;
    IterationPlan plan(std::move(plans));
    plan.replicas.persistent = true;
    plan.replicas.reserved_copies = (P - E) / G;  // the redundant slots, allocated up front
    return plan;
  }

 private:
  static int redundant(const spec::PolicySpec& spec, int gpus) {
    return spec.eplb().has_redundant() ? int(spec.eplb().redundant()) : gpus;
  }

  // Layer l's new holders from the physical map (slot q on GPU q / per_gpu); each copy on a GPU
  // that held none of its expert moves there from one that did.
  void place(std::size_t l, const std::vector<int>& phy2log, int per_gpu, int G, int E, std::vector<Migration>& moves) {
    if (holders_.empty()) {  // the first plan: until now, expert parallelism's placement
      const std::size_t L = history_.front().size();
      holders_.assign(L, std::vector<std::vector<int>>(std::size_t(E)));
      owner_.assign(L, std::vector<int>(std::size_t(E)));
      for (std::size_t k = 0; k < L; ++k)
        for (int e = 0; e < E; ++e) {
          owner_[k][std::size_t(e)] = expert_owner(e, E, G);
          holders_[k][std::size_t(e)] = {owner_[k][std::size_t(e)]};
        }
    }
    std::vector<std::vector<int>> next(static_cast<std::size_t>(E));
    for (std::size_t q = 0; q < phy2log.size(); ++q) {
      auto& h = next[std::size_t(phy2log[q])];
      const int g = int(q) / per_gpu;
      if (std::find(h.begin(), h.end(), g) == h.end()) h.push_back(g);
    }
    std::vector<int> owned(static_cast<std::size_t>(G), 0);
    for (int e = 0; e < E; ++e) {
      const auto& before = holders_[l][std::size_t(e)];
      for (int g : next[std::size_t(e)])
        if (std::find(before.begin(), before.end(), g) == before.end()) moves.push_back({e, owner_[l][std::size_t(e)], g});
      int& owner = owner_[l][std::size_t(e)];
      owner = *std::min_element(next[std::size_t(e)].begin(), next[std::size_t(e)].end(),
                                [&](int a, int b) { return owned[std::size_t(a)] < owned[std::size_t(b)]; });
      ++owned[std::size_t(owner)];
    }
    holders_[l] = std::move(next);
  }

  std::deque<std::vector<std::vector<double>>> history_;  // per past iteration, layer, expert: token-slots
  std::vector<std::vector<std::vector<int>>> holders_;      // per layer and expert: the GPUs with a copy
  std::vector<std::vector<int>> owner_;                     // per layer and expert: the copy that owns it
  int seen_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_eplb() { return std::make_unique<Eplb>(); }

}  // namespace moesim
