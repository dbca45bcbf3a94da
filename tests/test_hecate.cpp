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
#include "collectives/collectives.hpp"
#include "memory_model.hpp"
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
  ex.variants = {{"ep", ex.spec}, {"hecate", ex.spec}, {"hecate-rm", ex.spec}, {"hecate-reshard", ex.spec}};
  for (std::size_t v = 1; v < ex.variants.size(); ++v) {
    auto& p = *ex.variants[v].second.mutable_policy();
    p.set_name("hecate");
    p.mutable_hecate()->set_overlap_degree(2);
    p.mutable_hecate()->set_rematerialize(ex.variants[v].first == "hecate-rm");
    if (ex.variants[v].first == "hecate-reshard") p.mutable_hecate()->set_reshard_interval(2);  // at iteration 2
  }
  const auto r = run_experiment(ex);
  for (const char* name : {"hecate", "hecate-rm", "hecate-reshard"}) {
    const auto& h = r.run(name);
    // the time its spAG / spRS (and migrations) take per measured iteration (iterations 1 and 2)
    double sparse = 0;
    for (std::size_t i = 1; i < h.graphs.size(); ++i)
      for (const auto& op : h.graphs[i].ops())
        if (op.label.find("replica_") != std::string::npos || op.label.find("migrate") != std::string::npos)
          sparse += (h.timings[i].end[op.id] - h.timings[i].start[op.id]) / 2;
    INFO(name);
    CHECK(sparse > 0);
    CHECK(h.mean_time() <= r.run("ep").mean_time() + sparse);
  }
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
    // ".e<expert>", or a group call's ".e<expert>+<expert>+...", its members' experts in order.
    std::vector<int> experts;
    if (const auto at = op.label.rfind(".e"); at != std::string::npos)
      for (std::size_t p = at + 2; p <= op.label.size(); p = op.label.find('+', p) + 1) {
        experts.push_back(std::stoi(op.label.substr(p)));
        if (op.label.find('+', p) == std::string::npos) break;
      }
    const int expert = experts.empty() ? -1 : experts.front();
    if (const auto* t = std::get_if<Transfer>(&op.body); t && op.label.find("migrate") != std::string::npos)
      out.migrations.push_back({layer, expert, t->src, t->dst});
    const auto* c = std::get_if<Collective>(&op.body);
    if (!c || c->type != CollectiveType::reduce) continue;
    const auto members = c->grouped.empty() ? std::vector<std::vector<int>>{c->group} : c->grouped;
    REQUIRE(members.size() == experts.size());
    for (std::size_t i = 0; i < members.size(); ++i) out.reduce_root[{layer, experts[i]}] = members[i].front();
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
    CHECK(report.moved_experts == int(seen.migrations.size()));  // the results' count is the graph's
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

TEST_CASE("hecate: sharding without materialization keeps Algorithm 2's t (its hottest experts placed as if copied)") {
  // Fig. 15a's "Sharding only": the top-t experts of each layer (§5.2's 𝒥, "materialized anyway") go
  // to the GPUs with the most slots left though nothing copies them, as the paper's numbers for it
  // ask (policies/hecate.cpp); placed by load (t = 0) the shards would differ.
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.materialize=false", "policy.hecate.overlap_degree=2",
                            "policy.hecate.reshard_interval=3"});
  const int L = t.model.layers(), E = t.model.experts(), G = t.cluster.num_gpus();
  auto policy = make_policy(t.ex.spec.policy());
  const auto routing = t.routing(5, 0);  // the same every iteration: F is its loads
  std::vector<std::vector<int>> owner(static_cast<std::size_t>(L), std::vector<int>(static_cast<std::size_t>(E)));
  for (auto& layer : owner)
    for (int e = 0; e < E; ++e) layer[std::size_t(e)] = expert_owner(e, E, G);
  for (int it = 0; it <= 3; ++it) {
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), routing, report});
    const auto seen = graph_owners(g);
    CHECK(seen.reduce_root.empty());  // never a copy
    for (const auto& [l, e, from, to] : seen.migrations) owner[std::size_t(l)][std::size_t(e)] = to;
  }
  std::vector<std::vector<double>> F;
  for (const auto& r : routing) {
    const auto loads = r.expert_loads();
    F.emplace_back(loads.begin(), loads.end());
  }
  CHECK(owner == heterogeneous_shard(F, 2, t.cluster));
  CHECK(owner != heterogeneous_shard(F, 0, t.cluster));  // the case tells the two apart
}

// ---- Re-materialization (docs/spec/hecate.md §6) ---------------------------------------------------------

namespace {

// Bytes the lowered collectives of one kind move (every transfer, every round).
double moved(const Collective& c, const Cluster& cluster) {
  double bytes = 0;
  for (const auto& lane : lower(c, cluster))
    for (const auto& step : lane)
      for (const auto& tr : step.transfers) bytes += tr.bytes * step.rounds;
  return bytes;
}

struct SparseTraffic {
  double spag = 0, sprs = 0;
  double eq2 = 0;           // Eq. (2) summed over each replica group's devices: Σ_i 2(|𝒟_i| − 1) S/|𝒞|
  double ring_allreduce = 0;  // what a ring all-reduce over each group moves (the rearrangement systems')
  double chunk_copies = 0;    // Σ_i (|𝒟_i| − 1): the (e, d) ∈ 𝒫′ \ 𝒫, i.e. λ|𝒞| over the iteration
  double last_layer_copies = 0;
  int reduce_ops = 0;  // spRS ops: one group call a layer
  PolicyReport report;
  TaskGraph graph{1};
};

// Iteration 1 of Hecate (iteration 0 has no loads to predict from) on the small setup.
SparseTraffic hecate_traffic(bool rematerialize) {
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.overlap_degree=3", "policy.hecate.memory_slots=2",
                            std::string("policy.hecate.rematerialize=") + (rematerialize ? "true" : "false")});
  auto policy = make_policy(t.ex.spec.policy());
  SparseTraffic out;
  for (int it = 0; it < 2; ++it) {
    out.report = {};
    out.graph = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), t.routing(9, std::uint64_t(it)), out.report});
  }
  const double S = t.model.expert_params() * t.model.dtype_bytes();  // S / |𝒞|: one expert's parameters
  for (const auto& op : out.graph.ops()) {
    const auto* c = std::get_if<Collective>(&op.body);
    if (!c || op.label.find("replica_") == std::string::npos) continue;
    if (c->type == CollectiveType::broadcast) out.spag += moved(*c, t.cluster);
    if (c->type != CollectiveType::reduce) continue;
    out.sprs += moved(*c, t.cluster);
    ++out.reduce_ops;
    for (const auto& group : c->grouped.empty() ? std::vector<std::vector<int>>{c->group} : c->grouped) {
      const double n = double(group.size());  // |𝒟_i|: the owner and the copies
      out.eq2 += n * 2 * (n - 1) / n * S;
      out.ring_allreduce += moved({CollectiveType::all_reduce, group, {S}, "ring"}, t.cluster);
      out.chunk_copies += n - 1;
      if (op.label.rfind("L1.", 0) == 0) out.last_layer_copies += n - 1;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("hecate: spAG and spRS move λ|𝒞| experts each, as Eq. (2)'s all-reduces, re-materialization adds one spAG") {
  const test::SmallSetup t;
  const double S = t.model.expert_params() * t.model.dtype_bytes();
  const auto plain = hecate_traffic(false);
  REQUIRE(plain.chunk_copies > 0);
  // Eq. (1): each (e, d) ∈ 𝒫′ \ 𝒫 carries one chunk in spAG(𝒫, 𝒫′) and one in spRS(𝒫′, 𝒫).
  CHECK(plain.spag == Approx(plain.chunk_copies * S));
  CHECK(plain.sprs == Approx(plain.chunk_copies * S));
  // Eq. (2) (over each group's devices): the pair moves what the replicas' AllReduces would.
  CHECK(plain.spag + plain.sprs == Approx(plain.eq2));
  CHECK(plain.spag + plain.sprs == Approx(plain.ring_allreduce));
  // §5.1: each layer's spRS is one NCCL group call of its reduces (2 layers).
  CHECK(plain.reduce_ops > 0);
  CHECK(plain.reduce_ops <= t.model.layers());
  // With re-materialization every layer but the last gathers its copies a second time.
  const auto rm = hecate_traffic(true);
  CHECK(rm.chunk_copies == plain.chunk_copies);  // the same placement
  CHECK(rm.sprs == Approx(plain.sprs));
  CHECK(rm.spag == Approx((2 * rm.chunk_copies - rm.last_layer_copies) * S));
  CHECK(rm.spag > plain.spag);
}

TEST_CASE("hecate: re-materialization holds one layer's copies, lowering the peak memory") {
  const auto plain = hecate_traffic(false), rm = hecate_traffic(true);
  const test::SmallSetup t;
  const auto b = state_bytes(t.model.dtype());
  REQUIRE(plain.report.memory.materialized > 0);
  CHECK(rm.report.memory.materialized > 0);
  CHECK(rm.report.memory.materialized < plain.report.memory.materialized);
  CHECK(rm.report.memory.total() < plain.report.memory.total());
  // Copies hold parameters and gradients: the parameters' share is p / (p + g).
  CHECK(plain.report.memory.materialized_params == Approx(plain.report.memory.materialized * b.param / (b.param + b.grad)));
  // Each backward expert op on a copy of layer 0 waits for that copy's second spAG.
  std::map<OpId, std::string> labels;
  for (const auto& op : rm.graph.ops()) labels[op.id] = op.label;
  int waiting = 0;
  for (const auto& op : rm.graph.ops()) {
    if (op.label.find("replica_regather") != std::string::npos) CHECK(op.label.rfind("L0.bwd.", 0) == 0);  // not the last layer
    if (op.label != "L0.bwd.experts") continue;
    for (OpId d : op.deps) waiting += labels[d].find("L0.bwd.replica_regather") != std::string::npos;
  }
  CHECK(waiting > 0);
}

// ---- Calibration (docs/spec/hecate.md §4.4) -------------------------------------------------------------

TEST_CASE("hecate: calibration adds the real hot expert's copies after the gate only when they pay") {
  const test::SmallSetup t;  // 16 GPUs on 2 nodes, 32 experts
  const CostModel cost(t.cluster, t.gpu);
  const int G = 16, E = 32;
  // Every source sends half its slots to expert 7, the rest spread evenly: the prediction had no copies.
  RoutingMatrix hot(G, E);
  const long slots = long(t.model.tokens_per_gpu()) * t.model.top_k();
  for (int s = 0; s < G; ++s) {
    hot.mutable_at(s, 7) = slots / 2;
    for (int e = 0; e < E; ++e)
      if (e != 7) hot.mutable_at(s, e) += slots / 2 / (E - 1);
  }
  LayerPlan plan(hot);
  REQUIRE(calibrate(plan, 1, 2, t.model, cost));  // t = 1, m = 2: the top expert to every GPU
  REQUIRE(plan.replicas.size() == 1);
  CHECK(plan.replicas[0].expert == 7);
  CHECK(plan.replicas[0].holders.size() == 15);  // every GPU but its owner (3)
  CHECK(plan.replicas[0].late == 15);            // all of them gathered after the gate

  // Already materialized everywhere by the prediction: nothing left to calibrate.
  LayerPlan predicted(hot, {everywhere(7, E, G)});
  CHECK_FALSE(calibrate(predicted, 1, 2, t.model, cost));
  CHECK(predicted.replicas[0].late == 0);
  // No memory left (m = 1, one copy each already): nothing either.
  LayerPlan full(hot, {everywhere(9, E, G)});
  CHECK_FALSE(calibrate(full, 1, 1, t.model, cost));

  // Uniform routing: a copy saves nothing the broadcast does not cost; the plan stays.
  RoutingMatrix flat(G, E);
  for (int s = 0; s < G; ++s)
    for (int e = 0; e < E; ++e) flat.mutable_at(s, e) = slots / E;
  LayerPlan even(flat);
  CHECK_FALSE(calibrate(even, 1, 2, t.model, cost));
  CHECK(even.replicas.empty());
}

TEST_CASE("hecate: calibrated copies are broadcast after the gate, before the dispatch") {
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.overlap_degree=1", "policy.hecate.memory_slots=3",
                            "policy.hecate.calibrate=true"});
  auto policy = make_policy(t.ex.spec.policy());
  PolicyReport report;
  // Iteration 0 predicts nothing, so whatever is copied comes from the calibration.
  const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), t.routing(4, 0), report});
  int calibrated = 0;
  for (const auto& op : g.ops()) {
    if (op.label.find("replica_bcast") != std::string::npos) FAIL("a predicted copy in iteration 0: " << op.label);
    if (op.label.find("replica_calibrate") == std::string::npos) continue;
    ++calibrated;
    const std::string layer = op.label.substr(0, op.label.find('.'));
    bool after_gate = false;
    for (OpId d : op.deps) after_gate = after_gate || g.op(d).label == layer + ".fwd.encode";
    CHECK(after_gate);
  }
  CHECK(calibrated > 0);  // Zipf routing: the hottest expert is worth copying at once
}

// ---- Memory slots ------------------------------------------------------------------------------

TEST_CASE("hecate: Algorithm 1 never gives a GPU more than m copies, nor copies outside the top t") {
  const Cluster cluster{test::platform("p3dn-v100", 4)};  // 32 GPUs on 4 nodes
  Rng rng(17);
  std::vector<int> owner(64);
  for (int e = 0; e < 64; ++e) owner[std::size_t(e)] = expert_owner(e, 64, 32);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<double> load(64);
    for (auto& x : load) x = std::pow(rng.uniform(), 3) * 1000;
    const int t = int(rng.below(20)), m = int(rng.below(8));
    const auto copies = sparse_materialize(load, owner, t, m, cluster);
    std::vector<int> per_gpu(32, 0);
    int replicated = 0;
    double coldest_copied = 1e300, hottest_not = 0;
    for (int e = 0; e < 64; ++e) {
      const auto& c = copies[std::size_t(e)];
      CHECK(std::set<int>(c.begin(), c.end()).size() == c.size());  // one copy per GPU
      CHECK(std::count(c.begin(), c.end(), owner[std::size_t(e)]) == 0);
      for (int g : c) ++per_gpu[std::size_t(g)];
      if (c.empty()) hottest_not = std::max(hottest_not, load[std::size_t(e)]);
      else coldest_copied = std::min(coldest_copied, load[std::size_t(e)]), ++replicated;
    }
    INFO("t = " << t << ", m = " << m);
    CHECK(*std::max_element(per_gpu.begin(), per_gpu.end()) <= std::min(m, t));  // m ← min(m, t) slots
    CHECK(replicated <= t);
    if (replicated > 0 && replicated < 64) CHECK(coldest_copied >= hottest_not);  // only the hottest
  }
}

TEST_CASE("hecate: with calibration a GPU still holds at most m copies per layer") {
  const int m = 2;
  const test::SmallSetup t({"policy.name=hecate", "policy.hecate.overlap_degree=4", "policy.hecate.memory_slots=2",
                            "policy.hecate.calibrate=true"});
  auto policy = make_policy(t.ex.spec.policy());
  for (int it = 0; it < 4; ++it) {
    PolicyReport report;
    const TaskGraph g = policy->build_iteration({t.cluster, t.model, t.gpu, t.ex.spec.policy(), t.routing(21, std::uint64_t(it)), report});
    std::map<std::pair<std::string, int>, int> held;  // (layer, GPU) -> copies
    for (const auto& op : g.ops())
      if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::reduce && op.label.find("replica_") != std::string::npos)
        for (std::size_t i = 1; i < c->group.size(); ++i) ++held[{op.label.substr(0, op.label.find('.')), c->group[i]}];
    INFO("iteration " << it);
    CHECK(!held.empty());
    for (const auto& [key, n] : held) CHECK(n <= m);
  }
}

TEST_CASE("dispatch: a source's own copy, else a copy on its node (spread evenly), else any copy") {
  const Cluster cluster(test::platform("dgx-a100", 2));  // GPUs 0-7 and 8-15
  LayerPlan plan(RoutingMatrix(16, 16), {Replica{0, {3, 9}}});  // expert 0: owner 0, copies on 3 and 9
  std::map<int, int> served;
  for (int s = 0; s < 16; ++s) {
    const int t = expert_target(plan, cluster, s, 0);
    if (s == 0 || s == 3 || s == 9) CHECK(t == s);  // local first
    CHECK(cluster.node_of(t) == cluster.node_of(s));  // then its own node: each node has a copy
    ++served[t];
  }
  CHECK(served[0] == 4);  // GPU 0 and three of node 0's six others
  CHECK(served[3] == 4);  // GPU 3 and the other three: even
  CHECK(served[9] == 8);  // the whole of node 1
  // No copy on node 1: its sources go to the copies there are, spread over them.
  LayerPlan one_node(RoutingMatrix(16, 16), {Replica{0, {3}}});
  std::set<int> used;
  for (int s = 8; s < 16; ++s) used.insert(expert_target(one_node, cluster, s, 0));
  CHECK(used == std::set<int>{0, 3});
  // An expert without copies: everyone sends to its owner.
  for (int s = 0; s < 16; ++s) CHECK(expert_target(plan, cluster, s, 5) == 5);
}
