// The moesim command line: parses, dispatches, and turns errors into exit statuses
// (0 success, 2 bad input, 1 internal failure). The work lives in the libraries.
#include <CLI/CLI.hpp>
#include <google/protobuf/stubs/logging.h>
#include <fmt/format.h>

#include <map>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <iostream>

#include "cluster.hpp"
#include "catalog.hpp"
#include "collective_sweep.hpp"
#include "collectives/collectives.hpp"
#include "errors.hpp"
#include "hw_info.hpp"
#include "gating.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "results_db.hpp"
#include "sweep.hpp"
#include "results.hpp"
#include "runner.hpp"
#include "spec.hpp"
#include "trace.hpp"
#include "trace_import.hpp"
#include "trace_stats.hpp"
#include "calibrate.hpp"
#include "compare.hpp"
#include "timeline_summary.hpp"
#include "generator.hpp"
#include "rescale.hpp"
#include "textproto.hpp"

using namespace moesim;

namespace {

int cmd_run(const std::optional<std::string>& spec_path, const std::string& out, const std::vector<std::string>& sets,
            bool quiet, const std::string& backend) {
  const auto ex = load_experiment(spec_path, sets);  // everything validated before any work
  const bool writer = launcher_rank() == 0;  // under mpirun only rank 0 prints and writes
  quiet = quiet || !writer;
  const bool demo = !spec_path;
  if (writer)
    for (const auto& note : ex.notes) fmt::print(stderr, "moesim: note: {}\n", note);
  if (demo && !quiet)
    fmt::print(stderr, "moesim demo: {} policies on {} simulated {} GPUs; routing: {}\n", ex.variants.size(),
               ex.cluster_spec.nodes() * ex.cluster_spec.node().gpus(), ex.cluster_spec.gpu().model(),
               ex.spec.gating().has_trace() ? "the real SmartMoE GPT-MoE trace, " + ex.spec.gating().trace().path()
                                            : "the generator preset calibrated to the real SmartMoE trace "
                                              "(the trace itself is not beside this checkout)");
  const auto wall0 = std::chrono::steady_clock::now();
  const std::string runs = ex.variants.empty() ? "" : fmt::format(" of {} variants' iterations", ex.variants.size());
  const auto result = run_experiment(ex, [&](int done, int total) {
    if (quiet) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    const double eta = s / done * (total - done);
    fmt::print(stderr, "\r  {}/{}{}  {:.1f} s elapsed, ETA {:.1f} s   ", done, total, runs.empty() ? " iterations" : runs, s, eta);
    if (done == total) fmt::print(stderr, "\n");
  }, backend);
  if (!writer) return 0;
  write_results(out, ex, result);
  fmt::print("{}", summary_table(ex, result));
  fmt::print("\n  wrote {0}/summary.json and {0}/timeline.json (open the timeline in https://ui.perfetto.dev)\n", out);
  if (!demo) return 0;
  // The demo also draws: the speedup of every policy and the routing's expert-load heatmap.
  if (gnuplot_path().empty()) {
    fmt::print("  (no figures: gnuplot is not installed; `apt-get install gnuplot-nox`, then `moesim plot {}`)\n", out);
  } else {
    PlotOptions figures;
    figures.figures = {"speedup", "heatmap"};
    figures.format = "png";
    for (const auto& f : plot({out}, figures)) fmt::print("  wrote {}\n", f);
  }
  fmt::print("\nThat was the default demo ({}). Next: `moesim plot {}` for every figure (PDF), "
             "`moesim run experiments/<paper>/<figure>.textproto` to check a paper's claim, "
             "`moesim run --set cluster.nodes=32` for a bigger cluster, `moesim --help` for the rest.\n",
             kDemoSpec, out);
  return 0;
}

struct GenOptions {
  std::string preset = "naive";
  int experts = 32, top_k = 2, layers = 12, sources = 16, tokens = 4096, iterations = 100;
  std::uint64_t seed = 1;
  std::vector<std::string> sets;
};

int cmd_trace_gen(const GenOptions& o, const std::string& out, bool quiet) {
  spec::GeneratorSpec g;
  g.set_preset(o.preset);
  for (const auto& s : o.sets) apply_override(g, s);
  GeneratorParams params;
  try {
    params = resolve_generator(g);
  } catch (const FieldError& e) {
    throw InputError("trace gen: " + std::string(e.what()));
  }
  if (o.experts < 1 || o.top_k < 1 || o.top_k > o.experts || o.layers < 1 || o.sources < 1 || o.tokens < 1 ||
      o.iterations < 1)
    throw InputError("trace gen: experts, layers, sources, tokens and iterations must be >= 1, top-k in [1, experts]");
  spec::TraceHeader h;
  h.set_version(1);
  h.set_model(fmt::format("moesim synthetic generator, preset {}", o.preset));
  h.set_provenance(fmt::format("moesim trace gen --preset {} --seed {}; parameters: {}", o.preset, o.seed,
                               to_text(g).empty() ? "preset defaults" : to_text(g)));
  h.set_experts(o.experts);
  h.set_top_k(o.top_k);
  h.set_layers(o.layers);
  h.set_sources(o.sources);
  h.set_tokens_per_source(o.tokens);
  h.set_iteration_stride(1);
  h.set_rows_sum_to_tokens_times_k(true);
  h.add_comments("# moe-gating-trace v1");
  h.add_comments(fmt::format("# source: moesim trace gen --preset {} --seed {} (synthetic)", o.preset, o.seed));
  h.add_comments(fmt::format("# model: synthetic, top_k={}, num_experts={}, moe_layers={}, src_ranks={}", o.top_k,
                             o.experts, o.layers, o.sources));
  GatingGenerator gen(params, o.experts, o.top_k, o.layers, o.sources, o.tokens, o.seed);
  TraceWriter writer(out, h);
  const auto t0 = std::chrono::steady_clock::now();
  spec::TraceRecord rec;
  for (int it = 0; it < o.iterations; ++it) {
    for (int l = 0; l < o.layers; ++l) {
      rec.Clear();
      rec.set_iteration(std::uint64_t(it));
      rec.set_layer(std::uint32_t(l));
      set_record_counts(rec, gen.next(l));
      writer.write(rec);
    }
    if (!quiet) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(stderr, "\r  iteration {}/{}  {:.1f} s, ETA {:.1f} s   ", it + 1, o.iterations, s,
                 s / (it + 1) * (o.iterations - it - 1));
    }
  }
  writer.close();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet) fmt::print(stderr, "\n");
  const double cells = double(o.iterations) * o.layers * o.sources * o.experts;
  fmt::print("{}: {} iterations × {} layers × {} sources × {} experts in {:.2f} s ({:.1f} M cells/s, {:.1f} MB/s)\n",
             out, o.iterations, o.layers, o.sources, o.experts, s, cells / s / 1e6,
             double(std::filesystem::file_size(out)) / s / 1e6);
  return 0;
}

// One table per collective, as nccl-tests prints them: a row per GPU count, size and algorithm with
// the time, algbw and busbw, and each algorithm's speedup over the collective's first.
int cmd_collective(const CollectiveSweep& sweep, const std::string& out, bool quiet, const CollectiveSweepFile* file) {
  const auto wall0 = std::chrono::steady_clock::now();
  const auto points = run_collective_sweep(sweep, [&](int done, int total) {
    if (quiet) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    fmt::print(stderr, "\r  point {}/{}  {:.1f} s elapsed, ETA {:.1f} s   ", done, total, s, s / done * (total - done));
    if (done == total) fmt::print(stderr, "\n");
  });
  for (std::size_t i = 0; i < points.size();) {
    const CollectiveType type = points[i].collective;
    fmt::print("{}{} on {}: simulated time; algbw = S/t, busbw = algbw x {} (nccl-tests), GB/s of 1e9 B\n\n",
               i ? "\n" : "", collective_type_name(type), sweep.platform, bus_bandwidth_formula(type));
    const bool picks = type == CollectiveType::all_reduce;
    fmt::print("{:>6} {:>10}  {:<10} {:>12} {:>11} {:>11} {:>9}{}\n", "GPUs", "S", "algorithm", "time us", "algbw", "busbw",
               "speedup", picks ? "  NCCL would run" : "");
    std::map<std::pair<int, double>, double> first;  // (GPUs, S) -> the first algorithm's time
    for (; i < points.size() && points[i].collective == type; ++i) {
      const auto& p = points[i];
      const double base = first.emplace(std::make_pair(p.gpus, p.bytes), p.seconds).first->second;
      fmt::print("{:>6} {:>10}  {:<10} {:>12.1f} {:>11.2f} {:>11.2f} {:>8.2f}x{}\n", p.gpus, format_size(p.bytes), p.algorithm,
                 p.seconds * 1e6, p.algbw() / 1e9, p.busbw() / 1e9, base / p.seconds, picks ? "  " + p.nccl_pick : "");
    }
  }
  const std::string paper = file && !file->paper.empty() ? paper_table(collective_comparisons(*file, points)) : "";
  if (!paper.empty()) fmt::print("\n{}", paper);
  if (!out.empty()) {
    write_collective_results(out, sweep, points, file);
    fmt::print("  wrote {}/collective.json{}\n", out, paper.empty() ? "" : " and paper.md");
  }
  return 0;
}

// A platform, its errors naming file, line and field as `moesim run` does.
Cluster platform_cluster(const std::string& name) {
  ParsedFile file;
  const spec::ClusterSpec spec = load_platform(name, &file);
  try {
    return Cluster(spec);
  } catch (const FieldError& e) {
    throw InputError(file.describe(e.field(), e.message()));
  }
}

int cmd_platform_show(const std::string& name) {
  const Cluster c = platform_cluster(name);
  const auto& s = c.spec();
  fmt::print("{}: {}\n", s.name(), s.description());
  fmt::print("  nodes {} × {} GPUs ({}), {} GiB, {:.0f} GB/s memory\n", s.nodes(), s.node().gpus(), s.gpu().model(),
             s.gpu().memory_gib(), s.gpu().memory_gbytes_per_s());
  for (const auto& p : s.gpu().peak()) fmt::print("  peak {:<5} {:8.1f} TFLOP/s\n", dtype_name(p.dtype()), p.tflops());
  fmt::print("  routes inside a node (bottleneck GB/s, latency µs):\n");
  for (int i = 0; i < c.gpus_per_node(); ++i) {
    fmt::print("    gpu{}:", i);
    for (int j = 0; j < c.gpus_per_node(); ++j)
      if (i == j) fmt::print("      -    ");
      else fmt::print(" {:6.1f}/{:<3.1f}", c.route_bandwidth(c.intra_route(i, j)) / 1e9, c.route_latency(c.intra_route(i, j)) * 1e6);
    fmt::print("\n");
  }
  for (int i = 0; i < c.gpus_per_node() && !c.nics().empty(); ++i)
    if (c.nic_of(i) >= 0) {
      const Nic& nic = c.nics()[std::size_t(c.nic_of(i))];
      fmt::print("    gpu{} -> {} ({:.1f} GB/s{})\n", i, nic.name, nic.bandwidth / 1e9,
                 nic.staging_memory.empty() ? ", GPUDirect RDMA" : ", staged through host memory " + nic.staging_memory);
    }
  std::string ring;
  for (int g : c.ring_order()) ring += fmt::format(" {}", g);
  fmt::print("  ring order inside a node:{}; {} ring channel(s), entering a node at", ring, c.ring_channels());
  for (int ch = 0; ch < c.ring_channels(); ++ch) fmt::print(" gpu{}", c.ring_order()[std::size_t(c.channel_entry(ch))]);
  fmt::print("\n");
  fmt::print("  node uplink {:.1f} GB/s; fabric: {} nodes per leaf, {} spines\n", c.node_uplink_bandwidth() / 1e9,
             s.fabric().nodes_per_leaf(), s.fabric().spines());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every parse failure reaches the user as our own message (file, line, field); protobuf's log
  // lines would only repeat it less clearly.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  CLI::App app{
      "moesim: simulate distributed Mixture-of-Experts training on GPU clusters.\n"
      "A policy (expert parallelism, shadowing, ...) turns each iteration's token routing into a graph of\n"
      "compute and communication ops; SimGrid times it on a model of the cluster.\n\n"
      "  moesim run                          the default experiment (64 simulated A100s)\n"
      "  moesim run my.textproto --out res   an experiment of yours (schema: proto/moesim.proto)\n"
      "  moesim run experiments/fastermoe/fig13-johnny.textproto   a paper's figure: paper.md compares\n"
      "  moesim run --set policy.name=fastermoe --set cluster.nodes=4   any field, from the command line\n"
      "  moesim trace import|gen|stats|rescale|export ...   gating traces\n"
      "  moesim platform list                the cluster catalog; `moesim algorithms` the policies\n",
      "moesim"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moesim 0.1.0; hw backend: " + hw_backend_description());

  auto* run = app.add_subcommand("run", "Simulate an experiment; write summary.json and timeline.json");
  std::string spec_path, out = "moesim-out";
  std::vector<std::string> sets;
  bool quiet = false;
  run->add_option("spec", spec_path, "Experiment spec (.textproto or .json); default: the built-in demo, "
                                     "experiments/demo.textproto");
  run->add_option("--out,-o", out, "Output directory")->capture_default_str();
  run->add_option("--set,-s", sets,
                  "Override a spec field, e.g. --set cluster.nodes=4 --set model.top_k=1 "
                  "--set gating.zipf.exponent=1.2 (repeatable)");
  run->add_flag("--quiet,-q", quiet, "No progress on stderr");
  {
    std::string policies = "\nPolicies (policy.name; policies/policies.def):\n";
    for (const auto& p : policy_names()) policies += fmt::format("  {:<20} {}\n", p, policy_summary(p));
    run->footer(policies);
  }
  unsigned seeds = 0;
  run->add_option("--seeds", seeds,
                  "Run everything with N seeds (the spec's seed, +1, ...): times and paper values as mean and 95% "
                  "confidence interval, a claim inside the noise said so (same as --set seeds=N)")
      ->check(CLI::Range(1u, 1000u));
  std::string backend = "sim";
  run->add_option("--backend", backend,
                  "sim: the SimGrid model of the spec's cluster. host: the same graphs executed on this CPU (threads "
                  "as ranks, memcpy as transport, plain GEMMs; small models). hw: on this machine's GPUs through "
                  "CUDA, cuBLAS and NCCL (one rank per GPU; `mpirun -np N moesim run SPEC --backend hw` for more "
                  "machines)")
      ->check(CLI::IsMember({"sim", "host", "hw"}))
      ->capture_default_str();

  auto* platform = app.add_subcommand("platform", "The cluster catalog");
  platform->require_subcommand(1);
  auto* plist = platform->add_subcommand("list", "List the catalog's platforms");
  auto* pshow = platform->add_subcommand("show", "Show a platform: GPUs, routes inside a node, NICs, fabric");
  std::string pname;
  pshow->add_option("name", pname, "Catalog name or .textproto path")->required();
  auto* pexport = platform->add_subcommand("export", "Print a platform's text format");
  pexport->add_option("name", pname, "Catalog name or .textproto path")->required();

  auto* algos = app.add_subcommand("algorithms", "List the collective algorithms and policies");

  auto* compare_cmd = app.add_subcommand(
      "compare",
      "Two runs side by side: iteration time, critical-path phases, op classes, the ops that differ most\n"
      "  moesim run experiments/hw/moe-small.textproto --out sim-out\n"
      "  moesim run experiments/hw/moe-small.textproto --backend hw --out gpu-out\n"
      "  moesim compare sim-out gpu-out\n"
      "  moesim compare moesim-out moesim-out --a-variant ep --b-variant hecate   two variants of one run");
  std::string compare_a, compare_b;
  CompareOptions compare_options;
  compare_cmd->add_option("A", compare_a, "A results directory (or its summary.json)")->required();
  compare_cmd->add_option("B", compare_b, "Another, of the same spec")->required();
  compare_cmd->add_option("--top", compare_options.top_ops, "How many of the most different ops to list")->capture_default_str();
  compare_cmd->add_option("--a-variant", compare_options.a_variant,
                          "Compare this variant of A (with --b-variant: two variants, of one run when A and B are the same)");
  compare_cmd->add_option("--b-variant", compare_options.b_variant, "... with this variant of B");

  auto* timeline_cmd = app.add_subcommand("timeline", "Read a run's timeline.json");
  timeline_cmd->require_subcommand(1);
  auto* tsummary = timeline_cmd->add_subcommand(
      "summary",
      "Per layer, each phase in the order it starts on the hottest and the median GPU, its busy time and how much\n"
      "of it hides under expert compute (docs/timeline.md):\n"
      "  moesim run --out res && moesim timeline summary res --variant tutel --layer 3");
  std::string timeline_run;
  TimelineSummaryOptions timeline_options;
  tsummary->add_option("run", timeline_run, "A results directory (or its timeline.json)")->required();
  tsummary->add_option("--variant", timeline_options.variant, "Which variant (default: the first)");
  tsummary->add_option("--layer", timeline_options.layer, "One layer (default: all, then the ops outside the layers)")
      ->check(CLI::NonNegativeNumber);

  auto* calibrate_cmd = app.add_subcommand(
      "calibrate",
      "Measure the GEMM-efficiency curve of the spec's expert shapes and dtype and the memory bandwidth on a\n"
      "hardware backend; write them as a GPU profile the simulator takes in place of the catalog's GPU:\n"
      "  moesim calibrate --backend hw --out profile.textproto\n"
      "  moesim run SPEC --set cluster.gpu_profile=profile.textproto");
  std::string calibrate_spec, calibrate_out = "profile.textproto";
  std::vector<std::string> calibrate_sets;
  CalibrateOptions calibrate_options;
  calibrate_cmd->add_option("spec", calibrate_spec, "Experiment spec whose model is measured (default: the demo's)");
  calibrate_cmd->add_option("--backend", calibrate_options.backend, "host (this CPU) or hw (GPU 0 through CUDA)")
      ->check(CLI::IsMember({"host", "hw"}))
      ->capture_default_str();
  calibrate_cmd->add_option("--out,-o", calibrate_out, "Profile to write (GpuSpec text format)")->capture_default_str();
  calibrate_cmd->add_option("--set,-s", calibrate_sets, "Override a spec field (repeatable)");
  calibrate_cmd->add_option("--collective-ranks", calibrate_options.collective_ranks,
                            "Also time all-to-all and all-reduce over this many ranks (default: every GPU with hw, none on the host)")
      ->capture_default_str();
  bool calibrate_quiet = false;
  calibrate_cmd->add_flag("--quiet,-q", calibrate_quiet, "No progress on stderr");
  calibrate_cmd->add_option("--max-point-seconds", calibrate_options.max_point_seconds,
                            "End the GEMM sweep after a size that takes longer than this")
      ->capture_default_str();

  auto* coll = app.add_subcommand(
      "collective",
      "Time each collective per algorithm, GPU count and size, with nccl-tests' algbw and busbw\n"
      "  moesim collective --platform p4d-a100 --gpus 16 --sizes 256M              every collective, every algorithm\n"
      "  moesim collective --collectives all_reduce --gpus 8,16,64 --sizes 1G     one collective\n"
      "  moesim collective --gpus 16,64,256,1024 --sizes 1M,32M,256M --algorithms linear,2dh     Tutel §3.4\n"
      "  moesim collective experiments/schemoe/fig9-alltoall.textproto             a sweep spec with a paper's claims");
  CollectiveSweep sweep;
  std::vector<std::string> size_texts = {"1M"}, collective_names;
  std::string coll_out, coll_spec;
  coll->add_option("spec", coll_spec, "A sweep spec (CollectiveSweepSpec, e.g. experiments/tutel/alltoall-crossover.textproto); "
                                      "options given on the command line override it");
  coll->add_option("--platform", sweep.platform, "Catalog platform")->capture_default_str();
  coll->add_option("--gpus", sweep.gpus, "GPU counts (whole nodes)")->delimiter(',')->capture_default_str();
  coll->add_option("--sizes", size_texts,
                   "S as nccl-tests sizes it (an all-reduce's buffer, all-gather's output, an all-to-all's bytes per GPU): "
                   "1K, 32M, 2G, ... (powers of 1024)")
      ->delimiter(',')
      ->capture_default_str();
  coll->add_option("--collectives", collective_names,
                   "all_to_all, all_reduce, all_gather, reduce_scatter, broadcast, reduce (default: each that has one of "
                   "--algorithms, or all)")
      ->delimiter(',');
  coll->add_option("--algorithms", sweep.algorithms,
                   "Algorithms (`moesim algorithms`; default every one of each collective); speedups are over the first")
      ->delimiter(',');
  coll->add_option("--out,-o", coll_out, "Also write DIR/collective.json");
  coll->add_flag("--quiet,-q", quiet, "No progress on stderr");

  auto* plot_cmd = app.add_subcommand(
      "plot",
      "Paper-style figures with gnuplot, one style for all (NAME.gp is kept beside NAME.pdf to restyle)\n"
      "  moesim plot moesim-out                       every figure a results directory supports\n"
      "  moesim plot res/fig23-16 res/fig23-64 res/fig23-256 --figure scaling --baseline fairseq\n"
      "  moesim plot ../shared/traces/smartmoe-gpt-e32-k2-r16/trace.csv --figure heatmap --layer 3\n"
      "Figures: speedup (bars over a baseline, grouped by GROUP/ in variant names or by summary),\n"
      "breakdown (stacked critical path), scaling (time or speedup vs GPUs; also collective.json),\n"
      "load (per-GPU computed tokens), heatmap (expert x iteration load), timeline (timeline.json)");
  std::vector<std::string> plot_inputs;
  PlotOptions plot_options;
  plot_cmd->add_option("results", plot_inputs, "Results directories or files: summary.json, collective.json, "
                                               "timeline.json, a gating trace (.trace, .csv)")
      ->required();
  plot_cmd->add_option("--figure,-f", plot_options.figures, "Only these figures (default: every one the inputs support)")
      ->delimiter(',')
      ->check(CLI::IsMember(figure_names()));
  plot_cmd->add_option("--format", plot_options.format, "pdf, png or svg")
      ->check(CLI::IsMember({"pdf", "png", "svg"}))
      ->capture_default_str();
  plot_cmd->add_option("--out,-o", plot_options.out, "Output directory (default: the first input's directory)");
  plot_cmd->add_option("--baseline", plot_options.baseline,
                       "Speedups over this run (variant NAME; default: the first); with scaling, plot speedup instead of time");
  plot_cmd->add_option("--layer", plot_options.layer, "heatmap: the MoE layer")->capture_default_str();
  plot_cmd->add_option("--timeline-gpus", plot_options.timeline_gpus, "timeline: how many GPUs")->capture_default_str();

  auto* report_cmd = app.add_subcommand(
      "report",
      "The validation report: every experiment with a paper's numbers, paper vs simulated, pass/fail\n"
      "  moesim report --run --exclude fig23-layer-2048     run what has no results yet, then write report/report.md\n"
      "  moesim report --results results                    only read RESULTS/<name>/ (as `moesim run --out` wrote it)\n"
      "  moesim report --only schemoe --run                 one paper's experiments");
  ReportOptions report_options;
  report_cmd->add_option("--experiments", report_options.experiments, "Where the specs are (searched recursively)")
      ->capture_default_str();
  report_cmd->add_option("--results", report_options.results, "Results of each experiment in RESULTS/<name>/")
      ->capture_default_str();
  report_cmd->add_option("--out,-o", report_options.out, "Writes OUT/report.md and OUT/figures/")->capture_default_str();
  report_cmd->add_option("--ledger", report_options.ledger,
                         "The causes OUT/fidelity.md gives the claims that miss (Ledger in proto/moesim.proto)")
      ->capture_default_str();
  report_cmd->add_flag("--run", report_options.run, "Run (and save under RESULTS) the experiments that have no results yet");
  report_cmd->add_option("--seeds", report_options.seeds,
                         "With --run, run each experiment with N seeds: every claim as mean ± 95% interval, its verdict on "
                         "the interval (N times the time); a spec that sets `seeds` keeps its own")
      ->check(CLI::Range(1u, 1000u))
      ->capture_default_str();
  report_cmd->add_option("--jobs,-j", report_options.jobs,
                         "With --run, experiments run at once, each in its own process (default: the cores)")
      ->check(CLI::Range(1u, 256u));
  report_cmd->add_option("--only", report_options.only, "Only specs whose path contains one of these")->delimiter(',');
  report_cmd->add_option("--exclude", report_options.exclude, "Leave out specs whose path contains one of these")->delimiter(',');
  report_cmd->add_flag("--quiet,-q", quiet, "No progress on stderr");

  auto* sweep_cmd = app.add_subcommand(
      "sweep",
      "Run an experiment at every point of a grid of overrides (SweepSpec), points in parallel, results in SQLite\n"
      "  moesim sweep experiments/sweeps/policies-by-size.textproto             all points, --jobs = cores\n"
      "  moesim sweep SPEC --resume                                           continue a killed sweep\n"
      "  moesim sweep SPEC --shard 0/4 --db shard0.db                         one machine's quarter\n"
      "  moesim sweep SPEC --emit-slurm --shards 16 > sweep.slurm             a Slurm job array of the shards\n"
      "Then: moesim results export results.db --csv; moesim results merge all.db shard*.db; moesim plot results.db");
  std::string sweep_spec, shard_text;
  SweepOptions sweep_options;
  bool emit_slurm = false;
  int slurm_shards = 8, slurm_cpus = 8;
  sweep_cmd->add_option("spec", sweep_spec, "The sweep spec (.textproto)")->required();
  sweep_cmd->add_option("--jobs,-j", sweep_options.jobs, "Points run at once (worker processes); default: the cores")
      ->check(CLI::Range(0, 4096));
  sweep_cmd->add_option("--db", sweep_options.db, "The results database")->capture_default_str();
  sweep_cmd->add_flag("--resume", sweep_options.resume, "Continue the sweep in --db: skip its finished points");
  sweep_cmd->add_option("--shard", shard_text, "Run only shard i of n (points i, i+n, ...), 0 <= i < n, e.g. 2/8");
  sweep_cmd->add_flag("--emit-slurm", emit_slurm, "Print a Slurm job-array script that runs --shards shards, and exit");
  sweep_cmd->add_option("--shards", slurm_shards, "--emit-slurm: how many shards (array tasks)")->capture_default_str();
  sweep_cmd->add_option("--cpus", slurm_cpus, "--emit-slurm: cores per array task")->capture_default_str();
  sweep_cmd->add_flag("--quiet,-q", quiet, "No progress on stderr");

  auto* results_cmd = app.add_subcommand("results", "Sweep results databases: export, merge");
  results_cmd->require_subcommand(1);
  auto* rexport = results_cmd->add_subcommand("export", "Write a results.db as CSV (one row per point and variant)");
  std::string db_path, export_out;
  bool csv_flag = true, export_iterations = false;
  rexport->add_option("db", db_path, "The results database")->required();
  rexport->add_flag("--csv", csv_flag, "CSV (the only format; for the reader's clarity)");
  rexport->add_flag("--iterations", export_iterations, "One row per iteration instead of per run");
  rexport->add_option("--out,-o", export_out, "Output file (default: stdout)");
  auto* rmerge = results_cmd->add_subcommand("merge", "Combine shard databases of one sweep into a new one");
  std::string merge_out;
  std::vector<std::string> merge_inputs;
  rmerge->add_option("out", merge_out, "The database to create")->required();
  rmerge->add_option("inputs", merge_inputs, "Shard databases")->required();

  auto* trace = app.add_subcommand("trace", "Gating traces: import, export, generate, inspect, rescale");
  trace->require_subcommand(1);
  std::string input, output, format = "csv";
  ImportOptions import_options;
  std::vector<std::string> import_inputs;
  auto* timport = trace->add_subcommand(
      "import", "Convert a CSV trace, SmartMoE/FastMoE logs, or the rank files of a recorded PyTorch run to moesim's .trace format");
  timport->add_option("input", import_inputs,
                      "CSV file (iter,layer,src[,mb][,loss],e0..eN), a directory of table_iter*_rank*.log, or every rank's "
                      ".trace file of one run recorded by python/moesim_trace (README, Recording a PyTorch run)")
      ->required();
  timport->add_option("--out,-o", output, "Output .trace file")->required();
  timport->add_option("--from", format, "csv, smartmoe or ranks (default: smartmoe for a directory, ranks for .trace files, else csv)");
  timport->add_option("--top-k", import_options.top_k, "top-k of the gate, when the file's metadata lacks top_k=K");
  timport->add_option("--model", import_options.model, "Describe what produced the trace (header.model)");
  auto* tstats = trace->add_subcommand("stats", "Skew, drift and source similarity of a trace, per layer and overall");
  tstats->add_option("trace", input, "Input .trace file (or a CSV, imported on the fly)")->required();
  int stats_gpus = 0;
  std::uint64_t stats_from = 0;
  bool stats_json = false;
  tstats->add_option("--gpus", stats_gpus, "Also GPU-level max/mean with experts placed contiguously on this many GPUs");
  tstats->add_option("--from-iteration", stats_from, "Skip records before this iteration (e.g. a warm-up)");
  tstats->add_flag("--json", stats_json, "Machine-readable output");
  auto* tgen = trace->add_subcommand("gen", "Generate a seeded synthetic trace (shared/notes/gating-traces.md §6)");
  GenOptions gen;
  tgen->add_option("--out,-o", output, "Output .trace file")->required();
  tgen->add_option("--preset", gen.preset,
                   "naive (no balance loss, SmartMoE-like; FasterMoE's runs), aux (balanced), concentrated, pro-prophet "
                   "(fitted to Pro-Prophet Fig. 3: `moesim trace fit`)")
      ->capture_default_str();
  tgen->add_option("--experts", gen.experts, "Experts per layer")->capture_default_str();
  tgen->add_option("--top-k", gen.top_k, "Experts per token")->capture_default_str();
  tgen->add_option("--layers", gen.layers, "MoE layers")->capture_default_str();
  tgen->add_option("--sources", gen.sources, "Sources (GPUs)")->capture_default_str();
  tgen->add_option("--tokens", gen.tokens, "Tokens per source per iteration")->capture_default_str();
  tgen->add_option("--iterations", gen.iterations, "Iterations")->capture_default_str();
  tgen->add_option("--seed", gen.seed, "Seed: the same seed gives the same trace on any machine")->capture_default_str();
  tgen->add_option("--set,-s", gen.sets, "Override a generator parameter, e.g. --set sigma_pop=1.5 --set tau=500");
  tgen->add_flag("--quiet,-q", quiet, "No progress on stderr");
  auto* tfit = trace->add_subcommand(
      "fit",
      "The presets fitted to what a paper reports of its own workload: each one's statistic, its target, the value the\n"
      "preset reaches as the table has it, and sigma_pop fitted again\n"
      "  moesim trace fit                   every fitted preset\n"
      "  moesim trace fit pro-prophet       one");
  std::vector<std::string> fit_names;
  tfit->add_option("preset", fit_names, "Fitted presets (default: all)");
  auto* trescale = trace->add_subcommand("rescale", "Map a trace to more sources and experts (see README, Gating)");
  RescaleOptions rescale;
  trescale->add_option("trace", input, "Input .trace file")->required();
  trescale->add_option("--out,-o", output, "Output .trace file")->required();
  trescale->add_option("--sources", rescale.sources, "Sources (GPUs) of the new trace")->required();
  trescale->add_option("--experts", rescale.experts, "Experts of the new trace: a multiple of the trace's")->required();
  trescale->add_option("--tokens", rescale.tokens_per_source, "Tokens per source (default: the trace's)");
  trescale->add_option("--seed", rescale.seed, "Seed of the resampling")->capture_default_str();
  auto* texport = trace->add_subcommand("export", "Write a .trace file as CSV");
  texport->add_option("trace", input, "Input .trace file")->required();
  texport->add_option("--out,-o", output, "Output CSV file")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*run) {
      if (seeds > 0) sets.push_back(fmt::format("seeds={}", seeds));
      return cmd_run(spec_path.empty() ? std::nullopt : std::optional(spec_path), out, sets, quiet, backend);
    }
    if (*plist) {
      for (const auto& n : platform_names()) {
        spec::ClusterSpec c = load_platform(n);
        fmt::print("{:<16} {}\n", n, c.description());
      }
      return 0;
    }
    if (*pshow) return cmd_platform_show(pname);
    if (*compare_cmd) {
      fmt::print("{}", compare_runs(compare_a, compare_b, compare_options));
      return 0;
    }
    if (*tsummary) {
      fmt::print("{}", timeline_summary(timeline_run, timeline_options));
      return 0;
    }
    if (*calibrate_cmd) {
      const auto ex = load_experiment(calibrate_spec.empty() ? std::nullopt : std::optional(calibrate_spec), calibrate_sets);
      if (!calibrate_quiet) calibrate_options.progress = [](const std::string& line) { fmt::print(stderr, "  {}\n", line); };
      // The command as typed, for the profile's header (a comment: control characters become spaces).
      for (int i = 0; i < argc; ++i) {
        std::string word = i == 0 ? "moesim" : argv[i];
        for (char& ch : word)
          if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
        calibrate_options.command += (i ? " " : "") + word;
      }
      const Calibration cal = calibrate(ex, calibrate_options);
      write_atomically(calibrate_out, cal.text());
      fmt::print("wrote {}: peak {:.4g} TFLOP/s, {} GEMM points, {:.1f} GB/s; use it with --set cluster.gpu_profile={}\n",
                 calibrate_out, cal.gpu.peak(0).tflops(), cal.gemms.size(), cal.memory_bytes_per_s / 1e9, calibrate_out);
      return 0;
    }
    if (*sweep_cmd) {
      const auto sw = load_sweep(sweep_spec);  // every point checked before anything runs
      if (emit_slurm) {
        fmt::print("{}", slurm_script(sw, slurm_shards, slurm_cpus, std::filesystem::absolute(argv[0]).string()));
        return 0;
      }
      if (!shard_text.empty()) {
        const auto slash = shard_text.find('/');
        try {
          if (slash == std::string::npos) throw std::invalid_argument("no /");
          sweep_options.shard = std::stoi(shard_text.substr(0, slash));
          sweep_options.shards = std::stoi(shard_text.substr(slash + 1));
        } catch (const std::exception&) {
          throw InputError("--shard " + shard_text + ": use i/n, e.g. --shard 0/4");
        }
      }
      const int failed = run_sweep(sw, sweep_options, [&](const SweepProgress& p) {
        if (quiet) return;
        fmt::print(stderr, "\r  point {}/{} ({} running{})  {:.1f} s elapsed, ETA {:.1f} s   ", p.done, p.total, p.running,
                   p.failed ? fmt::format(", {} failed", p.failed) : "", p.elapsed_s, p.eta_s);
        if (p.done == p.total) fmt::print(stderr, "\n");
      });
      fmt::print("{}: {} points in {}{}\n", sw.spec.name(), sw.points.size(), sweep_options.db,
                 failed ? fmt::format(", {} failed (see above)", failed) : "");
      return failed ? 1 : 0;
    }
    if (*rexport) {
      const ResultsDb db(db_path, false);
      if (export_out.empty()) {
        db.export_csv(std::cout, export_iterations);
      } else {
        const std::string tmp = export_out + ".tmp";
        try {
          std::ofstream f(tmp);
          if (!f) throw InputError("-o " + export_out + ": cannot write there (does its folder exist?)");
          db.export_csv(f, export_iterations);
          if (!f.flush()) throw InputError("-o " + export_out + ": writing failed (disk full?)");
        } catch (...) {
          std::error_code ec;
          std::filesystem::remove(tmp, ec);  // nothing half-written
          throw;
        }
        std::filesystem::rename(tmp, export_out);
      }
      return 0;
    }
    if (*rmerge) {
      const int n = merge_results(merge_out, merge_inputs);
      fmt::print("{}: {} points from {} databases\n", merge_out, n, merge_inputs.size());
      return 0;
    }
    if (*report_cmd) {
      std::string command = "moesim report";
      for (int i = 2; i < argc; ++i)
        if (std::string(argv[i]) != "-q" && std::string(argv[i]) != "--quiet") command += std::string(" ") + argv[i];
      report_options.command = command;
      const auto entries = write_report(report_options, [&](const std::string& line) {
        if (!quiet) fmt::print(stderr, "  {}\n", line);
      });
      std::vector<PaperComparison> all;
      for (const auto& e : entries) all.insert(all.end(), e.claims.begin(), e.claims.end());
      const auto n = count_claims(all);
      fmt::print("{} claims from {} experiments: {} pass, {} fail, {} not run\n  wrote {}/report.md, fidelity.md, claims.json\n",
                 n.total(), entries.size(), n.pass, n.fail, n.not_run, report_options.out);
      return 0;
    }
    if (*plot_cmd) {
      for (const auto& f : plot(plot_inputs, plot_options)) fmt::print("  wrote {}\n", f);
      return 0;
    }
    if (*coll) {
      std::optional<CollectiveSweepFile> file;
      if (!coll_spec.empty()) file = load_collective_sweep(coll_spec);
      CollectiveSweep s = file ? file->sweep : sweep;
      if (coll->count("--platform")) s.platform = sweep.platform;
      if (coll->count("--gpus")) s.gpus = sweep.gpus;
      if (coll->count("--algorithms")) s.algorithms = sweep.algorithms;
      if (coll->count("--collectives")) {
        s.collectives.clear();
        for (const auto& name : collective_names) s.collectives.push_back(parse_collective_type(name));
      }
      if (!file || coll->count("--sizes")) {
        s.sizes.clear();
        for (const auto& t : size_texts) s.sizes.push_back(parse_size(t));
      }
      if (file) file->sweep = s;
      return cmd_collective(s, coll_out, quiet, file ? &*file : nullptr);
    }
    if (*timport) {
      const std::string& first = import_inputs.front();
      if (!timport->count("--from"))
        format = std::filesystem::is_directory(first) ? "smartmoe" : first.ends_with(".trace") ? "ranks" : "csv";
      if (format != "csv" && format != "smartmoe" && format != "ranks")
        throw FieldError("--from", "'" + format + "' is not a format; use csv, smartmoe or ranks");
      if (format != "ranks" && import_inputs.size() != 1)
        throw FieldError("input", fmt::format("{} inputs given; --from {} takes one (several: the rank files of a recorded run)",
                                              import_inputs.size(), format));
      const auto h = format == "ranks"      ? import_rank_traces(import_inputs, output, import_options)
                     : format == "smartmoe" ? import_smartmoe_logs(first, output, import_options)
                                            : import_csv(first, output, import_options);
      fmt::print("{}: {} layers × {} sources × {} experts, top-{}, {} tokens per source, iteration stride {}\n", output,
                 h.layers(), h.sources(), h.experts(), h.top_k(), h.tokens_per_source(), h.iteration_stride());
      return 0;
    }
    if (*tstats) {
      TraceReader reader(replay_trace_path(input));  // a CSV is read as `trace import` makes it
      TraceStats stats(reader.header(), stats_gpus, stats_from);
      spec::TraceRecord record;
      while (reader.next(record)) stats.add(record);
      fmt::print("{}\n", stats_json ? stats.json().dump(2) : stats.text());
      return 0;
    }
    if (*tgen) return cmd_trace_gen(gen, output, quiet);
    if (*tfit) {
      for (const auto& name : fit_names.empty() ? fitted_presets() : fit_names) {
        PresetFit f;
        try {
          f = fit_preset(name);
        } catch (const FieldError& e) {
          throw InputError("trace fit: " + e.message());
        }
        fmt::print("preset {} ({})\n  statistic: {}\n  target {:.3f}; the preset (sigma_pop {:.3f}) reaches {:.3f}; fitted again: "
                   "sigma_pop {:.3f} reaches {:.3f}\n",
                   f.preset, f.source, f.statistic, f.target, f.table_sigma_pop, f.table_reached, f.fitted_sigma_pop,
                   f.fitted_reached);
        for (const auto& [what, value] : f.others) fmt::print("  {}: {:.3f}\n", what, value);
      }
      return 0;
    }
    if (*trescale) {
      const auto h = rescale_trace(input, output, rescale);
      fmt::print("{}: {} sources × {} experts, {} tokens per source\n", output, h.sources(), h.experts(),
                 h.tokens_per_source());
      return 0;
    }
    if (*texport) {
      export_csv(input, output);
      return 0;
    }
    if (*pexport) {
      fmt::print("{}", to_text(load_platform(pname)));
      return 0;
    }
    if (*algos) {
      for (const auto* a : collective_algorithms())
        fmt::print("{:<15} {:<8} {}\n", collective_type_name(a->type), a->name, a->summary);
      for (const auto& p : policy_names()) fmt::print("{:<15} {:<20} {}\n", "policy", p, policy_summary(p));
      return 0;
    }
  } catch (const InputError& e) {
    fmt::print(stderr, "moesim: error: {}\n", e.what());
    return 2;
  } catch (const MachineError& e) {
    fmt::print(stderr, "moesim: machine error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moesim: internal error: {}\n", e.what());
    return 1;
  }
  return 0;
}
