// The balancer head-to-head (experiments/balancers/, docs/balancers.md): its specs and sweeps hold
// every balancer under every skew on the clusters the issue names, and what the reading rests on
// that can be derived by hand holds.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "helpers.hpp"
#include "runner.hpp"
#include "spec.hpp"
#include "sweep.hpp"

using namespace moesim;
namespace fs = std::filesystem;

namespace {
const std::string kDir = std::string(MOESIM_SOURCE_DIR) + "/experiments/balancers/";
const char* kTrace = MOESIM_SOURCE_DIR "/../shared/traces/smartmoe-gpt-e32-k2-r16/trace.csv";
}  // namespace

TEST_CASE("balancers: 7 balancers x 3 skews on each model, both clusters of each sweep") {
  if (!fs::exists(kTrace)) {
    test::skip(std::string(kTrace) + " is absent (the trace variants replay it)");
    return;
  }
  for (const auto& [model, gpus] : {std::pair<std::string, int>{"deepseek-v3-like", 64}, {"mixtral-like", 64}}) {
    INFO(model);
    const auto ex = load_experiment(kDir + model + ".textproto", {});
    std::set<std::string> names;
    for (const auto& [name, run] : ex.variants) names.insert(name);
    CHECK(names.size() == 21);
    for (const char* skew : {"naive", "aux-free", "trace"})
      for (const char* p : {"ep", "fastermoe", "pro-prophet", "hecate", "smartmoe", "flexmoe", "eplb"}) CHECK(names.count(std::string(skew) + "/" + p));
    for (const auto& [name, run] : ex.variants) {  // each skew is what its name says, the model the same
      CHECK(run.gating().has_trace() == (name.rfind("trace/", 0) == 0));
      CHECK(run.gating().has_aux_free() == (name.rfind("aux-free/", 0) == 0));
      CHECK(run.model().SerializeAsString() == ex.spec.model().SerializeAsString());
    }
    const auto sweep = load_sweep(kDir + model + "-sweep.textproto");
    REQUIRE(sweep.points.size() == 2);
    std::set<std::string> platforms;
    for (const auto& p : sweep.points) {
      const auto point = load_experiment(sweep.base, p.overrides);
      platforms.insert(point.cluster_spec.name());
      CHECK(int(point.cluster_spec.nodes() * point.cluster_spec.node().gpus()) == gpus);
    }
    CHECK(platforms == std::set<std::string>{"hgx-h800", "gb200-nvl72"});
  }
}

TEST_CASE("balancers: Hecate moves no expert under Mixtral's attention on an H800 node, so it runs as EP") {
  // t = floor(T_attention_forward · bw / expert bytes): a Mixtral expert is 3 · 4,096 · 14,336 BF16
  // parameters, 352 MB; the attention forward of 4,096 tokens takes about 1 ms on an H800, in which
  // 200 GB/s of NVLink moves 200 MB < 352 MB. With t = 0 and one expert a GPU, heterogeneous
  // sharding has nothing to shard: the same iterations as plain EP.
  // The spec without its trace variants (the trace may be absent here), its three runs as variants.
  std::string text, line;
  std::istringstream in(test::read_file(kDir + "mixtral-like.textproto"));
  while (std::getline(in, line))
    if (line.rfind("variants", 0) != 0) text += line + "\n";
  for (const char* p : {"ep", "hecate", "fastermoe"})
    text += std::string("variants { name: \"") + p + "\" set: \"policy.name=" + p + "\" }\n";
  const auto dir = test::temp_dir("balancers-hecate");
  test::write_file(dir + "/mixtral.textproto", text);
  const auto result = run_experiment(load_experiment(dir + "/mixtral.textproto", {"iterations=3", "warmup_iterations=1", "model.layers=1"}));
  std::map<std::string, double> time;
  for (const auto& r : result.runs) time[r.name] = r.mean_time();
  REQUIRE(time.size() == 3);
  CHECK(time["hecate"] == Approx(time["ep"]).epsilon(1e-9));
  CHECK(time["fastermoe"] < time["ep"]);  // a balancer that can act does
}

TEST_CASE("balancers: Mixtral-like EP 8 inside DP 8 on 64 GPUs of an NVL72 rack, groups inside the rack") {
  // parallel.ep = 8 on a 64-GPU part of one 72-GPU node: 8 EP groups of 8 consecutive GPUs, each
  // group's all-to-alls among its own GPUs, every token-slot computed once, simulated.
  std::string text, line;
  std::istringstream in(test::read_file(kDir + "mixtral-like.textproto"));
  while (std::getline(in, line))
    if (line.rfind("variants", 0) != 0) text += line + "\n";
  const auto dir = test::temp_dir("balancers-nvl72-dp");
  test::write_file(dir + "/mixtral.textproto", text);
  const auto result = run_experiment(load_experiment(
      dir + "/mixtral.textproto", {"cluster.platform=gb200-nvl72", "cluster.nodes=1", "cluster.gpus_per_node=64", "parallel.ep=8", "iterations=2",
                                   "warmup_iterations=1", "model.layers=1", "policy.name=fastermoe", "sim.timeline_iterations=1"}));
  const RunResult& r = result.runs.front();
  CHECK(r.gpus == 64);
  REQUIRE(r.graphs.size() == 1u);
  CHECK(test::forward_tokens(r.graphs[0]) == 64L * 4096 * 2);
  int exchanges = 0;
  for (const auto& op : r.graphs[0].ops())
    if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_to_all) {
      ++exchanges;
      REQUIRE(c->group.size() == 8u);
      CHECK(c->group.front() % 8 == 0);
      CHECK(c->group.back() == c->group.front() + 7);
    }
  CHECK(exchanges >= 8 * 4);  // each group's dispatch and combine, forward and backward
  CHECK(r.mean_time() > 0);
}
