// The catalog, the cluster's routes, the GPU compute model and spec-file plumbing.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "catalog.hpp"
#include "cluster.hpp"
#include "errors.hpp"
#include "gpu.hpp"
#include "helpers.hpp"
#include "taskgraph.hpp"
#include "textproto.hpp"

using namespace moesim;
using Catch::Matchers::Contains;

TEST_CASE("every catalog platform parses and validates") {
  const auto names = platform_names();
  for (const char* required : {"dgx1-v100", "v100-pcie", "dgx-a100", "rtx2080ti-pcie"})
    CHECK(std::find(names.begin(), names.end(), required) != names.end());
  for (const auto& n : names) {
    INFO(n);
    const Cluster c(test::platform(n, 2));
    CHECK(c.num_gpus() == 2 * c.gpus_per_node());
    CHECK(c.node_uplink_bandwidth() > 0);
  }
}

TEST_CASE("a job's share of a node keeps its first GPUs and what they reach") {
  // 64 of a GB200 NVL72's 72 GPUs: the NVSwitch, the 64 GPUs' NICs and their links; no other.
  const auto rack = test::platform("gb200-nvl72", 1);
  const spec::NodeSpec part = first_gpus(rack.node(), 64);
  CHECK(part.gpus() == 64);
  CHECK(part.nics_size() == 64);
  CHECK(part.links_size() == 2 * 64);  // a GPU to the NVSwitch, a GPU to its NIC
  for (const auto& l : part.links()) CHECK_FALSE((l.a() == "gpu64" || l.a() == "gpu71" || l.b() == "nic70"));
  spec::ClusterSpec s = rack;
  *s.mutable_node() = part;
  const Cluster c(s);
  CHECK(c.num_gpus() == 64);
  CHECK(c.route_bandwidth(c.intra_route(0, 63)) == Approx(680e9));  // the port, as NCCL measures it
  // DGX-1: GPUs 0 and 1 keep their NVLink, their PCIe switch and, through the CPUs, every PCIe
  // switch and NIC (switches only on the way); the other GPUs' links go: 1 + 2 + 4 + 1 + 4 links.
  const auto dgx = test::platform("dgx1-v100", 2);
  const spec::NodeSpec two = first_gpus(dgx.node(), 2);
  CHECK(two.gpus() == 2);
  CHECK(two.nics_size() == 4);
  CHECK(two.links_size() == 12);
  spec::ClusterSpec s2 = dgx;
  *s2.mutable_node() = two;
  const Cluster c2(s2);  // still routes GPU to GPU and out of the node
  CHECK(c2.num_gpus() == 4);
  CHECK(c2.route_bandwidth(c2.intra_route(0, 1)) == Approx(25e9));
  CHECK(c2.node_uplink_bandwidth() > 0);
  CHECK(first_gpus(dgx.node(), 8).SerializeAsString() == dgx.node().SerializeAsString());  // all of it: the node as it is
  CHECK_THROWS_WITH(first_gpus(dgx.node(), 9), Contains("1 to the node's 8 GPUs, not 9"));
  CHECK_THROWS_WITH(first_gpus(dgx.node(), 0), Contains("not 0"));
}

namespace {

// A GPU of 1 TB/s and 100 TFLOP/s in FP16 whose GEMM efficiency curve is (GFLOP, efficiency) points.
spec::GpuSpec test_gpu(std::initializer_list<std::pair<double, double>> curve) {
  spec::GpuSpec gpu;
  gpu.set_model("test");
  gpu.set_memory_gib(1);
  gpu.set_memory_gbytes_per_s(1000);
  auto* p = gpu.add_peak();
  p->set_dtype(spec::FP16);
  p->set_tflops(100);
  for (auto [gflops, eff] : curve) {
    auto* e = gpu.add_gemm_efficiency();
    e->set_gflops(gflops);
    e->set_efficiency(eff);
  }
  return gpu;
}

}  // namespace

TEST_CASE("gemm efficiency interpolates in log size and clamps outside the curve") {
  const spec::GpuSpec gpu = test_gpu({{1.0, 0.3}, {10.0, 0.65}});
  const GpuModel m(gpu, spec::FP16);
  CHECK(m.gemm_efficiency(std::sqrt(10.0) * 1e9) == Approx(0.475));  // halfway in log(gflops)
  CHECK(m.gemm_efficiency(1e6) == Approx(0.3));
  CHECK(m.gemm_efficiency(1e12) == Approx(0.65));
  const Gemm g{1024, 1024, 1024, 4};  // 8.6 GFLOP
  CHECK(m.gemm_time(g) == Approx(g.flops() / (100e12 * m.gemm_efficiency(g.flops()))));
  CHECK(m.memory_time(1e9) == Approx(1e-3));  // memory_efficiency 0 means 1
  // Attention's per-head scores, 64 heads of 1024 x 1024 x 64: 8.6 GFLOP, 132 µs at 65% of 100
  // TFLOP/s, but 2 · 64 · (64K + 64K + 1M) bytes = 151 MB through 1 TB/s: 151 µs, the roofline's.
  const Gemm scores{1024, 1024, 64, 64};
  const double bytes = 2.0 * 64 * (1024.0 * 64 + 64.0 * 1024 + 1024.0 * 1024);
  CHECK(m.gemm_time(scores) == Approx(bytes / 1e12));
  CHECK(m.gemm_time(scores) > scores.flops() / (100e12 * m.gemm_efficiency(scores.flops())));
  CHECK_THROWS_AS(GpuModel(gpu, spec::BF16), FieldError);  // no bf16 peak on this GPU
}

TEST_CASE("a dtype's own GEMM-efficiency points make its curve, the others take the points without a dtype") {
  spec::GpuSpec gpu = test_gpu({{1.0, 0.3}, {10.0, 0.65}});
  gpu.mutable_peak()->Add()->set_dtype(spec::FP32);
  gpu.mutable_peak(1)->set_tflops(20);
  for (auto [gflops, eff] : {std::pair{1.0, 0.5}, std::pair{10.0, 0.9}}) {
    auto* e = gpu.add_gemm_efficiency();
    e->set_dtype(spec::FP32);
    e->set_gflops(gflops);
    e->set_efficiency(eff);
  }
  CHECK(GpuModel(gpu, spec::FP16).gemm_efficiency(1e9) == Approx(0.3));   // the untyped points
  CHECK(GpuModel(gpu, spec::FP32).gemm_efficiency(1e9) == Approx(0.5));   // its own
  CHECK(GpuModel(gpu, spec::FP32).gemm_efficiency(1e11) == Approx(0.9));
  // Points of one dtype need not increase across another's: fp32's 1 GFLOP after fp16's 10.
  spec::ClusterSpec c = test::platform("dgx1-v100", 1);
  *c.mutable_gpu() = gpu;
  CHECK_NOTHROW(Cluster(c));
  // A dtype with a peak, no points of its own and no untyped points: refused, and no model built.
  for (int i = 0; i < 2; ++i) gpu.mutable_gemm_efficiency()->Mutable(i)->set_dtype(spec::BF16);
  *c.mutable_gpu() = gpu;
  CHECK_THROWS_WITH(Cluster(c), Contains("gpu.peak[0]") && Contains("dtype: FP16"));
  CHECK_THROWS_WITH(GpuModel(gpu, spec::FP16), Contains("gpu.gemm_efficiency") && Contains("fp16"));
}

// DeepBench's V100 GEMMs (tests/data/deepbench-v100-gemm.tsv: m, n, k, transposes, fp32 and fp16
// microseconds on a DGX-1's SXM2 card) against the catalog's V100 model, the GEMMs the curves were
// fitted to (tools/fit_gemm_curve.py: every shape below 0.3 GFLOP, above it m and n of 512 or more).
TEST_CASE("the V100 platforms' GEMM model gives DeepBench's measured V100 GEMM times") {
  std::ifstream in(std::string(MOESIM_SOURCE_DIR) + "/tests/data/deepbench-v100-gemm.tsv");
  REQUIRE(in);
  struct Row {
    Gemm g;
    double fp32_us, fp16_us;
  };
  std::vector<Row> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line[0] == 'm') continue;
    std::istringstream f(line);
    Row r;
    std::string ta, tb;
    f >> r.g.m >> r.g.n >> r.g.k >> ta >> tb >> r.fp32_us >> r.fp16_us;
    r.g.ta = ta == "T", r.g.tb = tb == "T";
    if (r.g.flops() >= 0.3e9 && std::min(r.g.m, r.g.n) < 512) continue;
    rows.push_back(r);
  }
  REQUIRE(rows.size() == 100);
  for (const char* name : {"p3dn-v100", "dgx1-v100", "trevor"}) {
    const spec::ClusterSpec c = test::platform(name, 1);
    for (const auto dtype : {spec::FP16, spec::FP32}) {
      INFO(name << " " << spec::DType_Name(dtype));
      const GpuModel gpu(c.gpu(), dtype);
      std::vector<double> err;
      for (const auto& r : rows)
        err.push_back(std::abs(std::log(gpu.gemm_time(r.g) * 1e6 / (dtype == spec::FP16 ? r.fp16_us : r.fp32_us))));
      std::sort(err.begin(), err.end());
      CHECK(err[err.size() / 2] < 0.06);  // the median GEMM within 6%
      CHECK(err[err.size() * 9 / 10] < 0.25);
      // The largest fat GEMMs, 0.81 (fp16) and 0.86 (fp32) of the peak: 6144 x 24000 x 2048 NN.
      const Gemm big{6144, 24000, 2048};
      CHECK(big.flops() / gpu.gemm_time(big) / gpu.peak_flops() == Approx(dtype == spec::FP16 ? 0.812 : 0.859));
    }
  }
}

TEST_CASE("the V100 platforms' curves are what tools/fit_gemm_curve.py fits to DeepBench's GEMMs") {
  if (std::system("python3 --version > /dev/null 2>&1") != 0) return test::skip("python3 is not installed");
  std::string out;
  REQUIRE(test::run_command("python3 " + std::string(MOESIM_SOURCE_DIR) + "/tools/fit_gemm_curve.py " +
                                std::string(MOESIM_SOURCE_DIR) +
                                "/tests/data/deepbench-v100-gemm.tsv --peak fp32=15.7 --peak fp16=125 --memory-gbps 900",
                            out) == 0);
  const spec::ClusterSpec c = test::platform("p3dn-v100", 1);
  for (const auto dtype : {spec::FP16, spec::FP32}) {
    // "fp16 fitted   100 GEMMs: 0.01->0.008 0.134->0.050 ...": each knot's value, as the platform has it.
    const std::string tag = fmt::format("{} fitted", dtype_name(dtype));
    const auto at = out.find(tag);
    REQUIRE(at != std::string::npos);
    std::istringstream line(out.substr(at, out.find('\n', at) - at));
    std::string word;
    int knots = 0;
    while (line >> word) {
      const auto arrow = word.find("->");
      if (arrow == std::string::npos) continue;
      const double gflops = std::stod(word.substr(0, arrow)), eff = std::stod(word.substr(arrow + 2));
      INFO(tag << " " << word);
      CHECK(GpuModel(c.gpu(), dtype).gemm_efficiency(gflops * 1e9) == Approx(eff).margin(0.0011));
      ++knots;
    }
    CHECK(knots == 6);
  }
}

TEST_CASE("the RTX 3090 platforms run their largest SGEMM at the rate published runs measured") {
  // 24.46, 24.79 and 24.84 TFLOP/s, the largest square torch.mm in fp32 on three 3090s
  // (zzc0721/torch-performance-test-data database.md); fp16 keeps its own curve.
  for (const char* name : {"rtx3090-pcie", "rtx3090-nvlink"}) {
    INFO(name);
    const spec::ClusterSpec c = test::platform(name, 1);
    const Gemm big{8192, 8192, 8192};
    const double tflops = big.flops() / GpuModel(c.gpu(), spec::FP32).gemm_time(big) / 1e12;
    CHECK(tflops > 24.4);
    CHECK(tflops < 25.0);
    CHECK(GpuModel(c.gpu(), spec::FP16).gemm_efficiency(big.flops()) == Approx(0.85));
  }
}

TEST_CASE("the RTX 2080 Ti platform times fp32 GEMMs as the ScheMoE group's fit on its testbed") {
  // Fragile-azalea/PipeMoE solver.py: t = 1.5e-4 s + 3.73e-14 s · m·n·k · 4 bytes.
  const spec::ClusterSpec c = test::platform("rtx2080ti-pcie", 1);
  const GpuModel gpu(c.gpu(), spec::FP32);
  for (const Gemm g : {Gemm{4216, 512, 512}, Gemm{2108, 512, 2048}, Gemm{19661, 8192, 8192}, Gemm{1024, 1024, 1024}}) {
    INFO(g.m << " x " << g.n << " x " << g.k);
    const double fit = 1.5e-4 + 3.73e-14 * double(g.m) * double(g.n) * double(g.k) * 4;
    CHECK(gpu.gemm_time(g) == Approx(fit).epsilon(0.03));  // the curve's points interpolate the fit
  }
}

TEST_CASE("a kernel takes at least the GPU's floor, kernel_us, and a GEMM of no tokens nothing") {
  // 1 TB/s, 100 TFLOP/s at 50%, a floor of 3 µs: an op's time is the sum over its kernels of
  // max(kernel, 3 µs) (Compute::seconds).
  spec::GpuSpec gpu = test_gpu({{1.0, 0.5}});
  gpu.set_kernel_us(3);
  const GpuModel m(gpu, spec::FP16);
  CHECK(m.kernel_seconds() == Approx(3e-6));
  // 4 KiB through HBM: 8 ns of traffic, one kernel: the floor.
  CHECK(Compute{ComputeKind::elementwise, {}, 4096}.seconds(m) == Approx(3e-6));
  // 40 MB: 40 µs, above the floor, unchanged.
  CHECK(Compute{ComputeKind::elementwise, {}, 40e6}.seconds(m) == Approx(40e-6));
  // A gate: a 4096 x 8 x 1024 GEMM (67 MFLOP: 1.3 µs at 50% of 100 TFLOP/s; its 8.4 MB of
  // operands 8.4 µs through HBM, the roofline's) and a kernel of 64 KB (64 ns): 8.4 + 3 µs.
  const Gemm gate{4096, 8, 1024};
  const double gate_bytes = 2.0 * (4096.0 * 1024 + 1024.0 * 8 + 4096.0 * 8);
  CHECK(Compute{ComputeKind::gemm, {gate}, 65536}.seconds(m) == Approx(gate_bytes / 1e12 + 3e-6));
  // The same small GEMM run 4 times, 64 x 64 x 64 (0.5 MFLOP, 24 KB: 24 ns): 4 floors.
  CHECK(Compute{ComputeKind::gemm, {{64, 64, 64, 1, 4}}, 0}.seconds(m) == Approx(12e-6));
  // An expert with no tokens launches nothing; a big GEMM is unchanged.
  CHECK(Compute{ComputeKind::gemm, {{0, 4096, 1024}}, 0}.seconds(m) == 0);
  const Gemm big{8192, 8192, 8192};
  CHECK(Compute{ComputeKind::gemm, {big}, 0}.seconds(m) == Approx(m.gemm_time(big)));
  // A floor of 0 (sim.ideal): the kernels' own times.
  gpu.set_kernel_us(0);
  const GpuModel ideal(gpu, spec::FP16);
  CHECK(Compute{ComputeKind::elementwise, {}, 4096}.seconds(ideal) == Approx(4096 / 1e12));
}

TEST_CASE("dgx1 routes follow the hybrid cube-mesh and never transit a GPU") {
  const Cluster c(test::platform("dgx1-v100", 1));
  // gpu0-gpu3 is a double NVLink bond: one hop at 50 GB/s.
  CHECK(c.intra_route(0, 3).size() == 1);
  CHECK(c.route_bandwidth(c.intra_route(0, 3)) == Approx(50e9));
  // gpu0-gpu5 has no NVLink: gpu0-plx0-cpu0-cpu1-plx2-gpu5 over PCIe and QPI, 11 GB/s.
  const auto& r = c.intra_route(0, 5);
  REQUIRE(r.size() == 5);
  CHECK(c.route_bandwidth(r) == Approx(11e9));
  bool crosses_qpi = false;
  for (const auto& h : r) crosses_qpi |= c.node_links()[h.link].kind == "qpi";
  CHECK(crosses_qpi);
  // Routes are direction-consistent: the reverse route uses the same links, flipped.
  const auto& back = c.intra_route(5, 0);
  REQUIRE(back.size() == r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    CHECK(back[r.size() - 1 - i].link == r[i].link);
    CHECK(back[r.size() - 1 - i].forward != r[i].forward);
  }
  // Each PCIe switch's GPUs use its NIC.
  CHECK(c.nics()[c.nic_of(1)].name == "nic0");
  CHECK(c.nics()[c.nic_of(6)].name == "nic3");
}

TEST_CASE("cluster validation names the offending field") {
  auto s = test::platform("dgx-a100", 2);
  s.mutable_node()->mutable_links(2)->set_gbytes_per_s(0);
  try {
    Cluster c(s);
    FAIL("a zero bandwidth was accepted");
  } catch (const FieldError& e) {
    CHECK(e.field() == "node.links[2].gbytes_per_s");
  }
  auto t = test::platform("dgx-a100", 20);  // 16 nodes per leaf: 20 fits neither one leaf nor whole leaves
  try {
    Cluster c(t);
    FAIL("20 nodes were accepted");
  } catch (const FieldError& e) {
    CHECK(e.field() == "nodes");
    CHECK_THAT(e.message(), Contains("multiple of 16"));
  }
  auto u = test::platform("dgx-a100", 1);
  u.mutable_node()->mutable_links()->DeleteSubrange(3, 1);  // gpu3 loses its NVSwitch port
  CHECK_THROWS_WITH(Cluster(u), Contains("gpu0 cannot reach gpu3"));
  // A GPU without a GEMM-efficiency curve ran every GEMM at the peak, silently.
  auto v = test::platform("dgx-a100", 2);
  v.mutable_gpu()->clear_gemm_efficiency();
  CHECK_THROWS_WITH(Cluster(v), Contains("gpu.gemm_efficiency") && Contains("moesim calibrate"));
  // Several nodes and no fabric block: named as missing, with an example, not as a bad field.
  auto w = test::platform("dgx-a100", 2);
  w.clear_fabric();
  CHECK_THROWS_WITH(Cluster(w), Contains("is missing") && Contains("fabric { nodes_per_leaf"));
  w.set_nodes(1);
  CHECK_NOTHROW(Cluster(w));  // one node needs none
}

TEST_CASE("parsed files know the line of every field") {
  const std::string text =
      "name: \"x\"\n"
      "nodes: 2\n"
      "node {\n"
      "  gpus: 2\n"
      "  links { a: \"gpu0\" b: \"gpu1\" gbytes_per_s: 10 }\n"
      "  links { a: \"gpu1\" b: \"sw\"\n"
      "          gbytes_per_s: 5 }\n"
      "}\n";
  spec::ClusterSpec c;
  const auto parsed = parse_text("x.textproto", text, c);
  CHECK(parsed.line_of("nodes") == 2);
  CHECK(parsed.line_of("node.links[1].gbytes_per_s") == 7);
  CHECK(parsed.line_of("node.links[0]") == 5);
  CHECK(parsed.describe("node.links[1].gbytes_per_s", "must be > 0") ==
        "x.textproto:7: field 'node.links[1].gbytes_per_s': must be > 0");
  spec::ClusterSpec bad;
  CHECK_THROWS_WITH(parse_text("y.textproto", "nodes: 2\nnode { gpuz: 3 }\n", bad),
                    Contains("y.textproto:2:") && Contains("gpuz"));
}

TEST_CASE("overrides set nested fields and reject unknown ones") {
  spec::ExperimentSpec s;
  apply_override(s, "cluster.nodes=4");
  apply_override(s, "cluster.platform=dgx1-v100");
  apply_override(s, "gating.zipf.exponent=1.5");
  apply_override(s, "model.dtype=BF16");
  CHECK(s.cluster().nodes() == 4);
  CHECK(s.cluster().platform() == "dgx1-v100");
  CHECK(s.gating().zipf().exponent() == 1.5);
  CHECK(s.model().dtype() == spec::BF16);
  CHECK_THROWS_WITH(apply_override(s, "model.layerz=3"), Contains("no field 'layerz'"));
  CHECK_THROWS_WITH(apply_override(s, "model.layers=many"), Contains("--set model.layers=many"));
  CHECK_THROWS_AS(apply_override(s, "nodes"), InputError);
}

TEST_CASE("the Hopper platforms time an expert GEMM as their GPU measured it") {
  // Each carries the curve `moesim calibrate` measured on one of its GPUs (experiments/hw/h100/ and
  // h200/profile-demo.textproto), rescaled to the datasheet peak: at each measured size the catalog's
  // GEMM time must be the measured one. The H800 has the H100's die and clocks.
  struct Case {
    const char* platform;
    const char* profile;
  };
  for (const Case& c : {Case{"dgx-h100", "h100"}, Case{"hgx-h800", "h100"}, Case{"h100-1gpu", "h100"},
                        Case{"dgx-h200", "h200"}}) {
    INFO(c.platform);
    spec::GpuSpec measured;
    parse_file(std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/" + c.profile + "/profile-demo.textproto", measured);
    const GpuModel device(measured, spec::FP16);
    const GpuModel catalog(test::platform(c.platform, 1).gpu(), spec::FP16);
    for (const auto& p : measured.gemm_efficiency()) {
      // The expert shape d = 1024, d_ffn = 4096 at the point's size: m = gflops / (2 · 4096 · 1024).
      const Gemm g{std::uint64_t(p.gflops() * 1e9 / (2.0 * 4096 * 1024) + 0.5), 4096, 1024, 1};
      CHECK(catalog.gemm_time(g) == Approx(device.gemm_time(g)).epsilon(0.01));
    }
  }
}
