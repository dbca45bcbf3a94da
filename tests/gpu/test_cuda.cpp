// The CUDA backend on a real GPU (built with the toolkit; run where a GPU is visible, else CTest
// reports the test skipped: exit code 77 with the reason).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "spec.hpp"
#include "cluster.hpp"
#include "hw_info.hpp"
#include "model.hpp"

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
