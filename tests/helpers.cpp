#include "helpers.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "plot.hpp"

namespace moesim::test {
namespace fs = std::filesystem;

void skip(const std::string& reason) {
  WARN("skipped: " << reason);
  case_skipped = true;
}

bool skip_without_gnuplot() {
  if (!gnuplot_path().empty()) return false;
  skip("gnuplot is not installed (apt-get install gnuplot-nox; the quickstart installs it)");
  return true;
}

spec::ModelSpec model_spec(int layers, int d_model, int d_ffn, int experts, int top_k, int seq_len, int tokens_per_gpu,
                           int heads, spec::DType dtype) {
  spec::ModelSpec m;
  m.set_layers(std::uint32_t(layers));
  m.set_d_model(std::uint32_t(d_model));
  m.set_d_ffn(std::uint32_t(d_ffn));
  m.set_experts(std::uint32_t(experts));
  m.set_top_k(std::uint32_t(top_k));
  m.set_seq_len(std::uint32_t(seq_len));
  m.set_tokens_per_gpu(std::uint32_t(tokens_per_gpu));
  m.set_heads(std::uint32_t(heads));
  m.set_dtype(dtype);
  return m;
}

namespace {
std::vector<std::string> small_overrides(std::vector<std::string> extra) {
  std::vector<std::string> all{"cluster.nodes=2", "model.layers=2", "model.experts=32"};
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}
}  // namespace

SmallSetup::SmallSetup(const std::vector<std::string>& extra)
    : ex(load_experiment(kBaseSpec, small_overrides(extra))), cluster(ex.cluster_spec), model(ex.spec.model()),
      gpu(ex.cluster_spec.gpu(), model.dtype()) {}

std::vector<RoutingMatrix> SmallSetup::routing(std::uint64_t seed, std::uint64_t iteration, int sources) const {
  std::vector<RoutingMatrix> out;
  for (int l = 0; l < model.layers(); ++l)
    out.push_back(generate_routing(ex.spec.gating(), sources ? sources : cluster.num_gpus(), model.experts(), model.tokens_per_gpu(),
                                   model.top_k(), seed, iteration, l));
  return out;
}

TaskGraph SmallSetup::build(const spec::PolicySpec& ps, std::uint64_t seed, PolicyReport& report) const {
  return make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing(seed), report});
}

int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string temp_dir(const std::string& name) {
  // Removed when the test process exits (each test case runs in its own), unless
  // MOESIM_KEEP_TEST_DIRS is set to look into them.
  static std::vector<fs::path> made;
  static const bool registered = [] {
    std::atexit([] {
      if (std::getenv("MOESIM_KEEP_TEST_DIRS")) return;
      std::error_code ec;
      for (const auto& d : made) fs::remove_all(d, ec);
    });
    return true;
  }();
  (void)registered;
  const fs::path dir = fs::temp_directory_path() / ("moesim-test-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  made.push_back(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace moesim::test
