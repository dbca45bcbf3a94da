// The rearranging baselines. SmartMoE-style: the balanced placement on a hand case, and the
// policy's invariants over iterations (E/G experts per GPU, one owner each, migrations only at the
// interval, each moving its expert's parameters and Adam states from its previous owner).
// FlexMoE-style: copies within the slots, never broadcast, their gradients all-reduced among the
// copies, each new copy's state moved from the owner, an expert's tokens shared evenly by its copies;
// faster than EP under skew once copied.
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "helpers.hpp"
#include "memory_model.hpp"
#include "moe_iteration.hpp"
#include "routing.hpp"
#include "runner.hpp"
#include "smartmoe.hpp"

using namespace moesim;

TEST_CASE("smartmoe: hot experts share a GPU with cold ones on a hand case") {
  // Loads of 8 experts, 4 GPUs with 2 slots each. Block placement: {0,1} 9, {2,3} 7, {4,5} 4, {6,7} 4.
  const std::vector<double> load{8, 1, 1, 6, 2, 2, 0, 4};
  const auto owner = balanced_placement(load, 4);
  // By hand: 8→g0, 6→g1, 4→g2, 2→g3, 2→g3, 1→g2, 1→g1, 0→g0.
  CHECK(owner == std::vector<int>{0, 2, 1, 1, 3, 3, 0, 2});
  std::vector<double> sum(4, 0.0);
  std::vector<int> count(4, 0);
  for (std::size_t e = 0; e < load.size(); ++e) {
    sum[std::size_t(owner[e])] += load[e];
    ++count[std::size_t(owner[e])];
  }
  CHECK(count == std::vector<int>{2, 2, 2, 2});
  CHECK(*std::max_element(sum.begin(), sum.end()) == 8);  // block placement: 9
  // One slot per GPU: every placement has the same maximum; ties go to the GPU loaded least so far.
  CHECK(balanced_placement({5, 3, 1}, 3, {0, 0, 0}) == std::vector<int>{0, 1, 2});
  CHECK(balanced_placement({5, 3, 1}, 3, {9, 1, 4}) == std::vector<int>{1, 2, 0});
}

TEST_CASE("smartmoe: E/G experts per GPU, migrations only every interval, each with its Adam states") {
  const test::SmallSetup t({"policy.name=smartmoe", "policy.smartmoe.interval=3"});
  const auto& model = t.model;
  auto policy = make_policy(t.ex.spec.policy());
  const auto b = state_bytes(model.dtype());
  std::vector<std::vector<int>> owner(2, std::vector<int>(32));
  for (auto& layer : owner)
    for (int e = 0; e < 32; ++e) layer[std::size_t(e)] = expert_owner(e, 32, 16);
  int rearranged = 0;
  for (int it = 0; it < 7; ++it) {
    const auto routing = t.routing(5, std::uint64_t(it));
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, model, t.gpu, t.ex.spec.policy(), routing, report});
    int moves = 0;
    for (const auto& op : g.ops()) {
      const auto* t = std::get_if<Transfer>(&op.body);
      if (!t || op.label.find(".migrate.e") == std::string::npos) continue;
      ++moves;
      const int l = op.label[1] - '0', e = std::stoi(op.label.substr(op.label.find(".e") + 2));
      INFO(op.label);
      CHECK(t->src == owner[std::size_t(l)][std::size_t(e)]);  // from its previous owner
      CHECK(t->bytes == Approx(model.expert_params() * (b.param + b.optimizer)));
      owner[std::size_t(l)][std::size_t(e)] = t->dst;
    }
    INFO("iteration " << it);
    CHECK(report.moved_experts == moves);  // the results' count is the graph's
    CHECK((moves > 0) == (it == 3 || it == 6));  // Zipf routing: the first rearrangement moves experts
    if (moves > 0) ++rearranged;
    for (const auto& layer : owner) {  // still E/G = 2 experts on every GPU
      std::vector<int> count(16, 0);
      for (int o : layer) ++count[std::size_t(o)];
      CHECK(std::all_of(count.begin(), count.end(), [](int c) { return c == 2; }));
    }
  }
  CHECK(rearranged == 2);
}

TEST_CASE("flexmoe: copies stay within the slots and are never broadcast and their gradients are all-reduced") {
  const test::SmallSetup t({"policy.name=flexmoe", "policy.flexmoe.slots=1", "policy.flexmoe.changes=2"});
  auto policy = make_policy(t.ex.spec.policy());
  const auto b = state_bytes(t.model.dtype());
  std::vector<std::map<int, std::set<int>>> copies(2);  // per layer: expert -> GPUs with a copy
  for (int it = 0; it < 6; ++it) {
    const auto routing = t.routing(5, std::uint64_t(it));
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), routing, report});
    std::vector<std::map<int, std::vector<int>>> reduced(2);
    for (const auto& op : g.ops()) {
      INFO(op.label);
      CHECK(op.label.find("replica_bcast") == std::string::npos);  // copies persist
      const int l = op.label[1] - '0';
      if (const auto* tr = std::get_if<Transfer>(&op.body); tr && op.label.find(".migrate.e") != std::string::npos) {
        const int e = std::stoi(op.label.substr(op.label.find(".e") + 2));
        CHECK(it > 0);                                 // decided from loads seen before
        CHECK(tr->src == expert_owner(e, 32, 16));     // the new copy's state comes from the owner
        CHECK(tr->bytes == Approx(t.model.expert_params() * (b.param + b.optimizer)));
        copies[std::size_t(l)][e].insert(tr->dst);
      }
      if (const auto* c = std::get_if<Collective>(&op.body); c && op.label.find("replica_allreduce") != std::string::npos) {
        CHECK(c->type == CollectiveType::all_reduce);
        reduced[std::size_t(l)][std::stoi(op.label.substr(op.label.find(".e") + 2))] = c->group;
      }
    }
    for (int l = 0; l < 2; ++l) {
      std::vector<int> used(16, 0);
      for (const auto& [e, group] : reduced[std::size_t(l)]) {
        REQUIRE(!group.empty());
        CHECK(group.front() == expert_owner(e, 32, 16));  // the owner and its copies
        for (std::size_t i = 1; i < group.size(); ++i) ++used[std::size_t(group[i])];
      }
      CHECK(*std::max_element(used.begin(), used.end()) <= 1);  // one slot per GPU and layer
    }
  }
  std::size_t total = 0;
  for (const auto& layer : copies) total += layer.size();
  CHECK(total > 0);  // Zipf routing: hot experts got copies
}

TEST_CASE("flexmoe: a threshold below 1 is refused at its field") {
  CHECK_THROWS_WITH(test::SmallSetup({"policy.name=flexmoe", "policy.flexmoe.threshold=0.5"}),
                    Catch::Matchers::Contains("policy.flexmoe.threshold"));
  CHECK_NOTHROW(test::SmallSetup({"policy.name=flexmoe", "policy.flexmoe.threshold=1.5"}));
}

TEST_CASE("flexmoe: the copies share an expert's tokens evenly, wherever the sources are") {
  // Expert 0 with its owner on GPU 0 and copies on 3 and 9 (two DGX A100 nodes: GPUs 0-7, 8-15);
  // source s sends it s + 1 tokens, 136 in all. Heaviest first, each to the copy with the fewest so
  // far (ties to the first), by hand, tokens -> copy: 16 -> 0, 15 -> 3, 14 -> 9, 13 -> 9, 12 -> 3,
  // 11 -> 0, 10 -> 0, 9 -> 3, 8 -> 9, 7 -> 9, 6 -> 3, 5 -> 0, 4 -> 0, 3 -> 3, 2 -> 9, 1 -> 9: the
  // copies on GPUs 0, 3 and 9 compute 46, 45 and 45.
  const Cluster cluster(test::platform("dgx-a100", 2));
  std::vector<std::int32_t> counts(16 * 16, 0);
  for (int s = 0; s < 16; ++s) counts[std::size_t(s) * 16] = s + 1;
  LayerPlan plan(RoutingMatrix(16, 16, counts), {Replica{0, {3, 9}}});
  plan.even_replica_loads = true;
  std::map<int, std::int64_t> load;
  for (int s = 0; s < 16; ++s) load[expert_target(plan, cluster, s, 0)] += s + 1;
  CHECK(load == std::map<int, std::int64_t>{{0, 46}, {3, 45}, {9, 45}});
  CHECK(expert_target(plan, cluster, 9, 0) == 0);   // GPU 9's own tokens (10) go to node 0: no locality
  CHECK(expert_target(plan, cluster, 0, 0) == 9);   // and GPU 0's (1) to node 1
  CHECK(expert_target(plan, cluster, 3, 5) == 5);   // an expert without copies: its owner
  // The nearest copy instead (Hecate's dispatcher): each copy its own GPU's and its node's.
  plan.even_replica_loads = false;
  CHECK(expert_target(plan, cluster, 9, 0) == 9);
}

TEST_CASE("flexmoe: once its copies are in place it beats plain EP under skewed routing") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=4", "model.layers=2", "model.experts=64", "iterations=8",
                                               "warmup_iterations=5", "gating.zipf.exponent=1.2"});
  ex.variants = {{"ep", ex.spec}, {"flexmoe", ex.spec}};
  ex.variants[1].second.mutable_policy()->set_name("flexmoe");
  const auto r = run_experiment(ex);
  CHECK(r.run("flexmoe").mean_time() < 0.9 * r.run("ep").mean_time());
}
