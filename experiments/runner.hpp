// Running an experiment: for each iteration, the routing of every layer, the policy's TaskGraph,
// the backend's timing, and the numbers reported for it.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cost_model.hpp"
#include "memory_model.hpp"
#include "spec.hpp"
#include "taskgraph.hpp"

namespace moesim {

struct IterationRecord {
  int iteration = 0;
  std::uint64_t trace_iteration = 0;  // the gating source's own iteration number
  std::int64_t dropped = 0;            // tokens over capacity, all layers
  std::vector<std::int64_t> dropped_per_layer;
  double capacity_factor = 0;          // mean over layers of the factor in force
  std::int64_t rerouted = 0;           // token-slots a topology-aware gate re-routed
  int shadowed = 0;                    // experts shadowed, all layers
  int moved = 0;                       // experts moved with their optimizer states (a rearrangement), all layers
  double decision_seconds = 0;         // wall time of the policy's decisions (not deterministic)
  double start = 0;          // simulated clock at the iteration's start, seconds
  double time = 0;           // iteration time (makespan), seconds
  Attribution attribution;   // where the time went: critical path and busy time per phase, per layer
  double max_mean_load = 0;  // the routing's: mean over layers of max/mean tokens routed per GPU under
                             // E/G experts per GPU, before capacity drops (what the policy is given)
  std::vector<double> load_max_mean_per_layer;  // the policy's: per layer, max/mean token-slots computed per GPU
  std::vector<double> load_stddev_per_layer;  // std-dev over GPUs of the token-slots each computes
  std::vector<double> gpu_load;               // per GPU, token-slots its experts compute (all layers)
  MemoryUse memory;                           // of the GPU that needs the most (memory_model.hpp)
  MemoryUse state_memory;                     // of the GPU whose model states need the most (the same)
  std::vector<int> over_memory;               // the GPUs whose memory model exceeds the GPU's memory
  double device_memory_peak = 0;              // hardware backends: the most any rank allocated, bytes
  /// Per layer and expert, the token-slots the gate routed to the expert (after capacity drops).
  std::vector<std::vector<std::int64_t>> expert_load;
};

/// The cost model's DDL-Roofline quantities of one layer (first iteration).
struct LayerRoofline {
  int layer = 0;
  Roofline r;
};

struct RunResult {
  std::string name;  // the variant's name ("" for a plain experiment)
  std::string policy;
  int gpus = 0;
  std::vector<IterationRecord> iterations;
  std::vector<LayerRoofline> roofline;  // per layer, the first iteration's routing (after the gate)
  // Graph and timing of the iterations timeline.json shows: sim.timeline_iterations of them from the
  // first after the warm-up (earlier where the run is too short), graphs[i] being iteration
  // first_graph + i. A warm-up iteration shows a policy before it has decided anything (Hecate's
  // is EP's), and a GPU before its kernels are loaded.
  std::vector<TaskGraph> graphs;
  std::vector<Timing> timings;
  int first_graph = 0;

  int warmup = 0;  // leading iterations left out of the means (ExperimentSpec.warmup_iterations)
  /// The model's FLOPs per GPU and iteration (MoeModel::iteration_flops_per_gpu()) and the GPU's
  /// dense peak for the model's dtype: MFU = flops / (mean_time() × peak).
  double model_flops_per_gpu = 0, peak_flops = 0;
  double mfu() const { return mean_time() > 0 && peak_flops > 0 ? model_flops_per_gpu / (mean_time() * peak_flops) : 0; }
  /// With several seeds (ExperimentSpec.seeds), each seed's mean iteration time, the first seed's
  /// first; everything else in this run is the first seed's.
  std::vector<double> seed_times;

  /// The iterations the means are over: all but the warm-up (at least one).
  std::span<const IterationRecord> measured() const;
  double mean_time() const;
  /// The mean iteration time over the seeds and its 95% confidence half-width (0 with one seed).
  double seeds_mean_time() const;
  double seeds_ci95() const;
  /// Means over the measured iterations.
  Attribution mean_attribution() const;
  Breakdown mean_breakdown() const { return mean_attribution().critical; }
  double mean_load_stddev(int layer) const;
  /// Per GPU, the mean over the measured iterations of the token-slots it computes (empty when the
  /// policy does not report it).
  std::vector<double> mean_gpu_load() const;
  /// The load spread the policy leaves: per layer, max over mean of the token-slots the GPUs compute,
  /// averaged over the measured iterations (empty when the policy does not report it).
  std::vector<double> mean_load_max_mean() const;
  /// The most memory any GPU needed in any iteration.
  MemoryUse peak_memory() const;
  /// The most memory any GPU's model states (all but activations) needed in any iteration: what
  /// MEMORY and PARAM_MEMORY claims compare (figures that leave activations out).
  MemoryUse peak_state_memory() const;
};

/// The half-width of the 95% confidence interval of the mean of `samples` (Student's t with n − 1
/// degrees of freedom); 0 for fewer than two samples.
double ci95_half_width(const std::vector<double>& samples);

/// A paper's number next to the simulated one.
struct PaperComparison {
  spec::PaperValue paper;
  double simulated = 0;  // see simulated_value(); with several seeds, the mean over them
  double ci95 = 0;       // its 95% confidence half-width over the seeds (0: one seed)
  std::vector<double> per_seed = {};
  double ratio() const { return simulated / paper.value(); }
  double tolerance() const { return paper.tolerance() > 0 ? paper.tolerance() : 0.15; }
  bool pass() const { return std::abs(ratio() - 1) <= tolerance(); }
  /// On the interval: "pass" (all of it within tolerance), "fail" (none of it), or "inside the
  /// noise" (the interval straddles the tolerance's edge). With one seed, pass or fail.
  std::string verdict() const;
};

struct ExperimentResult {
  std::string backend = "sim";  // what executed the graphs (Backend::name())
  std::vector<RunResult> runs;  // one per variant, or the spec's own run
  std::vector<PaperComparison> paper;
  const RunResult& run(const std::string& name) const;
};

/// The simulated counterpart of a paper's value (PaperValue in proto/moesim.proto): the quantity of
/// the best baseline over the variant's, per group (per group and layer for BALANCE), aggregated.
double simulated_value(const spec::PaperValue& p, const ExperimentResult& result);

/// Runs every iteration of every run (the variants, or the spec itself) on one backend: "sim" (one
/// SimGrid engine), "host" (hw/'s host device) or "hw" (GPUs through CUDA and NCCL, where built).
/// `progress(done, total)` is called after each iteration.
ExperimentResult run_experiment(const Experiment& ex, const std::function<void(int, int)>& progress = {},
                                const std::string& backend = "sim");

}  // namespace moesim
