// moesim calibrate: measure a GPU (GEMM efficiency, memory bandwidth, its host's launches and syncs,
// its least kernel time, collectives) on a hardware backend and write it as a GPU profile the simulator takes.
#include <fmt/format.h>

#include <optional>

#include "calibrate.hpp"
#include "command.hpp"
#include "results.hpp"
#include "spec.hpp"

namespace moesim::cli {
namespace {

struct Options {
  std::string spec, out = "profile.textproto";
  std::vector<std::string> sets;
  CalibrateOptions calibrate;
  bool quiet = false;
};

int calibrate_gpu(Options o, const Invocation& invocation) {
  const auto ex = load_experiment(o.spec.empty() ? std::nullopt : std::optional(o.spec), o.sets);
  if (!o.quiet) o.calibrate.progress = [](const std::string& line) { fmt::print(stderr, "  {}\n", line); };
  o.calibrate.command = invocation.command();  // for the profile's header
  const Calibration cal = calibrate(ex, o.calibrate);
  write_atomically(o.out, cal.text());
  const std::string host = cal.host.launch_seconds > 0 ? fmt::format(", {:.1f} µs a launch, {:.1f} µs a kernel at least",
                                                                     cal.host.launch_seconds * 1e6, cal.kernel_seconds * 1e6)
                                                       : "";
  fmt::print("wrote {}: peak {:.4g} TFLOP/s, {} GEMM points, {:.1f} GB/s{}; use it with --set cluster.gpu_profile={}\n", o.out,
             cal.gpu.peak(0).tflops(), cal.gemms.size(), cal.memory_bytes_per_s / 1e9, host, o.out);
  return 0;
}

}  // namespace

void add_calibrate(CLI::App& app, Commands& commands, const Invocation& invocation) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      R"(Measure the GEMM-efficiency curve of the spec's expert shapes and dtype and the memory bandwidth on a
hardware backend, and on a GPU what a kernel's launch and a host sync cost its host (launch_us,
host_sync_us) and the least time a kernel takes on the GPU (kernel_us); write them as a GPU
profile the simulator takes in place of the catalog's GPU:
  moesim calibrate --backend hw --out profile.textproto
  moesim run SPEC --set cluster.gpu_profile=profile.textproto)");
  auto o = std::make_shared<Options>();
  cmd->add_option("spec", o->spec, "Experiment spec whose model is measured (default: the demo's)");
  cmd->add_option("--backend", o->calibrate.backend, "host (this CPU) or hw (GPU 0 through CUDA)")
      ->check(CLI::IsMember({"host", "hw"}))
      ->capture_default_str();
  cmd->add_option("--out,-o", o->out, "Profile to write (GpuSpec text format)")->capture_default_str();
  cmd->add_option("--set,-s", o->sets, "Override a spec field (repeatable)");
  cmd->add_option("--collective-ranks", o->calibrate.collective_ranks,
                  "Also time all-to-all and all-reduce over this many ranks (default: every GPU with hw, none on the host)")
      ->capture_default_str();
  cmd->add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  cmd->add_option("--max-point-seconds", o->calibrate.max_point_seconds, "End the GEMM sweep after a size that takes longer than this")
      ->capture_default_str();
  commands.push_back({cmd, [o, invocation] { return calibrate_gpu(*o, invocation); }});
}

}  // namespace moesim::cli
