// The CUDA backend on a real GPU (built with the toolkit; run where a GPU is visible, else CTest
// reports the test skipped: exit code 77 with the reason).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "spec.hpp"
#include "calibrate.hpp"
#include "cluster.hpp"
#include "cuda_backend.hpp"
#include "cuda_kernels.hpp"
#include "data_path.hpp"
#include "../helpers.hpp"
#include "host_kernels.hpp"
#include "hw_info.hpp"
#include "model.hpp"
#include "policy.hpp"
#include "runner.hpp"

using namespace moesim;

int main(int argc, char** argv) {
  if (visible_gpus() == 0) {
    std::puts("skipped: no CUDA GPU is visible to this process (cudaGetDeviceCount found none)");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

namespace {
spec::ModelSpec layer_model() {
  spec::ModelSpec m;
  m.set_layers(1);
  m.set_d_model(1024);
  m.set_d_ffn(4096);
  m.set_experts(8);
  m.set_top_k(2);
  m.set_seq_len(1024);
  m.set_tokens_per_gpu(4096);
  m.set_heads(16);
  m.set_dtype(spec::FP16);
  return m;
}
}  // namespace

TEST_CASE("a GEMM of the demo's expert shape runs on GPU 0 and is timed by CUDA events") {
  const Cluster cluster(load_platform("h100-1gpu"));
  const MoeModel model(layer_model());
  auto backend = make_hw_backend("hw", cluster, model, 1);
  TaskGraph g(1);
  Compute c;
  c.gemms = {{8192, 4096, 1024, 1, 10}};
  const OpId a = g.add_compute(0, "expert_gemm", c);
  const OpId b = g.add_compute(0, "optimizer", {ComputeKind::optimizer, {}, double(1 << 28)}, {a});
  backend->execute(g);  // warm-up
  const Timing t = backend->execute(g);
  CHECK(t.end[a] > t.start[a]);
  CHECK(t.start[b] >= t.end[a]);
  const double tflops = c.flops() / (t.end[a] - t.start[a]) / 1e12;
  INFO("expert GEMM: " << tflops << " TFLOP/s");
  CHECK(tflops > 100);  // any H100/A100 in fp16; the calibration reports the exact figure
  REQUIRE(t.memory_peak.size() == 1);
  CHECK(t.memory_peak[0] >= double(8192ull * 1024 * 2));
}

TEST_CASE("a model that cannot fit is refused before anything is allocated") {
  const Cluster cluster(load_platform("h100-1gpu"));
  auto backend = make_hw_backend("hw", cluster, MoeModel(layer_model()), 1);
  CHECK_THROWS_WITH(backend->check_memory(1e15), Catch::Contains("GiB") && Catch::Contains("nothing was allocated"));
}

namespace {
// A device copy of `host`, copied back by `back()`.
struct DeviceArray {
  explicit DeviceArray(const std::vector<float>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p); }
  std::vector<float> back() const {
    std::vector<float> h(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  std::size_t n;
  float* p = nullptr;
};
std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}
}  // namespace

TEST_CASE("the CUDA kernels compute what the host device's kernels compute") {
  // Lengths that are not multiples of 4 take the float4 paths' scalar tails.
  SECTION("gate: the k best of each row, softmax-weighted, one warp a row") {
    for (const auto& [cols, k] : {std::pair{8, 2}, {64, 6}, {100, 8}, {3, 1}}) {
      const std::size_t rows = 1000;
      const auto scores = random_floats(rows * std::size_t(cols), std::uint32_t(cols));
      std::vector<std::uint32_t> want_index(rows * std::size_t(k));
      std::vector<float> want_weight(rows * std::size_t(k));
      hw::host::top_k_softmax(scores.data(), rows, std::size_t(cols), std::size_t(k), want_index.data(), want_weight.data());
      DeviceArray s(scores), out(std::vector<float>(2 * rows * std::size_t(k)));
      auto* index = reinterpret_cast<std::int32_t*>(out.p);
      hw::cuda::gate_top_k(s.p, rows, cols, k, index, out.p + rows * std::size_t(k), nullptr);
      const auto got = out.back();
      INFO(cols << " experts, top-" << k);
      for (std::size_t i = 0; i < rows * std::size_t(k); ++i) {
        std::int32_t gi = 0;
        std::memcpy(&gi, &got[i], sizeof gi);
        REQUIRE(gi == std::int32_t(want_index[i]));
        REQUIRE(got[rows * std::size_t(k) + i] == Approx(want_weight[i]).epsilon(1e-5));
      }
    }
  }
  SECTION("Adam over parameters, gradients and moments, each array 16-byte aligned") {
    for (const std::size_t n : {std::size_t(1), std::size_t(1003), std::size_t(4096)}) {
      const std::size_t st = (n + 3) / 4 * 4;
      auto state = random_floats(4 * st, 7);
      for (std::size_t i = 0; i < n; ++i) state[3 * st + i] = std::abs(state[3 * st + i]);  // v ≥ 0
      auto p = std::vector<float>(state.begin(), state.begin() + long(n));
      const auto g = std::vector<float>(state.begin() + long(st), state.begin() + long(st + n));
      auto m = std::vector<float>(state.begin() + long(2 * st), state.begin() + long(2 * st + n));
      auto v = std::vector<float>(state.begin() + long(3 * st), state.begin() + long(3 * st + n));
      hw::host::adam(p.data(), g.data(), m.data(), v.data(), n);
      DeviceArray d(state);
      hw::cuda::adam(d.p, n, nullptr);
      const auto got = d.back();
      INFO(n << " parameters");
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(got[i] == Approx(p[i]).epsilon(1e-5).margin(1e-7));
        REQUIRE(got[2 * st + i] == Approx(m[i]).epsilon(1e-5).margin(1e-7));  // b1·m + (1−b1)·g cancels: FMA rounds differently
        REQUIRE(got[3 * st + i] == Approx(v[i]).epsilon(1e-5).margin(1e-7));
      }
    }
  }
  SECTION("axpy: y += x / 2") {
    for (const std::size_t n : {std::size_t(1), std::size_t(1001), std::size_t(4096)}) {
      const std::size_t st = (n + 3) / 4 * 4;
      const auto state = random_floats(2 * st, 3);
      DeviceArray d(state);
      hw::cuda::axpy(d.p, n, nullptr);
      const auto got = d.back();
      for (std::size_t i = 0; i < n; ++i) REQUIRE(got[st + i] == Approx(state[st + i] + 0.5f * state[i]));
      for (std::size_t i = 0; i < st; ++i) REQUIRE(got[i] == state[i]);  // x untouched
    }
  }
  SECTION("permute: out row i is in row (i * 7919 mod rows)") {
    for (const std::size_t width : {std::size_t(6), std::size_t(8)}) {  // 6: floats; 8: float4s
      const std::size_t rows = 37;
      const auto in = random_floats(rows * width, 5);
      DeviceArray a(in), b(std::vector<float>(rows * width));
      hw::cuda::permute_rows(a.p, b.p, rows, width * sizeof(float), nullptr);
      const auto got = b.back();
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < width; ++c) REQUIRE(got[r * width + c] == in[(r * 7919 % rows) * width + c]);
    }
  }
}

namespace {
std::atomic<long> gpu_gemms{0};
void counted_cublas_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B,
                         float* C, float beta) {
  ++gpu_gemms;
  hw::cublas_gemm(ta, tb, m, n, k, A, B, C, beta);
}
}  // namespace

TEST_CASE("every placement policy computes plain EP's outputs and gradients with cuBLAS on the GPU") {
  // tests/test_hw.cpp's data-path check with the experts' GEMMs (forward, and the backward's
  // transposed ones) on the GPU: the demo's variants, every policy, on 16 ranks of a small layer.
  const Experiment ex = test::small_demo();
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  REQUIRE(ex.variants.size() == policy_names().size());
  for (const auto& [name, s] : ex.variants) {
    INFO("policy " << name);
    const long before = gpu_gemms;
    const hw::DataPathRun run = hw::run_data_path(cluster, model, gpu, s.policy(), 2, 7, 3.0, counted_cublas_gemm);
    CHECK(gpu_gemms > before);
    for (std::size_t it = 0; it < run.numbers.size(); ++it) {
      INFO("iteration " << it);
      const hw::LayerNumbers ref = hw::reference_layer(run.problems[it]);  // on the host
      CHECK(run.numbers[it].routing.counts() == ref.routing.counts());
      // fp32 on both, summed in another order by cuBLAS's kernels: a wrong operand or transpose is
      // off by O(1).
      CHECK(hw::max_relative_difference(run.numbers[it], ref) < 1e-4);
    }
  }
}

TEST_CASE("with the launch it measures, the simulator times a launch-bound run on this GPU within 25%") {
  // The demo layer at 128 tokens: kernels of a few µs, so that an iteration is the host issuing
  // them. calibrate measures this backend's launch L (one-kernel ops at the host's pace) and host
  // sync S (an 8-byte read to the host and the wait, beyond its launch; calibrate.hpp) and writes
  // them into the profile. On H200 and H100 machines (docs/hardware.md) L read 8.8-15.6 µs and S
  // 0-9 µs, and the simulator with the same machine's profile came within 0.86-1.10 of the GPU's
  // iteration, against 1.16-1.63 without launches. (The simulator runs once here: one SimGrid
  // engine a process.)
  Experiment ex = load_experiment(std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/demo-layer-1gpu.textproto",
                                  {"model.tokens_per_gpu=128", "model.seq_len=128"});
  CalibrateOptions o;
  o.backend = "hw";
  const Calibration cal = calibrate(ex, o);
  CHECK(cal.host.launch_seconds > 1e-6);
  CHECK(cal.host.launch_seconds < 50e-6);
  CHECK(cal.host.host_sync_seconds < 50e-6);
  REQUIRE(cal.gpu.has_launch_us());
  REQUIRE(cal.gpu.has_host_sync_us());
  CHECK(cal.gpu.launch_us() == Approx(cal.host.launch_seconds * 1e6));
  CHECK(cal.gpu.host_sync_us() == Approx(cal.host.host_sync_seconds * 1e6));
  // The least time of a kernel queued behind a long one: a GPU takes a microsecond or more to run
  // even an empty kernel and signal its end (the backend's two events an op included), and it
  // cannot be longer than the host's launch, or the launch-bound chains would have read it as L.
  CHECK(cal.kernel_seconds > 0.5e-6);
  CHECK(cal.kernel_seconds <= 1.05 * cal.host.launch_seconds);
  REQUIRE(cal.gpu.has_kernel_us());
  CHECK(cal.gpu.kernel_us() == Approx(cal.kernel_seconds * 1e6));

  const double on_gpu = run_experiment(ex, {}, "hw").runs.front().mean_time();
  *ex.cluster_spec.mutable_gpu() = cal.gpu;
  const double simulated = run_experiment(ex, {}, "sim").runs.front().mean_time();
  INFO("GPU " << on_gpu * 1e3 << " ms, simulated " << simulated * 1e3 << " ms with L = " << cal.gpu.launch_us()
              << " us, S = " << cal.gpu.host_sync_us() << " us, F = " << cal.gpu.kernel_us() << " us");
  CHECK(on_gpu / simulated == Approx(1).margin(0.25));
}
