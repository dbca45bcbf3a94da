// The moesim program as a user meets it: outputs, determinism, and bad input (exit status 2,
// a message naming file, line and field, and no output written).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpu.hpp"
#include "helpers.hpp"
#include "taskgraph.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kBin = MOESIM_BIN;
const std::string kSmall = " --set cluster.nodes=2 --set model.layers=2 --set model.experts=16 --set iterations=2 -q";

// A valid spec with one line replaced, written to DIR/bad.textproto.
std::string spec_with(const std::string& dir, const std::string& from, const std::string& to) {
  std::string text = test::read_file(test::kBaseSpec);
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  const std::string path = dir + "/bad.textproto";
  test::write_file(path, text);
  return path;
}

int line_of(const std::string& file, const std::string& needle) {
  const std::string text = test::read_file(file);
  return 1 + int(std::count(text.begin(), text.begin() + long(text.find(needle)), '\n'));
}

void expect_rejected(const std::string& args, const std::string& dir, const std::vector<std::string>& parts) {
  std::string out;
  const int rc = test::run_command(kBin + " run " + args + " --out " + dir + "/out", out);
  INFO(out);
  CHECK(rc == 2);
  for (const auto& p : parts) CHECK_THAT(out, Contains(p));
  CHECK_FALSE(fs::exists(dir + "/out"));
}

}  // namespace

TEST_CASE("moesim run writes the summary and a Chrome trace") {
  const auto dir = test::temp_dir("run");
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + test::kBaseSpec + kSmall + " --out " + dir, out) == 0);
  const auto summary = nlohmann::json::parse(test::read_file(dir + "/summary.json"));
  CHECK(summary["gpus"] == 16);
  CHECK(summary["policy"] == "ep");
  CHECK(summary["iterations"] == 2);
  const double t = summary["iteration_time_s"];
  double parts = 0;
  for (const auto& [phase, seconds] : summary["breakdown"].items()) parts += seconds.get<double>();
  CHECK(parts == Approx(t));
  CHECK(summary["breakdown"].size() == kNumPhases);
  CHECK(summary["breakdown"]["expert_compute"].get<double>() > 0);
  // Per layer (the spec's 2), critical path and busy time per phase; the layers' critical paths
  // are part of the iteration's.
  REQUIRE(summary["per_layer"].size() == 2);
  double layers = 0;
  for (const auto& l : summary["per_layer"])
    for (const auto& [phase, seconds] : l["critical_path"].items()) layers += seconds.get<double>();
  CHECK(layers > 0);
  CHECK(layers <= t * (1 + 1e-9));
  CHECK(summary["per_layer"][1]["busy"]["dispatch"].get<double>() > 0);
  CHECK(summary["per_iteration"].size() == 2);
  const auto trace = nlohmann::json::parse(test::read_file(dir + "/timeline.json"));
  int complete = 0;
  std::set<int> pids;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") {
      ++complete;
      pids.insert(e["pid"].get<int>());
      CHECK(e["dur"].get<double>() >= 0);
    }
  CHECK(complete > 0);
  CHECK(pids.size() == 16);  // one process per GPU
  // An all-to-all's events carry what each GPU sends; over the GPUs, the whole all-to-all.
  std::map<int, double> sent, total;  // per op id
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "dispatch") {
      sent[e["args"]["op"].get<int>()] += e["args"]["mbytes"].get<double>();
      total[e["args"]["op"].get<int>()] = e["args"]["mbytes_total"].get<double>();
    }
  REQUIRE(!sent.empty());
  for (const auto& [op, mb] : sent) CHECK(mb == Approx(total[op]));
  CHECK_THAT(out, Contains("iteration time") && Contains("routing: Zipf popularity, exponent 1, seed 1"));
  CHECK(summary["routing"] == "Zipf popularity, exponent 1, seed 1");
  // The CSVs: a row per iteration (the first marked warm-up when the spec leaves one out) with the
  // iteration's time, and a row per layer.
  const std::string iterations = test::read_file(dir + "/iterations.csv");
  CHECK(std::count(iterations.begin(), iterations.end(), '\n') == 3);
  CHECK(iterations.rfind("variant,policy,iteration,warmup,time_s,dense_compute_s,", 0) == 0);
  const std::string first_row = iterations.substr(iterations.find('\n') + 1);
  CHECK(first_row.rfind(fmt::format(",ep,0,{},{:.9g},", summary.value("warmup_iterations", 0) > 0 ? 1 : 0,
                                    summary["per_iteration"][0]["iteration_time_s"].get<double>()), 0) == 0);
  const std::string layers_csv = test::read_file(dir + "/layers.csv");
  CHECK(std::count(layers_csv.begin(), layers_csv.end(), '\n') == 3);
  CHECK_THAT(layers_csv, Contains(",ep,1,"));
}

TEST_CASE("the same spec and seed give an identical summary") {
  const auto dir = test::temp_dir("determinism");
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + test::kBaseSpec + kSmall + " --out " + dir + "/a", out) == 0);
  REQUIRE(test::run_command(kBin + " run " + test::kBaseSpec + kSmall + " --out " + dir + "/b", out) == 0);
  REQUIRE(test::run_command(kBin + " run " + test::kBaseSpec + kSmall + " --set seed=2 --out " + dir + "/c", out) == 0);
  const auto a = test::read_file(dir + "/a/summary.json");
  CHECK(a == test::read_file(dir + "/b/summary.json"));
  CHECK(test::read_file(dir + "/a/timeline.json") == test::read_file(dir + "/b/timeline.json"));
  CHECK(a != test::read_file(dir + "/c/summary.json"));  // the seed does change the routing
}

TEST_CASE("a syntax error names the file and line") {
  const auto dir = test::temp_dir("syntax");
  const auto spec = spec_with(dir, "layers: 12", "layers: }");
  expect_rejected(spec, dir, {"bad.textproto:" + std::to_string(line_of(spec, "layers: }")) + ":"});
}

TEST_CASE("an unknown field names the file, line and field") {
  const auto dir = test::temp_dir("unknown");
  const auto spec = spec_with(dir, "layers: 12", "layerz: 12");
  expect_rejected(spec, dir, {"bad.textproto:" + std::to_string(line_of(spec, "layerz")) + ":", "layerz"});
}

TEST_CASE("experts that do not divide among the GPUs are rejected") {
  const auto dir = test::temp_dir("experts");
  const auto spec = spec_with(dir, "experts: 64", "experts: 60");
  expect_rejected(spec, dir,
                  {"bad.textproto:" + std::to_string(line_of(spec, "experts: 60")) + ":", "model.experts",
                   "multiple of 64"});
  expect_rejected(test::kBaseSpec + " " + "--set model.experts=100", dir, {"--set model.experts=100", "model.experts"});
}

TEST_CASE("a bandwidth of zero in a platform file is rejected at its line") {
  const auto dir = test::temp_dir("bandwidth");
  std::string platform = test::read_file(std::string(MOESIM_SOURCE_DIR) + "/platforms/dgx-a100.textproto");
  const std::string from = "b: \"nvswitch\" gbytes_per_s: 231.6";
  const auto first = platform.find(from);
  platform.replace(platform.find(from, first + 1), from.size(), "b: \"nvswitch\" gbytes_per_s: 0");
  test::write_file(dir + "/slow.textproto", platform);
  const int line = line_of(dir + "/slow.textproto", "gbytes_per_s: 0");
  const auto spec = spec_with(dir, "platform: \"dgx-a100\"", "platform: \"" + dir + "/slow.textproto\"");
  expect_rejected(spec, dir,
                  {"slow.textproto:" + std::to_string(line) + ":", "node.links[1].gbytes_per_s", "must be in [0.001, 1e+06] GB/s"});
}

TEST_CASE("a node count that does not fit the fat-tree is rejected") {
  const auto dir = test::temp_dir("nodes");
  const auto spec = spec_with(dir, "nodes: 8", "nodes: 20");
  expect_rejected(spec, dir,
                  {"bad.textproto:" + std::to_string(line_of(spec, "nodes: 20")) + ":", "cluster.nodes", "multiple of 16"});
}

TEST_CASE("missing files, unknown platforms and unknown policies are rejected") {
  const auto dir = test::temp_dir("missing");
  expect_rejected(dir + "/nope.textproto", dir, {"nope.textproto", "cannot open"});
  expect_rejected(test::kBaseSpec + " " + "--set cluster.platform=dgx-z", dir, {"unknown platform 'dgx-z'", "dgx-a100"});
  expect_rejected(test::kBaseSpec + " " + "--set policy.name=magic", dir, {"unknown policy 'magic'", "ep"});
  expect_rejected(test::kBaseSpec + " " + "--set policy.all_to_all=telepathy", dir, {"unknown algorithm 'telepathy'", "linear"});
}

TEST_CASE("a custom platform's error names its file, line and field, from run and from platform show") {
  // The DGX H100 of the catalog, exported, with a NIC that no link reaches (it was an internal
  // error, map::at).
  const auto dir = test::temp_dir("custom-platform");
  std::string text, out;
  REQUIRE(test::run_command(kBin + " platform export dgx-h100", text) == 0);
  const auto at = text.find("  p2p_peers:");
  REQUIRE(at != std::string::npos);
  text.insert(at, "  nics {\n    name: \"nic8\"\n    gbits_per_s: 400\n  }\n");
  const int line = int(std::count(text.begin(), text.begin() + long(at), '\n')) + 2;  // the name's line
  test::write_file(dir + "/h100.textproto", text);
  const std::string where = fmt::format("{}/h100.textproto:{}: field 'node.nics[8].name': 'nic8' is in no link", dir, line);
  CHECK(test::run_command(kBin + " platform show " + dir + "/h100.textproto", out) == 2);
  CHECK_THAT(out, Contains(where));
  CHECK(test::run_command(kBin + " run " + test::kBaseSpec + kSmall + " --set cluster.platform=" + dir + "/h100.textproto --out " + dir + "/o", out) == 2);
  CHECK_THAT(out, Contains(where));
  CHECK_FALSE(fs::exists(dir + "/o"));
}

TEST_CASE("platform show prints each dtype's GEMM efficiency at a few sizes, from its own curve") {
  // p3dn-v100 has one curve per dtype (DeepBench's V100): fp16's and fp32's lines differ.
  std::string out;
  REQUIRE(test::run_command(kBin + " platform show p3dn-v100", out) == 0);
  const spec::ClusterSpec c = test::platform("p3dn-v100", 1);
  for (const auto dtype : {spec::FP16, spec::FP32}) {
    const GpuModel gpu(c.gpu(), dtype);
    CHECK_THAT(out, Contains(fmt::format("GEMMs of 0.1 / 1 / 10 / 100 GFLOP at {:.0f} / {:.0f} / {:.0f} / {:.0f}% of it",
                                         100 * gpu.gemm_efficiency(1e8), 100 * gpu.gemm_efficiency(1e9),
                                         100 * gpu.gemm_efficiency(1e10), 100 * gpu.gemm_efficiency(1e11))));
  }
  CHECK(GpuModel(c.gpu(), spec::FP16).gemm_efficiency(1e10) < GpuModel(c.gpu(), spec::FP32).gemm_efficiency(1e10));
}

TEST_CASE("help is available at every level") {
  std::string out;
  CHECK(test::run_command(kBin + " --help", out) == 0);
  CHECK_THAT(out, Contains("run") && Contains("platform"));
  CHECK(test::run_command(kBin + " run --help", out) == 0);
  CHECK_THAT(out, Contains("--set") && Contains("--out"));
  CHECK(test::run_command(kBin + " platform show --help", out) == 0);
  CHECK(test::run_command(kBin + " frobnicate", out) == 2);
}

TEST_CASE("an override that the spec's variants set again is named, not dropped silently") {
  const std::string spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/hw/moe-small.textproto";
  const std::string dir = test::temp_dir("override-note");
  std::string out;
  REQUIRE(test::run_command(kBin + " run " + spec + " --set policy.name=tutel --set seed=3 -q --out " + dir, out) == 0);
  CHECK_THAT(out, Contains("note: --set policy.name=tutel: 2 of the spec's 2 variants set policy.name themselves"));
  CHECK_THAT(out, !Contains("--set seed=3:"));  // no variant sets the seed: no note
}

TEST_CASE("the README's demo table is what the demo prints, with the real trace beside the checkout") {
  // The quick start's promise: a newcomer runs the demo and sees the README's table. The README
  // shows the run on the real trace (../shared, never in the repository); without it, skip.
  if (demo_trace_path().empty()) {
    test::skip("the real trace (../shared/traces) is not beside the checkout; the README's table is of it");
    return;
  }
  std::string out;
  REQUIRE(test::run_command("cd " + test::temp_dir("demo") + " && " + kBin + " run --out out -q", out) == 0);
  // A row of the table: two spaces, then the variant's name and its figures.
  auto rows = [](const std::string& text, const std::string& from) {
    std::vector<std::string> found;
    std::istringstream in(text.substr(text.find(from)));
    std::string line;
    std::getline(in, line);  // the demo's first line
    bool table = false;
    while (std::getline(in, line)) {
      if (line.starts_with("  variant ")) table = true;
      else if (table && line.empty()) break;
      else if (table && line.starts_with("  ") && line[2] != ' ') found.push_back(line);
    }
    return found;
  };
  const auto printed = rows(out, "demo: "), readme = rows(test::read_file(std::string(MOESIM_SOURCE_DIR) + "/README.md"), "demo: ");
  CHECK(printed.size() == 19);
  CHECK(readme == printed);
}
