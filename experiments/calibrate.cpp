#include "calibrate.hpp"

#include <algorithm>
#include <cmath>

#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "cluster.hpp"
#include "hw_info.hpp"
#include "model.hpp"
#include "textproto.hpp"

namespace moesim {

namespace {

/// Seconds of one execution of a one-op graph, after a warm-up execution.
double time_op(Backend& backend, const TaskGraph& graph) {
  backend.execute(graph);
  const Timing t = backend.execute(graph);
  return t.makespan();
}

/// Seconds of op `id` alone (its events' span), after a warm-up execution of the graph.
double time_one(Backend& backend, const TaskGraph& graph, OpId id) {
  backend.execute(graph);
  const Timing t = backend.execute(graph);
  return t.end[id] - t.start[id];
}

/// The fastest of three timings: a run the machine preempted would make a small GEMM look hundreds
/// of times slower than it is (and its efficiency fall below what a profile may hold).
template <typename Time>
double fastest_of_three(Time time) {
  return std::min({time(), time(), time()});
}

/// The middle of the values (of seven timings: a VM's host varies between runs).
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// One kernel of 4 KiB: nanoseconds of a GPU's HBM, so that what a chain of them takes is the
/// host's launches or the GPU's least time a kernel.
const Compute kTinyOp{ComputeKind::elementwise, {}, 4096};

}  // namespace

HostIssue measure_host_issue(Backend& backend, const GpuModel& gpu, int n) {
  // Two chains of n pairs: two tiny ops (2L a pair), and a tiny op with a host sync after it
  // (2L + S). Timed in turn, seven times each, and the median taken: a VM's host varies between
  // runs (L read 8.8-12.5 µs on one H200 minutes apart as the fastest of three), and S, a difference,
  // needs both chains timed on the same host at the same time.
  auto chain = [&](bool with_syncs) {
    TaskGraph g(1);
    std::vector<OpId> last;
    for (int i = 0; i < n; ++i) {
      last = {g.add_compute(0, "calibrate.tiny", kTinyOp, last)};
      last = {with_syncs ? g.add_compute(0, "calibrate.host_sync", host_sync_work(gpu), last)
                         : g.add_compute(0, "calibrate.tiny", kTinyOp, last)};
    }
    return g;
  };
  const TaskGraph plain = chain(false), synced = chain(true);
  backend.execute(plain);  // warm-up: first kernels, buffers
  backend.execute(synced);
  std::vector<double> pair, more;
  for (int i = 0; i < 7; ++i) {
    const double a = backend.execute(plain).makespan() / n, b = backend.execute(synced).makespan() / n;
    pair.push_back(a);
    more.push_back(b - a);
  }
  return {median(pair) / 2, std::max(0.0, median(more))};  // L, S
}

double measure_kernel_floor(Backend& backend, const Compute& cover, int n) {
  TaskGraph g(1);
  const OpId first = g.add_compute(0, "calibrate.cover", cover);
  OpId last = first;
  for (int i = 0; i < n; ++i) last = g.add_compute(0, "calibrate.tiny", kTinyOp, {last});
  backend.execute(g);  // warm-up
  std::vector<double> per_kernel;
  for (int i = 0; i < 7; ++i) {
    const Timing t = backend.execute(g);
    per_kernel.push_back((t.end[last] - t.end[first]) / n);
  }
  return median(per_kernel);
}

Calibration calibrate(const Experiment& ex, const CalibrateOptions& o) {
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  auto say = [&](const std::string& line) {
    if (o.progress) o.progress(line);
  };
  Calibration cal;
  auto backend = make_hw_backend(o.backend, cluster, model, 1);
  // The expert FFN's two GEMMs (tokens × d_ffn × d_model and tokens × d_model × d_ffn) from 16
  // tokens up to all of a GPU's token-slots, each size repeated to last about 50 ms.
  const std::uint64_t d = model.spec().d_model(), h = model.spec().d_ffn();
  const std::uint64_t max_m = std::uint64_t(model.tokens_per_gpu()) * std::uint64_t(model.top_k());
  // Warm-up: the largest pair for about half a second first. A GPU idles at a low clock (an H200
  // at 345 MHz, KINDS.md) and the first points, timed cold, ran 1.3x slower than the same shapes
  // inside a run (docs/hardware.md). (A CPU needs none.)
  // A cover: the largest pair repeated for about 10 ms ahead of each point, on the same stream, so
  // that the host has queued the point's GEMMs before the GPU reaches them. Timed bare, a small
  // GEMM's point measured the host's launches (7.8-9.6 µs each from this VM; 15-27 µs a pair,
  // varying 1.6x between runs), which a step that runs ahead of its GPU does not pay.
  Compute cover;
  cover.kind = ComputeKind::grouped_gemm;
  cover.gemms = {{max_m, h, d, 1, 1}, {max_m, d, h, 1, 1}};
  const bool gpu = o.backend == "hw";
  if (gpu) {
    TaskGraph g(1);
    g.add_compute(0, "calibrate.warmup", cover);
    const double once = time_op(*backend, g);
    cover.gemms[0].repeat = cover.gemms[1].repeat = std::uint64_t(std::clamp(0.5 / std::max(once, 1e-9), 1.0, 10000.0));
    TaskGraph warm(1);
    warm.add_compute(0, "calibrate.warmup", cover);
    if (once < o.max_point_seconds) backend->execute(warm);
    cover.gemms[0].repeat = cover.gemms[1].repeat = std::uint64_t(std::clamp(0.01 / std::max(once, 1e-9), 1.0, 10000.0));
  }
  double per_flop = 0;  // seconds per FLOP of the last point, to size the next one's repeats
  for (std::uint64_t m = 16;; m = std::min(max_m, m * 2)) {
    const double flops = 2.0 * 2.0 * double(m) * double(h) * double(d);  // the two GEMMs
    // About 2 ms of GEMMs on a GPU (at most 200 pairs: the host queues them under the cover);
    // about 50 ms on the host.
    const double target = gpu ? 0.002 : 0.05, most = gpu ? 200 : 1000;
    const auto repeat = std::uint64_t(per_flop > 0 ? std::clamp(target / (per_flop * flops), 1.0, most) : 1.0);
    TaskGraph g(1);
    Compute c;
    c.kind = ComputeKind::grouped_gemm;
    c.gemms = {{m, h, d, 1, repeat}, {m, d, h, 1, repeat}};
    const OpId point = g.add_compute(0, "calibrate.expert_gemms", c,
                                     gpu ? std::vector<OpId>{g.add_compute(0, "calibrate.cover", cover)} : std::vector<OpId>{});
    const double seconds = fastest_of_three([&] { return time_one(*backend, g, point); }) / double(repeat);
    per_flop = seconds / flops;
    cal.gemms.push_back({m, h, d, seconds, flops / seconds});
    say(fmt::format("GEMM {} x {} x {} (and back), {}: {:.3f} ms, {:.2f} TFLOP/s", m, h, d, dtype_name(model.dtype()),
                    seconds * 1e3, flops / seconds / 1e12));
    if (m >= max_m || seconds > o.max_point_seconds) break;
  }
  // Memory bandwidth: an elementwise pass (read + write) over 1 GiB on a GPU (256 MiB, 75 µs on an
  // H200, varied 3.36-3.70 TB/s between runs), 256 MiB on the host.
  {
    TaskGraph g(1);
    const double bytes = double(gpu ? 1ull << 30 : 1ull << 28);
    g.add_compute(0, "calibrate.elementwise", {ComputeKind::elementwise, {}, bytes});
    cal.memory_bytes_per_s = bytes / fastest_of_three([&] { return time_op(*backend, g); });
    // The yardstick it is held to: a device-to-device copy moving as many bytes (128 MiB read, 128
    // written), CUDA's copy (or the host's memcpy).
    TaskGraph copy(1);
    copy.add_transfer(Stream::comm, "calibrate.copy", {0, 0, bytes / 2});
    cal.copy_bytes_per_s = bytes / fastest_of_three([&] { return time_op(*backend, copy); });
    say(fmt::format("elementwise over {} MiB: {:.1f} GB/s, {:.0f}% of a device-to-device copy's {:.1f} GB/s",
                    bytes / double(1 << 20), cal.memory_bytes_per_s / 1e9, 100 * cal.memory_bytes_per_s / cal.copy_bytes_per_s,
                    cal.copy_bytes_per_s / 1e9));
  }
  if (gpu) {
    cal.host = measure_host_issue(*backend, GpuModel(ex.cluster_spec.gpu(), model.dtype()));
    say(fmt::format("host: {:.2f} µs a kernel's launch, {:.2f} µs a host sync beyond its launch",
                    cal.host.launch_seconds * 1e6, cal.host.host_sync_seconds * 1e6));
    cal.kernel_seconds = measure_kernel_floor(*backend, cover);
    say(fmt::format("GPU: {:.2f} µs a kernel at least (one-kernel ops queued behind a long one)", cal.kernel_seconds * 1e6));
  }
  double peak = 0;
  for (const auto& p : cal.gemms) peak = std::max(peak, p.flops_per_s);
  cal.gpu = ex.cluster_spec.gpu();
  cal.device = "this CPU (the host device; threads as ranks)";
  if (const auto id = gpu ? device_identity(0) : std::nullopt) {  // the GPU measured, not the spec's
    cal.gpu.set_model(id->name);
    cal.gpu.set_memory_gib(id->memory_gib);
    cal.gpu.set_compute_capability(std::uint32_t(id->compute_capability));
    cal.device = fmt::format("{}, {:.1f} GiB, compute capability {}.{}; {}", id->name, id->memory_gib,
                             id->compute_capability / 10, id->compute_capability % 10, id->software);
  }
  cal.gpu.set_model(fmt::format("{} as measured by `moesim calibrate --backend {}`", cal.gpu.model(), o.backend));
  cal.when = fmt::format("{:%Y-%m-%d %H:%M} UTC", fmt::gmtime(std::time(nullptr)));
  cal.command = o.command;
  cal.gpu.clear_peak();
  auto* pk = cal.gpu.add_peak();
  pk->set_dtype(model.dtype());
  pk->set_tflops(peak / 1e12);
  cal.gpu.clear_gemm_efficiency();
  for (const auto& p : cal.gemms) {
    auto* e = cal.gpu.add_gemm_efficiency();
    e->set_gflops(2.0 * double(p.m) * double(p.n) * double(p.k) / 1e9);
    e->set_efficiency(p.flops_per_s / peak);
  }
  cal.gpu.set_memory_gbytes_per_s(cal.memory_bytes_per_s / 1e9);
  cal.gpu.set_memory_efficiency(1);
  if (cal.host.launch_seconds > 0) {  // on a GPU: its host's, in place of the catalog's PyTorch figures
    cal.gpu.set_launch_us(cal.host.launch_seconds * 1e6);
    cal.gpu.set_host_sync_us(cal.host.host_sync_seconds * 1e6);
  }
  if (cal.kernel_seconds > 0) cal.gpu.set_kernel_us(cal.kernel_seconds * 1e6);

  // Collectives over the ranks asked for; on GPUs by default over every GPU of this machine.
  const int asked = o.collective_ranks > 0 ? o.collective_ranks : o.backend == "hw" ? visible_gpus() : 0;
  const int ranks = std::min(asked, cluster.num_gpus());
  if (ranks > 1) {
    auto multi = make_hw_backend(o.backend, cluster, model, ranks);
    std::vector<int> group(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) group[std::size_t(r)] = r;
    for (double bytes = 1 << 10; bytes <= double(1 << 26); bytes *= 8) {
      for (const auto type : {CollectiveType::all_to_all, CollectiveType::all_reduce}) {
        TaskGraph g(ranks);
        Collective c{type, group, {bytes}, type == CollectiveType::all_to_all ? "linear" : "ring"};
        if (type == CollectiveType::all_to_all)  // `bytes` per rank, split evenly over the others
          c.bytes = std::vector<double>(std::size_t(ranks) * std::size_t(ranks), bytes / ranks);
        g.add_collective(Stream::comm, "calibrate.collective", c);
        const double seconds = time_op(*multi, g);
        cal.collectives.push_back({collective_type_name(type), bytes, seconds});
        say(fmt::format("{} of {:.0f} KiB per rank over {} ranks: {:.3f} ms", collective_type_name(type), bytes / 1024,
                        ranks, seconds * 1e3));
      }
    }
  }
  return cal;
}

std::string Calibration::text() const {
  std::string out = "# proto-file: proto/moesim.proto\n# proto-message: moesim.spec.GpuSpec\n#\n"
                    "# Written by `moesim calibrate`. Use it in a spec: cluster { gpu_profile: \"THIS FILE\" }\n";
  out += fmt::format("# Device: {}\n# Measured {}{}\n", device, when, command.empty() ? "" : " with: " + command);
  out += "# Measured (expert GEMM pairs: tokens x d_ffn x d_model, then back):\n";
  for (const auto& p : gemms)
    out += fmt::format("#   m={:<6} n={:<6} k={:<6} {:10.4f} ms per GEMM pair  {:8.3f} TFLOP/s\n", p.m, p.n, p.k,
                       p.seconds * 1e3, p.flops_per_s / 1e12);
  out += fmt::format("#   elementwise: {:.1f} GB/s ({:.0f}% of a device-to-device copy's {:.1f} GB/s)\n",
                     memory_bytes_per_s / 1e9, copy_bytes_per_s > 0 ? 100 * memory_bytes_per_s / copy_bytes_per_s : 0.0,
                     copy_bytes_per_s / 1e9);
  if (host.launch_seconds > 0)
    out += fmt::format("#   host: {:.2f} us a kernel's launch (one-kernel ops at the host's pace), {:.2f} us a host "
                       "sync beyond its launch\n", host.launch_seconds * 1e6, host.host_sync_seconds * 1e6);
  if (kernel_seconds > 0)
    out += fmt::format("#   GPU: {:.2f} us a kernel at least (one-kernel ops queued behind a long one)\n",
                       kernel_seconds * 1e6);
  for (const auto& c : collectives)
    out += fmt::format("#   {} {:.0f} B per rank: {:.4f} ms\n", c.collective, c.bytes, c.seconds * 1e3);
  return out + to_text(gpu);
}

}  // namespace moesim
