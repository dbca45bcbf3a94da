// moesim-bench: how fast moesim simulates. For each GPU count it runs, in a fresh process (SimGrid
// allows one engine per process, and peak memory must be per size), one forward+backward EP
// iteration of a 12-MoE-layer GPT-MoE (top-2, one expert per GPU, Zipf(1.0)-skewed routing) on
// simulated DGX-A100 nodes, and prints wall time per phase and peak resident memory.
//
//   moesim-bench                       64, 256 and 1024 GPUs
//   moesim-bench --gpus 64,256 --flows per-flow collectives (sim.aggregate=false) for comparison
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include "policy.hpp"
#include "routing.hpp"
#include "runner.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One size, in this process: prints one result line.
int bench_one(int gpus, bool aggregate) {
  const int nodes = gpus / 8;
  auto ex = load_experiment(std::nullopt, {fmt::format("cluster.nodes={}", nodes), fmt::format("model.experts={}", gpus),
                                           "model.layers=12", "model.top_k=2", "gating.zipf.exponent=1.0"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  auto policy = make_policy(ex.spec.policy());

  auto t = Clock::now();
  std::vector<RoutingMatrix> routing;
  for (int l = 0; l < model.layers(); ++l)
    routing.push_back(generate_routing(ex.spec.gating(), gpus, model.experts(), model.tokens_per_gpu(), model.top_k(),
                                       ex.spec.seed(), 0, l));
  const double t_routing = since(t);
  t = Clock::now();
  PolicyReport report;
  const TaskGraph graph = policy->build_iteration({cluster, model, gpu, ex.spec.policy(), routing, report});
  const double t_graph = since(t);
  t = Clock::now();
  SimBackend sim(cluster, gpu, SimOptions{aggregate});
  const double t_platform = since(t);
  t = Clock::now();
  const Timing timing = sim.execute(graph);
  const double t_sim = since(t);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("{} {} {} {} {} {} {} {}\n", gpus, graph.size(), t_routing, t_graph, t_platform, t_sim,
             double(ru.ru_maxrss) / 1024.0, timing.makespan());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moesim-bench: wall time and peak memory of simulating one EP iteration at several scales"};
  std::vector<int> sizes = {64, 256, 1024};
  int one = 0;
  bool flows = false;
  app.add_option("--gpus", sizes, "GPU counts (multiples of 8)")->delimiter(',')->capture_default_str();
  app.add_flag("--flows", flows, "One flow per transfer inside collectives (sim.aggregate=false)");
  app.add_option("--one", one, "Internal: run one size in this process")->group("");
  CLI11_PARSE(app, argc, argv);
  if (one > 0) return bench_one(one, !flows);

  fmt::print("One fwd+bwd EP iteration, GPT-MoE 12 MoE layers (d_model 1024, d_ffn 4096, 4096 tokens/GPU),\n"
             "top-2, one expert per GPU, Zipf(1.0) routing, DGX-A100 nodes, collectives {}.\n\n",
             flows ? "one flow per transfer" : "as one parallel task per step (default)");
  fmt::print("{:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>13} {:>13}\n", "GPUs", "ops", "routing s",
             "graph s", "platform s", "simulate s", "total s", "peak MB", "ops/s (sim)", "simulated ms");
  for (int g : sizes) {
    const std::string cmd = fmt::format("'{}' --one {}{}", argv[0], g, flows ? " --flows" : "");
    FILE* p = popen(cmd.c_str(), "r");
    double gpus = 0, ops = 0, tr = 0, tg = 0, tp = 0, ts = 0, rss = 0, makespan = 0;
    const int n = p ? fscanf(p, "%lf %lf %lf %lf %lf %lf %lf %lf", &gpus, &ops, &tr, &tg, &tp, &ts, &rss, &makespan) : 0;
    if (p) pclose(p);
    if (n != 8) {
      fmt::print(stderr, "moesim-bench: the run at {} GPUs failed\n", g);
      return 1;
    }
    fmt::print("{:>6} {:>9.0f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.0f} {:>13.0f} {:>13.3f}\n", g, ops,
               tr, tg, tp, ts, tr + tg + tp + ts, rss, ops / ts, makespan * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
