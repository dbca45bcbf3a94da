// Today's MoE models: grouped-query attention, gated (SwiGLU) FFNs, fine-grained and shared experts,
// dense blocks before the MoE blocks, top-8; against the published parameter counts of the models
// whose configs experiments/models/ holds, and against hand-computed shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "collectives/collectives.hpp"
#include "gating.hpp"
#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "policy.hpp"
#include "runner.hpp"
#include "taskgraph.hpp"

using namespace moesim;

namespace {

MoeModel catalog_model(const std::string& name) {
  const auto ex = load_experiment(std::string(MOESIM_SOURCE_DIR) + "/experiments/models/" + name + ".textproto", {});
  return MoeModel(ex.spec.model());
}

// The FLOPs of GPU `rank`'s op of that label (its part of an op of every GPU's), or -1.
double flops_of(const TaskGraph& g, const std::string& label, int rank) {
  double flops = -1;
  for (const auto& op : g.ops())
    if (op.label == label)
      test::for_each_compute(op, [&](const Compute& c, int r) {
        if (r == rank) flops = c.flops();
      });
  return flops;
}

}  // namespace

TEST_CASE("the catalog's models have their published parameter counts") {
  // Mixtral-8x7B: 46.7B parameters, 12.9B activated (mistral.ai's announcement and model card).
  const MoeModel mixtral = catalog_model("mixtral-8x7b");
  CHECK(mixtral.total_params() == Approx(46.7e9).epsilon(0.01));
  CHECK(mixtral.activated_params() == Approx(12.9e9).epsilon(0.01));
  // Qwen3-235B-A22B: 235B in all, 22B activated (its name and model card).
  const MoeModel qwen = catalog_model("qwen3-235b-a22b");
  CHECK(qwen.total_params() == Approx(235e9).epsilon(0.01));
  CHECK(qwen.activated_params() == Approx(22e9).epsilon(0.02));
  // DeepSeek-V3 with multi-head attention in place of MLA: the routed and shared experts and the
  // dense blocks as published (58 × 257 experts of 3 · 7168 · 2048, 3 dense FFNs of 18,432), the
  // attention 128 heads of 128 (4 · 7168 · 16384 each block): 688B where the report has 671B.
  const MoeModel ds = catalog_model("deepseek-v3");
  const double expert = 3.0 * 7168 * 2048, attention = 4.0 * 7168 * 16384;
  CHECK(ds.expert_params() == expert);
  CHECK(ds.total_params() == Approx(58 * (attention + 7168 * 256 + 257 * expert) + 3 * (attention + 3.0 * 7168 * 18432) +
                                    2.0 * 129280 * 7168));
  CHECK(ds.total_params() == Approx(671e9).epsilon(0.03));
}

TEST_CASE("model FLOPs: six per activated GEMM parameter and token, plus the attention's scores and context") {
  // The textbook count (Megatron-LM's, Narayanan et al. 2021): each GEMM parameter a token passes
  // costs 2 FLOPs forward and 4 backward; the input embedding is a lookup, not a GEMM; the scores
  // and context add 4·s·h·dh per token and block forward. DeepSeek-V3's 61 blocks, 37B activated.
  const MoeModel ds = catalog_model("deepseek-v3");
  const double T = 4096, s = 4096, h = 128, dh = 128, v = 129280, d = 7168;
  const double gemm_params = ds.activated_params() - v * d;  // less the input embedding table
  CHECK(ds.iteration_flops_per_gpu() == Approx(T * (6 * gemm_params + 3 * 4 * s * h * dh * 61)).epsilon(1e-9));
  // A run reports it over the time and the GPU's peak: MFU.
  RunResult r;
  r.model_flops_per_gpu = 1e15;
  r.peak_flops = 1e15;
  r.iterations.push_back({});
  r.iterations.back().time = 2.0;
  CHECK(r.mfu() == Approx(0.5));
}

TEST_CASE("at their defaults the new fields leave the seeds' block as it was") {
  const MoeModel m(test::model_spec(2, 64, 256, 8, 2, 16, 32, 4));
  CHECK(m.expert_params() == 2.0 * 64 * 256);
  CHECK(m.dense_params_per_layer() == 4.0 * 64 * 64 + 64 * 8);
  CHECK(m.expert_ffn() == 256);
  const auto gemms = m.dense_forward_gemms();
  CHECK((gemms[0].m == 32 && gemms[0].n == 3 * 64 && gemms[0].k == 64));  // QKV
  CHECK((gemms[3].n == 64 && gemms[3].k == 64));                          // output projection
  CHECK(m.shared_expert_gemms().empty());
  CHECK(m.dense_block_gemms().empty());
  CHECK(m.total_params() == 2 * (4.0 * 64 * 64 + 64 * 8 + 8 * 2.0 * 64 * 256));
}

TEST_CASE("grouped-query attention, wide heads and gated fine-grained experts on a hand case") {
  auto s = test::model_spec(1, 64, 512, 8, 2, 16, 32, 8);
  s.set_kv_heads(2);
  s.set_head_dim(16);
  s.set_gated_ffn(true);
  s.set_expert_d_ffn(96);
  const MoeModel m(s);
  const auto gemms = m.dense_forward_gemms();
  CHECK(gemms[0].n == (8 + 2 * 2) * 16);             // Q 8 heads, K and V 2 heads each, of 16
  CHECK((gemms[3].n == 64 && gemms[3].k == 8 * 16));  // output projection from 128 back to 64
  CHECK(m.dense_params_per_layer() == 64.0 * 16 * (2 * 8 + 2 * 2) + 64 * 8);
  const auto e = m.expert_gemms(10);
  REQUIRE(e.size() == 2);
  CHECK((e[0].n == 2 * 96 && e[0].k == 64));  // gate and up fused: 2f outputs
  CHECK((e[1].n == 64 && e[1].k == 96));      // down
  CHECK(m.expert_params() == 3.0 * 64 * 96);
  s.set_kv_heads(3);
  CHECK_THROWS_WITH(MoeModel(s), Catch::Contains("kv_heads"));
}

TEST_CASE("shared experts run on every GPU's tokens beside the routed ones, overlapping the dispatch") {
  // 16 GPUs, 2 MoE layers of 32 experts, 2 shared experts of 512: each GPU's shared-expert op has
  // the FLOPs of all its tokens through both, forward (2 FLOPs a parameter) and backward (4).
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=32", "model.shared_experts=2",
                                              "model.expert_d_ffn=512", "iterations=1"});
  const MoeModel model(ex.spec.model());
  const double T = model.tokens_per_gpu(), P = model.expert_params();
  CHECK(model.dense_params_per_layer() == 4.0 * 1024 * 1024 + 1024.0 * 32 + 2 * P);
  const auto result = run_experiment(ex);
  const auto& run = result.runs.front();
  const TaskGraph& g = run.graphs.at(0);
  const Timing& t = run.timings.at(0);
  CHECK(flops_of(g, "L1.fwd.shared_experts", 5) == Approx(2 * 2 * T * P));
  CHECK(flops_of(g, "L1.bwd.shared_experts", 5) == Approx(2 * 4 * T * P));
  int shared = 0;
  for (const auto& op : g.ops()) {
    CHECK(known_op_name(op.label));
    if (op.label != "L0.fwd.shared_experts") continue;
    // On every GPU, the layer's dispatch runs while the shared experts compute.
    const auto& parts = std::get<Computes>(op.body);
    for (std::size_t i = 0; i < parts.parts(); ++i, ++shared) {
      const std::size_t k = parts.first_part + i;
      for (const auto& d : g.ops())
        if (d.label == "L0.fwd.a2a_dispatch") CHECK((t.start[d.id] < t.part_end[k] && t.part_start[k] < t.end[d.id]));
    }
  }
  CHECK(shared == 16);
}

TEST_CASE("dense blocks: one op per pass with every block's GEMMs, their parameters in the dense all-reduce") {
  const test::SmallSetup dense({"model.dense_layers=3", "model.d_ffn=2048"});
  const test::SmallSetup wide({"model.d_ffn=2048"});
  spec::PolicySpec ps;
  ps.set_name("ep");
  auto build = [&](const test::SmallSetup& t) {
    PolicyReport report;
    return t.build(ps, 3, report);
  };
  const TaskGraph g = build(dense);
  const MoeModel& m = dense.model;
  const double T = m.tokens_per_gpu(), d = m.spec().d_model(), f = m.spec().d_ffn();
  double attention = 0;
  for (const auto& gemm : m.dense_forward_gemms()) attention += 2.0 * double(gemm.m) * double(gemm.n) * double(gemm.k) * double(gemm.batch);
  CHECK(flops_of(g, "fwd.dense_blocks", 3) == Approx(3 * (attention + 2 * T * 2 * d * f)));
  CHECK(flops_of(g, "bwd.dense_blocks", 3) == Approx(2 * 3 * (attention + 2 * T * 2 * d * f)));
  CHECK(flops_of(build(wide), "fwd.dense_blocks", 3) < 0);  // none without dense blocks
  auto allreduce_bytes = [](const TaskGraph& graph) {
    for (const auto& op : graph.ops())
      if (op.label == "allreduce.dense") return std::get<Collective>(op.body).bytes.total();
    return -1.0;
  };
  // The dense blocks' attention (4d²) and FFN (2·d·f) parameters join the dense all-reduce.
  CHECK(allreduce_bytes(g) - allreduce_bytes(build(wide)) == Approx(3 * (4 * d * d + 2 * d * f) * m.dtype_bytes()));
  CHECK(m.total_params() == Approx(wide.model.total_params() + 3 * (4 * d * d + 2 * d * f)));
}

TEST_CASE("top-8 of 256 experts: the generator's rows sum to each source's tokens times 8") {
  auto ex = load_experiment(test::kBaseSpec, {"model.experts=256", "model.top_k=8", "model.layers=2", "cluster.nodes=4"});
  ex.spec.mutable_gating()->mutable_generator()->set_preset("aux");
  const MoeModel model(ex.spec.model());
  auto source = make_gating_source(ex.spec.gating(), model, 32, 1);
  for (int it = 0; it < 2; ++it)
    for (const auto& R : source->next()) {
      REQUIRE(R.experts == 256);
      for (int s = 0; s < 32; ++s) {
        std::int64_t row = 0;
        for (int e = 0; e < 256; ++e) row += R.at(s, e);
        CHECK(row == std::int64_t(model.tokens_per_gpu()) * 8);
      }
    }
}

TEST_CASE("token spreads: a token counts once in each block of experts it reaches, from the same draws") {
  // One token per source: each row is one token's experts, so a block's count is 1 where the row
  // has any of the block's experts and 0 elsewhere. Blocks of 8 (a GPU's experts) and 32 (a node's).
  std::vector<double> popularity(64);
  for (int e = 0; e < 64; ++e) popularity[std::size_t(e)] = 1.0 / (1 + e % 5);
  for (const GroupLimit limit : {GroupLimit{}, GroupLimit{2, 1}}) {
    std::vector<TokenSpread> spreads = {{8, 0, {}}, {32, 0, {}}};
    Rng a(11), b(11);
    const RoutingMatrix R = sample_routing(popularity, 300, 1, 8, a, limit, &spreads);
    CHECK(R.counts() == sample_routing(popularity, 300, 1, 8, b, limit).counts());  // the same draws
    for (const auto& t : spreads) {
      REQUIRE(t.blocks == 64 / t.block);
      for (int s = 0; s < 300; ++s)
        for (int blk = 0; blk < t.blocks; ++blk) {
          std::int64_t slots = 0;
          for (int e = blk * t.block; e < (blk + 1) * t.block; ++e) slots += R.at(s, e);
          CHECK(t.at(s, blk) == (slots > 0 ? 1 : 0));
        }
    }
    if (limit.on())  // node-limited to one node: every token reaches exactly one 32-expert block
      for (int s = 0; s < 300; ++s) CHECK(spreads[1].at(s, 0) + spreads[1].at(s, 1) == 1);
  }
  std::vector<TokenSpread> bad = {{7, 0, {}}};
  Rng c(1);
  CHECK_THROWS_AS(sample_routing(popularity, 2, 1, 8, c, {}, &bad), std::invalid_argument);
}

TEST_CASE("DeepEP in an iteration: each token once per GPU, and over the network once per node, all-gather: every token") {
  // 2 DGX-A100 nodes (16 GPUs, 2 experts each), top-8 within 1 of 2 groups (a group: a node's 16
  // experts): a token crosses the network at most once, so GPU s sends over it exactly its tokens
  // of the other node, and to each GPU each token once however many of its experts are there.
  const test::SmallSetup t({"model.top_k=8", "model.expert_groups=2", "model.group_limit=1", "policy.all_to_all=deepep"});
  const int G = 16, E = 32;
  const auto blocks = spread_blocks("deepep", E, G, t.cluster.gpus_per_node());
  REQUIRE(blocks == std::vector<int>{2, 16});
  std::vector<RoutingMatrix> routing;
  for (int l = 0; l < t.model.layers(); ++l)
    routing.push_back(generate_routing(t.ex.spec.gating(), G, E, t.model.tokens_per_gpu(), t.model.top_k(), 5, 0, l,
                                       t.model.group_limit(), blocks));
  auto dispatch_of = [&](const std::string& algorithm) {
    spec::PolicySpec ps = t.ex.spec.policy();
    ps.set_all_to_all(algorithm);
    PolicyReport report;
    const TaskGraph g = make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
    for (const auto& op : g.ops())
      if (op.label == "L0.fwd.a2a_dispatch") return std::get<Collective>(op.body);
    FAIL("no dispatch");
    return Collective{};
  };
  const Collective deepep = dispatch_of("deepep"), linear = dispatch_of("linear");
  const double slots = double(G) * t.model.tokens_per_gpu() * t.model.top_k();
  double between = 0;
  for (int s = 0; s < G; ++s)
    for (int q = 0; q < G; ++q) between += t.cluster.node_of(s) != t.cluster.node_of(q) ? linear.bytes.at(std::size_t(s), std::size_t(q), G) : 0;
  const double token = linear.total_bytes() / slots;  // bytes per token-slot, as linear sends them
  const TokenSpread& per_gpu = *routing[0].spread(2);
  const TokenSpread& per_node = *routing[0].spread(16);
  double tokens = 0;
  for (int s = 0; s < G; ++s)
    for (int q = 0; q < G; ++q) tokens += double(per_gpu.at(s, q));
  CHECK(deepep.total_bytes() == Approx(tokens * token));
  CHECK(deepep.total_bytes() < linear.total_bytes());  // 8 experts on 2 per GPU: tokens meet on GPUs
  std::map<int, double> network;  // by sender
  for (const auto& lane : lower(deepep, t.cluster))
    for (const auto& step : lane)
      for (const auto& tr : step.transfers)
        if (t.cluster.node_of(tr.src) != t.cluster.node_of(tr.dst)) {
          CHECK(t.cluster.local_of(tr.src) == t.cluster.local_of(tr.dst));  // one rail
          network[tr.src] += tr.bytes;
        }
  for (int s = 0; s < G; ++s) CHECK(network[s] == Approx(double(per_node.at(s, 1 - s / 8)) * token));
  double network_total = 0;
  for (const auto& [s, b] : network) network_total += b;
  CHECK(network_total < between);  // a token once per node, not once per expert
  // Megatron's all-gather dispatcher gathers every token of every GPU, whatever the routing.
  CHECK(dispatch_of("allgather").gathered == Approx(t.model.tokens_per_gpu() * token));
  // A generator or a trace counts token-slots only: the run says DeepEP then sends each on its own.
  auto ex = load_experiment(test::kBaseSpec, {"policy.all_to_all=deepep", "gating.generator.preset=naive"});
  CHECK(std::any_of(ex.notes.begin(), ex.notes.end(), [](const std::string& n) { return n.find("token-slot counts only") != std::string::npos; }));
  CHECK(load_experiment(test::kBaseSpec, {"policy.all_to_all=deepep"}).notes.empty());  // Zipf: counted per token
  // A policy that changes the counts (a capacity that drops) loses the spreads: token-slots again.
  RoutingMatrix changed = routing[0];
  changed.mutable_at(0, 0) += 0;
  CHECK(changed.spread(2) == nullptr);
}

TEST_CASE("group-limited routing: each token's top-k within at most group_limit groups of experts") {
  // One token per source, so that each row is one token's experts: 64 experts in 8 groups of 8,
  // top-8 within at most 2 groups. Without the limit the same draws spread over more groups.
  std::vector<double> popularity(64);
  for (int e = 0; e < 64; ++e) popularity[std::size_t(e)] = 1.0 / (1 + e % 13);
  auto widest = [&](const RoutingMatrix& R) {
    int most = 0;
    for (int s = 0; s < R.sources; ++s) {
      std::set<int> groups;
      std::int64_t slots = 0;
      for (int e = 0; e < 64; ++e)
        if (R.at(s, e) > 0) groups.insert(e / 8), slots += R.at(s, e);
      CHECK(slots == 8);
      most = std::max(most, int(groups.size()));
    }
    return most;
  };
  Rng a(7), b(7);
  CHECK(widest(sample_routing(popularity, 2000, 1, 8, a, {8, 2})) == 2);
  CHECK(widest(sample_routing(popularity, 2000, 1, 8, b)) > 2);
  // The generator draws token by token under the limit, the rows still summing to tokens × k.
  auto ex = load_experiment(test::kBaseSpec, {"model.experts=64", "model.top_k=8", "model.layers=1", "model.tokens_per_gpu=1024",
                                              "model.seq_len=1024", "model.expert_groups=8", "model.group_limit=2"});
  ex.spec.mutable_gating()->mutable_generator()->set_preset("naive");
  const MoeModel model(ex.spec.model());
  const auto R = make_gating_source(ex.spec.gating(), model, 64, 3)->next().front();
  for (int s = 0; s < 64; ++s) CHECK(R.row_sum(s) == 1024 * 8);
  // Refused: a limit that cannot hold a token's top-k, and a limit on a replayed trace.
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"model.top_k=8", "model.expert_groups=16", "model.group_limit=1"}),
                    Catch::Contains("group_limit"));
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"model.expert_groups=8", "model.group_limit=9"}), Catch::Contains("group_limit"));
}

TEST_CASE("a 256-expert top-8 trace: generated, replayed on 64 GPUs, every row tokens times 8 under the cap") {
  // The command line writes it (16 sources), the replay maps its sources onto 64 GPUs.
  const auto dir = test::temp_dir("top8");
  const std::string trace = dir + "/t.trace", flags = " --experts 256 --top-k 8 --layers 2 --sources 16 --tokens 1024 --iterations 3";
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " trace gen -q --preset aux --seed 2" + flags + " -o " + trace, out) == 0);
  auto ex = load_experiment(test::kBaseSpec, {"model.experts=256", "model.top_k=8", "model.layers=2", "model.tokens_per_gpu=1024",
                                              "model.seq_len=1024"});
  ex.spec.mutable_gating()->mutable_trace()->set_path(trace);
  const MoeModel model(ex.spec.model());
  auto source = make_gating_source(ex.spec.gating(), model, 64, 1);
  for (int it = 0; it < 3; ++it)
    for (const auto& R : source->next()) {
      REQUIRE((R.sources == 64 && R.experts == 256));
      for (int s = 0; s < 64; ++s) CHECK(R.row_sum(s) == 1024 * 8);
      CHECK(R.largest_count() <= 1024);
    }
}

namespace {
double max_over_mean(const RoutingMatrix& R) {
  double most = 0, sum = 0;
  for (int e = 0; e < R.experts; ++e) {
    most = std::max(most, double(R.expert_load(e)));
    sum += double(R.expert_load(e));
  }
  return most / (sum / R.experts);
}
}  // namespace

TEST_CASE("auxiliary-loss-free balancing flattens a skewed routing over the iterations, every row kept") {
  // Zipf(1.2) popularity, the same every iteration: the bias of an overloaded expert falls by γ a
  // step, so its share shrinks by exp(γ/τ) a step until the loads are about even. The first
  // iteration is the source's own routing (b = 0).
  auto ex = load_experiment(test::kBaseSpec, {"model.experts=16", "model.layers=1", "cluster.nodes=2"});
  ex.spec.mutable_gating()->mutable_zipf()->set_exponent(1.2);
  const MoeModel model(ex.spec.model());
  auto plain = make_gating_source(ex.spec.gating(), model, 16, 5);
  ex.spec.mutable_gating()->mutable_aux_free()->set_bias_update(0.001);
  ex.spec.mutable_gating()->mutable_aux_free()->set_score_scale(0.005);  // a step moves the odds by e^0.2
  auto balanced = make_gating_source(ex.spec.gating(), model, 16, 5);
  const std::int64_t slots = std::int64_t(model.tokens_per_gpu()) * model.top_k();
  std::vector<double> plain_skew, skew;
  for (int it = 0; it < 30; ++it) {
    const RoutingMatrix p = plain->next().front(), b = balanced->next().front();
    if (it == 0) CHECK(p.counts() == b.counts());
    for (int s = 0; s < 16; ++s) {
      CHECK(b.row_sum(s) == slots);
      for (int e = 0; e < 16; ++e) CHECK(b.at(s, e) <= model.tokens_per_gpu());  // a token picks an expert once
    }
    plain_skew.push_back(max_over_mean(p));
    skew.push_back(max_over_mean(b));
  }
  CHECK(plain_skew.back() > 3);            // the source stays skewed
  CHECK(skew[1] < plain_skew[1]);          // one step of bias already moves tokens off the hottest expert
  CHECK(skew.back() < 1.3);                // and thirty bring it near even
  CHECK(skew[10] < skew[2]);
  // Refused: a bias that is no number, and group-limited routing from a source of counts, whose token
  // spreads are drawn before any bias (the generator takes it into its logits: the next test).
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"gating.aux_free.bias_update=nan"}), Catch::Contains("bias_update"));
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"gating.aux_free.score_scale=0.01", "gating.zipf.exponent=1", "model.experts=64",
                                                      "model.top_k=8", "model.expert_groups=8", "model.group_limit=2"}),
                    Catch::Contains("gating.aux_free"));
}

TEST_CASE("auxiliary-loss-free balancing revives the naive preset's dead experts and flattens its routing") {
  // The naive preset kills about 15% of the experts (a gate that has stopped picking them: no token
  // ever); under a bias they are the coldest live expert less σ_pop, which the bias raises like any
  // other: a step moves a logit by γ/τ = 0.1, and 2.2 + the live spread takes under 120 steps.
  auto ex = load_experiment(test::kBaseSpec, {"model.experts=16", "model.layers=1", "cluster.nodes=2"});
  ex.spec.mutable_gating()->mutable_generator()->set_preset("naive");
  const MoeModel model(ex.spec.model());
  auto plain = make_gating_source(ex.spec.gating(), model, 16, 3);
  ex.spec.mutable_gating()->mutable_aux_free()->set_bias_update(0.001);
  auto balanced = make_gating_source(ex.spec.gating(), model, 16, 3);
  std::vector<int> dead;
  RoutingMatrix p = plain->next().front(), b = balanced->next().front();
  for (int e = 0; e < 16; ++e)
    if (p.expert_load(e) == 0) dead.push_back(e);
  REQUIRE_FALSE(dead.empty());
  for (int it = 1; it < 120; ++it) p = plain->next().front(), b = balanced->next().front();
  for (int e : dead) {
    CHECK(p.expert_load(e) == 0);  // without the bias, still never picked
    CHECK(double(b.expert_load(e)) > 0.5 * 16 * double(model.tokens_per_gpu() * model.top_k()) / 16);
  }
  CHECK(max_over_mean(p) > 3);
  CHECK(max_over_mean(b) < 1.3);
}

TEST_CASE("auxiliary-loss-free balancing enters the generator's logits: group-limited draws and their spreads follow it") {
  // DeepSeek-V3-like routing: 64 experts in 8 groups, top-8 within 2 groups, the naive preset's skew.
  const std::vector<std::string> sets = {"model.experts=64", "model.top_k=8", "model.layers=1", "model.tokens_per_gpu=1024",
                                         "model.seq_len=1024", "model.expert_groups=8", "model.group_limit=2"};
  auto ex = load_experiment(test::kBaseSpec, sets);
  ex.spec.mutable_gating()->mutable_generator()->set_preset("naive");
  const MoeModel model(ex.spec.model());
  auto plain = make_gating_source(ex.spec.gating(), model, 16, 2, {8});
  ex.spec.mutable_gating()->mutable_aux_free()->set_score_scale(0.005);
  REQUIRE_NOTHROW(validate_gating(ex.spec.gating(), model, 1, 2));
  auto balanced = make_gating_source(ex.spec.gating(), model, 16, 2, {8});
  double first = 0, last = 0, plain_last = 0;
  for (int it = 0; it < 25; ++it) {
    const RoutingMatrix p = plain->next().front(), b = balanced->next().front();
    if (it == 0) CHECK(p.counts() == b.counts());  // no bias yet: the same draws
    for (int s = 0; s < 16; ++s) CHECK(b.row_sum(s) == 1024 * 8);
    const TokenSpread* spread = b.spread(8);  // drawn with the bias: a token counts once per block of 8
    REQUIRE(spread);
    for (int s = 0; s < 16; ++s)
      for (int blk = 0; blk < 8; ++blk) {
        std::int64_t slots = 0;
        for (int e = 8 * blk; e < 8 * blk + 8; ++e) slots += b.at(s, e);
        CHECK(spread->at(s, blk) <= std::min<std::int64_t>(slots, 1024));
        CHECK(spread->at(s, blk) * 8 >= slots);
      }
    if (it == 0) first = max_over_mean(b);
    last = max_over_mean(b);
    plain_last = max_over_mean(p);
  }
  CHECK(last < 0.6 * first);
  CHECK(last < 0.6 * plain_last);
}
