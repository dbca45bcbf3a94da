// The SimGrid backend: builds the cluster as SimGrid zones and executes a TaskGraph on it.
//
// How ops map to SimGrid (docs/spec/simgrid-probe.md; docs/model.md):
// - host model ptask_L07: every activity is a SimGrid parallel task sharing links fairly (CM02/LV08
//   share by route latency, pitfall P4), and one model serves both forms of a collective below;
// - GPUs are hosts; a compute op is an Exec on its GPU whose duration comes from the GPU model
//   (concurrent execs on one GPU share it); one that runs alone on its GPU is a SimGrid timer
//   until another exec joins it there (the same times, without a solver variable);
// - a Transfer is a two-host parallel task (bytes/bandwidth + route latency on an idle route);
// - a collective is lowered by policies/collectives into steps; with `aggregate` each step is a few
//   parallel tasks, one per block of about √N nodes' links and of the fabric's (a task's transfers
//   progress at one rate: alone, exactly the bottleneck bound; cheap and insensitive to skew),
//   without it one flow per transfer (max-min sharing);
// - dependencies and stream order are SimGrid activity dependencies: no actors, no event loop of
//   our own.
#pragma once
#include <memory>

#include "backend.hpp"
#include "cluster.hpp"

namespace moesim {

struct SimOptions {
  bool aggregate = true;
};

class SimBackend final : public Backend {
 public:
  /// Creates the SimGrid engine and the platform. SimGrid allows one engine per process, so there
  /// is at most one SimBackend per process.
  SimBackend(const Cluster& cluster, const GpuModel& gpu, SimOptions options = {});
  ~SimBackend();
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  /// Runs the graph from the current simulated clock; times in the result are relative to it.
  std::string name() const override { return "sim"; }
  Timing execute(const TaskGraph& graph) override;
  /// Simulated clock after the last execute().
  double now() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim
