// moesim sweep: an experiment at every point of a grid of overrides, points in parallel, results
// in SQLite; sharded, resumable, or as a Slurm job array.
#include <fmt/format.h>

#include <filesystem>

#include "command.hpp"
#include "errors.hpp"
#include "sweep.hpp"

namespace moesim::cli {
namespace {

struct Options {
  std::string spec, shard;
  SweepOptions sweep;
  bool emit_slurm = false, quiet = false;
  int slurm_shards = 8, slurm_cpus = 8;
};

int run(Options o, const Invocation& invocation) {
  const auto sw = load_sweep(o.spec);  // every point checked before anything runs
  if (o.emit_slurm) {
    fmt::print("{}", slurm_script(sw, o.slurm_shards, o.slurm_cpus, std::filesystem::absolute(invocation.argv[0]).string()));
    return 0;
  }
  if (!o.shard.empty()) {
    const auto slash = o.shard.find('/');
    try {
      if (slash == std::string::npos) throw std::invalid_argument("no /");
      o.sweep.shard = std::stoi(o.shard.substr(0, slash));
      o.sweep.shards = std::stoi(o.shard.substr(slash + 1));
    } catch (const std::exception&) {
      throw InputError("--shard " + o.shard + ": use i/n, e.g. --shard 0/4");
    }
  }
  const Progress progress(o.quiet, "point");
  const int failed = run_sweep(sw, o.sweep, [&](const SweepProgress& p) {
    progress.show(p.done, p.total, fmt::format(" ({} running{})", p.running, p.failed ? fmt::format(", {} failed", p.failed) : ""),
                  p.elapsed_s, p.eta_s);
  });
  fmt::print("{}: {} points in {}{}\n", sw.spec.name(), sw.points.size(), o.sweep.db,
             failed ? fmt::format(", {} failed (see above)", failed) : "");
  return failed ? 1 : 0;
}

}  // namespace

void add_sweep(CLI::App& app, Commands& commands, const Invocation& invocation) {
  auto* cmd = app.add_subcommand(
      "sweep",
      R"(Run an experiment at every point of a grid of overrides (SweepSpec), points in parallel, results in SQLite
  moesim sweep experiments/sweeps/policies-by-size.textproto             all points, --jobs = cores
  moesim sweep SPEC --resume                                           continue a killed sweep
  moesim sweep SPEC --shard 0/4 --db shard0.db                         one machine's quarter
  moesim sweep SPEC --emit-slurm --shards 16 > sweep.slurm             a Slurm job array of the shards
Then: moesim results export results.db --csv; moesim results merge all.db shard*.db; moesim plot results.db)");
  auto o = std::make_shared<Options>();
  cmd->add_option("spec", o->spec, "The sweep spec (.textproto)")->required();
  cmd->add_option("--jobs,-j", o->sweep.jobs, "Points run at once (worker processes); default: the cores")->check(CLI::Range(0, 4096));
  cmd->add_option("--db", o->sweep.db, "The results database")->capture_default_str();
  cmd->add_flag("--resume", o->sweep.resume, "Continue the sweep in --db: skip its finished points");
  cmd->add_option("--shard", o->shard, "Run only shard i of n (points i, i+n, ...), 0 <= i < n, e.g. 2/8");
  cmd->add_flag("--emit-slurm", o->emit_slurm, "Print a Slurm job-array script that runs --shards shards, and exit");
  cmd->add_option("--shards", o->slurm_shards, "--emit-slurm: how many shards (array tasks)")->capture_default_str();
  cmd->add_option("--cpus", o->slurm_cpus, "--emit-slurm: cores per array task")->capture_default_str();
  cmd->add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  commands.push_back({cmd, [o, invocation] { return run(*o, invocation); }});
}

}  // namespace moesim::cli
