// What every backend is to the runner: it executes an iteration's TaskGraph and returns the Timing.
// sim/ (SimGrid) and hw/ (the host device; CUDA + NCCL) implement it; experiments/ picks one.
#pragma once
#include <string>

#include "taskgraph.hpp"

namespace moesim {

class Backend {
 public:
  virtual ~Backend() = default;
  /// "sim", "host" or "hw": what summary.json records as the run's backend.
  virtual std::string name() const = 0;
  /// Runs the graph; times in the result are seconds from the call's start.
  virtual Timing execute(const TaskGraph& graph) = 0;
  /// The backend's clock after the last execute() (simulated or wall seconds since it was made).
  virtual double now() const = 0;
  /// Called before an iteration with the memory model's need of the fullest GPU (bytes): a backend
  /// with real devices refuses (InputError, with both numbers) what cannot fit, before allocating.
  virtual void check_memory(double /*bytes_per_rank*/) {}
};

}  // namespace moesim
