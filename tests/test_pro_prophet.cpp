// Pro-Prophet: the performance model (Eqs. 1-8) on hand cases, the greedy search (Algorithm 1) on
// constructed loads and at 1024 GPUs, token conservation, the block-wise schedule against the
// exposed one, and determinism.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <iostream>
#include <numeric>

#include "cost_model.hpp"
#include "gating.hpp"
#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "pro_prophet.hpp"
#include "runner.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

namespace {

// The demo experiment's model (d_model 1024, d_ffn 4096, 4,096 tokens per GPU, top-2, FP16), one
// layer unless overridden.
MoeModel moe_model(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"cluster.nodes=1", "model.layers=1"});
  return MoeModel(load_experiment(test::kBaseSpec, overrides).spec.model());
}

// Token-slots the expert ops compute, forward and backward: each routed slot exactly once in each.
std::pair<long, long> expert_slots(const TaskGraph& g) {
  std::pair<long, long> n{0, 0};
  for (const auto& op : g.ops())
    if (const auto* c = std::get_if<Compute>(&op.body); c && c->kind == ComputeKind::grouped_gemm)
      (op.label.find(".fwd.") != std::string::npos ? n.first : n.second) += c->tokens;
  return n;
}

// Source s routes `hot(s)` slots to expert `e` and spreads `rest` evenly over the others (the
// remainder one each to the first of them).
RoutingMatrix one_hot(int G, int E, int e, const std::function<std::int64_t(int)>& hot, std::int64_t rest) {
  RoutingMatrix R(G, E);
  for (int s = 0; s < G; ++s)
    for (int x = 0; x < E; ++x) {
      const int other = x < e ? x : x - 1;  // index among the E − 1 others
      R.mutable_at(s, x) = x == e ? hot(s) : rest / (E - 1) + (other < rest % (E - 1) ? 1 : 0);
    }
  return R;
}

std::vector<std::string> replica_labels(const TaskGraph& g) {
  std::vector<std::string> out;
  for (const auto& op : g.ops())
    if (op.label.find("replica") != std::string::npos) out.push_back(op.label);
  return out;
}

}  // namespace

TEST_CASE("Pro-Prophet's performance model, Eqs. 1-8, on hand cases") {
  ProphetModel m;
  m.devices = 4;
  m.input_bytes = 1000;
  m.a2a_bandwidth = 1e6;
  m.xfer_bandwidth = 2e6;
  m.throughput = 1000;
  m.params_bytes = m.grads_bytes = 4e6;
  m.fnec = 0.5;
  m.bnec = 1.0;
  CHECK(a2a_time(m, {10, 30, 20, 0}) == Approx(30 * 1000 / 1e6));        // Eq. 1: the busiest receiver
  CHECK(fec_time(m, {100, 400, 200, 300}) == Approx(0.4));                 // Eq. 2
  CHECK(bec_time(m, {100, 400, 200, 300}) == Approx(0.8));                 // Eq. 3
  CHECK(trans_time(m, 2, 1) == Approx(2 * 3 * 4e6 / (4 * 2e6)));           // Eq. 4: 3.0
  CHECK(agg_time(m, 2, 1) == Approx(3.0));                                 // Eq. 5
  CHECK(layer_time(0.03, 0.4, 3, 3) == Approx(0.12 + 1.2 + 3 + 3));       // Eq. 6
  // Eq. 8: Trans 3 − FEC 0.4 − FNEC 0.5 = 2.1 exposed; Agg 3 − BEC 0.8 − BNEC 1.0 = 1.2 exposed.
  CHECK(layer_time_overlapped(m, 0.03, 0.4, 3, 3) == Approx(0.12 + 1.2 + 2.1 + 1.2));
  CHECK(layer_time_overlapped(m, 0.03, 0.4, 0.5, 0.5) == Approx(0.12 + 1.2));  // fully hidden
  // Eq. 7: spread 10 against α · 415 / 4.
  CHECK(balanced({100, 110, 105, 100}, 0.1));       // 10 < 10.375
  CHECK_FALSE(balanced({100, 110, 105, 100}, 0.09)); // 10 ≥ 9.3375

  // The scalars come from the shared cost model: a uniform all-to-all and a full broadcast cost
  // what the cost model says, the mean load computes in what its GEMM curve says.
  const Cluster c(test::platform("dgx-a100", 2));
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  const MoeModel model = moe_model({"model.experts=16"});
  const auto pm = prophet_model(cost, model, gpu);
  // One NIC per GPU: a uniform all-to-all loads every receiver as one fed by all others, so Eq. 1
  // (B̄ profiled with 1 MB messages) gives its time exactly at that message size.
  std::vector<double> uniform(16 * 16, 1e6);
  for (int i = 0; i < 16; ++i) uniform[i * 16 + i] = 0;
  CHECK(a2a_time(pm, std::vector<double>(16, 15 * 1e6 / model.token_bytes())) == Approx(cost.alltoall_time(uniform)));
  std::vector<int> all(16);
  std::iota(all.begin(), all.end(), 0);
  CHECK(trans_time(pm, 1, 0) == Approx(cost.broadcast_time(all, pm.params_bytes)));
  CHECK(fec_time(pm, std::vector<double>(16, 8192)) == Approx(cost.expert_time(model, 8192)));
  CHECK(pm.fnec > 0);
  CHECK(pm.bnec == Approx(2 * pm.fnec));
}

TEST_CASE("the greedy search stops balanced (Eq. 7) or with the heaviest device relieved") {
  const Cluster c(test::platform("dgx-a100", 1));  // 8 GPUs, one expert each (E = D, as in the paper)
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  const MoeModel model = moe_model({"model.experts=8"});
  const auto pm = prophet_model(cost, model, gpu);
  SearchOptions o;
  o.alpha = 0.1;
  for (bool overlap : {false, true}) {
    INFO("overlap " << overlap);
    o.overlap = overlap;
    // Every source sends 4,096 slots to expert 3 and 4,096 to the others (585 each, one 586); source
    // 3 sends 8,776 to its own expert. Expert 3's home computes 37,448 slots, the others 4,680-4,681.
    // Replicating expert 3 everywhere lets each source compute its own: 8,776-8,777 everywhere.
    const auto hot = one_hot(8, 8, 3, [](int s) { return s == 3 ? 8776 : 4096; }, 4096);
    o.n = 0;
    const auto plan = greedy_search(pm, c, hot, o);
    CHECK(plan.stop == ProphetPlan::Stop::balanced);
    REQUIRE(plan.replicas.size() == 1);
    CHECK(plan.replicas[0].expert == 3);
    CHECK(plan.replicas[0].holders == std::vector<int>{0, 1, 2, 4, 5, 6, 7});
    CHECK(balanced(plan.H, o.alpha));
    CHECK(plan.time_after < plan.time_before);
    // BottomK with n = 2: the two devices (besides the home) with the fewest inputs for expert 3,
    // sources 0 and 1, get no copy; their tokens go to a copy on their node.
    const auto graded = one_hot(8, 8, 3, [](int s) { return s == 3 ? 8776 : 4000 + 100 * s; }, 4096);
    o.n = 2;
    const auto bottom = greedy_search(pm, c, graded, o);
    REQUIRE_FALSE(bottom.replicas.empty());
    CHECK(bottom.replicas[0].expert == 3);
    CHECK(bottom.replicas[0].holders == std::vector<int>{2, 4, 5, 6, 7});
    // Expert 3's inputs all come from its home: no other device can take them, the heaviest device
    // stays heaviest and is already in Used. Not balanced, nothing replicated.
    o.n = 0;
    const auto local = one_hot(8, 8, 3, [](int s) { return s == 3 ? 30000 : 0; }, 4096);
    const auto stuck = greedy_search(pm, c, local, o);
    CHECK(stuck.stop == ProphetPlan::Stop::relieved);
    CHECK(stuck.replicas.empty());
    CHECK_FALSE(balanced(stuck.H, o.alpha));
    CHECK(stuck.time_after == stuck.time_before);
  }
}

TEST_CASE("the greedy search's H, R and T' are those of its plan, recomputed from scratch") {
  // The search updates H and R incrementally; here they are rebuilt from the gating and the chosen
  // replicas with the iteration builder's own rule (replica_targets), and T' (Eq. 6 or 8) from them.
  const Cluster c(test::platform("dgx-a100", 4));  // 32 GPUs, 2 experts each
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  const MoeModel model = moe_model({"model.experts=64"});
  const auto pm = prophet_model(cost, model, gpu);
  const int D = 32, E = 64;
  Rng rng(7);
  RoutingMatrix gating(D, E);  // skewed: expert e's share ∝ (e % 13 + 1)^-1.5, noise per source
  for (int s = 0; s < D; ++s)
    for (int e = 0; e < E; ++e)
      gating.mutable_at(s, e) = std::int64_t(2000 * std::pow(e % 13 + 1, -1.5) * (0.2 + rng.uniform()) * (s % 5 == 0 ? 0 : 1) +
                                     (s == 3 && e == 9 ? 900 : 0));
  for (bool overlap : {false, true})
    for (int n : {0, 3, 9}) {
      INFO("overlap " << overlap << ", n " << n);
      SearchOptions o;
      o.overlap = overlap, o.n = n, o.alpha = 0.02;
      const auto plan = greedy_search(pm, c, gating, o);
      REQUIRE_FALSE(plan.replicas.empty());
      std::vector<double> H(D, 0.0), R(D, 0.0);
      std::vector<std::vector<int>> target(E);
      double trans = 0, agg = 0;
      for (const auto& rep : plan.replicas) {
        target[std::size_t(rep.expert)] = replica_targets(rep, c, expert_owner(rep.expert, E, D));
        trans += trans_time(pm, 1, D - 1 - double(rep.holders.size()));
        agg += agg_time(pm, 1, D - 1 - double(rep.holders.size()));
      }
      for (int s = 0; s < D; ++s)
        for (int e = 0; e < E; ++e) {
          const int t = target[std::size_t(e)].empty() ? expert_owner(e, E, D) : target[std::size_t(e)][std::size_t(s)];
          H[std::size_t(t)] += double(gating.at(s, e));
          if (s != t) R[std::size_t(t)] += double(gating.at(s, e));
        }
      CHECK(plan.H == H);
      CHECK(plan.R == R);
      const double a2a = a2a_time(pm, R), fec = fec_time(pm, H);
      CHECK(plan.time_after == Approx(overlap ? layer_time_overlapped(pm, a2a, fec, trans, agg) : layer_time(a2a, fec, trans, agg)).epsilon(1e-12));
      CHECK(plan.time_after < plan.time_before);
    }
}

TEST_CASE("Pro-Prophet replicates nothing under a uniform load") {
  const Cluster c(test::platform("dgx-a100", 2));
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  const MoeModel model = moe_model({"model.experts=32"});
  const auto pm = prophet_model(cost, model, gpu);
  RoutingMatrix uniform(16, 32);
  for (auto& x : uniform.mutable_counts()) x = 256;
  for (bool overlap : {false, true}) {
    SearchOptions o;
    o.overlap = overlap;
    const auto plan = greedy_search(pm, c, uniform, o);
    CHECK(plan.stop == ProphetPlan::Stop::balanced);
    CHECK(plan.searched == 0);
    CHECK(plan.replicas.empty());
  }
  std::vector<RoutingMatrix> routing{uniform};
  for (const char* name : {"pro-prophet", "pro-prophet-planner"}) {
    spec::PolicySpec ps;
    ps.set_name(name);
    auto policy = make_policy(ps);
    for (int it = 0; it < 3; ++it) {
      PolicyReport report;
      policy->build_iteration({c, model, gpu, ps, routing, report});
      CHECK(report.shadowed_experts == 0);
    }
  }
}

TEST_CASE("Pro-Prophet and top-k replication compute each routed token-slot exactly once") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=32"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  const long slots = 2L * 16 * model.tokens_per_gpu() * 2;
  for (const char* name : {"pro-prophet", "pro-prophet-planner", "replicate-top2", "replicate-top3"}) {
    INFO(name);
    spec::PolicySpec ps;
    ps.set_name(name);
    ps.mutable_pro_prophet()->set_n(3);
    auto policy = make_policy(ps);
    int shadowed = 0;
    for (int it = 0; it < 3; ++it) {  // the first iteration has no observed loads: plain EP
      std::vector<RoutingMatrix> routing;
      for (int l = 0; l < 2; ++l)
        routing.push_back(generate_routing(ex.spec.gating(), 16, 32, model.tokens_per_gpu(), 2, 11, it, l));
      PolicyReport report;
      const auto g = policy->build_iteration({cluster, model, gpu, ps, routing, report});
      CHECK(expert_slots(g) == std::make_pair(slots, slots));
      if (it == 0 && std::string(name).rfind("pro-prophet", 0) == 0) CHECK(report.shadowed_experts == 0);
      shadowed += report.shadowed_experts;
    }
    CHECK(shadowed > 0);
  }
}

TEST_CASE("the block-wise schedule hides Trans and Agg") {
  // 2 × 8 V100-PCIe GPUs (6.25 GB/s per node), 4 layers of 16 experts, a hot expert per layer
  // replicated on every GPU. The same plans with the replicas' transfers exposed (planner only)
  // and block-wise (Algorithm 2).
  const Cluster cluster(test::platform("v100-pcie", 2));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  auto run = [&](int d_model, int tokens, ReplicaSchedule mode) {
    const MoeModel model = moe_model({"model.layers=4", "model.experts=16", fmt::format("model.d_model={}", d_model),
                                      fmt::format("model.d_ffn={}", 2 * d_model),
                                      fmt::format("model.tokens_per_gpu={}", tokens)});
    const CostModel cost(cluster, gpu);
    const auto pm = prophet_model(cost, model, gpu);
    std::vector<LayerPlan> plans;
    for (int l = 0; l < 4; ++l) {
      LayerPlan p{one_hot(16, 16, (5 * l + 3) % 16, [&](int) { return tokens; }, tokens), {}};
      p.replicas.push_back(everywhere((5 * l + 3) % 16, 16, 16));
      plans.push_back(std::move(p));
    }
    spec::PolicySpec ps;
    PolicyReport report;
    std::vector<RoutingMatrix> routing;
    for (const auto& p : plans) routing.push_back(p.routing);
    IterationPlan plan(plans);
    plan.replicas.timing = mode;
    plan.replicas.trans_under_dense = int(std::floor(pm.fnec / trans_time(pm, 1, 0)));
    plan.replicas.agg_under_dense = int(std::floor(pm.bnec / agg_time(pm, 1, 0)));
    const auto g = build_moe_iteration({cluster, model, gpu, ps, routing, report}, plan);
    CHECK(expert_slots(g) == std::make_pair(4L * 16 * tokens * 2, 4L * 16 * tokens * 2));
    return sim.execute(g).makespan();
  };
  // Small experts: Trans is short, block-wise is no slower.
  const double small_exposed = run(512, 2048, ReplicaSchedule::exposed);
  const double small_block = run(512, 2048, ReplicaSchedule::block_wise);
  // Large experts (d_model 2048: 16.8M parameters, 34 MB per transfer, ~5 ms over 6.25 GB/s): the
  // expert compute of the previous block hides most of it.
  const double big_exposed = run(2048, 8192, ReplicaSchedule::exposed);
  const double big_block = run(2048, 8192, ReplicaSchedule::block_wise);
  const double big_order = run(2048, 8192, ReplicaSchedule::stream_order);
  std::cout << fmt::format("block-wise vs exposed: small {:.3f} / {:.3f} ms, large {:.3f} / {:.3f} ms (stream order {:.3f})\n",
                           small_block * 1e3, small_exposed * 1e3, big_block * 1e3, big_exposed * 1e3, big_order * 1e3);
  CHECK(small_block <= small_exposed * (1 + 1e-9));
  CHECK(big_block < 0.97 * big_exposed);
  CHECK(big_block <= big_order * (1 + 1e-9));
}

TEST_CASE("Pro-Prophet's plans are deterministic") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=16"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  auto labels = [&] {
    spec::PolicySpec ps;
    ps.set_name("pro-prophet");
    ps.mutable_pro_prophet()->set_history(2);
    auto policy = make_policy(ps);
    std::vector<std::string> out;
    for (int it = 0; it < 4; ++it) {
      std::vector<RoutingMatrix> routing;
      for (int l = 0; l < 2; ++l)
        routing.push_back(generate_routing(ex.spec.gating(), 16, 16, model.tokens_per_gpu(), 2, 7, it, l));
      PolicyReport report;
      const auto g = policy->build_iteration({cluster, model, gpu, ps, routing, report});
      for (auto& s : replica_labels(g)) out.push_back(fmt::format("{}:{}", it, s));
    }
    return out;
  };
  const auto a = labels();
  CHECK_FALSE(a.empty());
  CHECK(a == labels());
}

TEST_CASE("the greedy search at 1024 GPUs x 1024 experts") {
  const Cluster cluster(test::platform("dgx-a100", 128));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  const CostModel cost(cluster, gpu);
  const MoeModel model = moe_model({"model.experts=1024"});
  auto t0 = std::chrono::steady_clock::now();
  const auto pm = prophet_model(cost, model, gpu);
  const double profile = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Zipf(1.2) popularity over a seeded permutation, 8,192 slots per source, per-source noise.
  const int G = 1024, E = 1024;
  Rng rng(42);
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = E - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(std::uint64_t(i + 1))]);
  double z = 0;
  for (int r = 0; r < E; ++r) z += std::pow(r + 1, -1.2);
  RoutingMatrix R(G, E);
  for (int s = 0; s < G; ++s)
    for (int r = 0; r < E; ++r)
      R.mutable_at(s, perm[r]) = std::int64_t(8192 * std::pow(r + 1, -1.2) / z * (0.5 + rng.uniform()));
  SearchOptions o;
  o.overlap = true;
  t0 = std::chrono::steady_clock::now();
  const auto plan = greedy_search(pm, cluster, R, o);
  const double search = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("1024 GPUs x 1024 experts: profile {:.1f} ms (once), search {:.1f} ms per layer, "
                           "{} experts searched, {} replicated, modelled layer {:.3f} -> {:.3f} ms\n",
                           profile * 1e3, search * 1e3, plan.searched, plan.replicas.size(), plan.time_before * 1e3,
                           plan.time_after * 1e3);
  CHECK(plan.time_after < plan.time_before);
  CHECK(search < 1.0);
}

TEST_CASE("Eq. 1 estimates the simulated all-to-alls of skewed routings from below (Fig. 13)") {
  // Pro-Prophet Fig. 13 reports a mean estimation error under 5% for A2A. Fig. 10a's setting: 4
  // HPWNV nodes (16 RTX 3090 on PCIe, one 100 Gb/s NIC a node reached through host memory),
  // MoE-GPT-M, top-1, fp32, the `naive` generator. The "real" time is the SimGrid backend running
  // the dispatch all-to-all of each layer's routing under plain EP; the estimate is Eq. 1 with B̄
  // as prophet_model() profiles it (every GPU sending to one). Eq. 1 sees the busiest receiver
  // alone, while a node's four receivers share its NIC: the estimate is a lower bound, short
  // where the other three receive much too. Measured: 15% short on average (34% with the
  // experiments' own `pro-prophet` preset, half as skewed; 8% and 22% while the NIC moved 96 Gb/s
  // rather than the 79 Gb/s measured on GeForce hosts, docs/collectives.md). The paper's < 5% is
  // not reproduced: its all-to-alls were set more by one receiver than the simulated ones.
  const auto ex = load_experiment(std::string(MOESIM_SOURCE_DIR) + "/experiments/pro-prophet/fig10a-hpwnv16-top1.textproto",
                                  {"gating.generator.preset=naive"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  const int G = cluster.num_gpus();
  const CostModel cost(cluster, gpu);
  const auto pm = prophet_model(cost, model, gpu);
  // B̄ profiled on a uniform all-to-all instead: every GPU sends b to every other.
  ProphetModel uniform = pm;
  {
    const double b = 1e6;
    std::vector<double> all(std::size_t(G) * G, b);
    for (int i = 0; i < G; ++i) all[std::size_t(i) * G + i] = 0;
    uniform.a2a_bandwidth = (G - 1) * b / cost.alltoall_time(all);
  }
  SimBackend sim(cluster, gpu);
  auto gating = make_gating_source(ex.spec.gating(), model, G, ex.spec.seed());
  double error = 0, uniform_error = 0;
  int n = 0;
  for (int it = 0; it < 3; ++it)
    for (const auto& R : gating->next()) {
      std::vector<double> received(std::size_t(G), 0.0), bytes(std::size_t(G) * G, 0.0);
      for (int s = 0; s < G; ++s)
        for (int e = 0; e < G; ++e)
          if (s != e) {  // one expert per GPU: expert e lives on GPU e
            received[std::size_t(e)] += double(R.at(s, e));
            bytes[std::size_t(s) * G + e] += double(R.at(s, e)) * model.token_bytes();
          }
      Collective a2a{CollectiveType::all_to_all, std::vector<int>(static_cast<std::size_t>(G)), bytes, "linear"};
      std::iota(a2a.group.begin(), a2a.group.end(), 0);
      TaskGraph g(G);
      g.add_collective(Stream::comm, "a2a", std::move(a2a), {});
      const double real = sim.execute(g).makespan(), estimate = a2a_time(pm, received);
      INFO("layer " << n << ": Eq. 1 " << estimate << " s, simulated " << real << " s");
      CHECK(estimate < 1.02 * real);
      error += std::abs(estimate - real) / real;
      uniform_error += std::abs(a2a_time(uniform, received) - real) / real;
      ++n;
    }
  error /= n;
  uniform_error /= n;
  std::cout << fmt::format("Eq. 1 vs simulated skewed all-to-alls: mean error {:.1f}% over {} layers ({:.1f}% with B̄ from a "
                           "uniform all-to-all)\n",
                           100 * error, n, 100 * uniform_error);
  CHECK(n == 36);
  // Profiling B̄ on one receiver is what makes Eq. 1 usable under skew.
  CHECK(error < uniform_error / 3);
}
