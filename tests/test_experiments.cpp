// Experiments that carry a paper's numbers: the simulated counterpart of each claim (best of several
// baselines, groups and their aggregate, the RB balance ratio, critical-path categories, memory) on hand cases, the balance degree the
// iteration builder reports, a claim naming a variant that does not exist, and one workload for all
// the specs of a paper.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <google/protobuf/text_format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "results.hpp"
#include "runner.hpp"

using namespace moesim;
using Catch::Matchers::Contains;

namespace {

// A run whose iterations take `times` seconds, with per-layer load std-devs `stddev`.
RunResult run(const std::string& name, std::vector<double> times, std::vector<double> stddev = {}) {
  RunResult r;
  r.name = name;
  for (double t : times) {
    IterationRecord it;
    it.time = t;
    it.load_stddev_per_layer = stddev;
    r.iterations.push_back(it);
  }
  return r;
}

spec::PaperValue claim(const std::string& text) {
  spec::PaperValue p;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(text, &p));
  return p;
}

}  // namespace

TEST_CASE("a paper value's simulated counterpart: best baseline, groups, aggregates, balance") {
  ExperimentResult r;
  // Mean times. Group A: ep 10 s, fastermoe 6 s, pro-prophet 5 s. Group B: ep 8 s, fastermoe 9 s,
  // pro-prophet 4 s.
  r.runs = {run("A/ep", {10, 10}), run("A/fastermoe", {5, 7}), run("A/pro-prophet", {5, 5}),
            run("B/ep", {8, 8}),   run("B/fastermoe", {9, 9}), run("B/pro-prophet", {3, 5}),
            run("solo", {2, 4}),   run("base", {6, 6})};
  // One baseline, no groups: time(base) / time(solo) = 6 / 3.
  CHECK(simulated_value(claim(R"(variant: "solo" baseline: "base" value: 2)"), r) == Approx(2.0));
  // The best of two baselines, per group: A 6/5 = 1.2, B 8/4 = 2.
  const std::string best = R"(variant: "pro-prophet" baseline: "ep" baseline: "fastermoe" groups: "A" groups: "B" value: 1 )";
  CHECK(simulated_value(claim(best), r) == Approx(2.0));  // MAX is the default
  CHECK(simulated_value(claim(best + "aggregate: MIN"), r) == Approx(1.2));
  CHECK(simulated_value(claim(best + "aggregate: MEAN"), r) == Approx(1.6));
  CHECK(simulated_value(claim(best + "aggregate: GEOMEAN"), r) == Approx(std::sqrt(1.2 * 2.0)));
  // A single baseline: against ep only, A 10/5 = 2, B 8/4 = 2; against fastermoe A 1.2, B 2.25.
  CHECK(simulated_value(claim(R"(variant: "pro-prophet" baseline: "fastermoe" groups: "A" groups: "B" value: 1)"), r) ==
        Approx(2.25));

  // Warm-up iterations are left out of the means: (2 + 4) / 2, not (10 + 2 + 4) / 3.
  RunResult w = run("w", {10, 2, 4});
  w.warmup = 1;
  CHECK(w.mean_time() == Approx(3.0));
  w.warmup = 5;  // never all of them
  CHECK(w.mean_time() == Approx(4.0));

  // The quantities of part of an iteration: the critical path's phases, not the whole iteration.
  ExperimentResult m;
  m.runs = {run("base", {10}), run("moe", {9})};
  auto& base = m.runs[0].iterations[0].attribution.critical.seconds;
  auto& moe = m.runs[1].iterations[0].attribution.critical.seconds;
  base[int(Phase::expert_compute)] = 2;
  base[int(Phase::routing)] = 1;
  base[int(Phase::dispatch)] = 3;
  base[int(Phase::dense_compute)] = 4;
  moe[int(Phase::expert_compute)] = 1;
  moe[int(Phase::combine)] = 1.5;
  moe[int(Phase::sync)] = 0.5;
  moe[int(Phase::dense_compute)] = 6;
  CHECK(simulated_value(claim(R"(variant: "moe" baseline: "base" value: 1)"), m) == Approx(10.0 / 9));

  // ALL_TO_ALL: dispatch and combine (base 3, moe 1.5); OTHER_COMM: the sparse collectives, not
  // idle time; MEMORY and PARAM_MEMORY: the model states (all but activations) of the GPU whose
  // states need the most, not of the GPU that needs the most in all, and its parameters (owned +
  // materialized), baseline over variant.
  base[int(Phase::replica_broadcast)] = 0.5;
  moe[int(Phase::replica_reduce)] = 1;
  moe[int(Phase::expert_moves)] = 1;
  moe[int(Phase::idle)] = 7;
  m.runs[0].iterations[0].memory = {4, 1, 6, 2, 3, 1};        // total 16: the most activations, states 14
  m.runs[0].iterations[0].state_memory = {4, 1, 6, 1, 5, 2};  // states 16, parameters 4 + 2
  m.runs[1].iterations[0].memory = m.runs[1].iterations[0].state_memory = {4, 1, 6, 1, 0, 0};  // states 11, parameters 4
  CHECK(simulated_value(claim(R"(variant: "moe" baseline: "base" quantity: ALL_TO_ALL value: 1)"), m) == Approx(2.0));
  CHECK(simulated_value(claim(R"(variant: "moe" baseline: "base" quantity: OTHER_COMM value: 1)"), m) == Approx(0.25));
  CHECK(simulated_value(claim(R"(variant: "moe" baseline: "base" quantity: MEMORY value: 1)"), m) == Approx(16.0 / 11));
  CHECK(simulated_value(claim(R"(variant: "moe" baseline: "base" quantity: PARAM_MEMORY value: 1)"), m) == Approx(6.0 / 4));

  // BALANCE: per layer, std(best baseline) / std(variant), mean over iterations.
  ExperimentResult b;
  b.runs = {run("k1/fastermoe", {1, 1}, {4, 3}), run("k1/planner", {1, 1}, {1, 6}),
            run("k2/fastermoe", {1, 1}, {10, 2}), run("k2/planner", {1, 1}, {2, 2})};
  // Layer ratios: k1 4, 0.5; k2 5, 1.
  const std::string rb = R"(variant: "planner" baseline: "fastermoe" quantity: BALANCE groups: "k1" groups: "k2" value: 1 )";
  CHECK(simulated_value(claim(rb), b) == Approx(5.0));
  CHECK(simulated_value(claim(rb + "aggregate: MIN"), b) == Approx(0.5));
  CHECK(simulated_value(claim(rb + "aggregate: MEAN"), b) == Approx((4 + 0.5 + 5 + 1) / 4));
}

TEST_CASE("the builder reports each layer's balance degree and load spread of the per-GPU computed load") {
  // One HPWNV node (4 RTX 3090), one expert per GPU; every source sends 3 slots to expert 0 and 1
  // to expert 1. EP: GPU loads 12, 4, 0, 0 (std-dev sqrt(24) = 4.899). Expert 0 copied everywhere:
  // each GPU computes its own 3 slots for it, GPU 1 also the 4 for expert 1: 3, 7, 3, 3 (std-dev
  // sqrt(3) = 1.732).
  const spec::ClusterSpec cs = test::platform("rtx3090-pcie", 1);
  const Cluster cluster(cs);
  auto ex = load_experiment(test::kBaseSpec, {"cluster.platform=rtx3090-pcie", "cluster.nodes=1", "model.layers=1", "model.experts=4", "model.top_k=1",
                                          "model.tokens_per_gpu=4", "model.seq_len=4"});
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(cs.gpu(), model.dtype());
  RoutingMatrix R(4, 4);
  for (int s = 0; s < 4; ++s) R.mutable_at(s, 0) = 3, R.mutable_at(s, 1) = 1;
  const std::vector<RoutingMatrix> routing{R};
  // The load spread, max over mean: EP 12 / 4 = 3; copied 7 / 4 = 1.75.
  auto stats = [&](std::vector<Replica> replicas) {
    PolicyReport report;
    spec::PolicySpec ps;
    build_moe_iteration({cluster, model, gpu, ps, routing, report}, IterationPlan({{R, std::move(replicas)}}));
    REQUIRE(report.load_stddev.size() == 1);
    REQUIRE(report.load_max_mean.size() == 1);
    return std::pair{report.load_stddev[0], report.load_max_mean[0]};
  };
  CHECK(stats({}).first == Approx(std::sqrt(24.0)));
  CHECK(stats({}).second == Approx(3.0));
  CHECK(stats({everywhere(0, 4, 4)}).first == Approx(std::sqrt(3.0)));
  CHECK(stats({everywhere(0, 4, 4)}).second == Approx(1.75));
}

TEST_CASE("a paper value naming a variant the experiment lacks is rejected") {
  const auto dir = test::temp_dir("paper-groups");
  const std::string spec = dir + "/bad.textproto";
  test::write_file(spec, R"(name: "x"
cluster { platform: "dgx-a100" nodes: 2 }
model { layers: 1 d_model: 512 d_ffn: 1024 experts: 16 top_k: 1 seq_len: 128 tokens_per_gpu: 128 heads: 8 dtype: FP16 }
iterations: 1
variants { name: "A/ep" set: "policy.name=ep" }
variants { name: "A/pro-prophet" set: "policy.name=pro-prophet" }
variants { name: "B/ep" set: "policy.name=ep" }
paper { claim: "c" variant: "pro-prophet" baseline: "ep" groups: "A" groups: "B" value: 1.2 }
)");
  std::string out;
  const int rc = test::run_command(std::string(MOESIM_BIN) + " run " + spec + " --out " + dir + "/out", out);
  INFO(out);
  CHECK(rc == 2);
  CHECK_THAT(out, Contains("bad.textproto:8"));
  CHECK_THAT(out, Contains("'B/pro-prophet'"));
  CHECK_THAT(out, Contains("GROUP/NAME"));
  CHECK_FALSE(std::filesystem::exists(dir + "/out"));
}

TEST_CASE("sim.ideal leaves out the overheads: no per-message NIC cost, no NCCL call latency, no host sync, no launch") {
  const std::vector<std::string> small = {"cluster.nodes=2", "model.layers=2", "iterations=1"};
  const auto real = load_experiment(test::kBaseSpec, small);
  auto with_ideal = small;
  with_ideal.push_back("sim.ideal=true");
  const auto ideal = load_experiment(test::kBaseSpec, with_ideal);
  // GPU 0 to GPU 8: across the two nodes, through a NIC.
  CHECK(Cluster(real.cluster_spec).message_overhead_bytes(0, 8) > 0);
  CHECK(Cluster(ideal.cluster_spec).message_overhead_bytes(0, 8) == 0);
  CHECK(Cluster(real.cluster_spec).nccl_call_latency() == Approx(8.4e-6));
  CHECK(Cluster(ideal.cluster_spec).nccl_call_latency() == 0);
  CHECK(GpuModel(real.cluster_spec.gpu(), spec::FP16).host_sync_seconds() == Approx(15e-6));
  CHECK(GpuModel(ideal.cluster_spec.gpu(), spec::FP16).host_sync_seconds() == 0);
  CHECK(GpuModel(real.cluster_spec.gpu(), spec::FP16).launch_seconds() == Approx(7e-6));
  CHECK(GpuModel(ideal.cluster_spec.gpu(), spec::FP16).launch_seconds() == 0);
}

TEST_CASE("the timeline shows the first iteration after the warm-up") {
  // A warm-up iteration shows a policy before it has decided anything: Hecate's first iteration is
  // EP's. With one warm-up iteration of three, the timeline is iteration 1's, and Hecate's differs.
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=32", "iterations=3",
                                               "warmup_iterations=1"});
  ex.variants = {{"ep", ex.spec}, {"hecate", ex.spec}};
  ex.variants[1].second.mutable_policy()->set_name("hecate");
  const auto r = run_experiment(ex);
  const RunResult& h = r.run("hecate");
  CHECK(h.first_graph == 1);
  REQUIRE(h.graphs.size() == 1);
  CHECK(h.graphs[0].size() != r.run("ep").graphs[0].size());  // its copies are in the graph
  bool replicas = false;
  for (const auto& op : h.graphs[0].ops()) replicas |= op.label.find("replica_") != std::string::npos;
  CHECK(replicas);
}

TEST_CASE("a run too short for a steady timeline shows it from the first iteration") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=1", "iterations=2", "warmup_iterations=1",
                                               "sim.timeline_iterations=2"});
  const auto r = run_experiment(ex).runs.front();
  CHECK(r.first_graph == 0);
  CHECK(r.graphs.size() == 2);
}

TEST_CASE("a timeline over its event limit shows every stride-th GPU, and says so") {
  const auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=1", "iterations=1"});
  const auto r = run_experiment(ex);
  const std::size_t events = std::size_t(timeline_stride(r, 1));  // the stride for one event: every event
  CHECK(timeline_stride(r) == 1);  // a 16-GPU run is far under the default limit
  const std::size_t limit = (events + 3) / 4;
  REQUIRE(timeline_stride(r, limit) == 4);
  std::stringstream out;
  write_timeline(out, r, limit);
  const auto trace = nlohmann::json::parse(out.str());
  CHECK(trace.at("otherData").at("gpus") == fmt::format("every 4th GPU (the timeline keeps under {} events)", limit));
  CHECK(every_nth_gpu(2) == "every 2nd GPU");
  CHECK(every_nth_gpu(3) == "every 3rd GPU");
  CHECK(every_nth_gpu(11) == "every 11th GPU");
  CHECK(every_nth_gpu(12) == "every 12th GPU");
  CHECK(every_nth_gpu(21) == "every 21st GPU");
  CHECK(every_nth_gpu(112) == "every 112th GPU");
  const auto processes = timeline_processes(trace, "timeline.json");
  CHECK(processes.size() == 4u);  // GPUs 0, 4, 8, 12
  for (const auto& [pid, who] : processes) CHECK(who.second % 4 == 0);
  std::size_t shown = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") {
      ++shown;
      CHECK(e.at("pid").get<int>() % 4 == 0);
    }
  CHECK(shown > 0);
  CHECK(shown <= limit);
}

TEST_CASE("a confidence interval on known samples, and a claim's verdict on its interval") {
  // {1, 2, 3}: mean 2, s = 1, t(0.975, 2 d.f.) = 4.302653: half-width 4.302653 / sqrt(3) = 2.484138.
  CHECK(ci95_half_width({1, 2, 3}) == Approx(2.484138).epsilon(1e-6));
  // {10, 12}: s = sqrt(2), t(0.975, 1) = 12.706205: 12.706205 · sqrt(2) / sqrt(2) = 12.706205.
  CHECK(ci95_half_width({10, 12}) == Approx(12.706205).epsilon(1e-6));
  CHECK(ci95_half_width({5}) == 0);
  CHECK(ci95_half_width({2, 2, 2}) == 0);
  // A paper value of 2.0 within ±15%: [1.7, 2.3].
  spec::PaperValue p;
  p.set_value(2.0);
  auto verdict = [&](double simulated, double ci) { return PaperComparison{p, simulated, ci, {}}.verdict(); };
  CHECK(verdict(2.0, 0.1) == "pass");
  CHECK(verdict(2.0, 0.5) == "inside the noise");  // [1.5, 2.5] straddles both edges
  CHECK(verdict(2.25, 0.1) == "inside the noise");
  CHECK(verdict(3.0, 0.1) == "fail");
  CHECK(verdict(1.6, 0.0) == "fail");
  CHECK(verdict(1.75, 0.0) == "pass");
}

TEST_CASE("seeds: with --seeds N every variant runs N times, times and claims as mean and 95% interval") {
  const auto dir = test::temp_dir("seeds");
  const std::string spec = dir + "/seeds.textproto";
  test::write_file(spec, R"(name: "seeds"
cluster { platform: "dgx-a100" nodes: 2 }
model { layers: 2 d_model: 512 d_ffn: 1024 experts: 16 top_k: 2 seq_len: 128 tokens_per_gpu: 512 heads: 8 dtype: FP16 }
gating { zipf { exponent: 1.2 } }
iterations: 2
seed: 5
variants { name: "ep" set: "policy.name=ep" }
variants { name: "shadow" set: "policy.name=fastermoe-shadow" }
variants { name: "ep-1" set: "policy.name=ep" set: "model.layers=1" }
paper { claim: "shadowing vs EP" variant: "shadow" baseline: "ep" value: 1.2 }
)");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " run " + spec + " --seeds 3 -q --out " + dir + "/out", out) == 0);
  INFO(out);
  const auto s = nlohmann::json::parse(test::read_file(dir + "/out/summary.json"));
  for (const auto& v : s["variants"]) {
    const auto& over = v["iteration_time_over_seeds"];
    REQUIRE(over["per_seed_s"].size() == 3);
    CHECK(over["per_seed_s"][0].get<double>() == v["iteration_time_s"].get<double>());  // the first seed's run in full
    const auto times = over["per_seed_s"].get<std::vector<double>>();
    CHECK(times[0] != times[1]);  // each seed routes its own tokens
    CHECK(over["mean_s"].get<double>() == Approx((times[0] + times[1] + times[2]) / 3));
    CHECK(over["ci95_s"].get<double>() == Approx(ci95_half_width(times)));
  }
  // A variant with a model of its own says so; the others run the spec's.
  CHECK(s["variants"][2]["model"]["layers"] == 1);
  CHECK_FALSE(s["variants"][0].contains("model"));
  const auto& claim = s["paper"][0];
  REQUIRE(claim["simulated_per_seed"].size() == 3);
  CHECK(claim["simulated_ci95"].get<double>() > 0);
  CHECK(claim.contains("verdict"));
  CHECK_THAT(out, Contains("over 3 seeds") && Contains(" ± "));
  // The seed count is the experiment's: a variant that sets its own is refused.
  test::write_file(spec, test::read_file(spec) + "variants { name: \"x\" set: \"seeds=2\" }\n");
  CHECK(test::run_command(std::string(MOESIM_BIN) + " run " + spec + " -q --out " + dir + "/bad", out) == 2);
  CHECK_THAT(out, Contains("set it outside the variants"));
}

namespace {

constexpr const char* kPapers[] = {"fastermoe", "hecate", "pro-prophet", "schemoe", "tutel"};

// The experiment specs of one paper's folder (not its collective sweeps), by file name.
std::vector<std::filesystem::path> experiment_specs(const char* paper) {
  std::vector<std::filesystem::path> specs;
  for (const auto& f : std::filesystem::directory_iterator(std::string(MOESIM_SOURCE_DIR) + "/experiments/" + paper))
    if (f.path().extension() == ".textproto" &&
        test::read_file(f.path().string()).find("proto-message: moesim.spec.ExperimentSpec") != std::string::npos)
      specs.push_back(f.path());
  std::sort(specs.begin(), specs.end());
  return specs;
}

}  // namespace

// One workload per paper setup (issue 20: "one preset per paper setup, never one per claim"): every
// spec reproducing one paper's figures, the held-out ones too, draws the same routing. A spec that
// drew another (trevor's split trace once did, FasterMoE Fig. 13) would compare the paper's
// systems on a workload its other figures do not have.
TEST_CASE("the specs of one paper all draw its one workload") {
  // Specs that are no figure of their paper: a dense compute check whose routing nothing reads.
  const std::set<std::string> not_a_figure{"v100-dense-megatron.textproto"};
  int papers = 0;
  for (const char* paper : kPapers) {
    std::map<std::string, std::vector<std::string>> by_gating;  // the gating, as text -> the specs drawing it
    for (const auto& path : experiment_specs(paper)) {
      if (not_a_figure.count(path.filename().string())) continue;
      spec::ExperimentSpec s;
      REQUIRE(google::protobuf::TextFormat::ParseFromString(test::read_file(path.string()), &s));
      by_gating[s.gating().ShortDebugString()].push_back(path.filename().string());
    }
    std::string drawn;
    for (const auto& [gating, specs] : by_gating) drawn += fmt::format("\n  {} <- {}", gating, fmt::join(specs, ", "));
    INFO(paper << "'s workloads:" << drawn);
    CHECK(by_gating.size() == 1);
    ++papers;
  }
  CHECK(papers == 5);
}

TEST_CASE("a model has one shape in all the specs of its paper, its vocabulary included") {
  // A model's shape: what its paper fixes for it. Tokens, top-k and experts are an experiment's
  // (Hecate's weak scaling gives 32 experts at 16 GPUs and 64 at 32; Pro-Prophet runs k = 1 and 2),
  // and one layer is a layer benchmark of the model (FasterMoE Fig. 12): its layer count is left out.
  auto shape = [](const spec::ModelSpec& m) {
    return fmt::format("{}d_model {} d_ffn {} heads {} seq_len {} dtype {} vocab {} untied {}",
                       m.layers() == 1 ? "" : fmt::format("layers {} ", m.layers()), m.d_model(), m.d_ffn(), m.heads(), m.seq_len(),
                       spec::DType_Name(m.dtype()), m.vocab(), m.untied_output());
  };
  int models = 0;
  for (const char* paper : kPapers) {
    std::map<std::string, std::map<std::string, std::set<std::string>>> shapes;  // model -> shape -> specs
    for (const auto& path : experiment_specs(paper)) {
      const auto ex = load_experiment(path.string(), {});
      const std::string name = path.filename().string();
      if (ex.variants.empty()) shapes[ex.spec.model().name()][shape(ex.spec.model())].insert(name);
      for (const auto& [variant, s] : ex.variants) shapes[s.model().name()][shape(s.model())].insert(name);
    }
    for (const auto& [model, by_shape] : shapes) {
      std::string seen;
      std::set<std::string> whole, benchmarked;  // the models' shapes; a layer benchmark's, without "layers N"
      for (const auto& [sh, specs] : by_shape) {
        seen += fmt::format("\n  {} <- {}", sh, fmt::join(specs, ", "));
        (sh.rfind("layers ", 0) == 0 ? whole : benchmarked).insert(sh);
      }
      INFO(paper << "'s " << model << ":" << seen);
      CHECK(whole.size() <= 1);
      CHECK(benchmarked.size() <= 1);
      for (const auto& b : benchmarked)  // the layer benchmark's is the whole model's, less its layer count
        for (const auto& w : whole) CHECK(w.substr(w.find("d_model")) == b);
      ++models;
    }
  }
  CHECK(models >= 15);
}
