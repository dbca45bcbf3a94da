// Tutel's adaptive pipelining: Algorithm 2's buckets on hand cases, and the online search
// converging to the best fixed strategy on a stationary workload.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <iostream>
#include <map>

#include "collectives/collectives.hpp"
#include "helpers.hpp"
#include "memory_model.hpp"
#include "gating.hpp"
#include "runner.hpp"
#include "tutel.hpp"

using namespace moesim;

namespace {

// One layer of the base model on 2 DGX-A100 nodes (16 GPUs) with `set` applied, its routing drawn
// once, and the forward FLOPs of its experts on every routed token-slot (EP's count).
struct Layer {
  Experiment ex;
  Cluster cluster;
  MoeModel model;  // refers to ex's model spec
  GpuModel gpu;
  std::vector<RoutingMatrix> routing;
  explicit Layer(std::vector<std::string> set)
      : ex(load_experiment(test::kBaseSpec, with_base(std::move(set)))),
        cluster(ex.cluster_spec),
        model(ex.spec.model()),
        gpu(ex.cluster_spec.gpu(), model.dtype()),
        routing(make_gating_source(ex.spec.gating(), model, 16, 1)->next()) {}
  double expert_flops() const {
    double f = 0;
    for (int e = 0; e < model.experts(); ++e)
      f += double(routing[0].expert_load(e)) * 2 * 2 * model.spec().d_model() * model.spec().d_ffn();
    return f;
  }

 private:
  static std::vector<std::string> with_base(std::vector<std::string> set) {
    set.insert(set.begin(), {"cluster.nodes=2", "model.layers=1"});
    return set;
  }
};

}  // namespace

TEST_CASE("Algorithm 2 tries each strategy once per bucket, then keeps the best") {
  const std::vector<Strategy> space = {{1, "linear"}, {2, "linear"}, {1, "2dh"}};
  StrategySearch s(space, 1.0);
  // f = 2.0: untried strategies first, in order; each measured.
  const double times[] = {3.0, 1.0, 2.0};
  for (int i = 0; i < 3; ++i) {
    const Strategy x = s.get(2.0);
    CHECK(x == space[std::size_t(i)]);
    s.record(2.0, x, times[i]);
  }
  CHECK(s.get(2.0) == space[1]);  // all tried for f: the fastest
  // f = 2.5 is in 2.0's bucket (L = 1): it reuses the bucket's best without trying anything.
  CHECK(s.get(2.5) == space[1]);
  CHECK(s.buckets() == 1);
  // f = 3.4 opens a new bucket: nothing tried there yet.
  CHECK(s.get(3.4) == space[0]);
  CHECK(s.buckets() == 2);
  // Times in a bucket are normalised by its lowest f: at f = 2.5, 2dh takes 1.1 s, i.e. 0.88 s at
  // f = 2.0, better than linear/2's 1.0 s.
  s.record(2.5, space[2], 1.1);
  CHECK(s.get(2.5) == space[2]);  // the bucket's best, f = 2.5 not having tried everything itself
  CHECK(s.get(2.0) == space[1]);  // f = 2.0 has: its own best
  s.record(2.5, space[0], 0.5), s.record(2.5, space[1], 9);
  CHECK(s.get(2.5) == space[0]);
}

TEST_CASE("adaptive pipelining converges to the best fixed strategy on a stationary workload") {
  // The demo's cluster (8 DGX-A100 nodes, 64 GPUs), 2 MoE layers, Zipf routing (same popularity
  // every iteration): 8 strategies, each run fixed for 2 iterations, and the search for 12.
  Experiment ex = load_experiment(test::kBaseSpec, {"model.layers=2", "iterations=12", "policy.name=tutel"});
  ex.variants.emplace_back("adaptive", ex.spec);
  for (int d : {1, 2, 4, 8})
    for (const char* a : {"linear", "2dh"}) {
      spec::ExperimentSpec fixed = ex.spec;
      fixed.set_iterations(2);
      fixed.mutable_policy()->mutable_tutel()->set_degree(std::uint32_t(d));
      fixed.mutable_policy()->mutable_tutel()->set_all_to_all(a);
      ex.variants.emplace_back(fmt::format("{}/{}", d, a), fixed);
    }
  const auto result = run_experiment(ex);
  std::string best;
  double best_time = 1e300;
  for (const auto& r : result.runs)
    if (r.name != "adaptive" && r.mean_time() < best_time) best = r.name, best_time = r.mean_time();
  const auto& adaptive = result.run("adaptive").iterations;
  double settled = 0;
  for (std::size_t i = 8; i < adaptive.size(); ++i) settled += adaptive[i].time / double(adaptive.size() - 8);
  std::cout << fmt::format("best fixed strategy {} ({:.3f} ms); adaptive after 8 trials {:.3f} ms\n", best,
                           best_time * 1e3, settled * 1e3);
  CHECK(settled == Approx(best_time).epsilon(0.01));
  double worst = 0;
  for (const auto& r : result.runs) worst = std::max(worst, r.mean_time());
  CHECK(worst > 1.05 * best_time);  // the choice matters here
}

TEST_CASE("adaptive parallelism: r in {0} and the divisors of W/E, memory, and the switching rule") {
  auto rs = [](const std::vector<ParallelismOption>& o) {
    std::vector<int> out;
    for (const auto& x : o) out.push_back(x.r);
    return out;
  };
  const double P = 64e6, D = 1e6, big = 1e12;
  CHECK(rs(parallelism_options(16, 2, P, D, big)) == std::vector<int>{0, 1, 2, 4, 8});
  CHECK(rs(parallelism_options(12, 2, P, D, big)) == std::vector<int>{0, 1, 2, 3, 6});
  CHECK(rs(parallelism_options(8, 16, P, D, big)) == std::vector<int>{0, 1});  // E ≥ W: plain EP or DP
  // Hand case, W = 8, E = 2 (s = 4): r = 1 all-gathers 3/4 of the expert and exchanges 2D; r = 4
  // gathers nothing and exchanges 8D; r = 0 gathers both experts' 7/8.
  const auto o = parallelism_options(8, 2, P, D, big);
  CHECK(o[0].allgather_bytes == Approx(2 * P * 7 / 8));
  CHECK(o[0].alltoall_bytes == 0);
  CHECK(o[1].allgather_bytes == Approx(P * 3 / 4));
  CHECK(o[1].alltoall_bytes == Approx(2 * D));
  CHECK(o.back().r == 4);
  CHECK(o.back().allgather_bytes == Approx(0));
  CHECK(o.back().alltoall_bytes == Approx(8 * D));
  // Every r keeps the same persistent slice (switching moves no parameter); memory differs by the
  // transient gathered expert and the repeated tokens. A budget that only r = 4 fits leaves r = 4.
  const double budget = o.back().memory_bytes;
  for (const auto& x : parallelism_options(8, 2, P, D, budget)) CHECK(x.fits == (x.memory_bytes <= budget));
  CHECK(choose_parallelism(parallelism_options(8, 2, P, D, budget)) == 4);
  CHECK(choose_parallelism(parallelism_options(8, 2, P, D, 0)) == -1);
  // Tutel Table 5a (W = 8, E = 2, M = 2048, V = 8192, 2,048 tokens per GPU, top-1, fp16): P2 (r = s)
  // at small f, P1 (r = 1) from f = 4 on. The model puts the crossover at f = 1 (a tie there, where
  // the paper has P2 19% ahead): its communication ratio P2 / P1 grows with f and passes 1 by f = 4.
  const double expert = 2.0 * 2048 * 8192 * 2;
  double previous = 0;
  for (double f : {1.0, 2.0, 4.0, 8.0, 16.0}) {
    const auto opts = parallelism_options(8, 2, expert, f * 2048 * 2048 * 2, big);
    const double ratio = opts.back().comm_bytes() / opts[1].comm_bytes();
    INFO("f = " << f << ": P2 / P1 communication " << ratio);
    CHECK(ratio > previous);
    if (f == 1) CHECK(ratio <= 1.0 + 1e-9);
    if (f >= 4) CHECK(ratio > 1.2);
    previous = ratio;
  }
}

TEST_CASE("sharded experts compute every token-slot's full expert once, for every r") {
  // 16 GPUs (2 DGX-A100 nodes), 4 experts (s = 4), skewed routing: r = 1, 2, 4 split the tokens
  // and the hidden dimension differently, but the forward expert FLOPs add up to the EP count, and
  // r = 1 moves a quarter of the tokens r = 4 does.
  const Layer t({"model.experts=4", "policy.name=tutel", "gating.zipf.exponent=1.0"});
  const auto& [ex, cluster, model, gpu, routing] = t;
  const double want = t.expert_flops();
  std::map<int, double> moved;
  for (int r : {1, 2, 4}) {
    spec::PolicySpec ps = ex.spec.policy();
    ps.mutable_tutel()->set_parallel_r(r);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    CHECK(report.parallel_r == r);
    double flops = 0;
    int gathers[2] = {0, 0}, scatters = 0;  // forward, backward
    for (const auto& op : g.ops()) {
      if (op.label == "L0.fwd.experts") flops += std::get<Compute>(op.body).flops();
      if (op.label == "L0.fwd.a2a_dispatch") moved[r] = std::get<Collective>(op.body).total_bytes();
      if (op.label.find("expert_allgather") != std::string::npos) ++gathers[op.label.find(".bwd.") != std::string::npos];
      scatters += op.label.find("bwd.expert_reduce_scatter") != std::string::npos;
    }
    INFO("r = " << r);
    CHECK(flops == Approx(want).epsilon(1e-3));  // token counts rounded per GPU
    // As released (zero_gather's backward is a reduce-scatter, the gathered weights kept): each of
    // the 16 / (s / r) subgroups gathers in the forward and reduce-scatters in the backward, and the
    // backward gathers nothing; r = s has nothing to gather or scatter.
    const int subgroups = r < 4 ? 16 / (4 / r) : 0;
    CHECK(gathers[0] == subgroups);
    CHECK(gathers[1] == 0);
    CHECK(scatters == subgroups);
    // The memory: each layer's gathered 1/r slice is held until its backward.
    if (r < 4) CHECK(report.memory.materialized_params == Approx(model.expert_params() / r * state_bytes(model.dtype()).param));
  }
  CHECK(moved[4] == Approx(4 * moved[1]));
  CHECK(moved[2] == Approx(2 * moved[1]));
}

TEST_CASE("Tutel's pipelined linear all-to-all sends a peer one message per expert slice, as released") {
  // 16 GPUs, 64 experts: ΔE = 4 slices of C/d·M to each peer in each part (custom_kernel.cpp's
  // nccl_all_to_all_scatter_async); unpipelined, one all_to_all_single: one message a peer.
  const Layer t({"model.experts=64", "policy.name=tutel"});
  const auto& [ex, cluster, model, gpu, routing] = t;
  for (const auto& [degree, algorithm, messages] : {std::tuple{2, "linear", 4}, std::tuple{1, "linear", 1}, std::tuple{4, "2dh", 1}}) {
    spec::PolicySpec ps = ex.spec.policy();
    ps.mutable_tutel()->set_degree(std::uint32_t(degree));
    ps.mutable_tutel()->set_all_to_all(algorithm);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    int all_to_alls = 0;
    for (const auto& op : g.ops())
      if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_to_all && c->total_bytes() > 1e3) {
        INFO(op.label << " at degree " << degree);
        CHECK(c->messages == messages);
        ++all_to_alls;
      }
    CHECK(all_to_alls == 2 * 2 * degree);  // dispatch and combine, forward and backward, a part each
  }
  // 2DH's lowering sends each phase's aggregated chunk as one message whatever ΔE (AllToAll2DAsync).
  Collective c{CollectiveType::all_to_all, {}, std::vector<double>(16 * 16, 1e6), "2dh"};
  for (int i = 0; i < 16; ++i) c.group.push_back(i);
  c.messages = 4;
  for (const auto& lane : lower(c, cluster))
    for (const auto& step : lane) CHECK(step.messages == 1);
}

TEST_CASE("tutel-released: the MOELayer's arguments with their defaults, no strategy search") {
  // microsoft/tutel's moe_layer.py: a2a_ffn_overlap_degree=1, use_2dh=False, parallel_type='adaptive:1'.
  const Layer t({});
  const auto& [ex, cluster, model, gpu, routing] = t;
  spec::PolicySpec ps;
  ps.set_name("tutel-released");
  auto policy = make_policy(ps);
  for (int it = 0; it < 3; ++it) {  // whatever it observes, the strategy stays the given one
    PolicyReport report;
    const auto g = policy->build_iteration({cluster, model, gpu, ps, routing, report});
    int parts = 0, all_to_alls = 0;
    for (const auto& op : g.ops()) {
      parts += op.label.find(".p1") != std::string::npos;
      if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_to_all && c->total_bytes() > 1e3) {
        ++all_to_alls;
        CHECK(c->algorithm == "linear");
      }
    }
    CHECK(parts == 0);
    CHECK(all_to_alls == 4);  // unpipelined: one dispatch and one combine, forward and backward
    CHECK(report.parallel_r == 1);
    Timing t;
    t.start.assign(g.size(), 0.0);
    t.end.assign(g.size(), 1e-3 * (it + 1));
    policy->observe(g, t);
  }
  ps.mutable_tutel()->add_degrees(2);
  CHECK_THROWS_WITH(make_policy(ps)->validate(cluster, model, ps), Catch::Contains("policy.tutel.degrees") && Catch::Contains("no strategy search"));
}

TEST_CASE("tutel-released pipelines sharded experts: d parts, the slices gathered once, the same FLOPs") {
  // 16 GPUs, 4 experts (s = 4), r = 2, degree 2: the release allows a degree with sharding
  // (moe_layer.py takes both); the parts split the tokens, not the work.
  const Layer t({"model.experts=4", "policy.name=tutel-released", "policy.tutel.parallel_r=2", "policy.tutel.degree=2",
                 "gating.zipf.exponent=1.0"});
  const auto& [ex, cluster, model, gpu, routing] = t;
  const double want = t.expert_flops();
  const spec::PolicySpec ps = ex.spec.policy();
  PolicyReport report;
  const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
  double flops = 0;
  std::map<std::string, int> count;
  for (const auto& op : g.ops()) {
    if (op.label.rfind("L0.fwd.experts.p", 0) == 0) flops += std::get<Compute>(op.body).flops();
    for (const char* name : {"L0.fwd.a2a_dispatch.p", "L0.fwd.a2a_combine.p", "L0.fwd.expert_allgather", "L0.bwd.expert_allgather",
                             "L0.bwd.expert_reduce_scatter"})
      count[name] += op.label.rfind(name, 0) == 0;
  }
  CHECK(flops == Approx(want).epsilon(2e-3));  // token counts rounded per GPU and part
  CHECK(count["L0.fwd.a2a_dispatch.p"] == 2);
  CHECK(count["L0.fwd.a2a_combine.p"] == 2);
  CHECK(count["L0.fwd.expert_allgather"] == 8);  // 16 / (s / r) subgroups, once each
  CHECK(count["L0.bwd.expert_allgather"] == 0);
  CHECK(count["L0.bwd.expert_reduce_scatter"] == 8);
}

TEST_CASE("a tutel spec asking for two layer schedules that do not compose is refused, naming the field") {
  // A plan names one schedule: data parallelism (r = 0) has no all-to-all to pipeline, and the
  // paper's policy does not pipeline sharded experts, so a static degree would be ignored.
  for (const auto& [sets, refused] : std::vector<std::pair<std::vector<std::string>, bool>>{
           {{"policy.name=tutel", "policy.tutel.degree=2", "policy.tutel.parallel_r=0"}, true},
           {{"model.experts=4", "policy.name=tutel", "policy.tutel.degree=2"}, true},
           {{"model.experts=4", "policy.name=tutel-released", "policy.tutel.degree=2", "policy.tutel.parallel_r=2"}, false},
           {{"model.experts=4", "policy.name=tutel", "policy.tutel.degree=1"}, false}}) {
    // Loading the spec validates it (exit 2 from the command line, before any work).
    auto check = [&] {
      const Layer t(sets);
      const spec::PolicySpec ps = t.ex.spec.policy();
      make_policy(ps)->validate(t.cluster, t.model, ps);
    };
    if (refused)
      CHECK_THROWS_WITH(check(), Catch::Contains("policy.tutel.degree"));
    else
      CHECK_NOTHROW(check());
  }
}

TEST_CASE("Fairseq's dense encode and decode cost its one-hot einsums as released, two GEMMs in the backward decode") {
  // fairseq/modules/moe (top2gate.py, moe_layer.py): the combine weights built over s × E × C, the
  // dispatch einsum "sec,sm->ecm" and the combine einsum "sec,ecm->sm", each a GEMM of
  // (E·C) × M × s; the backward decode also computes the combine weights' gradient.
  const Layer t({"gate.capacity_factor=1", "gate.pad_to_capacity=true"});
  const auto& [ex, cluster, model, gpu, routing] = t;
  spec::PolicySpec ps;
  ps.set_name("tutel");
  auto& tutel = *ps.mutable_tutel();
  tutel.set_parallel_r(1);
  tutel.set_flexible_alltoall(false);
  tutel.add_degrees(1);
  tutel.add_algorithms("linear");
  const double s = model.tokens_per_gpu(), E = model.experts(), M = model.spec().d_model(), b = model.dtype_bytes();
  double C = 0;
  for (int e = 0; e < model.experts(); ++e) C = std::max(C, double(routing[0].at(0, e)));
  const double gemm = 2 * E * C * M * s;  // one einsum's FLOPs
  auto gpu0 = [](const TaskGraph& g, const std::string& label) {
    Compute c;
    for (const auto& op : g.ops())
      if (op.label == label) test::for_each_compute(op, [&](const Compute& w, int rank) { if (rank == 0) c = w; });
    return c;
  };
  for (const bool dense : {true, false}) {
    INFO((dense ? "Fairseq's dense path" : "Tutel's sparse kernels"));
    tutel.set_dense_encode(dense);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    const Compute fe = gpu0(g, "L0.fwd.encode"), fd = gpu0(g, "L0.fwd.decode"), bd = gpu0(g, "L0.bwd.decode"), be = gpu0(g, "L0.bwd.encode");
    if (!dense) {  // each routed token read and written, no GEMM
      for (const Compute& c : {fe, fd, bd, be}) {
        CHECK(c.flops() == 0);
        CHECK(c.memory_bytes == Approx(2 * s * model.top_k() * model.token_bytes()));
      }
      continue;
    }
    CHECK(fe.flops() == Approx(gemm));
    CHECK(fd.flops() == Approx(gemm));
    CHECK(bd.flops() == Approx(2 * gemm));  // the expert outputs' gradient and the combine weights'
    CHECK(be.flops() == Approx(gemm));      // the input's gradient only: the bool mask has none
    // Two bmm written, added, .bool(), cast back (7b + 2 an element of s·E·C), the two one-hot s × C
    // int64 locations zeroed and cast; backward, the two bmm read the combine weights' gradient.
    CHECK(fe.memory_bytes == Approx(s * E * C * (7 * b + 2) + 2 * s * C * (16 + b)));
    CHECK(fd.memory_bytes == 0);
    CHECK(be.memory_bytes == Approx(s * E * C * 2 * b));
  }
}

TEST_CASE("without Flexible All-to-All each expert's tokens are copied out of the all-to-all's layout and back, one GEMM an expert") {
  // Tutel v0.1's FusedExpertsNetwork and Fairseq's MOELayer: (W, dE, dC, M) permuted and reshaped
  // (a copy) into (dE, W*dC, M), one GEMM per expert, the output copied back; the same FLOPs.
  const Layer t({});
  const auto& [ex, cluster, model, gpu, routing] = t;
  REQUIRE(model.experts() > cluster.num_gpus());  // several experts a GPU: the layouts differ
  spec::PolicySpec ps;
  ps.set_name("tutel");
  auto& tutel = *ps.mutable_tutel();
  tutel.set_parallel_r(1);
  tutel.add_degrees(1);
  tutel.add_algorithms("linear");
  auto experts_op = [&](bool flexible, const std::string& label) {
    tutel.set_flexible_alltoall(flexible);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    Compute c;
    for (const auto& op : g.ops())
      if (op.label == label) test::for_each_compute(op, [&](const Compute& w, int rank) { if (rank == 0) c = w; });
    return c;
  };
  for (const char* label : {"L0.fwd.experts", "L0.bwd.experts"}) {
    INFO(label);
    const Compute flexible = experts_op(true, label), copied = experts_op(false, label);
    REQUIRE(copied.tokens > 0);
    CHECK(copied.tokens == flexible.tokens);
    CHECK(copied.flops() == Approx(flexible.flops()));
    CHECK(copied.memory_bytes - flexible.memory_bytes == Approx(4.0 * double(copied.tokens) * model.token_bytes()));
  }
}
