// Collective sweeps, in the manner of nccl-tests (all_reduce_perf, alltoall_perf, ...): the
// simulated time of each collective moesim lowers, with each of its algorithms, for each GPU count
// and size S on one catalog platform, with nccl-tests' algorithm and bus bandwidths (its
// doc/PERFORMANCE.md; S is its size: an all-reduce's or broadcast's buffer, all-gather's output,
// reduce-scatter's input, an all-to-all's bytes per rank, S/n to each peer). Tutel §3.4 (linear vs
// 2DH against GPU count) and ScheMoE Fig. 9 (four all-to-all algorithms against message size) are
// such sweeps.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runner.hpp"
#include "taskgraph.hpp"

namespace moesim {

/// The most GPUs and bytes a collective sweep takes: an all-to-all's exchange matrix grows with the
/// GPUs squared (8,192 GPUs: 67 M pairs); a TiB is far beyond nccl-tests' sizes.
inline constexpr int kMaxCollectiveGpus = 8192;
inline constexpr double kMaxCollectiveBytes = 1024.0 * 1024 * 1024 * 1024;

/// An all-to-all's bytes from a sampled top-k routing (CollectiveSweepSpec.Routed): DeepEP's
/// benchmark. A token's experts are drawn uniformly without replacement, within at most
/// `node_limit` nodes (its scores i.i.d., as the benchmark's are: the draw order is the score
/// order, so the first nodes drawn are the nodes of the highest scores); each GPU holds
/// experts / n consecutive experts.
struct RoutedExchange {
  int tokens = 4096, hidden = 7168, experts = 256, top_k = 8, node_limit = 4;
  double dispatch_bytes_per_element = 1 + 4.0 / 128, combine_bytes_per_element = 2;
  std::uint64_t seed = 1;
  std::optional<std::uint32_t> sms;  // DeepEP's kernels' SMs (unset: 20, its Buffer.num_sms)
};

struct CollectiveSweep {
  std::string platform = "dgx-a100";
  std::vector<int> gpus = {16, 64, 256};      // multiples of the platform's GPUs per node
  std::vector<double> sizes = {1 << 20};      // S
  /// Empty: every collective that has one of `algorithms` (all of them when that is empty too).
  std::vector<CollectiveType> collectives;
  /// Empty: every algorithm of each collective.
  std::vector<std::string> algorithms;
  /// Set: every all-to-all's bytes come from this routing, a dispatch and a combine per GPU count
  /// (`sizes` unused).
  std::optional<RoutedExchange> routed;
};

struct CollectivePoint {
  CollectiveType collective = CollectiveType::all_to_all;
  int gpus = 0;
  double bytes = 0;
  std::string algorithm;
  double seconds = 0;
  /// What NCCL's tuner would run for this size and group: an all-reduce's algorithm and protocol
  /// ("tree/LL128"; CostModel::nccl_tuner_input()), a broadcast's or reduce's protocol ("ring/Simple";
  /// chain_protocol()); empty for the other collectives.
  std::string nccl_pick;
  /// A routed sweep's "dispatch" or "combine"; `bytes` is then what DeepEP's benchmark counts for
  /// rank 0: between nodes the tokens it sends once per node (its own node too), inside one node
  /// the tokens it receives (from itself too). So algbw() is DeepEP's "bottleneck bandwidth".
  std::string exchange = {};
  double algbw() const { return bytes / seconds; }  // nccl-tests: S / t, bytes/s
  double busbw() const;                              // algbw × bus_bandwidth_factor(collective, gpus)
};

/// "all_reduce" -> CollectiveType::all_reduce (InputError naming the choices otherwise).
CollectiveType parse_collective_type(const std::string& name);

/// The sweep's (collective, algorithm) pairs in the order they run: collectives as given (or in
/// their enum order), each with its algorithms in `moesim algorithms` order; InputError when an
/// algorithm runs for none of the collectives or a collective has none of the algorithms.
std::vector<std::pair<CollectiveType, std::string>> collective_cases(const CollectiveSweep& sweep);

/// Validates the sweep (InputError naming the option) and simulates every point on one platform of
/// max(gpus) GPUs, each collective among the first `gpus` of them (a broadcast or reduce rooted at
/// rank 0). `progress(done, total)` after each point.
std::vector<CollectivePoint> run_collective_sweep(const CollectiveSweep& sweep,
                                                  const std::function<void(int, int)>& progress = {});

/// A paper's time(baseline) / time(algorithm) at one GPU count and size (claim, value, source and
/// tolerance in `paper`).
struct CollectiveClaim {
  int gpus = 0;
  double bytes = 0;
  std::string algorithm, baseline;  // all-to-all algorithms
  std::string exchange;             // routed: "dispatch" or "combine", the paper's value in GB/s
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

/// collective.json: {"platform", "points": [{"collective", "algorithm", "gpus", "bytes", "time_us",
/// "algbw_gbps", "busbw_gbps"}, ...]} (GB/s of 1e9 bytes, as nccl-tests prints), and back.
nlohmann::json collective_json(const std::string& platform, const std::vector<CollectivePoint>& points);
std::vector<CollectivePoint> collective_points(const nlohmann::json& j);

/// "1M" = 1 MiB, "32K", "2G", or a byte count.
double parse_size(const std::string& text);
std::string format_size(double bytes);

}  // namespace moesim
