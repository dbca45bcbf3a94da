// Tutel (Hwang et al.; docs/spec/tutel.md): adaptive pipelining's online strategy search
// (Algorithm 2, §2.3). The policy is in tutel.cpp; the pipelined layer is built by
// schedule/pipelined.cpp (no compressor) and schedule/sharded.cpp.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace moesim {

/// A pipelining strategy: degree × all-to-all algorithm.
struct Strategy {
  int degree = 1;
  std::string all_to_all = "linear";
  bool operator<(const Strategy& o) const { return degree != o.degree ? degree < o.degree : all_to_all < o.all_to_all; }
  bool operator==(const Strategy& o) const { return degree == o.degree && all_to_all == o.all_to_all; }
};

/// Algorithm 2: a table f → {strategy: measured time} and buckets of nearby f (width L), so that a
/// new capacity factor reuses what its bucket has tried. Known f: O(log M) (a map); a new f
/// re-sorts and re-packs the known ones, O(N log N) at worst, as the paper states.
class StrategySearch {
 public:
  StrategySearch(std::vector<Strategy> space, double bucket_length);
  /// GetStrategy(f): the best tried for f once all are tried for it; else the bucket's best once all
  /// are tried in the bucket; else one the bucket has not tried yet.
  Strategy get(double f);
  /// OptimizeStrategy(f, s, t): records the measured time of s at f.
  void record(double f, const Strategy& s, double seconds);
  int buckets() const { return int(bucket_of_.empty() ? 0 : bucket_of_.rbegin()->second + 1); }

 private:
  void recompute_buckets();
  // The bucket's times per strategy, each normalised to the bucket's lowest f (t · f_low / f).
  std::map<Strategy, double> bucket_times(int bucket) const;

  std::vector<Strategy> space_;
  double length_;
  std::map<double, std::map<Strategy, double>> tried_;  // f -> strategy -> seconds
  std::map<double, int> bucket_of_;                       // known f -> bucket index
};

/// Tutel's adaptive parallelism (docs/spec/tutel.md §1.4, the released code's `r`): with E experts on W GPUs
/// and E < W, each expert is sharded over s = W/E GPUs (ZeRO-style slices, the same for every r,
/// so switching moves no parameter). r = 0 is data parallelism (every GPU gathers every expert,
/// no all-to-all); r ≥ 1, a divisor of s, repeats the dispatch tensor r times and gathers each
/// expert inside groups of s/r GPUs: r = 1 is EP+DP (P1), r = s is EP+MP (P2). The computation per
/// GPU is the same for every r; the choice compares communication.
struct ParallelismOption {
  int r = 0;
  double alltoall_bytes = 0;   // per GPU per layer, forward: dispatch + combine of the (repeated) tokens
  double allgather_bytes = 0;  // per GPU per layer, forward: expert parameters received
  double memory_bytes = 0;     // per GPU per layer: parameter slices + transient gathered parameters + token buffers
  bool fits = true;            // memory_bytes within the budget given
  double comm_bytes() const { return alltoall_bytes + allgather_bytes; }
};
/// The options for W GPUs, E experts of `expert_bytes` parameters each, a dispatch tensor of
/// `dispatch_bytes` per GPU (E × ΔC × M elements), within `memory_budget` bytes per GPU and layer.
std::vector<ParallelismOption> parallelism_options(int gpus, int experts, double expert_bytes, double dispatch_bytes,
                                                   double memory_budget);
/// The switching rule, Tutel's inline router: among r ≥ 1 (P1 = EP+DP … P2 = EP+MP), the fitting
/// option with the least forward communication (ties: the smaller r); -1 when none fits. Data
/// parallelism (r = 0) is listed for its costs but only chosen explicitly (policy.tutel.parallel_r),
/// as in Tutel, whose router compares P1 and P2.
int choose_parallelism(const std::vector<ParallelismOption>& options);

}  // namespace moesim
