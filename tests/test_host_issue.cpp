// Each GPU's host issuing its kernels (GpuSpec.launch_us; sim/host_issue.cpp) on hand cases: one
// DGX A100 node, launches of 7 µs, kernels of fixed length. Each TEST_CASE runs in its own process
// (SimGrid allows one engine per process).
#include <catch2/catch.hpp>

#include "helpers.hpp"
#include "calibrate.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

namespace {

constexpr double kLaunch = 7e-6;

struct Host {
  Cluster cluster;
  GpuModel gpu;
  SimBackend sim;
  explicit Host(double launch_us = kLaunch * 1e6)
      : cluster([&] {
          auto s = test::platform("dgx-a100", 1);
          s.mutable_gpu()->set_launch_us(launch_us);
          s.mutable_gpu()->set_kernel_us(0);  // kernels of the lengths given, however short
          return s;
        }()),
        gpu(cluster.spec().gpu(), spec::FP16),
        sim(cluster, gpu) {}
};

// A kernel of `seconds` (one launch: no GEMM, no traffic).
Compute kernel(double seconds, bool blocks_host = false) {
  Compute c{ComputeKind::elementwise, {}, 0};
  c.fixed_seconds = seconds;
  c.blocks_host = blocks_host;
  return c;
}

}  // namespace

TEST_CASE("host issue: kernels shorter than their launch run at the host's pace") {
  // Ten 1 µs kernels on one stream: kernel k is issued at (k + 1) × 7 µs and starts then; the GPU
  // idles 6 µs between kernels. The last ends at 10 × 7 + 1 = 71 µs, not 10 µs.
  Host h;
  TaskGraph g(8);
  std::vector<OpId> ids;
  for (int k = 0; k < 10; ++k) ids.push_back(g.add_compute(0, "k", kernel(1e-6)));
  const Timing t = h.sim.execute(g);
  for (int k = 0; k < 10; ++k) CHECK(t.start[ids[std::size_t(k)]] == Approx((k + 1) * kLaunch).epsilon(1e-9));
  CHECK(t.makespan() == Approx(10 * kLaunch + 1e-6).epsilon(1e-9));
}

TEST_CASE("host issue: an op of k kernels starts at its first launch, or later where its kernels are short") {
  // A 100 µs op of 5 kernels (four GEMMs and a memory-bound kernel: 20 µs each, longer than their
  // launches) starts at the first launch, 7 µs. On another GPU an op of 5 kernels of 10 ns each
  // cannot end before its last launch, 35 µs, plus a kernel.
  Host h;
  TaskGraph g(8);
  Compute five{ComputeKind::gemm, {{64, 64, 64, 1}, {64, 64, 64, 1}, {64, 64, 64, 1}, {64, 64, 64, 1}}, 1e3};
  REQUIRE(five.kernels() == 5);
  five.fixed_seconds = 100e-6 - five.seconds(h.gpu);
  const OpId big = g.add_compute(0, "big", five);
  five.fixed_seconds = 50e-9 - (five.seconds(h.gpu) - five.fixed_seconds);
  const OpId tiny = g.add_compute(1, "tiny", five);
  const Timing t = h.sim.execute(g);
  CHECK(t.start[big] == Approx(kLaunch).epsilon(1e-9));
  CHECK(t.end[big] == Approx(kLaunch + 100e-6).epsilon(1e-9));
  CHECK(t.end[tiny] == Approx(5 * kLaunch + 10e-9).epsilon(1e-9));
}

TEST_CASE("host issue: behind a long kernel the host runs ahead and its launches cost nothing") {
  // A 1 ms kernel, then ten 1 µs ones: all are issued by 77 µs, long before the first ends, so
  // they run back to back after it: 7 µs + 1 ms + 10 µs.
  Host h;
  TaskGraph g(8);
  const OpId first = g.add_compute(0, "long", kernel(1e-3));
  OpId last = first;
  for (int k = 0; k < 10; ++k) last = g.add_compute(0, "k", kernel(1e-6));
  const Timing t = h.sim.execute(g);
  CHECK(t.start[first] == Approx(kLaunch).epsilon(1e-9));
  CHECK(t.start[first + 1] == Approx(t.end[first]).epsilon(1e-12));
  CHECK(t.end[last] == Approx(kLaunch + 1e-3 + 10e-6).epsilon(1e-9));
}

TEST_CASE("host issue: after a host sync the GPU waits for the next launch") {
  // A 1 ms kernel, a sync that reads its result on the host (15 µs), then a 1 µs kernel. The host
  // issues the kernel and the sync by 14 µs and waits; the sync runs after the kernel on the
  // stream, from 1.007 ms to 1.022 ms; only then does the host launch the last kernel, 7 µs later.
  Host h;
  TaskGraph g(8);
  const OpId a = g.add_compute(0, "a", kernel(1e-3));
  const OpId sync = g.add_compute(0, "host_sync", kernel(15e-6, true));
  const OpId b = g.add_compute(0, "b", kernel(1e-6));
  const Timing t = h.sim.execute(g);
  CHECK(t.start[sync] == Approx(t.end[a]).epsilon(1e-12));
  CHECK(t.end[sync] == Approx(kLaunch + 1e-3 + 15e-6).epsilon(1e-9));
  CHECK(t.start[b] == Approx(t.end[sync] + kLaunch).epsilon(1e-9));
  // Another GPU's host is not held by this one's sync: its kernel after the sync runs at once.
  TaskGraph g2(8);
  g2.add_compute(0, "a", kernel(1e-3));
  g2.add_compute(0, "host_sync", kernel(15e-6, true));
  const OpId other = g2.add_compute(1, "other", kernel(1e-6));
  CHECK(h.sim.execute(g2).start[other] == Approx(kLaunch).epsilon(1e-9));
}

TEST_CASE("host issue: a collective starts when the last of its ranks' hosts has issued it") {
  // GPU 0's host issues three 1 µs kernels before the all-reduce, GPU 1's none: the all-reduce is
  // issued by GPU 1 at 7 µs and by GPU 0 at 4 × 7 = 28 µs, and starts at 28 µs.
  Host h;
  TaskGraph g(8);
  for (int k = 0; k < 3; ++k) g.add_compute(0, "k", kernel(1e-6));
  const OpId ar = g.add_collective(Stream::comm, "ar", {CollectiveType::all_reduce, {0, 1}, {1024.0}, "ring"});
  const Timing t = h.sim.execute(g);
  CHECK(t.start[ar] == Approx(4 * kLaunch).epsilon(1e-9));
}

TEST_CASE("host issue: each part of a Computes op waits for its own GPU's host") {
  // Every GPU's part of one op (a 1 µs kernel); GPU 3's host first issues two kernels of its own:
  // its part starts at 21 µs, the others' at 7 µs. GPU 1's part is a GEMM and a memory-bound kernel,
  // two launches, shorter than them: it ends at 2 × 7 µs + T / 2, so starts at 2 × 7 µs - T / 2.
  Host h;
  TaskGraph g(8);
  g.add_compute(3, "x", kernel(1e-6));
  g.add_compute(3, "y", kernel(1e-6));
  Compute two{ComputeKind::gemm, {{64, 64, 64, 1}}, 1e3};
  REQUIRE(two.kernels() == 2);
  const OpId all = g.add_computes("all", {{0, 1, 2, 3}, make_works({kernel(1e-6), two}), {0, 1, 0, 0}});
  const Timing t = h.sim.execute(g);
  const auto& c = std::get<Computes>(g.op(all).body);
  CHECK(t.part_start[c.first_part + 0] == Approx(kLaunch).epsilon(1e-9));
  const double T = two.seconds(h.gpu);
  REQUIRE(T < 2 * kLaunch);
  CHECK(t.part_start[c.first_part + 1] == Approx(2 * kLaunch - T / 2).epsilon(1e-9));
  CHECK(t.part_end[c.first_part + 1] == Approx(2 * kLaunch + T / 2).epsilon(1e-9));
  CHECK(t.part_start[c.first_part + 3] == Approx(3 * kLaunch).epsilon(1e-9));
}

TEST_CASE("host issue: with no launch time the ops start as their predecessors end") {
  Host h(0);
  TaskGraph g(8);
  std::vector<OpId> ids;
  for (int k = 0; k < 10; ++k) ids.push_back(g.add_compute(0, "k", kernel(1e-6)));
  const OpId sync = g.add_compute(0, "host_sync", kernel(15e-6, true));
  const OpId after = g.add_compute(0, "after", kernel(1e-6));
  const Timing t = h.sim.execute(g);
  CHECK(t.start[ids[0]] == 0);
  CHECK(t.start[after] == Approx(t.end[sync]).epsilon(1e-12));
  CHECK(t.makespan() == Approx(10e-6 + 15e-6 + 1e-6).epsilon(1e-9));
}

TEST_CASE("host issue: ops every GPU takes part in, a host sync that ends at different times, a collective after it") {
  // On all 8 GPUs: A (GPU r's part 100 µs × (r + 1)), then a host sync S (15 µs) on each, then on
  // GPU 0 alone a 1 µs kernel D, then an all-reduce C over all 8. Each host launches A at 7 µs and
  // S at 14 µs, then waits for its S: GPU r's S ends at 7 + 100 (r + 1) + 15 µs. GPU 0's host then
  // launches D (7 µs later) and C (14 µs later); the others C 7 µs after their S. C starts when
  // GPU 7's host has launched it: 7 + 800 + 15 + 7 µs.
  Host h;
  TaskGraph g(8);
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<Compute> works;
  for (int r = 0; r < 8; ++r) works.push_back(kernel(100e-6 * (r + 1)));
  const OpId a = g.add_computes("A", {all, make_works(works), {0, 1, 2, 3, 4, 5, 6, 7}});
  const OpId s = g.add_computes("host_sync", {all, make_works({kernel(15e-6, true)}), std::vector<std::uint32_t>(8, 0)});
  const OpId d = g.add_compute(0, "D", kernel(1e-6));
  const OpId c = g.add_collective(Stream::comm, "C", {CollectiveType::all_reduce, all, {1024.0}, "ring"});
  const Timing t = h.sim.execute(g);
  const auto& parts = std::get<Computes>(g.op(s).body);
  for (int r = 0; r < 8; ++r) {
    CHECK(t.part_start[std::get<Computes>(g.op(a).body).first_part + std::size_t(r)] == Approx(kLaunch).epsilon(1e-9));
    CHECK(t.part_end[parts.first_part + std::size_t(r)] == Approx(kLaunch + 100e-6 * (r + 1) + 15e-6).epsilon(1e-9));
  }
  CHECK(t.start[d] == Approx(kLaunch + 100e-6 + 15e-6 + kLaunch).epsilon(1e-9));
  CHECK(t.start[c] == Approx(kLaunch + 800e-6 + 15e-6 + kLaunch).epsilon(1e-9));
}

TEST_CASE("host issue: a collective ready after one host passed a later host sync waits for the host still behind") {
  // GPU 2's host first issues 300 kernels of its own (1 ns each: at its pace, 7 µs each). Then on
  // all 8 GPUs: an all-reduce C that waits for D, 0.5 ms on GPU 1, a host sync S (15 µs) and a
  // 1 µs kernel E. GPU 0's host issues C at 7 µs and S at 14 µs, goes on when its S ends at 29 µs
  // and issues E at 36 µs. C is ready at 507 µs (D's end), but GPU 2's host issues it only at
  // 301 × 7 = 2,107 µs: C starts then, and GPU 2's S ends at 302 × 7 + 15 µs. (The simulator finds
  // C's last host among hosts that went on past a later stop at different times:
  // SimBackend::Impl::held_by_hosts.)
  Host h;
  TaskGraph g(8);
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int k = 0; k < 300; ++k) g.add_compute(2, "k", kernel(1e-9));
  const OpId d = g.add_compute(1, "D", kernel(500e-6));
  const OpId c = g.add_collective(Stream::comm, "C", {CollectiveType::all_reduce, all, {1024.0}, "ring"}, {d});
  const OpId s = g.add_computes("host_sync", {all, make_works({kernel(15e-6, true)}), std::vector<std::uint32_t>(8, 0)});
  const OpId e = g.add_computes("E", {all, make_works({kernel(1e-6)}), std::vector<std::uint32_t>(8, 0)});
  const Timing t = h.sim.execute(g);
  const auto& parts = std::get<Computes>(g.op(s).body);
  CHECK(t.end[d] == Approx(kLaunch + 500e-6).epsilon(1e-9));
  CHECK(t.part_start[std::get<Computes>(g.op(e).body).first_part] == Approx(3 * kLaunch + 15e-6).epsilon(1e-9));
  CHECK(t.part_end[parts.first_part + 0] == Approx(2 * kLaunch + 15e-6).epsilon(1e-9));
  CHECK(t.start[c] == Approx(301 * kLaunch).epsilon(1e-9));
  CHECK(t.part_end[parts.first_part + 2] == Approx(302 * kLaunch + 15e-6).epsilon(1e-9));
}

TEST_CASE("host issue: calibrate's measurement, run on the simulator, gives back its launch and host sync") {
  // `moesim calibrate --backend hw` measures L and S with two chains of tiny ops (calibrate.hpp).
  // On the simulator, with L = 5 µs and S = 12 µs set, it must read the same: its arithmetic is the
  // model's, but for the last kernel of each chain, a tiny op of F = 3 µs (kernel_us): the plain
  // chain's 2n ops take 2n L + F, the synced one n (2L + S), so the reading is L + F / 2n and
  // S - F / n.
  auto spec = test::platform("dgx-a100", 1);
  spec.mutable_gpu()->set_launch_us(5);
  spec.mutable_gpu()->set_host_sync_us(12);
  spec.mutable_gpu()->set_kernel_us(3);
  const Cluster cluster(spec);
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  const int n = 50;
  const HostIssue h = measure_host_issue(sim, gpu, n);
  CHECK(h.launch_seconds == Approx(5e-6 + 3e-6 / (2 * n)).epsilon(1e-6));
  CHECK(h.host_sync_seconds == Approx(12e-6 - 3e-6 / n).epsilon(1e-6));
}

TEST_CASE("kernel floor: calibrate's measurement, run on the simulator, gives back kernel_us") {
  // `moesim calibrate --backend hw` queues n one-kernel ops of 4 KiB behind a long op (calibrate.hpp):
  // with F = 3 µs and L = 5 µs set, the host has issued them all before the long op ends (50 x 5 µs
  // of a 5 ms op), and they run back to back at F each.
  auto spec = test::platform("dgx-a100", 1);
  spec.mutable_gpu()->set_launch_us(5);
  spec.mutable_gpu()->set_kernel_us(3);
  const Cluster cluster(spec);
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  CHECK(measure_kernel_floor(sim, kernel(5e-3), 50) == Approx(3e-6).epsilon(1e-6));
}
