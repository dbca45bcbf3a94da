// Collective sweeps, in the manner of nccl-tests' alltoall_perf: the simulated time of a uniform
// all-to-all of S bytes per GPU (S/n to each peer) for each GPU count, size and algorithm, on one
// catalog platform. Tutel §3.4 (linear vs 2DH against GPU count) and ScheMoE Fig. 9 (four
// algorithms against message size) are such sweeps.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runner.hpp"

namespace moesim {

struct CollectiveSweep {
  std::string platform = "dgx-a100";
  std::vector<int> gpus = {16, 64, 256};      // multiples of the platform's GPUs per node
  std::vector<double> sizes = {1 << 20};      // S, bytes per GPU
  std::vector<std::string> algorithms = {"linear", "2dh"};
};

struct CollectivePoint {
  int gpus = 0;
  double bytes = 0;
  std::string algorithm;
  double seconds = 0;
};

/// Validates the sweep (InputError naming the option) and simulates every point on one platform of
/// max(gpus) GPUs, each all-to-all among the first `gpus` of them. `progress(done, total)` after
/// each point.
std::vector<CollectivePoint> run_collective_sweep(const CollectiveSweep& sweep,
                                                  const std::function<void(int, int)>& progress = {});

/// A paper's time(baseline) / time(algorithm) at one GPU count and size (claim, value, source and
/// tolerance in `paper`).
struct CollectiveClaim {
  int gpus = 0;
  double bytes = 0;
  std::string algorithm, baseline;
  spec::PaperValue paper;
};

/// A sweep from a CollectiveSweepSpec file (InputError with file, line and field when it is bad).
struct CollectiveSweepFile {
  CollectiveSweep sweep;
  std::string name, description;
  std::vector<CollectiveClaim> paper;
};
CollectiveSweepFile load_collective_sweep(const std::string& path);

/// Each claim next to the sweep's value (not finite when the sweep did not run its point), for
/// paper_table().
std::vector<PaperComparison> collective_comparisons(const CollectiveSweepFile& f, const std::vector<CollectivePoint>& points);

/// collective.json: {"platform", "points": [{"gpus", "bytes", "algorithm", "seconds"}, ...]}, and back.
nlohmann::json collective_json(const std::string& platform, const std::vector<CollectivePoint>& points);
std::vector<CollectivePoint> collective_points(const nlohmann::json& j);

/// "1M" = 1 MiB, "32K", "2G", or a byte count.
double parse_size(const std::string& text);
std::string format_size(double bytes);

}  // namespace moesim
