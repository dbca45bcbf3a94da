// Sweeps (`moesim sweep SPEC`): an experiment spec run at every point of a grid of overrides
// (SweepSpec in proto/moesim.proto), points in parallel worker processes (SimGrid allows one engine
// per process), each finished point committed to results.db in one transaction, so that a sweep
// killed at any moment resumes (`--resume`) without losing or repeating a finished point.
// `--shard i/n` runs a deterministic subset (points i, i+n, i+2n, ...) for clusters; the shard
// databases merge into one (`moesim results merge`).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

struct SweepPoint {
  int index = 0;                       // its place in the expansion: the point's id in results.db
  std::string label;                   // "cluster.nodes=8 policy.name=ep"
  std::vector<std::pair<std::string, std::string>> values;  // (field, value) of each axis
  std::vector<std::string> overrides;  // the sweep's `set`, then field=value of each axis
};

/// The points of a sweep: the cartesian product of its axes, then its zip groups, the last fastest.
/// InputError (naming the field) for an axis without values or zip axes of unequal lengths.
std::vector<SweepPoint> expand_sweep(const spec::SweepSpec& sweep);

/// Points i, i+n, i+2n, ... of `points` (0 <= i < n).
std::vector<SweepPoint> shard_points(const std::vector<SweepPoint>& points, int i, int n);

struct Sweep {
  spec::SweepSpec spec;
  std::string path, base;            // the sweep file; the base experiment spec's path
  std::vector<std::string> fields;   // the swept fields, in axis order
  std::vector<SweepPoint> points;
};

/// Reads the sweep and checks every point's experiment (load_experiment) before anything runs.
Sweep load_sweep(const std::string& path);

struct SweepOptions {
  std::string db = "results.db";
  int jobs = 0;        // worker processes; 0 = the machine's cores
  int shard = 0, shards = 1;
  bool resume = false;
};

struct SweepProgress {
  int done = 0, total = 0, running = 0, failed = 0;
  double elapsed_s = 0, eta_s = 0;
  std::string last;  // the label of the point that just finished
};

/// Runs the sweep's points (this shard's, those not yet in the database when resuming) and returns
/// how many failed. A database that exists without --resume is refused (InputError), as is one of
/// another sweep.
int run_sweep(const Sweep& sweep, const SweepOptions& options,
              const std::function<void(const SweepProgress&)>& progress = {});

/// A Slurm job-array script that runs the sweep's shards (one array task per shard, each with
/// `cpus` cores and its own database) and says how to merge them.
std::string slurm_script(const Sweep& sweep, int shards, int cpus, const std::string& moesim);

}  // namespace moesim
