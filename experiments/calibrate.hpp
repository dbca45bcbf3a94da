// `moesim calibrate`: measures, on a hardware backend, what the simulator's GPU model assumes — the
// GEMM-efficiency curve for the model's expert shapes and dtype, memory bandwidth and, on a GPU, what
// a kernel's launch and a host sync cost its host and the least time a kernel takes — and writes them as a GpuSpec profile that a spec
// uses in place of the catalog's GPU (`cluster { gpu_profile: "profile.textproto" }`, or
// --set cluster.gpu_profile=...). With more than
// one rank it also times all-to-all and all-reduce against message size (printed: the network side
// of the simulator is the platform's links, compared with `moesim collective`).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "moesim.pb.h"
#include "spec.hpp"

namespace moesim {

struct CalibrateOptions {
  std::string backend = "host";     // host or hw
  double max_point_seconds = 2;     // a GEMM size slower than this ends the sweep (the host is slow)
  int collective_ranks = 0;         // ranks for the collective sweep (0: every GPU with hw, none on the host)
  std::function<void(const std::string&)> progress;  // one line per measurement
  std::string command;              // the command line, for the profile's header
};

/// What issuing work costs the host, as the simulator models it (sim/host_issue.cpp): L, the
/// launch of one kernel (GpuSpec.launch_us), and S, a host sync beyond its launch (host_sync_us).
/// Measured on `backend` (one rank) from two chains of ops: 2n ops of one kernel too short to
/// matter run at the host's pace, 2n L; n pairs of such an op and a host sync after it take
/// n (2L + S).
/// Where the GPU's own time per kernel exceeds the host's, L is the GPU's: the pace either way.
struct HostIssue {
  double launch_seconds = 0, host_sync_seconds = 0;
};
struct GemmPoint {
  std::uint64_t m = 0, n = 0, k = 0;
  double seconds = 0, flops_per_s = 0;
};
struct CollectiveTiming {
  std::string collective;
  double bytes = 0, seconds = 0;
};
struct Calibration {
  spec::GpuSpec gpu;                 // the profile: peak = the best rate measured, the curve under it
  std::vector<GemmPoint> gemms;
  double memory_bytes_per_s = 0;     // an elementwise kernel's bytes (read + written) per second
  double copy_bytes_per_s = 0;       // a device-to-device copy's, the same way
  HostIssue host;                    // on a GPU: its host's launch and sync (0: not measured)
  double kernel_seconds = 0;         // on a GPU: the least time of one kernel (0: not measured)
  std::vector<CollectiveTiming> collectives;
  std::string device;                // what was measured: the GPU and its software, or the host
  std::string when, command;         // the date (UTC) and the command line
  std::string text() const;          // the profile in text format with the measurements as comments
};

Calibration calibrate(const Experiment& ex, const CalibrateOptions& options);

/// L and S measured on `backend` (HostIssue).
HostIssue measure_host_issue(Backend& backend, const GpuModel& gpu, int n = 200);

/// F, the least time one kernel takes on the GPU (GpuSpec.kernel_us), measured on `backend` (one
/// rank): n one-kernel ops of 4 KiB queued behind `cover`, an op long enough for the host to issue
/// them all while it runs, then run back to back: (end of the last - end of the cover) / n, the
/// median of seven runs.
double measure_kernel_floor(Backend& backend, const Compute& cover, int n = 200);

}  // namespace moesim
