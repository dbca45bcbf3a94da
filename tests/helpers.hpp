// Small helpers shared by the tests.
#pragma once
#include <string>

#include "cluster.hpp"
#include "policy.hpp"
#include "routing.hpp"
#include "spec.hpp"
#include "skip.hpp"
#include "taskgraph.hpp"

namespace moesim::test {

/// The tests' base experiment: EP on 64 DGX-A100 GPUs, Zipf routing, no variants.
inline const std::string kBaseSpec = std::string(MOESIM_SOURCE_DIR) + "/experiments/gpt-moe-s.textproto";

/// A catalog platform with its node count set.
inline spec::ClusterSpec platform(const std::string& name, int nodes) {
  auto s = load_platform(name);
  s.set_nodes(nodes);
  return s;
}

/// The platform with its hosts' kernel launches left out (GpuSpec.launch_us 0): for hand cases of
/// other mechanisms, timed without the host's issue of each op (tests/test_host_issue.cpp has its own).
inline spec::ClusterSpec without_launches(spec::ClusterSpec s) {
  s.mutable_gpu()->set_launch_us(0);
  return s;
}

/// A ModelSpec with its shape given in one line.
spec::ModelSpec model_spec(int layers, int d_model, int d_ffn, int experts, int top_k, int seq_len, int tokens_per_gpu,
                           int heads, spec::DType dtype = spec::FP16);

/// The demo's variants (every policy, as the demo configures them) on a small problem: 2 DGX-A100
/// nodes (16 GPUs), one MoE layer, d_model 32, d_ffn 64, 16 experts, top-2, 64 tokens per GPU.
inline Experiment small_demo(const std::vector<std::string>& extra = {},
                             const std::string& spec = std::string(MOESIM_SOURCE_DIR) + "/experiments/demo.textproto") {
  std::vector<std::string> set{"cluster.nodes=2",  "model.layers=1",          "model.d_model=32",
                               "model.d_ffn=64",   "model.experts=16",        "model.tokens_per_gpu=64",
                               "model.seq_len=64", "model.heads=2",           "model.dtype=FP32"};
  set.insert(set.end(), extra.begin(), extra.end());
  return load_experiment(spec, set);
}

/// The base experiment made small (2 DGX-A100 nodes: 16 GPUs, 2 layers, 32 experts; `extra`
/// overrides on top) with what a test needs to build iterations by hand.
struct SmallSetup {
  explicit SmallSetup(const std::vector<std::string>& extra = {});
  /// One iteration's routing of every layer (the spec's Zipf gating, this seed and iteration), from
  /// `sources` GPUs (0: the cluster's).
  std::vector<RoutingMatrix> routing(std::uint64_t seed, std::uint64_t iteration = 0, int sources = 0) const;
  /// The iteration a fresh policy `ps` builds on routing(seed), its figures in `report`.
  TaskGraph build(const spec::PolicySpec& ps, std::uint64_t seed, PolicyReport& report) const;
  Experiment ex;
  Cluster cluster;
  MoeModel model;
  GpuModel gpu;
};

/// A policy spec of that name, at its defaults.
inline spec::PolicySpec policy(const std::string& name) {
  spec::PolicySpec ps;
  ps.set_name(name);
  return ps;
}

/// f(compute, rank) for what an op computes: a Compute op's work, each part of a Computes op.
template <class F>
void for_each_compute(const Op& op, const F& f) {
  if (const auto* c = std::get_if<Compute>(&op.body)) f(*c, op.rank);
  if (const auto* parts = std::get_if<Computes>(&op.body))
    for (std::size_t i = 0; i < parts->parts(); ++i) f(parts->work(i), parts->ranks[i]);
}

/// Token-slots the forward's expert ops compute ("L<l>.fwd." ops), all GPUs and layers together.
inline long forward_tokens(const TaskGraph& g) {
  long n = 0;
  for (const auto& op : g.ops())
    if (op.label.find(".fwd.") != std::string::npos) for_each_compute(op, [&](const Compute& c, int) { n += c.tokens; });
  return n;
}

/// True, with a warning that the test is skipped, where gnuplot is not installed.
bool skip_without_gnuplot();

/// Runs a shell command; returns its exit status and puts stdout+stderr in `output`.
int run_command(const std::string& command, std::string& output);

/// A fresh empty directory in the temp folder, removed when the test process exits (set
/// MOESIM_KEEP_TEST_DIRS to keep it).
std::string temp_dir(const std::string& name);

void write_file(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

}  // namespace moesim::test
