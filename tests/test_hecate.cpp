// Hecate's FSSDP: Algorithm 1 (sparse materialization) on hand cases in both branches, and the
// policy's schedule: nothing materialized before loads are known, the copies' broadcasts (spAG)
// issued with the attention and never after the gate, every token-slot computed once, and under
// uniform routing no more than EP plus its sparse collectives.
#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "hecate.hpp"
#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "runner.hpp"

using namespace moesim;

namespace {

// 2 DGX-A100 nodes: 16 GPUs; expert e owned by GPU e.
struct Sixteen {
  Cluster cluster{test::platform("dgx-a100", 2)};
  std::vector<int> owner = [] {
    std::vector<int> o(16);
    for (int e = 0; e < 16; ++e) o[std::size_t(e)] = e;
    return o;
  }();
  std::vector<double> load = [] {
    std::vector<double> f(16, 1.0);
    f[5] = 100;
    f[2] = 50;
    f[9] = 30;
    return f;
  }();
};

}  // namespace

TEST_CASE("hecate: with memory to spare the top-t experts go to every GPU") {
  const Sixteen s;
  const auto copies = sparse_materialize(s.load, s.owner, 2, 3, s.cluster);  // t = 2 <= m = 3
  for (int e = 0; e < 16; ++e) {
    INFO("expert " << e);
    if (e == 5 || e == 2) {
      CHECK(copies[std::size_t(e)].size() == 15);  // every GPU but the owner
      CHECK(std::count(copies[std::size_t(e)].begin(), copies[std::size_t(e)].end(), e) == 0);
    } else {
      CHECK(copies[std::size_t(e)].empty());
    }
  }
  CHECK(sparse_materialize(s.load, s.owner, 0, 3, s.cluster) == std::vector<std::vector<int>>(16));  // t = 0: EP
}

TEST_CASE("hecate: when memory binds slots follow the load and copies go to the other node first") {
  const Sixteen s;
  const auto copies = sparse_materialize(s.load, s.owner, 3, 1, s.cluster);  // m = 1 < t = 3: 16 slots
  // Shares of 16 slots over loads 100, 50, 30: 8.9 -> 9, 4.4 -> 4, 2.7 -> 3.
  CHECK(copies[5].size() == 9);
  CHECK(copies[2].size() == 4);
  CHECK(copies[9].size() == 3);
  std::vector<int> per_gpu(16, 0);
  for (int e = 0; e < 16; ++e)
    for (int g : copies[std::size_t(e)]) {
      CHECK(g != e);
      ++per_gpu[std::size_t(g)];
    }
  CHECK(*std::max_element(per_gpu.begin(), per_gpu.end()) <= 1);  // m = 1 per GPU
  // Expert 5 lives on node 0: its first copies go to node 1, then they alternate.
  const auto node1 = std::count_if(copies[5].begin(), copies[5].end(), [](int g) { return g >= 8; });
  CHECK(node1 == 5);  // 9 copies + the owner: 5 on each node
  // Expert 9 lives on node 1: its first copy goes to node 0.
  CHECK(std::count_if(copies[9].begin(), copies[9].end(), [](int g) { return g < 8; }) >= 1);
}

TEST_CASE("hecate: spAG with the attention from predicted loads and each token-slot computed once") {
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.overlap_degree=3", "policy.hecate.memory_slots=2"});
  auto policy = make_policy(t.ex.spec.policy());
  for (int it = 0; it < 3; ++it) {
    const auto routing = t.routing(7, std::uint64_t(it));
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), routing, report});
    std::map<std::string, OpId> first;  // label -> first op with that label
    int bcasts = 0;
    long tokens = 0;
    for (const auto& op : g.ops()) {
      first.emplace(op.label, op.id);
      if (const auto* c = std::get_if<Compute>(&op.body); c && op.label.find(".fwd.experts") != std::string::npos) tokens += c->tokens;
      if (op.label.find("replica_bcast") == std::string::npos) continue;
      ++bcasts;
      const std::string layer = op.label.substr(0, op.label.find('.'));
      INFO(op.label);
      CHECK(first.count(layer + ".fwd.attention") == 0);  // issued with the layer's attention, before it
      CHECK(first.count(layer + ".fwd.gate") == 0);       // so before its gate
      for (OpId d : op.deps) CHECK(g.op(d).label.find("gate") == std::string::npos);
    }
    INFO("iteration " << it);
    CHECK((bcasts > 0) == (it > 0));  // nothing known to predict from in the first iteration
    CHECK(tokens == 2L * 16 * t.model.tokens_per_gpu() * t.model.top_k());  // every slot once
  }
}

TEST_CASE("hecate: under uniform routing it costs no more than EP plus its sparse collectives") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=32", "iterations=3",
                                               "warmup_iterations=1", "gating.uniform={}", "sim.timeline_iterations=3"});
  ex.variants = {{"ep", ex.spec}, {"hecate", ex.spec}};
  ex.variants[1].second.mutable_policy()->set_name("hecate");
  ex.variants[1].second.mutable_policy()->mutable_hecate()->set_overlap_degree(2);
  const auto r = run_experiment(ex);
  const auto& h = r.run("hecate");
  double sparse = 0;  // the time its spAG / spRS take per measured iteration (iterations 1 and 2)
  for (std::size_t i = 1; i < h.graphs.size(); ++i)
    for (const auto& op : h.graphs[i].ops())
      if (op.label.find("replica_") != std::string::npos) sparse += (h.timings[i].end[op.id] - h.timings[i].start[op.id]) / 2;
  CHECK(sparse > 0);
  CHECK(h.mean_time() <= r.run("ep").mean_time() + sparse);
}

// ---- Algorithm 2: heterogeneous sharding -------------------------------------------------------

TEST_CASE("hecate: Algorithm 2 on a hand case (2 nodes of 8 GPUs, 2 layers of 16 experts, t = 1)") {
  const Cluster cluster{test::platform("dgx-a100", 2)};
  // Layer 0: expert 0 the hottest (𝒥), experts 1..15 with loads 15..1. Layer 1: expert 3 hot (𝒥),
  // every other expert load 1. S = 2·16/16 = 2 slots per GPU.
  std::vector<std::vector<double>> F(2, std::vector<double>(16, 1.0));
  F[0][0] = 100;
  for (int e = 1; e < 16; ++e) F[0][std::size_t(e)] = 16 - e;
  F[1][3] = 50;
  const auto P = heterogeneous_shard(F, 1, cluster);
  // Layer 0 goes first (its hottest underloaded expert, 15, beats layer 1's, 1). Each expert goes to
  // the less loaded node (ties: fewer free slots, then node 0), then its least loaded GPU: the two
  // nodes alternate and end with 60 tokens each (worked out by hand in the test's comment below).
  //   e1→0 e2→8 e3→9 e4→1 e5→2 e6→10 e7→11 e8→3 e9→4 e10→12 e11→13 e12→5 e13→6 e14→14 e15→15
  CHECK(P[0] == std::vector<int>{7, 0, 8, 9, 1, 2, 10, 11, 3, 4, 12, 13, 5, 6, 14, 15});
  // Layer 1: equal loads, so the node with fewer free slots (node 1: 8 vs 9, GPU 7 still has 2)
  // wins every tie, then node 0; inside node 0, GPUs with one slot before GPU 7's two.
  //   e0→8 e1→0 e2→9 e4→1 e5→10 e6→2 e7→11 e8→3 e9→12 e10→4 e11→13 e12→5 e13→14 e14→6 e15→15
  // 𝒥 (layer 0's expert 0, layer 1's expert 3) takes the slots left: both on GPU 7.
  CHECK(P[1] == std::vector<int>{8, 0, 9, 7, 1, 10, 2, 11, 3, 12, 4, 13, 5, 14, 6, 15});
  double node0 = 0;
  for (int e = 1; e < 16; ++e)
    if (P[0][std::size_t(e)] < 8) node0 += F[0][std::size_t(e)];
  CHECK(node0 == 60);  // half of layer 0's underloaded tokens on each node
}

TEST_CASE("hecate: Algorithm 2 gives every expert one owner and every GPU the same number of shards") {
  const Cluster cluster{test::platform("p3dn-v100", 4)};  // 32 GPUs
  Rng rng(3);
  for (int t : {0, 1, 4, 64}) {
    std::vector<std::vector<double>> F(6, std::vector<double>(64));
    for (auto& layer : F)
      for (auto& x : layer) x = std::pow(rng.uniform(), 4) * 1000;  // skewed
    const auto P = heterogeneous_shard(F, t, cluster);
    std::vector<int> per_gpu(32, 0);
    for (const auto& layer : P)
      for (int g : layer) {
        REQUIRE(g >= 0);
        REQUIRE(g < 32);
        ++per_gpu[std::size_t(g)];
      }
    INFO("t = " << t);
    CHECK(per_gpu == std::vector<int>(32, 6 * 64 / 32));  // S = |ℰ^g| / |𝒟| each
  }
}

namespace {

// The owner of each (layer, expert) as the graph's spRS names it (a reduce's chain starts at the
// owner), and the migrations the graph carries: (layer, expert, from, to).
struct GraphOwners {
  std::map<std::pair<int, int>, int> reduce_root;
  std::vector<std::array<int, 4>> migrations;
};

GraphOwners graph_owners(const TaskGraph& g) {
  GraphOwners out;
  for (const auto& op : g.ops()) {
    if (op.label.find("migrate") == std::string::npos && op.label.find("replica_reduce") == std::string::npos) continue;
    const int layer = std::stoi(op.label.substr(1, op.label.find('.') - 1));
    const int expert = op.label.find(".e") != std::string::npos ? std::stoi(op.label.substr(op.label.rfind(".e") + 2)) : -1;
    if (const auto* t = std::get_if<Transfer>(&op.body); t && op.label.find("migrate") != std::string::npos)
      out.migrations.push_back({layer, expert, t->src, t->dst});
    if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::reduce)
      out.reduce_root[{layer, expert}] = c->group.front();
  }
  return out;
}

}  // namespace

TEST_CASE("hecate: re-sharding every N iterations keeps one owner per expert and moves only what changed") {
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.overlap_degree=2", "policy.hecate.memory_slots=2",
                            "policy.hecate.reshard_interval=3"});
  const int L = t.model.layers(), E = t.model.experts(), G = t.cluster.num_gpus();
  auto policy = make_policy(t.ex.spec.policy());
  std::vector<std::vector<int>> owner(static_cast<std::size_t>(L), std::vector<int>(static_cast<std::size_t>(E)));
  for (auto& layer : owner)
    for (int e = 0; e < E; ++e) layer[std::size_t(e)] = expert_owner(e, E, G);  // homogeneous at first
  int moved = 0;
  for (int it = 0; it < 8; ++it) {
    // The same routing every iteration: the re-shard at 3 moves experts, the one at 6 sees the
    // same predicted loads, plans the same shards and so moves nothing.
    const auto routing = t.routing(5, 0);
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), routing, report});
    const auto seen = graph_owners(g);
    INFO("iteration " << it);
    CHECK((!seen.migrations.empty()) == (it == 3));  // every 3 iterations, and only if the shards change
    for (const auto& [l, e, from, to] : seen.migrations) {
      CHECK(owner[std::size_t(l)][std::size_t(e)] == from);  // it moves from its one owner
      CHECK(from != to);
      owner[std::size_t(l)][std::size_t(e)] = to;
      ++moved;
    }
    std::vector<int> per_gpu(std::size_t(G), 0);
    for (const auto& layer : owner)
      for (int o : layer) ++per_gpu[std::size_t(o)];
    CHECK(per_gpu == std::vector<int>(std::size_t(G), L * E / G));  // memory stays balanced
    CHECK(seen.reduce_root.empty() == (it == 0));  // copies from iteration 1 on, reduced to their owners
    for (const auto& [key, root] : seen.reduce_root) CHECK(root == owner[std::size_t(key.first)][std::size_t(key.second)]);
    CHECK(report.memory.params > 0);
  }
  CHECK(moved > 0);
}
