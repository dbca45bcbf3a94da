// The hardware backend's host device (hw/): the data path with real numbers for every placement
// policy, and the TaskGraph executor on threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "data_path.hpp"
#include "helpers.hpp"
#include "host_backend.hpp"
#include "op_work.hpp"
#include "policy.hpp"
#include "runner.hpp"
#include "textproto.hpp"

using namespace moesim;
using test::small_demo;

namespace {

constexpr double kTolerance = 1e-5;  // fp32 sums in another order

}  // namespace

TEST_CASE("every placement policy computes plain EP's outputs and gradients on the host device") {
  const Experiment ex = small_demo();
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  REQUIRE(ex.variants.size() == policy_names().size());  // the demo lists every policy
  // And Hecate's options: heterogeneous re-sharding every 2 iterations (experts change owner),
  // re-materialization, the calibration stage.
  auto variants = ex.variants;
  for (const auto& [name, set] : std::vector<std::pair<std::string, std::string>>{
           {"hecate-reshard", "policy.hecate.reshard_interval=2"},
           {"hecate-rm", "policy.hecate.rematerialize=true"},
           {"hecate-calibrate", "policy.hecate.calibrate=true"}}) {
    const auto hecate = std::find_if(ex.variants.begin(), ex.variants.end(), [](const auto& v) { return v.first == "hecate"; });
    REQUIRE(hecate != ex.variants.end());
    spec::ExperimentSpec s = hecate->second;
    apply_override(s, set);
    variants.emplace_back(name, s);
  }
  std::set<std::string> copied, migrated;
  const hw::DataPathRun ep = hw::run_data_path(cluster, model, gpu, ex.spec.policy(), 4, 7, 3.0);  // once for all
  for (const auto& [name, s] : variants) {
    INFO("policy " << name);
    const hw::DataPathRun run = hw::run_data_path(cluster, model, gpu, s.policy(), 4, 7, 3.0);
    for (std::size_t it = 0; it < run.numbers.size(); ++it) {
      INFO("iteration " << it);
      const hw::LayerNumbers ref = hw::reference_layer(run.problems[it]);
      const hw::LayerNumbers& got = run.numbers[it];
      CHECK(got.routing.counts() == ref.routing.counts());
      CHECK(hw::max_relative_difference(got, ref) < kTolerance);
      CHECK(hw::max_relative_difference(got, ep.numbers[it]) < kTolerance);
      // Every expert has exactly one owner, and its gradients are there and nowhere else.
      for (int e = 0; e < model.experts(); ++e) CHECK(!got.dw1[std::size_t(e)].empty());
      CHECK(got.bytes_moved > 0);
      if (got.copies > 0) copied.insert(name);
      if (got.migrations > 0) migrated.insert(name);
    }
  }
  // The check is not vacuous: the skewed gate makes these policies place copies or move experts.
  for (const char* p : {"zero2", "zero3", "fastermoe-shadow", "replicate-top2", "pro-prophet", "flexmoe", "hecate", "eplb"})
    CHECK(copied.count(p) == 1);
  CHECK(migrated.count("smartmoe") == 1);
  CHECK(migrated.count("eplb") == 1);
  CHECK(migrated.count("hecate-reshard") == 1);
  CHECK(copied.count("ep") == 0);
}

TEST_CASE("every policy's iteration graph runs on the host device") {
  const Experiment ex = small_demo({"iterations=2"});
  const ExperimentResult result = run_experiment(ex, {}, "host");
  CHECK(result.backend == "host");
  REQUIRE(result.runs.size() == policy_names().size());
  for (const RunResult& run : result.runs) {
    INFO("policy " << run.policy);
    REQUIRE(run.iterations.size() == 2);
    for (const auto& it : run.iterations) {
      CHECK(it.time > 0);
      CHECK(it.device_memory_peak > 0);
      CHECK(it.attribution.critical.total() == Approx(it.time).epsilon(1e-9));
    }
    REQUIRE(!run.timings.empty());
    const Timing& t = run.timings.front();
    for (std::size_t id = 0; id < t.start.size(); ++id) CHECK(t.end[id] >= t.start[id]);
  }
}

TEST_CASE("Tutel's sharded experts (fewer experts than GPUs) add up their slices to EP's numbers") {
  const Experiment ex = small_demo({"model.experts=4", "policy.name=tutel"}, test::kBaseSpec);
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  for (int r : {1, 2, 4}) {
    INFO("r = " << r);
    spec::PolicySpec p = ex.spec.policy();
    p.mutable_tutel()->set_parallel_r(r);
    const hw::DataPathRun run = hw::run_data_path(cluster, model, gpu, p, 1, 3, 1.0);
    const hw::LayerNumbers ref = hw::reference_layer(run.problems[0]);
    CHECK(hw::max_relative_difference(run.numbers[0], ref) < kTolerance);
    CHECK(run.numbers[0].copies == 4 * 3);  // each expert on its s = 4 GPUs
  }
}

TEST_CASE("the data path's comparison catches a wrong gradient") {
  const Experiment ex = small_demo();
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  const hw::DataPathRun run = hw::run_data_path(cluster, model, gpu, ex.spec.policy(), 1, 7, 3.0);
  hw::LayerNumbers wrong = run.numbers[0];
  wrong.dw2[5][17] += 1e-3f * (1 + std::abs(wrong.dw2[5][17]));
  CHECK(hw::max_relative_difference(wrong, hw::reference_layer(run.problems[0])) > 1e-4);
}

TEST_CASE("the host device executes a TaskGraph: transfers, lowered collectives and GEMMs in dependency order") {
  const Experiment ex = small_demo();
  const Cluster cluster(ex.cluster_spec);
  TaskGraph g(cluster.num_gpus());
  Compute c;
  c.gemms = {{64, 64, 64, 1}};
  const OpId a = g.add_compute(0, "gemm0", c);
  const OpId t = g.add_transfer(Stream::comm, "send0to9", {0, 9, 1 << 16}, {a});
  std::vector<int> everyone(std::size_t(cluster.num_gpus()));
  for (int r = 0; r < cluster.num_gpus(); ++r) everyone[std::size_t(r)] = r;
  const OpId ar = g.add_collective(Stream::comm, "allreduce", {CollectiveType::all_reduce, everyone, {1 << 20}, "ring"}, {t});
  const OpId b = g.add_compute(9, "gemm9", c, {ar});
  // An op of parts (FasterMoE's steps): each rank runs its own part; what depends on the op waits
  // for all of them.
  const OpId parts = g.add_computes("L0.fwd.C0", {{3, 9, 12}, make_works({c}), {0, 0, 0}}, {ar});
  const OpId after = g.add_compute(0, "gemm0 again", c, {parts});
  hw::HostBackend backend(cluster, MoeModel(ex.spec.model()));
  const Timing timing = backend.execute(g);
  REQUIRE(timing.start.size() == g.size());
  CHECK(timing.end[a] <= timing.start[t]);
  CHECK(timing.end[t] <= timing.start[ar]);
  CHECK(timing.end[ar] <= timing.start[b]);
  REQUIRE(timing.part_start.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(timing.part_start[i] >= timing.end[ar]);
    CHECK(timing.part_end[i] >= timing.part_start[i]);
    CHECK(timing.part_end[i] <= timing.start[after]);
  }
  CHECK(timing.start[parts] == *std::min_element(timing.part_start.begin(), timing.part_start.end()));
  CHECK(timing.end[parts] == *std::max_element(timing.part_end.begin(), timing.part_end.end()));
  CHECK(hw::participants(g.op(parts)) == std::vector<int>{3, 9, 12});
  for (OpId id = 0; id < g.size(); ++id) CHECK(timing.end[id] >= timing.start[id]);
  // Rank 9 received the 64 KiB message and a ring all-reduce's 2(n−1)/n · 1 MiB in steps.
  REQUIRE(timing.memory_peak.size() == std::size_t(cluster.num_gpus()));
  CHECK(timing.memory_peak[9] >= double(1 << 16));
  CHECK(backend.now() == Approx(timing.makespan()));
  // The participants of a transfer are both ends; the lowering is the simulator's.
  CHECK(hw::participants(g.op(t)) == std::vector<int>{0, 9});
  const Lowering ring = hw::communication_steps(g.op(ar), cluster);
  REQUIRE(ring.size() == 1);
  REQUIRE(ring.front().size() == 1);
  const Step& step = ring.front().front();
  CHECK(step.rounds == 2 * (cluster.num_gpus() - 1));
  // Each of the ring channels (one per NIC) carries its share of 2(n−1)/n · 1 MiB on each edge.
  CHECK(hw::wire_bytes(step.transfers.front(), step) ==
        std::size_t(2 * (cluster.num_gpus() - 1) * (1 << 20) / cluster.num_gpus() / cluster.ring_channels()));
}

TEST_CASE("the host device names the op a rank waited for too long") {
  const Experiment ex = small_demo();
  const Cluster cluster(ex.cluster_spec);
  TaskGraph g(cluster.num_gpus());
  Compute slow;
  slow.gemms = {{768, 768, 768, 1}};  // 0.9 GFLOP: far longer than the 10 ms the peer will wait
  const OpId a = g.add_compute(1, "L0.fwd.experts", slow);
  g.add_transfer(Stream::comm, "L0.fwd.send", {0, 1, 1024}, {a});
  hw::HostBackend backend(cluster, MoeModel(ex.spec.model()), {0.01});
  CHECK_THROWS_WITH(backend.execute(g), Catch::Contains("L0.fwd.send") && Catch::Contains("0.01 s"));
}
