// moesim-bench: how fast moesim simulates. For each GPU count it runs, in a fresh process (SimGrid
// allows one engine per process, and peak memory must be per size), one forward+backward EP
// iteration of a 12-MoE-layer GPT-MoE (top-2, one expert per GPU, Zipf(1.0)-skewed routing) on
// simulated DGX-A100 nodes, and prints wall time per phase and peak resident memory.
//
//   moesim-bench                       64, 256 and 1024 GPUs
//   moesim-bench --gpus 64,256 --flows per-flow collectives (sim.aggregate=false) for comparison
//   moesim-bench --gpus 1024 --policy pro-prophet --iterations 2   a policy's decision time
//   moesim-bench --gpus 1024 --all-policies    every policy at one size, a row each (2 iterations)
//   moesim-bench --gpus 1024,4096,16384 --ep 64   EP groups of 64 GPUs (64 experts), data parallelism over them
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <optional>

#include "allocator.hpp"
#include "parallel_layout.hpp"
#include "policy.hpp"
#include "routing.hpp"
#include "runner.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The least-squares slope of log y against log x: the exponent b of y ∝ x^b over the points.
double growth_exponent(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = double(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

// One size, in this process: prints one result line (the last iteration's figures; a policy that
// learns from timings, like Pro-Prophet's planner, decides from the second iteration on).
int bench_one(int gpus, bool aggregate, const std::string& policy_name, int iterations, int ep, int pp, int micro_batches) {
  const int nodes = gpus / 8;
  if (ep == 0) ep = gpus / pp;
  auto ex = load_experiment(std::string(MOESIM_SOURCE_DIR) + "/experiments/gpt-moe-s.textproto",
                            {fmt::format("cluster.nodes={}", nodes), fmt::format("model.experts={}", ep), "model.layers=12",
                             "model.top_k=2", "gating.zipf.exponent=1.0", "policy.name=" + policy_name,
                             fmt::format("parallel.ep={}", ep), fmt::format("parallel.pp={}", pp),
                             fmt::format("parallel.micro_batches={}", micro_batches)});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  const ParallelLayout layout = parallel_layout(ex.spec.parallel(), cluster);
  LayoutIteration policy(cluster.spec(), model, layout, ex.spec.policy());
  auto t = Clock::now();
  SimBackend sim(cluster, gpu, SimOptions{aggregate});
  const double t_platform = since(t);
  double t_routing = 0, t_graph = 0, t_sim = 0, decide = 0, makespan = 0;
  std::size_t ops = 0;
  for (int it = 0; it < iterations; ++it) {
    t = Clock::now();
    std::vector<RoutingMatrix> routing;
    for (int l = 0; l < model.layers(); ++l)
      routing.push_back(generate_routing(ex.spec.gating(), layout.stage_gpus(), model.experts(), model.tokens_per_gpu(), model.top_k(),
                                         ex.spec.seed(), std::uint64_t(it), l));
    t_routing = since(t);
    t = Clock::now();
    PolicyReport report;
    const IterationInput input{cluster, model, gpu, ex.spec.policy(), routing, report, dispatch_sizing(ex.spec.gate())};
    const TaskGraph graph = policy.build_iteration(input);
    t_graph = since(t);
    decide = report.decision_seconds;
    t = Clock::now();
    const Timing timing = sim.execute(graph);
    t_sim = since(t);
    policy.observe(graph, timing);
    ops = graph.size();
    makespan = timing.makespan();
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("{} {} {} {} {} {} {} {} {}\n", gpus, ops, t_routing, t_graph, t_platform, t_sim, double(ru.ru_maxrss) / 1024.0,
             makespan, decide);
  return 0;
}

struct Row {
  double gpus = 0, ops = 0, routing = 0, graph = 0, platform = 0, simulate = 0, rss = 0, makespan = 0, decide = 0;
  double total() const { return routing + graph + platform + simulate; }
};

// One size and policy in a fresh process (this program with --one). The policy name is checked
// against the registry before it reaches the shell.
std::optional<Row> run_child(const char* self, int gpus, const std::string& policy, int iterations, bool flows, int ep, int pp,
                             int micro_batches) {
  const std::string cmd = fmt::format("'{}' --one {} --policy {} --iterations {} --ep {} --pp {} --micro-batches {}{}", self, gpus,
                                      policy, iterations, ep, pp, micro_batches, flows ? " --flows" : "");
  FILE* p = popen(cmd.c_str(), "r");
  Row r;
  const int n = p ? fscanf(p, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &r.gpus, &r.ops, &r.routing, &r.graph, &r.platform,
                           &r.simulate, &r.rss, &r.makespan, &r.decide)
                  : 0;
  if (p) pclose(p);
  if (n != 9) return std::nullopt;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  use_large_pages();
  CLI::App app{"moesim-bench: wall time and peak memory of simulating one EP iteration at several scales"};
  std::vector<int> sizes = {64, 256, 1024};
  int one = 0, iterations = 1;
  bool flows = false, all = false;
  std::string policy = "ep";
  app.add_option("--gpus", sizes, "GPU counts (multiples of 8)")->delimiter(',')->capture_default_str();
  app.add_flag("--flows", flows, "One flow per transfer inside collectives (sim.aggregate=false)");
  app.add_option("--policy", policy, "The policy (`moesim algorithms`); its decision time is reported")->capture_default_str();
  app.add_flag("--all-policies", all, "Every policy at each GPU count, a row each (2 iterations unless --iterations says more)");
  app.add_option("--iterations", iterations, "Iterations simulated; the last one is reported (2 for policies that "
                                             "learn from the previous iteration's timings)")
      ->capture_default_str();
  int ep = 0;
  app.add_option("--ep", ep, "EP groups of this many GPUs (whole nodes), one expert per GPU of a group, data parallelism "
                             "over the groups (default: one group of all the GPUs, an expert per GPU)");
  int pp = 1, micro_batches = 1;
  app.add_option("--pp", pp, "Pipeline stages (the 12 layers split over them), each its own EP groups")->capture_default_str();
  app.add_option("--micro-batches", micro_batches, "Micro-batches per iteration, in the 1F1B order")->capture_default_str();
  app.add_option("--one", one, "Internal: run one size in this process")->group("");
  CLI11_PARSE(app, argc, argv);
  const auto known = policy_names();
  if (std::find(known.begin(), known.end(), policy) == known.end()) {
    fmt::print(stderr, "moesim-bench: --policy: unknown policy; `moesim algorithms` lists them\n");
    return 2;
  }
  for (int g : sizes)
    if (g < 8 || g % 8 != 0) {
      fmt::print(stderr, "moesim-bench: --gpus {}: a multiple of 8 (whole DGX-A100 nodes)\n", g);
      return 2;
    }
  if (one > 0) sizes = {one};
  if (pp < 1 || pp > 12 || micro_batches < 1 || micro_batches > 1024) {
    fmt::print(stderr, "moesim-bench: --pp from 1 to 12 (the layers), --micro-batches from 1 to 1024\n");
    return 2;
  }
  for (int g : sizes)
    if (g % (8 * pp) != 0 || ep < 0 || ep % 8 != 0 || (ep > 0 && (g / pp) % ep != 0)) {
      fmt::print(stderr, "moesim-bench: --gpus {}: every stage whole nodes (--pp {}), --ep {} whole nodes that divide a stage\n", g,
                 pp, ep);
      return 2;
    }
  if (one > 0) return bench_one(one, !flows, policy, iterations, ep, pp, micro_batches);

  if (all) {
    iterations = std::max(iterations, 2);
    fmt::print("Every policy, one fwd+bwd iteration (the last of {}), GPT-MoE 12 MoE layers (d_model 1024, d_ffn 4096,\n"
               "4096 tokens/GPU), top-2, one expert per GPU, Zipf(1.0) routing, DGX-A100 nodes. Wall seconds of the\n"
               "reported iteration (routing, graph with the policy's decisions, simulation, and the platform once),\n"
               "peak resident memory of its process.\n\n", iterations);
    for (int g : sizes) {
      fmt::print("{:>6} {:<20} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>13}\n", "GPUs", "policy", "ops", "total s",
                 "routing", "graph", "decide s", "simulate", "peak MB", "simulated ms");
      for (const auto& name : known) {
        const auto r = run_child(argv[0], g, name, iterations, flows, ep, pp, micro_batches);
        if (!r) {
          fmt::print("{:>6} {:<20} (failed)\n", g, name);
          continue;
        }
        fmt::print("{:>6} {:<20} {:>9.0f} {:>8.2f} {:>8.2f} {:>8.2f} {:>9.3f} {:>8.2f} {:>9.0f} {:>13.3f}\n", g, name, r->ops,
                   r->total(), r->routing, r->graph, r->decide, r->simulate, r->rss, r->makespan * 1e3);
        std::fflush(stdout);
      }
    }
    return 0;
  }

  fmt::print("One fwd+bwd iteration (policy {}), GPT-MoE 12 MoE layers (d_model 1024, d_ffn 4096, 4096 tokens/GPU),\n"
             "top-2, one expert per GPU{}, Zipf(1.0) routing, DGX-A100 nodes, collectives {}.\n"
             "Per iteration: routing, graph (of which decide: the policy's decisions), simulate.\n\n",
             policy,
             (ep ? fmt::format(" of EP groups of {} GPUs (data parallelism over the groups)", ep) : "") +
                 (pp > 1 || micro_batches > 1 ? fmt::format(", {} pipeline stages, {} micro-batches (1F1B)", pp, micro_batches) : ""),
             flows ? "one flow per transfer" : "as parallel tasks per block of links (default)");
  fmt::print("{:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>13} {:>13}\n", "GPUs", "ops", "routing s",
             "graph s", "decide s", "platform s", "simulate s", "total s", "peak MB", "decide/sim", "simulated ms");
  std::vector<double> gpus, wall, memory, op_counts;
  for (int g : sizes) {
    const auto r = run_child(argv[0], g, policy, iterations, flows, ep, pp, micro_batches);
    if (!r) {
      fmt::print(stderr, "moesim-bench: the run at {} GPUs failed\n", g);
      return 1;
    }
    gpus.push_back(g), wall.push_back(r->total()), memory.push_back(r->rss), op_counts.push_back(r->ops);
    fmt::print("{:>6} {:>9.0f} {:>10.2f} {:>10.2f} {:>10.3f} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.0f} {:>12.2f}% {:>13.3f}\n", g,
               r->ops, r->routing, r->graph, r->decide, r->platform, r->simulate, r->total(), r->rss,
               100 * r->decide / r->simulate, r->makespan * 1e3);
    std::fflush(stdout);
  }
  if (gpus.size() >= 2)
    fmt::print("\nGrowth with the GPU count G (least squares of log against log G over the rows): wall time ∝ G^{:.2f}, "
               "peak memory ∝ G^{:.2f}, ops ∝ G^{:.2f}\n",
               growth_exponent(gpus, wall), growth_exponent(gpus, memory), growth_exponent(gpus, op_counts));
  return 0;
}
