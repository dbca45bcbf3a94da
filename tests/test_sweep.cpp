// Sweeps: expansion of axes and zip groups on hand cases, sharding, a sweep killed with SIGKILL and
// resumed (nothing finished lost, the same results as an uninterrupted run), shards merged (the
// same as one unsharded run), CSV export, and the refusals a user meets.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "errors.hpp"
#include "helpers.hpp"
#include "plot.hpp"
#include "results_db.hpp"
#include "sweep.hpp"
#include "textproto.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

spec::SweepSpec parse_sweep(const std::string& text) {
  spec::SweepSpec s;
  parse_text("sweep.textproto", text, s);
  return s;
}

// A small sweep of the base experiment (16 GPUs, 2 layers, 2 iterations): 3 policies × 3 routings
// × 2 seeds = 18 points of a fraction of a second each.
std::string small_sweep(const std::string& dir) {
  const std::string path = dir + "/sweep.textproto";
  test::write_file(path, "name: \"small\"\nbase: \"" + test::kBaseSpec +
                             "\"\n"
                             "set: \"cluster.nodes=2\" set: \"model.layers=2\" set: \"model.experts=16\" set: \"iterations=2\"\n"
                             "axis { field: \"policy.name\" values: [\"ep\", \"fastermoe-shadow\", \"pro-prophet\"] }\n"
                             "axis { field: \"gating.zipf.exponent\" values: [\"0.5\", \"1.0\", \"1.5\"] }\n"
                             "axis { field: \"seed\" values: [\"1\", \"2\"] }\n");
  return path;
}

// Point id -> (label, summary) of a database: what must not depend on how the sweep was run.
std::map<int, std::pair<std::string, std::string>> contents(const std::string& db) {
  std::map<int, std::pair<std::string, std::string>> out;
  for (const auto& p : ResultsDb(db, false).points()) out[p.id] = {p.label, p.summary.dump()};
  return out;
}

}  // namespace

TEST_CASE("sweep: axes multiply and zipped axes vary together with the last fastest") {
  const auto points = expand_sweep(parse_sweep(
      "axis { field: \"a\" values: [\"1\", \"2\"] }\n"
      "axis { field: \"b\" values: [\"x\", \"y\", \"z\"] }\n"
      "zip { axis { field: \"c\" values: [\"p\", \"q\"] } axis { field: \"d\" values: [\"r\", \"s\"] } }\n"
      "set: \"iterations=2\"\n"));
  REQUIRE(points.size() == 2 * 3 * 2);
  CHECK(points[0].label == "a=1 b=x c=p d=r");
  CHECK(points[1].label == "a=1 b=x c=q d=s");
  CHECK(points[2].label == "a=1 b=y c=p d=r");
  CHECK(points[11].label == "a=2 b=z c=q d=s");
  CHECK(points[5].overrides == std::vector<std::string>{"iterations=2", "a=1", "b=z", "c=q", "d=s"});
  for (std::size_t i = 0; i < points.size(); ++i) CHECK(points[i].index == int(i));
  // Sharding: points i, i+n, ...; the shards partition the sweep.
  const auto shard = shard_points(points, 1, 5);
  REQUIRE(shard.size() == 3);
  CHECK(shard[0].index == 1);
  CHECK(shard[1].index == 6);
  CHECK(shard[2].index == 11);
  std::size_t all = 0;
  for (int i = 0; i < 5; ++i) all += shard_points(points, i, 5).size();
  CHECK(all == points.size());
  CHECK_THROWS_AS(shard_points(points, 5, 5), InputError);
  // Bad grids are named by field.
  CHECK_THROWS_WITH(expand_sweep(parse_sweep("zip { axis { field: \"c\" values: [\"p\"] } axis { field: \"d\" values: [\"r\", \"s\"] } }")),
                    Contains("zip[0].axis[1].values"));
  CHECK_THROWS_WITH(expand_sweep(parse_sweep("axis { field: \"a\" }")), Contains("axis[0].values"));
}

TEST_CASE("sweep: a bad point is refused before anything runs and named") {
  const auto dir = test::temp_dir("sweep-bad");
  test::write_file(dir + "/sweep.textproto", "name: \"bad\"\nbase: \"" + test::kBaseSpec +
                                                 "\"\naxis { field: \"model.experts\" values: [\"64\", \"60\"] }\n");
  CHECK_THROWS_WITH(load_sweep(dir + "/sweep.textproto"), Contains("point 1 (model.experts=60)"));
  std::string out;
  CHECK(test::run_command(std::string(MOESIM_BIN) + " sweep " + dir + "/sweep.textproto --db " + dir + "/r.db", out) == 2);
  CHECK_FALSE(fs::exists(dir + "/r.db"));
}

TEST_CASE("sweep: killed with SIGKILL then resumed or sharded then merged it equals an uninterrupted run") {
  const auto dir = test::temp_dir("sweep");
  const std::string spec = small_sweep(dir), bin = MOESIM_BIN;
  std::string out;
  // The uninterrupted run.
  REQUIRE(test::run_command(bin + " sweep " + spec + " --jobs 2 -q --db " + dir + "/full.db", out) == 0);
  const auto full = contents(dir + "/full.db");
  REQUIRE(full.size() == 18);

  // Killed: one worker at a time, SIGKILL once a few points are in; then resumed.
  const std::string db = dir + "/killed.db";
  REQUIRE(test::run_command("(" + bin + " sweep " + spec + " --jobs 1 -q --db " + db + " & echo $! > " + dir +
                                "/pid) >/dev/null 2>&1",
                            out) == 0);
  const int pid = std::stoi(test::read_file(dir + "/pid"));
  std::size_t before = 0;
  for (int i = 0; i < 2000 && before < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (fs::exists(db)) before = ResultsDb(db, false).finished().size();
  }
  ::kill(pid, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its worker dies with it (PR_SET_PDEATHSIG)
  before = ResultsDb(db, false).finished().size();
  INFO("points finished before the kill: " << before);
  CHECK(before >= 3);
  CHECK(before < 18);
  for (const auto& [id, point] : contents(db)) CHECK(point == full.at(id));  // whole points only
  CHECK(test::run_command(bin + " sweep " + spec + " -q --db " + db, out) == 2);  // exists: --resume, or remove it
  CHECK_THAT(out, Contains("--resume"));
  REQUIRE(test::run_command(bin + " sweep " + spec + " --resume --jobs 2 -q --db " + db, out) == 0);
  CHECK(contents(db) == full);

  // Sharded in two and merged.
  REQUIRE(test::run_command(bin + " sweep " + spec + " --shard 0/2 -q --db " + dir + "/s0.db", out) == 0);
  REQUIRE(test::run_command(bin + " sweep " + spec + " --shard 1/2 -q --db " + dir + "/s1.db", out) == 0);
  CHECK(contents(dir + "/s0.db").size() == 9);
  REQUIRE(test::run_command(bin + " results merge " + dir + "/merged.db " + dir + "/s0.db " + dir + "/s1.db", out) == 0);
  CHECK(contents(dir + "/merged.db") == full);

  // CSV: a column per swept field, a row per run.
  REQUIRE(test::run_command(bin + " results export " + dir + "/full.db --csv --out " + dir + "/full.csv", out) == 0);
  const std::string csv = test::read_file(dir + "/full.csv");
  CHECK(csv.rfind("point,policy.name,gating.zipf.exponent,seed,variant,policy,gpus,iteration_time_s,", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 18);
  CHECK_THAT(csv, Contains("\n17,pro-prophet,1.5,2,,pro-prophet,16,"));
  // Per iteration, the warm-up marked (the base spec leaves none out: every row 0).
  REQUIRE(test::run_command(bin + " results export " + dir + "/full.db --iterations --out " + dir + "/its.csv", out) == 0);
  const std::string its = test::read_file(dir + "/its.csv");
  CHECK(its.rfind("point,policy.name,gating.zipf.exponent,seed,variant,iteration,warmup,time_s,dense_compute_s,", 0) == 0);
  CHECK(std::count(its.begin(), its.end(), '\n') == 1 + 18 * 2);
  CHECK_THAT(its, Contains("\n17,pro-prophet,1.5,2,,1,0,"));

  // A database of another sweep is refused, by resume and by merge.
  test::write_file(dir + "/other.textproto", test::read_file(spec) + "set: \"model.top_k=1\"\n");
  CHECK(test::run_command(bin + " sweep " + dir + "/other.textproto --resume -q --db " + db, out) == 2);
  CHECK_THAT(out, Contains("another sweep"));
  REQUIRE(test::run_command(bin + " sweep " + dir + "/other.textproto --shard 0/9 -q --db " + dir + "/o.db", out) == 0);
  CHECK(test::run_command(bin + " results merge " + dir + "/bad.db " + dir + "/s0.db " + dir + "/o.db", out) == 2);
  CHECK_FALSE(fs::exists(dir + "/bad.db"));

  // The database plots: time against GPU count needs two sizes, one point per series is enough here.
  if (!gnuplot_path().empty()) {
    PlotOptions o;
    o.figures = {"speedup"};
    o.out = dir + "/plots";
    CHECK(fs::file_size(plot({dir + "/full.db"}, o).at(0)) > 1000);
    // Without -o, a database named from its own folder (docs/sweeps.md's example): figures beside it.
    REQUIRE(test::run_command("cd " + dir + " && " + bin + " plot full.db --figure speedup", out) == 0);
    CHECK(fs::file_size(dir + "/speedup.pdf") > 1000);
  }
}

TEST_CASE("sweep: --emit-slurm writes a job array over the shards that resumes and says how to merge") {
  const auto dir = test::temp_dir("slurm");
  const auto sw = load_sweep(small_sweep(dir));
  const std::string script = slurm_script(sw, 6, 4, "/opt/moesim");
  CHECK(script.rfind("#!/bin/bash\n", 0) == 0);
  CHECK_THAT(script, Contains("#SBATCH --array=0-5\n"));
  CHECK_THAT(script, Contains("#SBATCH --cpus-per-task=4\n"));
  CHECK_THAT(script, Contains("--shard \"${SLURM_ARRAY_TASK_ID}/6\""));
  CHECK_THAT(script, Contains("--resume"));
  CHECK_THAT(script, Contains("'/opt/moesim' results merge results.db small-shard-*.db"));
  CHECK_THAT(script, Contains(fs::absolute(dir + "/sweep.textproto").lexically_normal().string()));
}

TEST_CASE("sweep: a path in the sweep's overrides is relative to the sweep file") {
  // A trace beside the sweep spec, named without a directory; the sweep is run from elsewhere.
  const auto dir = test::temp_dir("sweep-paths");
  std::string csv = "# moe-gating-trace v1\n# model: top_k=2, num_experts=16, moe_layers=1, src_ranks=1, microbatches_per_iter=1\n"
                    "# tokens_per_microbatch_per_src=64\niter,layer,src";
  for (int e = 0; e < 16; ++e) csv += ",e" + std::to_string(e);
  csv += "\n1,0,0";
  for (int e = 0; e < 16; ++e) csv += e == 3 ? ",38" : ",6";  // 38 + 15 × 6 = 128 = 64 tokens × top-2
  test::write_file(dir + "/routing.csv", csv + "\n");
  auto sweep = [&](const std::string& trace) {
    test::write_file(dir + "/sweep.textproto", "name: \"paths\"\nbase: \"" + test::kBaseSpec +
                                                   "\"\nset: \"cluster.nodes=2\" set: \"model.layers=1\" set: \"model.experts=16\"\n"
                                                   "set: \"iterations=1\"\naxis { field: \"gating.trace.path\" values: [\"" + trace + "\"] }\n");
    return dir + "/sweep.textproto";
  };
  REQUIRE_FALSE(fs::exists(fs::current_path() / "routing.csv"));
  const auto sw = load_sweep(sweep("routing.csv"));
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " sweep " + sw.path + " -q --db " + dir + "/paths.db", out) == 0);
  const auto points = ResultsDb(dir + "/paths.db", false).points();
  REQUIRE(points.size() == 1);
  CHECK_THAT(points[0].spec, Contains((fs::path(dir) / "routing.csv").lexically_normal().string()));
  CHECK(double(points[0].summary["iteration_time_s"]) > 0);
  // Not beside the sweep: as given with --set, relative to the current directory, where it is not.
  CHECK_THROWS_WITH(load_sweep(sweep("elsewhere.csv")), Contains("gating.trace.path") && Contains("elsewhere.csv"));
}

TEST_CASE("aggregated collectives and one flow per message agree within 2% for every policy and routing") {
  // A sweep over policy × routing × sim.aggregate on 16 GPUs (each point its own process: one
  // SimGrid engine per process), compared pairwise.
  const auto dir = test::temp_dir("aggregate");
  test::write_file(dir + "/agg.textproto",
                   "name: \"agg\"\nbase: \"" + test::kBaseSpec +
                       "\"\nset: \"cluster.nodes=2\" set: \"model.layers=2\" set: \"model.experts=32\" set: \"iterations=2\"\n"
                       "set: \"policy.smartmoe.interval=1\" set: \"policy.hecate.overlap_degree=2\" set: \"policy.eplb.interval=1\"\n"
                       "axis { field: \"policy.name\" values: [\"ep\", \"zero3\", \"fastermoe-shadow\", \"fastermoe-smart\", "
                       "\"fastermoe\", \"replicate-top2\", \"pro-prophet\", \"schemoe\", \"tutel\", \"smartmoe\", \"flexmoe\", \"hecate\", \"eplb\"] }\n"
                       "axis { field: \"gating.zipf.exponent\" values: [\"0\", \"1.2\"] }\n"
                       "axis { field: \"sim.aggregate\" values: [\"true\", \"false\"] }\n");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " sweep " + dir + "/agg.textproto -q --db " + dir + "/agg.db", out) == 0);
  const auto points = ResultsDb(dir + "/agg.db", false).points();
  REQUIRE(points.size() == 13 * 2 * 2);
  for (std::size_t i = 0; i < points.size(); i += 2) {  // sim.aggregate is the fastest axis: true, false
    INFO(points[i].label << " vs " << points[i + 1].label);
    REQUIRE(points[i].overrides["sim.aggregate"] == "true");
    REQUIRE(points[i + 1].overrides["sim.aggregate"] == "false");
    const double aggregated = points[i].summary["iteration_time_s"], per_pair = points[i + 1].summary["iteration_time_s"];
    CHECK(aggregated == Approx(per_pair).epsilon(0.02));
  }
}

TEST_CASE("sweep: a speedup figure groups each point's GROUP/NAME variants under the point's name") {
  // Two platforms of 16 GPUs (the node count zipped with them), each with two skews × two policies
  // as variants: four groups, each point named by its platform, not by its node count.
  if (gnuplot_path().empty()) return;
  const auto dir = test::temp_dir("sweep-groups");
  std::string base = test::read_file(test::kBaseSpec);
  base = base.substr(0, base.find("cluster {")) + "cluster { platform: \"dgx-a100\" nodes: 2 }\n" +
         base.substr(base.find("model {"));
  for (const char* skew : {"z05", "z15"})
    for (const char* p : {"ep", "fastermoe-shadow"})
      base += fmt::format("variants {{ name: \"{}/{}\" set: \"gating.zipf.exponent={}\" set: \"policy.name={}\" }}\n", skew, p,
                          skew[1] == '0' ? "0.5" : "1.5", p);
  test::write_file(dir + "/base.textproto", base);
  test::write_file(dir + "/sweep.textproto",
                   "name: \"groups\"\nbase: \"base.textproto\"\nset: \"model.layers=1\" set: \"model.experts=16\" set: \"iterations=1\"\n"
                   "zip { axis { field: \"cluster.platform\" values: [\"dgx-a100\", \"rtx3090-nvlink\"] }\n"
                   "      axis { field: \"cluster.nodes\" values: [\"2\", \"4\"] } }\n");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " sweep " + dir + "/sweep.textproto -q --db " + dir + "/g.db", out) == 0);
  PlotOptions o;
  o.figures = {"speedup"};
  o.baseline = "ep";
  o.out = dir;
  plot({dir + "/g.db"}, o);
  const std::string gp = test::read_file(dir + "/speedup.gp");
  for (const char* group : {"\"dgx-a100 z05\" 1.0000", "\"dgx-a100 z15\" 1.0000", "\"rtx3090-nvlink z05\" 1.0000",
                            "\"rtx3090-nvlink z15\" 1.0000"})
    CHECK_THAT(gp, Contains(group));  // each group over its own ep
  CHECK_THAT(gp, !Contains("\"2 z05\"") && !Contains("cluster.nodes"));
}
