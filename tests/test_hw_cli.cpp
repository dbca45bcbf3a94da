// The hardware backends as a user drives them: `moesim run --backend host|hw`, `moesim compare`,
// `moesim calibrate` and a measured GPU profile in the simulator.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpu.hpp"
#include "helpers.hpp"
#include "hw_info.hpp"
#include "moesim.pb.h"
#include "textproto.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kBin = MOESIM_BIN;
const std::string kSpec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/moe-small.textproto";
// Small enough for plain host GEMMs: 8 GPUs, 2 layers of d_model 64, 1 iteration.
const std::string kTiny = " --set model.d_model=64 --set model.d_ffn=128 --set model.tokens_per_gpu=128"
                          " --set model.seq_len=64 --set model.heads=2 --set iterations=1 -q";

nlohmann::json summary(const std::string& dir) { return nlohmann::json::parse(test::read_file(dir + "/summary.json")); }
// The one-GPU models of docs/hardware.md beside experiments/hw/demo-layer-1gpu.textproto: the
// fine-grained layer (its tokens set per run) and the 4-layer language model.
const std::string kFine = " --set model.d_model=2048 --set model.d_ffn=1408 --set model.experts=64 --set model.top_k=6"
                          " --set model.heads=16 --set model.name=fine-grained";
const std::string kLm = " --set model.layers=4 --set model.vocab=32000 --set model.name=lm-4-layers";

}  // namespace

TEST_CASE("moesim run --backend host runs the spec's graphs and records what it measured") {
  const std::string dir = test::temp_dir("host-run");
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + kSpec + kTiny + " --backend host --out " + dir, out) == 0);
  const auto j = summary(dir);
  CHECK(j["backend"] == "host");
  REQUIRE(j["variants"].size() == 2);
  for (const auto& v : j["variants"]) {
    CHECK(v["iteration_time_s"].get<double>() > 0);
    CHECK(v["device_memory_peak_bytes"].get<double>() > 0);  // allocated by the host device
    double parts = 0;
    for (const auto& [k, x] : v["breakdown"].items()) parts += x.get<double>();
    CHECK(parts == Approx(v["iteration_time_s"].get<double>()).epsilon(1e-9));  // the critical path adds up
  }
  CHECK(fs::file_size(dir + "/timeline.json") > 1000);
}

TEST_CASE("moesim compare matches a simulated and a host run op by op") {
  const std::string dir = test::temp_dir("compare");
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + kSpec + kTiny + " --out " + dir + "/sim", out) == 0);
  REQUIRE(test::run_command(kBin + " run " + kSpec + kTiny + " --backend host --out " + dir + "/host", out) == 0);
  REQUIRE(test::run_command(kBin + " compare " + dir + "/sim " + dir + "/host --top 3", out) == 0);
  CHECK_THAT(out, Contains("backend sim") && Contains("backend host"));
  CHECK_THAT(out, Contains("L#.fwd.experts") && Contains("L#.bwd.a2a_combine"));  // classes fold layers, not "a2a"
  CHECK_THAT(out, Contains("the 3 ops that differ most"));
  CHECK_THAT(out, Contains("0 of A's not found in B"));  // the same graph on both backends
  // A run against itself: no op differs, and none is listed.
  REQUIRE(test::run_command(kBin + " compare " + dir + "/sim " + dir + "/sim", out) == 0);
  CHECK_THAT(out, Contains("no op differs between the") && !Contains("differ most"));
  // Two variants of one run: phases and op classes side by side, each class counted in its own run.
  REQUIRE(test::run_command(kBin + " compare " + dir + "/sim " + dir + "/sim --a-variant ep --b-variant fastermoe", out) == 0);
  CHECK_THAT(out, Contains("ep vs fastermoe") && Contains("L#.fwd.replica_bcast.e#") && Contains("B ops"));
  CHECK(test::run_command(kBin + " compare " + dir + "/sim " + dir + "/sim --b-variant tutel", out) == 2);
  CHECK_THAT(out, Contains("--a-variant tutel") && Contains("it has: ep, fastermoe"));
  // Not a results directory: exit 2, named.
  CHECK(test::run_command(kBin + " compare " + dir + "/nothing " + dir + "/host", out) == 2);
  CHECK_THAT(out, Contains(dir + "/nothing") && Contains("no summary.json"));
}

TEST_CASE("the one-GPU layer spec runs simulated and on the host, and compare matches its single run") {
  // The spec the GPU is validated on: one GPU, no links, no variants. The simulator divided by its
  // (zero) links per node, and compare refused a summary without "variants".
  const std::string spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/demo-layer-1gpu.textproto";
  const std::string dir = test::temp_dir("compare-1gpu");
  const std::string tiny = kTiny + " --set warmup_iterations=0";
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + spec + tiny + " --out " + dir + "/sim", out) == 0);
  const auto s = summary(dir + "/sim");
  CHECK(s["breakdown"]["dispatch"].get<double>() + s["breakdown"]["combine"].get<double>() == 0);  // one GPU: nothing to send
  CHECK(s["iteration_time_s"].get<double>() > 0);
  REQUIRE(test::run_command(kBin + " run " + spec + tiny + " --backend host --out " + dir + "/host", out) == 0);
  REQUIRE(test::run_command(kBin + " compare " + dir + "/sim " + dir + "/host", out) == 0);
  CHECK_THAT(out, Contains("(run)") && Contains("L#.fwd.experts"));
  CHECK_THAT(out, Contains("0 of A's not found in B"));
}

TEST_CASE("moesim calibrate writes a GPU profile the simulator takes, reproducing the measured GEMM times") {
  const std::string dir = test::temp_dir("calibrate");
  const std::string profile = dir + "/profile.textproto";
  std::string out;
  REQUIRE(test::run_command(kBin + " calibrate " + kSpec + kTiny + " --backend host --out " + profile, out) == 0);
  spec::GpuSpec gpu;
  parse_file(profile, gpu);
  REQUIRE(gpu.peak_size() == 1);
  CHECK(gpu.peak(0).dtype() == spec::FP16);
  REQUIRE(gpu.gemm_efficiency_size() >= 2);  // 16 tokens up to 128 · top-2 = 256: 16, 32, ..., 256
  double best = 0;
  for (const auto& p : gpu.gemm_efficiency()) {
    CHECK(p.efficiency() > 0);
    CHECK(p.efficiency() <= 1.0);
    best = std::max(best, p.efficiency());
  }
  CHECK(best == Approx(1.0));  // the peak is the best rate measured
  // The simulator's GEMM time for a measured size is what was measured: flops / (peak · efficiency).
  const GpuModel model(gpu, spec::FP16);
  for (const auto& p : gpu.gemm_efficiency()) {
    const double flops = p.gflops() * 1e9;
    CHECK(model.gemm_efficiency(flops) == Approx(p.efficiency()).epsilon(1e-6));
  }
  CHECK(gpu.memory_gbytes_per_s() > 0);
  // Its header says what was measured, when and how, and the elementwise rate beside a plain copy's.
  const std::string text = test::read_file(profile);
  CHECK_THAT(text, Contains("# Device: this CPU") && Contains("# Measured 20") && Contains(" UTC with: moesim calibrate "));
  CHECK_THAT(text, Contains("of a device-to-device copy's"));
  // A spec runs with it in place of the catalog's GPU, and the summary's times change accordingly.
  REQUIRE(test::run_command(kBin + " run " + kSpec + kTiny + " --set cluster.gpu_profile=" + profile + " --out " + dir + "/with", out) == 0);
  REQUIRE(test::run_command(kBin + " run " + kSpec + kTiny + " --out " + dir + "/without", out) == 0);
  const double with = summary(dir + "/with")["variants"][0]["breakdown"]["expert_compute"];
  const double without = summary(dir + "/without")["variants"][0]["breakdown"]["expert_compute"];
  CHECK(with > 100 * without);  // a CPU is far slower than the A100 the catalog describes
  // A profile with a typo: exit 2, naming the file and line.
  test::write_file(dir + "/bad.textproto", "model: \"x\"\npeak { dtype: FP16 tflop: 1 }\n");
  CHECK(test::run_command(kBin + " run " + kSpec + kTiny + " --set cluster.gpu_profile=" + dir + "/bad.textproto --out " + dir + "/bad", out) == 2);
  CHECK_THAT(out, Contains("bad.textproto:2") && Contains("cluster.gpu_profile"));
  CHECK(!fs::exists(dir + "/bad"));
}

TEST_CASE("the CUDA libraries are loaded on first use only, not by a simulation") {
  // The loader's own account (LD_DEBUG=libs: each library it opens, as "calling init: PATH"): a
  // command that simulates opens no CUDA library; --version, which reports the CUDA backend, loads
  // the module where this build has one.
  std::string out;
  REQUIRE(test::run_command("LD_DEBUG=libs " + kBin + " run " + kSpec + kTiny + " --out " + test::temp_dir("no-cuda"), out) == 0);
  CHECK_THAT(out, Contains("calling init:") && Contains("libmoesim_proto.so"));  // the account is there
  CHECK_THAT(out, !Contains("libcublas") && !Contains("libnccl") && !Contains("libcudart") && !Contains("libmoesim_cuda"));
  REQUIRE(test::run_command("LD_DEBUG=libs " + kBin + " --version", out) == 0);
  if (hw_backend_built()) {
    CHECK_THAT(out, Contains("libmoesim_cuda.so"));
    CHECK_THAT(out, Contains("hw backend: CUDA runtime") || Contains("CUDA backend not loadable"));
  } else {
    CHECK_THAT(out, !Contains("libmoesim_cuda") && Contains("built without CUDA"));
  }
}

TEST_CASE("moesim run --backend hw refuses clearly where it cannot run") {
  if (visible_gpus() > 0) {
    WARN("a GPU is visible: the refusal is not what happens here (tests/gpu covers the GPU runs)");
    return;
  }
  const std::string dir = test::temp_dir("hw-refused");
  std::string out;
  CHECK(test::run_command(kBin + " run " + kSpec + kTiny + " --backend hw --out " + dir, out) == 2);
  CHECK_THAT(out, Contains("--backend hw") && Contains("--backend host"));
  CHECK(!fs::exists(dir + "/summary.json"));
}

TEST_CASE("with a GPU's measured profile the simulator times that GPU's own runs within 10%") {
  // experiments/hw/h200/ and h100/: what `moesim run --backend hw` measured on an NVIDIA H200 and an
  // H100 (CUDA 13.0, cuBLAS 13.1, 2026-11-26) and the profiles `moesim calibrate` measured there,
  // from the expert GEMMs alone. The simulator, given a profile, must time the other runs'
  // iterations, and their compute and MoE phases, as the GPU did (docs/hardware.md has the op
  // classes). The model was compared and fixed on the H200; the H100's runs came after, unchanged.
  const std::string spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/demo-layer-1gpu.textproto";
  const std::string fine = kFine + " --set model.tokens_per_gpu=8192", lm = kLm;
  // Held out: layers of DeepSeek-V3's and Mixtral's sizes, run on the H200 after the rest had been
  // compared and fixed; only their iteration is held to 10% (Mixtral's experts are larger GEMMs than
  // the profile measured, where its curve is held at its last point: MoE phase 0.88).
  const std::string deepseek = " --set model.d_model=7168 --set model.d_ffn=2048 --set model.experts=64 --set model.top_k=8"
                               " --set model.tokens_per_gpu=8192 --set model.heads=56 --set model.name=deepseek-v3-layer-64-experts";
  const std::string mixtral = " --set model.d_model=4096 --set model.d_ffn=14336 --set model.experts=8 --set model.top_k=2"
                              " --set model.tokens_per_gpu=8192 --set model.heads=32 --set model.name=mixtral-layer";
  struct Case {
    std::string name, sets;
    bool phases = true;
  };
  for (const char* device : {"h200", "h100"}) {
    const std::string measured = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/" + device;
    for (const Case& c : {Case{"demo", ""}, Case{"fine", fine}, Case{"lm", lm}, Case{"deepseek", deepseek, false},
                          Case{"mixtral", mixtral, false}}) {
      INFO(device << " " << c.name);
      const std::string dir = test::temp_dir(std::string(device) + "-" + c.name);
      std::string out;
      REQUIRE(test::run_command(kBin + " run " + spec + c.sets + " --set cluster.gpu_profile=" + measured +
                                    "/profile-demo.textproto -q --out " + dir, out) == 0);
      const auto sim = summary(dir), gpu = summary(measured + "/" + c.name);
      REQUIRE(gpu["backend"] == "hw");
      CHECK(sim["iteration_time_s"].get<double>() == Approx(gpu["iteration_time_s"].get<double>()).epsilon(0.10));
      // Dense compute and the optimizer; the MoE layers' compute (on one GPU: routing, codec, experts;
      // no all-to-all). The H200's summaries predate phases: their "compute" and "moe" are these sums.
      auto phases = [](const nlohmann::json& b, std::initializer_list<const char*> names) {
        double s = 0;
        for (const char* n : names) s += b.value(n, 0.0);
        return s;
      };
      const auto &b = sim["breakdown"], &g = gpu["breakdown"];
      const bool old = g.contains("compute");
      const double gpu_compute = old ? g["compute"].get<double>() : phases(g, {"dense_compute", "optimizer"});
      const double gpu_moe = old ? g["moe"].get<double>() : phases(g, {"routing", "codec", "expert_compute", "compression"});
      if (c.phases) {
        CHECK(phases(b, {"dense_compute", "optimizer"}) == Approx(gpu_compute).epsilon(0.10));
        CHECK(phases(b, {"routing", "codec", "expert_compute", "compression"}) == Approx(gpu_moe).epsilon(0.10));
      }
    }
  }
}

TEST_CASE("with the launch it measured, the simulator times an H200's and an H100's launch-bound runs within 15%") {
  // experiments/hw/h200/launch/ and h100/launch/: on three H200 machines and one H100 (2026-11-28),
  // three `moesim calibrate` profiles each (GEMMs, HBM, and now the host: launch_us from one-kernel
  // ops at the host's pace, host_sync_us from a chain with host syncs; calibrate.hpp), and models of
  // a few-µs kernels run twice on the GPU:
  // the demo layer at 128 tokens, four of its layers with a 32,000-word output at 256, the
  // fine-grained layer (64 experts, top-6) at 512 and 2,048. The host's pace varied between the
  // machines and between calibrations (launch 8.8-15.6 µs); each machine's runs are simulated with
  // its middle profile by launch_us. Without launches (sim.ideal) the simulator is 15-65% fast.
  const std::string spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/demo-layer-1gpu.textproto";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"demo-128", " --set model.tokens_per_gpu=128 --set model.seq_len=128"},
      {"lm-256", kLm + " --set model.tokens_per_gpu=256 --set model.seq_len=256"},
      {"fine-512", kFine + " --set model.tokens_per_gpu=512 --set model.seq_len=512"},
      {"fine-2048", kFine + " --set model.tokens_per_gpu=2048 --set model.seq_len=1024"}};
  for (const char* machine : {"h200/launch/machine-a", "h200/launch/machine-b", "h200/launch/machine-c", "h100/launch/machine-a"}) {
    const std::string measured = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/" + machine;
    std::vector<std::pair<double, std::string>> profiles;  // (launch_us, file)
    for (int i = 1; i <= 3; ++i) {
      const std::string file = fmt::format("{}/profile-demo-{}.textproto", measured, i);
      spec::GpuSpec gpu;
      parse_file(file, gpu);
      REQUIRE(gpu.has_launch_us());
      profiles.emplace_back(gpu.launch_us(), file);
    }
    std::sort(profiles.begin(), profiles.end());
    const std::string profile = profiles[1].second;
    std::string tag = machine;
    std::replace(tag.begin(), tag.end(), '/', '-');
    for (const auto& [name, sets] : cases) {
      INFO(machine << " " << name << " with " << profile);
      const double gpu = (summary(measured + "/" + name + "-1")["iteration_time_s"].get<double>() +
                          summary(measured + "/" + name + "-2")["iteration_time_s"].get<double>()) / 2;
      for (const bool ideal : {false, true}) {
        const std::string dir = test::temp_dir(fmt::format("launch-{}-{}-{}", tag, name, ideal));
        std::string out;
        REQUIRE(test::run_command(kBin + " run " + spec + sets + " --set cluster.gpu_profile=" + profile +
                                      (ideal ? " --set sim.ideal=true" : "") + " -q --out " + dir, out) == 0);
        const double sim = summary(dir)["iteration_time_s"].get<double>();
        if (ideal)
          CHECK(gpu / sim > 1.15);
        else
          CHECK(gpu / sim == Approx(1).margin(0.15));
      }
    }
  }
}

TEST_CASE("with its measured profile, the simulator times an H200's runs under three routing skews within 10%") {
  // experiments/hw/h200/skew/: one H200 (2026-11-28), the demo layer under the naive, pro-prophet and
  // aux presets (sigma_pop 2.2, 1.11, 0.27: one GPU holds every expert, so skew sets the experts'
  // GEMM shapes) and the fine-grained layer under naive and aux, each run twice, with the middle of
  // three profiles by launch_us. The experts' phase moved on the GPU from 0.61 ms (naive) to 0.74
  // (aux) for the demo; simulated, 0.62 to 0.71.
  const std::string spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/demo-layer-1gpu.textproto";
  const std::string measured = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/h200/skew";
  const std::string fine = kFine + " --set model.tokens_per_gpu=8192";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"demo-naive", ""},
      {"demo-pro-prophet", " --set gating.generator.preset=pro-prophet"},
      {"demo-aux", " --set gating.generator.preset=aux"},
      {"fine-naive", fine},
      {"fine-aux", fine + " --set gating.generator.preset=aux"}};
  for (const auto& [name, sets] : cases) {
    INFO(name);
    const std::string dir = test::temp_dir("skew-" + name);
    std::string out;
    REQUIRE(test::run_command(kBin + " run " + spec + sets + " --set cluster.gpu_profile=" + measured +
                                  "/profile-demo.textproto -q --out " + dir, out) == 0);
    const auto sim = summary(dir);
    double gpu = 0, gpu_experts = 0;
    for (const char* rep : {"-1", "-2"}) {
      const auto g = summary(measured + "/" + name + rep);
      REQUIRE(g["backend"] == "hw");
      gpu += g["iteration_time_s"].get<double>() / 2;
      gpu_experts += g["breakdown"]["expert_compute"].get<double>() / 2;
    }
    CHECK(sim["iteration_time_s"].get<double>() == Approx(gpu).epsilon(0.10));
    CHECK(sim["breakdown"]["expert_compute"].get<double>() == Approx(gpu_experts).epsilon(0.10));
  }
}
