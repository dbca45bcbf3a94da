#include "runner.hpp"

#include <boost/math/distributions/students_t.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "gate.hpp"
#include "gating.hpp"
#include "hw_info.hpp"
#include "parallel_layout.hpp"
#include "routing.hpp"
#include "simgrid_backend.hpp"

namespace moesim {

std::span<const IterationRecord> RunResult::measured() const {
  const std::size_t skip = std::min<std::size_t>(std::size_t(warmup), iterations.size() ? iterations.size() - 1 : 0);
  return std::span<const IterationRecord>(iterations).subspan(skip);
}

double RunResult::mean_time() const {
  const auto its = measured();
  double sum = 0;
  for (const auto& it : its) sum += it.time;
  return its.empty() ? 0 : sum / double(its.size());
}

double ci95_half_width(const std::vector<double>& samples) {
  const std::size_t n = samples.size();
  if (n < 2) return 0;
  const double mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(n);
  double ss = 0;
  for (double x : samples) ss += (x - mean) * (x - mean);
  const boost::math::students_t t(double(n - 1));
  return boost::math::quantile(t, 0.975) * std::sqrt(ss / double(n - 1)) / std::sqrt(double(n));
}

double RunResult::seeds_mean_time() const {
  return seed_times.empty() ? mean_time()
                            : std::accumulate(seed_times.begin(), seed_times.end(), 0.0) / double(seed_times.size());
}

double RunResult::seeds_ci95() const { return ci95_half_width(seed_times); }

std::string PaperComparison::verdict() const {
  const double lo = (simulated - ci95) / paper.value(), hi = (simulated + ci95) / paper.value();
  const double tol = tolerance();
  if (lo >= 1 - tol && hi <= 1 + tol) return "pass";
  if (hi < 1 - tol || lo > 1 + tol) return "fail";
  return "inside the noise";
}

Attribution RunResult::mean_attribution() const {
  const auto its = measured();
  Attribution sum;
  for (const auto& it : its) sum += it.attribution;
  return sum.scaled(its.empty() ? 0.0 : 1.0 / double(its.size()));
}

double RunResult::mean_load_stddev(int layer) const {
  const auto its = measured();
  double sum = 0;
  for (const auto& it : its) sum += it.load_stddev_per_layer.at(std::size_t(layer)) / double(its.size());
  return sum;
}

MemoryUse RunResult::peak_memory() const {
  MemoryUse peak;
  for (const auto& it : iterations)
    if (it.memory.total() > peak.total()) peak = it.memory;
  return peak;
}

MemoryUse RunResult::peak_state_memory() const {
  MemoryUse peak;
  for (const auto& it : iterations)
    if (it.state_memory.states() > peak.states()) peak = it.state_memory;
  return peak;
}

namespace {
// Entry by entry, the mean over `its` of a per-iteration vector; empty where an iteration lacks it.
std::vector<double> mean_of(std::span<const IterationRecord> its, std::vector<double> IterationRecord::*field) {
  std::vector<double> mean;
  for (const auto& it : its) {
    const auto& v = it.*field;
    if (v.empty()) return {};
    mean.resize(v.size(), 0.0);
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += v[i] / double(its.size());
  }
  return mean;
}
}  // namespace

std::vector<double> RunResult::mean_gpu_load() const { return mean_of(measured(), &IterationRecord::gpu_load); }

std::vector<double> RunResult::mean_load_max_mean() const {
  return mean_of(measured(), &IterationRecord::load_max_mean_per_layer);
}

namespace {

// Max/mean of the per-GPU expert load with E/G experts per GPU (G an EP group's GPUs: each place's
// load summed over the groups); with fewer experts than GPUs
// (Tutel's sharded experts) each expert's load is shared by its W/E GPUs, the same ratio as
// per expert.
double max_mean_gpu_load(const std::vector<RoutingMatrix>& routing, int gpus) {
  double sum = 0;
  for (const auto& R : routing) {
    const int local = std::max(1, R.experts / gpus), slots = R.experts < gpus ? R.experts : gpus;
    std::vector<double> load(std::size_t(slots), 0.0);
    const auto loads = R.expert_loads();
    for (int e = 0; e < R.experts; ++e) load[std::size_t(e / local)] += double(loads[std::size_t(e)]);
    double total = 0;
    for (double x : load) total += x;
    sum += total > 0 ? *std::max_element(load.begin(), load.end()) / (total / double(slots)) : 1.0;
  }
  return routing.empty() ? 1.0 : sum / double(routing.size());
}

}  // namespace

namespace {

RunResult run_one(const spec::ExperimentSpec& s, const Cluster& cluster, const GpuModel& gpu, Backend& backend,
                  const std::function<void()>& iteration_done) {
  // EP groups inside data and pipeline parallelism (parallel): a policy per group and stage, their
  // micro-batches merged. The routing has a source per GPU of a stage; under tensor and context
  // parallelism each GPU routes its share of its group's tokens.
  const ParallelLayout layout = parallel_layout(s.parallel(), cluster);
  const MoeModel model = MoeModel(s.model()).tensor_parallel(layout.tp).context_parallel(layout.cp);
  const int ep = layout.ep, sources = layout.stage_gpus();
  LayoutIteration policy(cluster.spec(), model, layout, s.policy());
  RunResult result;
  result.policy = policy.policy_name();
  result.gpus = cluster.num_gpus();
  result.warmup = int(s.warmup_iterations());
  // A pipeline of pp GPUs runs the whole model on m micro-batches.
  result.model_flops_per_gpu = model.iteration_flops_per_gpu() * layout.micro_batches / layout.pp;
  result.peak_flops = gpu.peak_flops();
  const int iterations = int(s.iterations());
  const int keep = std::min(iterations, int(s.sim().timeline_iterations() ? s.sim().timeline_iterations() : 1));
  result.first_graph = std::clamp(result.warmup, 0, iterations - keep);
  auto gating = make_gating_source(s.gating(), model, sources, s.seed(),
                                   spread_blocks(collective_algorithm(s.policy(), CollectiveType::all_to_all), model.experts(),
                                                 ep, cluster.gpus_per_node()));
  for (int it = 0; it < iterations; ++it) {
    IterationRecord rec;
    rec.iteration = it;
    const std::vector<RoutingMatrix> demand = gating->next();
    std::vector<RoutingMatrix> routed;
    for (const auto& R : demand) {
      GateOutcome g = apply_gate(s.gate(), R, model.tokens_per_gpu(), model.top_k());
      rec.dropped += g.dropped;
      rec.dropped_per_layer.push_back(g.dropped);
      rec.capacity_factor += g.factor / model.layers();
      routed.push_back(std::move(g.routed));
    }
    rec.trace_iteration = gating->label();
    if (it == 0 && sources == cluster.num_gpus() && model.experts() % cluster.num_gpus() == 0) {  // the cost model places E/G experts per GPU
      const CostModel cost(cluster, gpu);
      for (int l = 0; l < model.layers(); ++l) result.roofline.push_back({l, cost.roofline(model, routed[l])});
    }
    PolicyReport report;
    const IterationInput input{cluster, model, gpu, s.policy(), routed, report, dispatch_sizing(s.gate())};
    TaskGraph graph = policy.build_iteration(input);
    backend.check_memory(report.memory.total());
    rec.start = backend.now();
    Timing timing = backend.execute(graph);
    policy.observe(graph, timing);
    rec.time = timing.makespan();
    rec.attribution = attribute(graph, timing);
    rec.max_mean_load = max_mean_gpu_load(demand, ep);  // before the gate drops
    rec.rerouted = report.rerouted_tokens;
    rec.shadowed = report.shadowed_experts;
    rec.moved = report.moved_experts;
    rec.decision_seconds = report.decision_seconds;
    rec.load_stddev_per_layer = report.load_stddev;
    rec.load_max_mean_per_layer = report.load_max_mean;
    rec.gpu_load = report.gpu_load;
    rec.memory = report.memory;
    rec.state_memory = report.state_memory;
    for (std::size_t g = 0; g < report.gpu_memory.size(); ++g)
      if (gpu.memory_bytes() > 0 && report.gpu_memory[g] > gpu.memory_bytes()) rec.over_memory.push_back(int(g));
    for (double m : timing.memory_peak) rec.device_memory_peak = std::max(rec.device_memory_peak, m);
    for (const auto& R : routed) {
      rec.expert_load.push_back(R.expert_loads());
    }
    result.iterations.push_back(rec);
    if (it >= result.first_graph && it < result.first_graph + keep) {
      graph.drop_collective_matrices();  // only the timeline reads it from here on
      result.graphs.push_back(std::move(graph));
      result.timings.push_back(std::move(timing));
    }
    if (iteration_done) iteration_done();
  }
  return result;
}

}  // namespace

const RunResult& ExperimentResult::run(const std::string& name) const {
  for (const auto& r : runs)
    if (r.name == name) return r;
  throw std::logic_error("no run named " + name);
}

ExperimentResult run_experiment(const Experiment& ex, const std::function<void(int, int)>& progress,
                                const std::string& backend_name) {
  const Cluster cluster(ex.cluster_spec);
  const GpuModel gpu(ex.cluster_spec.gpu(), ex.spec.model().dtype());
  std::unique_ptr<Backend> backend;
  if (backend_name == "sim") {
    SimOptions options;
    options.aggregate = !ex.spec.sim().has_aggregate() || ex.spec.sim().aggregate();
    backend = std::make_unique<SimBackend>(cluster, gpu, options);
  } else {
    backend = make_hw_backend(backend_name, cluster, MoeModel(ex.spec.model()));
  }

  std::vector<std::pair<std::string, spec::ExperimentSpec>> runs = ex.variants;
  if (runs.empty()) runs.emplace_back("", ex.spec);
  const int seeds = std::max(1, int(ex.spec.seeds()));
  int total = 0, done = 0;
  for (const auto& [name, s] : runs) total += seeds * int(s.iterations());
  ExperimentResult result;
  result.backend = backend->name();
  result.paper.resize(std::size_t(ex.spec.paper_size()));
  // Seed by seed: every run, then the paper's values from that seed's runs. The first seed's runs
  // are kept whole; of the others, their times and paper values.
  for (int k = 0; k < seeds; ++k) {
    ExperimentResult this_seed;
    for (const auto& [name, spec] : runs) {
      spec::ExperimentSpec s = spec;
      s.set_seed(spec.seed() + std::uint64_t(k));
      this_seed.runs.push_back(run_one(s, cluster, gpu, *backend, [&] {
        if (progress) progress(++done, total);
      }));
      this_seed.runs.back().name = name;
    }
    for (int i = 0; i < ex.spec.paper_size(); ++i)
      result.paper[std::size_t(i)].per_seed.push_back(simulated_value(ex.spec.paper(i), this_seed));
    if (k == 0) result.runs = std::move(this_seed.runs);
    if (seeds > 1)
      for (std::size_t r = 0; r < result.runs.size(); ++r)
        result.runs[r].seed_times.push_back((k == 0 ? result.runs : this_seed.runs)[r].mean_time());
  }
  for (int i = 0; i < ex.spec.paper_size(); ++i) {
    auto& c = result.paper[std::size_t(i)];
    c.paper = ex.spec.paper(i);
    c.simulated = std::accumulate(c.per_seed.begin(), c.per_seed.end(), 0.0) / double(c.per_seed.size());
    c.ci95 = ci95_half_width(c.per_seed);
  }
  return result;
}

double simulated_value(const spec::PaperValue& p, const ExperimentResult& result) {
  using PV = spec::PaperValue;
  std::vector<std::string> groups(p.groups().begin(), p.groups().end());
  if (groups.empty()) groups.emplace_back();
  std::vector<double> values;
  for (const auto& g : groups) {
    auto run = [&](const std::string& name) -> const RunResult& { return result.run(g.empty() ? name : g + "/" + name); };
    const RunResult& variant = run(p.variant());
    // The quantity of a run (lower is better): mean iteration time, or a layer's load std-dev.
    auto best = [&](const std::function<double(const RunResult&)>& quantity) {
      double b = std::numeric_limits<double>::infinity();
      for (const auto& name : p.baseline()) b = std::min(b, quantity(run(name)));
      const double v = quantity(variant);
      return b == v ? 1.0 : b / v;  // two runs with none of it (0 / 0) are alike
    };
    if (p.quantity() == PV::SPEEDUP) {
      values.push_back(best([](const RunResult& r) { return r.mean_time(); }));
    } else if (p.quantity() == PV::ALL_TO_ALL) {
      values.push_back(best([](const RunResult& r) { return all_to_all_seconds(r.mean_breakdown()); }));
    } else if (p.quantity() == PV::OTHER_COMM) {
      values.push_back(best([](const RunResult& r) { return sparse_collective_seconds(r.mean_breakdown()); }));
    } else if (p.quantity() == PV::MEMORY) {
      values.push_back(best([](const RunResult& r) { return r.peak_state_memory().states(); }));
    } else if (p.quantity() == PV::PARAM_MEMORY) {
      values.push_back(best([](const RunResult& r) { return r.peak_state_memory().params + r.peak_state_memory().materialized_params; }));
    } else {
      const int layers = variant.iterations.empty() ? 0 : int(variant.iterations.front().load_stddev_per_layer.size());
      for (int l = 0; l < layers; ++l) values.push_back(best([l](const RunResult& r) { return r.mean_load_stddev(l); }));
    }
  }
  if (values.empty()) return 0;
  switch (p.aggregate()) {
    case PV::MIN: return *std::min_element(values.begin(), values.end());
    case PV::MEAN: return std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
    case PV::GEOMEAN: {
      double log_sum = 0;
      for (double v : values) log_sum += std::log(v);
      return std::exp(log_sum / double(values.size()));
    }
    default: return *std::max_element(values.begin(), values.end());
  }
}

}  // namespace moesim
