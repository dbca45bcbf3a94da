// Hecate's FSSDP: Algorithm 1 (sparse materialization) on hand cases in both branches, and the
// policy's schedule: nothing materialized before loads are known, the copies' broadcasts (spAG)
// issued with the attention and never after the gate, every token-slot computed once, and under
// uniform routing no more than EP plus its sparse collectives.
#include <catch2/catch.hpp>
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
