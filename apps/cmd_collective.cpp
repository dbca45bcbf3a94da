// moesim collective: each collective timed per algorithm, GPU count and size, printed as
// nccl-tests prints them (time, algbw, busbw) with each algorithm's speedup over the first.
#include <fmt/format.h>

#include <map>
#include <optional>

#include "collective_sweep.hpp"
#include "collectives/collectives.hpp"
#include "command.hpp"
#include "results.hpp"

namespace moesim::cli {
namespace {

struct Options {
  CollectiveSweep sweep;
  std::vector<std::string> sizes = {"1M"}, collectives;
  std::string out, spec;
  bool quiet = false;
};

// One table per collective: a row per GPU count, size and algorithm.
int time_collectives(const CollectiveSweep& sweep, const std::string& out, bool quiet, const CollectiveSweepFile* file) {
  const Progress progress(quiet, "point");
  const auto points = run_collective_sweep(sweep, [&](int done, int total) { progress(done, total); });
  for (std::size_t i = 0; i < points.size();) {
    const CollectiveType type = points[i].collective;
    if (sweep.routed)
      fmt::print("{} on {}, routed ({} tokens per GPU, top-{} of {} experts, hidden {}): simulated time; S = what DeepEP's "
                 "benchmark counts for rank 0 (tokens once per node sent, or inside a node received), algbw = S/t (its "
                 "bottleneck bandwidth), GB/s of 1e9 B\n\n",
                 collective_type_name(type), sweep.platform, sweep.routed->tokens, sweep.routed->top_k, sweep.routed->experts,
                 sweep.routed->hidden);
    else
      fmt::print("{}{} on {}: simulated time; algbw = S/t, busbw = algbw x {} (nccl-tests), GB/s of 1e9 B\n\n",
                 i ? "\n" : "", collective_type_name(type), sweep.platform, bus_bandwidth_formula(type));
    const bool picks = type == CollectiveType::all_reduce || type == CollectiveType::broadcast || type == CollectiveType::reduce;
    const int w = sweep.routed ? 16 : 10;  // "dispatch 123 MB"
    fmt::print("{:>6} {:>{}}  {:<10} {:>12} {:>11} {:>11} {:>9}{}\n", "GPUs", "S", w, "algorithm", "time us", "algbw", "busbw",
               "speedup", picks ? "  NCCL would run" : "");
    std::map<std::pair<int, double>, double> first;  // (GPUs, S) -> the first algorithm's time
    for (; i < points.size() && points[i].collective == type; ++i) {
      const auto& p = points[i];
      const double base = first.emplace(std::make_pair(p.gpus, p.bytes), p.seconds).first->second;
      fmt::print("{:>6} {:>{}}  {:<10} {:>12.1f} {:>11.2f} {:>11.2f} {:>8.2f}x{}\n", p.gpus,
                 p.exchange.empty() ? format_size(p.bytes) : fmt::format("{} {:.0f} MB", p.exchange, p.bytes / 1e6), w, p.algorithm,
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

// A spec's sweep with the command line's options over it.
int run(const Options& o, const CLI::App& cmd) {
  std::optional<CollectiveSweepFile> file;
  if (!o.spec.empty()) file = load_collective_sweep(o.spec);
  CollectiveSweep s = file ? file->sweep : o.sweep;
  if (cmd.count("--platform")) s.platform = o.sweep.platform;
  if (cmd.count("--gpus")) s.gpus = o.sweep.gpus;
  if (cmd.count("--algorithms")) s.algorithms = o.sweep.algorithms;
  if (cmd.count("--collectives")) {
    s.collectives.clear();
    for (const auto& name : o.collectives) s.collectives.push_back(parse_collective_type(name));
  }
  if (!file || cmd.count("--sizes")) {
    s.sizes.clear();
    for (const auto& t : o.sizes) s.sizes.push_back(parse_size(t));
  }
  if (file) file->sweep = s;
  return time_collectives(s, o.out, o.quiet, file ? &*file : nullptr);
}

}  // namespace

void add_collective(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand(
      "collective",
      R"(Time each collective per algorithm, GPU count and size, with nccl-tests' algbw and busbw
  moesim collective --platform p4d-a100 --gpus 16 --sizes 256M              every collective, every algorithm
  moesim collective --collectives all_reduce --gpus 8,16,64 --sizes 1G     one collective
  moesim collective --gpus 16,64,256,1024 --sizes 1M,32M,256M --algorithms linear,2dh     Tutel §3.4
  moesim collective experiments/schemoe/fig9-alltoall.textproto             a sweep spec with a paper's claims
  moesim collective experiments/deepep/normal-kernels.textproto             DeepEP's dispatch and combine, routed tokens)");
  auto o = std::make_shared<Options>();
  cmd->add_option("spec", o->spec, "A sweep spec (CollectiveSweepSpec, e.g. experiments/tutel/alltoall-crossover.textproto); "
                                   "options given on the command line override it");
  cmd->add_option("--platform", o->sweep.platform, "Catalog platform")->capture_default_str();
  cmd->add_option("--gpus", o->sweep.gpus, "GPU counts (whole nodes)")->delimiter(',')->capture_default_str();
  cmd->add_option("--sizes", o->sizes,
                  "S as nccl-tests sizes it (an all-reduce's buffer, all-gather's output, an all-to-all's bytes per GPU): "
                  "1K, 32M, 2G, ... (powers of 1024)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--collectives", o->collectives,
                  "all_to_all, all_reduce, all_gather, reduce_scatter, broadcast, reduce (default: each that has one of "
                  "--algorithms, or all)")
      ->delimiter(',');
  cmd->add_option("--algorithms", o->sweep.algorithms,
                  "Algorithms (`moesim algorithms`; default every one of each collective); speedups are over the first")
      ->delimiter(',');
  cmd->add_option("--out,-o", o->out, "Also write DIR/collective.json");
  cmd->add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  commands.push_back({cmd, [o, cmd] { return run(*o, *cmd); }});
}

}  // namespace moesim::cli
