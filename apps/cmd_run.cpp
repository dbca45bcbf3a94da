// moesim run: simulate (or execute) an experiment and write its results.
#include <fmt/format.h>

#include <optional>

#include "command.hpp"
#include "hw_info.hpp"
#include "plot.hpp"
#include "policy.hpp"
#include "results.hpp"
#include "runner.hpp"
#include "spec.hpp"

namespace moesim::cli {
namespace {

struct RunOptions {
  std::string spec_path, out = "moesim-out", backend = "sim";
  std::vector<std::string> sets;
  bool quiet = false;
  unsigned seeds = 0;
};

int run(RunOptions o) {
  if (o.seeds > 0) o.sets.push_back(fmt::format("seeds={}", o.seeds));
  const bool demo = o.spec_path.empty();
  const auto ex = load_experiment(demo ? std::nullopt : std::optional(o.spec_path), o.sets);  // everything validated before any work
  const bool writer = launcher_rank() == 0;  // under mpirun only rank 0 prints and writes
  const bool quiet = o.quiet || !writer;
  if (writer)
    for (const auto& note : ex.notes) fmt::print(stderr, "moesim: note: {}\n", note);
  if (demo && !quiet)
    fmt::print(stderr, "moesim demo: {} policies on {} simulated {} GPUs; routing: {}\n", ex.variants.size(),
               ex.cluster_spec.nodes() * ex.cluster_spec.node().gpus(), ex.cluster_spec.gpu().model(),
               ex.spec.gating().has_trace() ? "the real SmartMoE GPT-MoE trace, " + ex.spec.gating().trace().path()
                                            : "the generator preset calibrated to the real SmartMoE trace "
                                              "(the trace itself is not beside this checkout)");
  const Progress progress(quiet, "iterations");
  const std::string runs = ex.variants.empty() ? "" : fmt::format(" of {} variants", ex.variants.size());
  const auto result = run_experiment(ex, [&](int done, int total) { progress(done, total, runs); }, o.backend);
  if (!writer) return 0;
  write_results(o.out, ex, result);
  fmt::print("{}", summary_table(ex, result));
  fmt::print("\n  wrote {0}/summary.json and {0}/timeline.json (open the timeline in https://ui.perfetto.dev)\n", o.out);
  if (const int stride = timeline_stride(result); stride > 1)
    fmt::print("  the timeline shows {}: all of them would be more than {} events\n", every_nth_gpu(stride), kMaxTimelineEvents);
  if (!demo) return 0;
  // The demo also draws: the speedup of every policy and the routing's expert-load heatmap.
  if (gnuplot_path().empty()) {
    fmt::print("  (no figures: gnuplot is not installed; `apt-get install gnuplot-nox`, then `moesim plot {}`)\n", o.out);
  } else {
    PlotOptions figures;
    figures.figures = {"speedup", "heatmap"};
    figures.format = "png";
    for (const auto& f : plot({o.out}, figures)) fmt::print("  wrote {}\n", f);
  }
  fmt::print("\nThat was the default demo ({}). Next: `moesim plot {}` for every figure (PDF), "
             "`moesim run experiments/<paper>/<figure>.textproto` to check a paper's claim, "
             "`moesim run --set cluster.nodes=32` for a bigger cluster, `moesim --help` for the rest.\n",
             kDemoSpec, o.out);
  return 0;
}

}  // namespace

void add_run(CLI::App& app, Commands& commands) {
  auto* run_cmd = app.add_subcommand("run", "Simulate an experiment; write summary.json and timeline.json");
  auto o = std::make_shared<RunOptions>();
  run_cmd->add_option("spec", o->spec_path, "Experiment spec (.textproto or .json); default: the built-in demo, "
                                            "experiments/demo.textproto");
  run_cmd->add_option("--out,-o", o->out, "Output directory")->capture_default_str();
  run_cmd->add_option("--set,-s", o->sets,
                      "Override a spec field, e.g. --set cluster.nodes=4 --set model.top_k=1 "
                      "--set gating.zipf.exponent=1.2 (repeatable)");
  run_cmd->add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  std::string policies = "\nPolicies (policy.name; policies/policies.def):\n";
  for (const auto& p : policy_names()) policies += fmt::format("  {:<20} {}\n", p, policy_summary(p));
  run_cmd->footer(policies);
  run_cmd->add_option("--seeds", o->seeds,
                      "Run everything with N seeds (the spec's seed, +1, ...): times and paper values as mean and 95% "
                      "confidence interval, a claim inside the noise said so (same as --set seeds=N)")
      ->check(CLI::Range(1u, 1000u));
  run_cmd->add_option("--backend", o->backend,
                      "sim: the SimGrid model of the spec's cluster. host: the same graphs executed on this CPU (threads "
                      "as ranks, memcpy as transport, plain GEMMs; small models). hw: on this machine's GPUs through "
                      "CUDA, cuBLAS and NCCL (one rank per GPU; `mpirun -np N moesim run SPEC --backend hw` for more "
                      "machines)")
      ->check(CLI::IsMember({"sim", "host", "hw"}))
      ->capture_default_str();
  commands.push_back({run_cmd, [o] { return run(*o); }});
}

}  // namespace moesim::cli
