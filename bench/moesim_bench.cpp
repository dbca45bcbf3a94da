// moesim-bench: how fast moesim simulates. For each GPU count it runs, in a fresh process (SimGrid
// allows one engine per process, and peak memory must be per size), one forward+backward EP
// iteration of a 12-MoE-layer GPT-MoE (top-2, one expert per GPU, Zipf(1.0)-skewed routing) on
// simulated DGX-A100 nodes, and prints wall time per phase and peak resident memory.
//
//   moesim-bench                       64, 256 and 1024 GPUs
//   moesim-bench --gpus 64,256 --flows per-flow collectives (sim.aggregate=false) for comparison
//   moesim-bench --gpus 1024 --policy pro-prophet --iterations 2   a policy's decision time
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

// One size, in this process: prints one result line (the last iteration's figures; a policy that
// learns from timings, like Pro-Prophet's planner, decides from the second iteration on).
int bench_one(int gpus, bool aggregate, const std::string& policy_name, int iterations) {
  const int nodes = gpus / 8;
  auto ex = load_experiment(std::string(MOESIM_SOURCE_DIR) + "/experiments/gpt-moe-s.textproto",
                            {fmt::format("cluster.nodes={}", nodes), fmt::format("model.experts={}", gpus), "model.layers=12",
                             "model.top_k=2", "gating.zipf.exponent=1.0", "policy.name=" + policy_name});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  auto policy = make_policy(ex.spec.policy());
  auto t = Clock::now();
  SimBackend sim(cluster, gpu, SimOptions{aggregate});
  const double t_platform = since(t);
  double t_routing = 0, t_graph = 0, t_sim = 0, decide = 0, makespan = 0;
  std::size_t ops = 0;
  for (int it = 0; it < iterations; ++it) {
    t = Clock::now();
    std::vector<RoutingMatrix> routing;
    for (int l = 0; l < model.layers(); ++l)
      routing.push_back(generate_routing(ex.spec.gating(), gpus, model.experts(), model.tokens_per_gpu(), model.top_k(),
                                         ex.spec.seed(), std::uint64_t(it), l));
    t_routing = since(t);
    t = Clock::now();
    PolicyReport report;
    const TaskGraph graph = policy->build_iteration({cluster, model, gpu, ex.spec.policy(), routing, report, !ex.spec.gate().pad_to_capacity()});
    t_graph = since(t);
    decide = report.decision_seconds;
    t = Clock::now();
    const Timing timing = sim.execute(graph);
    t_sim = since(t);
    policy->observe(graph, timing);
    ops = graph.size();
    makespan = timing.makespan();
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("{} {} {} {} {} {} {} {} {}\n", gpus, ops, t_routing, t_graph, t_platform, t_sim, double(ru.ru_maxrss) / 1024.0,
             makespan, decide);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moesim-bench: wall time and peak memory of simulating one EP iteration at several scales"};
  std::vector<int> sizes = {64, 256, 1024};
  int one = 0, iterations = 1;
  bool flows = false;
  std::string policy = "ep";
  app.add_option("--gpus", sizes, "GPU counts (multiples of 8)")->delimiter(',')->capture_default_str();
  app.add_flag("--flows", flows, "One flow per transfer inside collectives (sim.aggregate=false)");
  app.add_option("--policy", policy, "The policy (`moesim algorithms`); its decision time is reported")->capture_default_str();
  app.add_option("--iterations", iterations, "Iterations simulated; the last one is reported (2 for policies that "
                                             "learn from the previous iteration's timings)")
      ->capture_default_str();
  app.add_option("--one", one, "Internal: run one size in this process")->group("");
  CLI11_PARSE(app, argc, argv);
  if (one > 0) return bench_one(one, !flows, policy, iterations);

  fmt::print("One fwd+bwd iteration (policy {}), GPT-MoE 12 MoE layers (d_model 1024, d_ffn 4096, 4096 tokens/GPU),\n"
             "top-2, one expert per GPU, Zipf(1.0) routing, DGX-A100 nodes, collectives {}.\n"
             "Per iteration: routing, graph (of which decide: the policy's decisions), simulate.\n\n",
             policy, flows ? "one flow per transfer" : "as parallel tasks per block of links (default)");
  fmt::print("{:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>13} {:>13}\n", "GPUs", "ops", "routing s",
             "graph s", "decide s", "platform s", "simulate s", "total s", "peak MB", "decide/sim", "simulated ms");
  for (int g : sizes) {
    const std::string cmd =
        fmt::format("'{}' --one {} --policy '{}' --iterations {}{}", argv[0], g, policy, iterations, flows ? " --flows" : "");
    FILE* p = popen(cmd.c_str(), "r");
    double gpus = 0, ops = 0, tr = 0, tg = 0, tp = 0, ts = 0, rss = 0, makespan = 0, decide = 0;
    const int n =
        p ? fscanf(p, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &gpus, &ops, &tr, &tg, &tp, &ts, &rss, &makespan, &decide) : 0;
    if (p) pclose(p);
    if (n != 9) {
      fmt::print(stderr, "moesim-bench: the run at {} GPUs failed\n", g);
      return 1;
    }
    fmt::print("{:>6} {:>9.0f} {:>10.2f} {:>10.2f} {:>10.3f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.0f} {:>12.2f}% {:>13.3f}\n", g,
               ops, tr, tg, decide, tp, ts, tr + tg + tp + ts, rss, 100 * decide / ts, makespan * 1e3);
    std::fflush(stdout);
  }
  return 0;
}
