// The memory model (policies/memory_model.hpp) against hand-computed sizes: the Hecate paper's
// expert size, Adam's states in mixed precision, Korthikanti et al.'s activations, and the state
// each sharding keeps per GPU.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "helpers.hpp"
#include "memory_model.hpp"
#include "policy.hpp"
#include "routing.hpp"

using namespace moesim;

namespace {

spec::ModelSpec gpt_moe_s() {  // docs/spec/hecate.md §11: d_model 768, d_ffn 1536, 64 experts, top-2
  return test::model_spec(12, 768, 1536, 64, 2, 1024, 4096, 12);
}

}  // namespace

TEST_CASE("memory model: a GPT-MoE-S expert is 4.72 MB in fp16 and its Adam state six times that") {
  const MoeModel model(gpt_moe_s());
  CHECK(model.expert_params() == 2.0 * 768 * 1536);  // 2,359,296
  const auto fp16 = state_bytes(spec::FP16);
  CHECK(model.expert_params() * fp16.param == Approx(4.72e6).epsilon(0.001));  // "4.72 MB fp16"
  CHECK(fp16.grad == 2);
  CHECK(fp16.optimizer == 12);  // fp32 master copy, m, v: "optimizer states >= 6x the parameters"
  CHECK(fp16.optimizer / fp16.param == 6);
  const auto fp32 = state_bytes(spec::FP32);
  CHECK(fp32.param == 4);
  CHECK(fp32.optimizer == 8);  // m and v only
}

TEST_CASE("memory model: activations per layer are Korthikanti et al.'s 34h + 5as per token plus the MoE buffers") {
  const MoeModel model(gpt_moe_s());
  const double T = 4096, h = 768, a = 12, s = 1024, f = 1536, k = 2;
  // A dense-like check: f = 2h here, so the FFN term is 3h + 4f = 11h per slot (19h when f = 4h).
  const double expected = T * (11 * h + 5 * a * s) + T * 4 * h + T * k * (3 * h + 4 * f) + T * 2 * k * h;
  CHECK(layer_activation_bytes(model, T, T * k) == Approx(expected));
  // The FFN part follows the slots a GPU computes: twice the slots, the slot term twice.
  CHECK(layer_activation_bytes(model, T, 2 * T * k) - layer_activation_bytes(model, T, T * k) ==
        Approx(T * k * (3 * h + 4 * f)));
  auto fp32 = gpt_moe_s();
  fp32.set_dtype(spec::FP32);
  CHECK(layer_activation_bytes(MoeModel(fp32), T, T * k) == Approx(2 * expected));
  // A layer benchmark (model.moe_layer_only) keeps the MoE FFN's alone: no attention, no norms.
  auto alone = gpt_moe_s();
  alone.set_moe_layer_only(true);
  CHECK(layer_activation_bytes(MoeModel(alone), T, T * k) == Approx(T * k * (3 * h + 4 * f) + T * 2 * k * h));
}

TEST_CASE("memory model: the output layer keeps Korthikanti et al.'s 4sbh(1 + v/h), the logits in fp32") {
  auto spec = gpt_moe_s();
  const double T = spec.tokens_per_gpu(), h = 768, v = 50304;
  CHECK(outside_layers_activation_bytes(MoeModel(spec)) == 0);  // no dense blocks, no vocabulary
  spec.set_vocab(50304);
  CHECK(outside_layers_activation_bytes(MoeModel(spec)) == Approx(4 * T * h * (1 + v / h)));
  // fp32 doubles the norm's and the projection's inputs; the logits are fp32 either way.
  spec.set_dtype(spec::FP32);
  CHECK(outside_layers_activation_bytes(MoeModel(spec)) == Approx(8 * T * h + 4 * T * v));
}

TEST_CASE("FlashAttention: no s x s scores in memory or traffic, their log-sum-exp kept, Q.K recomputed in the backward") {
  auto flash = gpt_moe_s();
  flash.set_flash_attention(true);
  const MoeModel with(flash), without(gpt_moe_s());
  const double T = 4096, h = 768, a = 12, s = 1024, b = 2;
  // Activations: 5as per token (scores, softmax, dropout) become 2a (an fp32 log-sum-exp a head).
  CHECK(layer_activation_bytes(without, T, 2 * T) - layer_activation_bytes(with, T, 2 * T) == Approx(T * (5 * a * s - 2 * a)));
  // The forward's traffic: the scores' h·(t/s)·s²·(4b + 1) bytes go, the t·d·(10b + 2) stay.
  CHECK(with.dense_forward_memory_bytes() == Approx(T * h * (10 * b + 2)));
  CHECK(without.dense_forward_memory_bytes() - with.dense_forward_memory_bytes() == Approx(a * (T / s) * s * s * (4 * b + 1)));
  // The backward attention op: the forward's GEMMs twice over, plus the scores Q·Kᵀ once more.
  REQUIRE(with.attention_recompute_gemms().size() == 1u);
  CHECK(without.attention_recompute_gemms().empty());
  auto backward_flops = [](const MoeModel& model) {
    const Cluster cluster(test::platform("dgx-a100", 1));
    const GpuModel gpu(cluster.spec().gpu(), model.dtype());
    std::vector<RoutingMatrix> routing;
    for (int l = 0; l < model.layers(); ++l) routing.push_back(generate_routing({}, 8, model.experts(), model.tokens_per_gpu(), model.top_k(), 1, 0, l));
    spec::PolicySpec ps;
    ps.set_name("ep");
    PolicyReport report;
    double flops = 0;
    const TaskGraph graph = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    for (const auto& op : graph.ops())
      if (op.label == "L0.bwd.attention") test::for_each_compute(op, [&](const Compute& c, int rank) { flops += rank == 0 ? c.flops() : 0; });
    return flops;
  };
  const double scores = 2 * s * s * (h / a) * (T / s) * a;  // 2·m·n·k per sequence and head
  CHECK(backward_flops(with) - backward_flops(without) == Approx(scores));
}

TEST_CASE("memory model: EP keeps its experts' state, ZeRO-3 a 1/G shard of every tensor plus one gathered layer, shadowing its copies") {
  const test::SmallSetup t;
  const auto& model = t.model;
  const auto routing = t.routing(11);
  auto memory = [&](const char* name) {
    spec::PolicySpec ps;
    ps.set_name(name);
    PolicyReport report;
    make_policy(ps)->build_iteration({t.cluster, model, t.gpu, ps, routing, report});
    return report.memory;
  };
  const auto b = state_bytes(model.dtype());
  const double P = model.expert_params(), L = 2, E = 32, G = 16;
  const MemoryUse dense = dense_memory(model);
  CHECK(dense.params == Approx(L * model.dense_params_per_layer() * 2));

  const MemoryUse ep = memory("ep");  // E/G = 2 experts per layer
  CHECK(ep.params == Approx(dense.params + L * 2 * P * b.param));
  CHECK(ep.optimizer == Approx(dense.optimizer + L * 2 * P * b.optimizer));
  CHECK(ep.materialized == 0);
  CHECK(ep.activations > 0);

  // ZeRO shards the layers' dense tensors with their experts (DeepSpeed partitions every tensor).
  const double D = model.dense_params_per_layer();  // this model has nothing outside its layers
  const MemoryUse z3 = memory("zero3");
  CHECK(z3.params == Approx(L * (D + E * P) * b.param / G));
  CHECK(z3.grads == Approx(L * (D + E * P) * b.grad / G));
  CHECK(z3.optimizer == Approx(L * (D + E * P) * b.optimizer / G));
  CHECK(z3.materialized == Approx((D + E * P) * (b.param + b.grad)));  // one layer's, gathered
  CHECK(z3.activations <= ep.activations);  // every GPU computes its own tokens: no hot GPU
  const MemoryUse z2 = memory("zero2");  // ZeRO-2 keeps the parameters whole, shards the rest
  CHECK(z2.params == Approx(L * (D + E * P) * b.param));
  CHECK(z2.optimizer == Approx(L * (D + E * P) * b.optimizer / G));

  const MemoryUse shadow = memory("fastermoe-shadow");  // Zipf routing: some experts shadowed
  REQUIRE(shadow.materialized > 0);
  const double copies = shadow.materialized / (P * (b.param + b.grad));
  CHECK(copies == Approx(std::round(copies)));  // whole experts' parameters and gradients
  CHECK(shadow.params == ep.params);            // the owners keep their experts
}

TEST_CASE("memory model: FlexMoE holds its reserved slots from the first iteration, before any copy is made") {
  const test::SmallSetup t;
  const auto routing = t.routing(11);
  const auto b = state_bytes(t.model.dtype());
  const double P = t.model.expert_params(), L = 2;
  for (int slots : {1, 3}) {
    spec::PolicySpec ps;
    ps.set_name("flexmoe");
    ps.mutable_flexmoe()->set_slots(std::uint32_t(slots));
    PolicyReport report;
    make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});  // iteration 0: no copy yet
    // Each layer's slots hold a whole expert's parameters, gradients and Adam state (copies keep them).
    CHECK(report.memory.materialized == Approx(L * slots * P * (b.param + b.grad + b.optimizer)));
  }
}

TEST_CASE("a vocabulary adds its output op and its parameters to the dense all-reduce and the memory") {
  // The same iteration with and without GPT-2's vocabulary: an "output" op of every GPU's three GEMMs
  // (forward and the two of its backward), and V·d more parameters all-reduced and held.
  struct Built {
    TaskGraph graph;
    PolicyReport report;
    MoeModel model;
  };
  auto build = [](int vocab) {
    const test::SmallSetup t({fmt::format("model.vocab={}", vocab)});
    PolicyReport report;
    auto graph = t.build(test::policy("ep"), 3, report);
    return Built{std::move(graph), report, t.model};
  };
  const Built b0 = build(0), b1 = build(50257);
  const TaskGraph &without = b0.graph, &with = b1.graph;
  const PolicyReport &r0 = b0.report, &r1 = b1.report;
  const MoeModel& m1 = b1.model;
  auto output_flops = [](const TaskGraph& g, int& ops) {
    double flops = 0;
    for (const auto& op : g.ops())
      if (op.label == "output")
        test::for_each_compute(op, [&](const Compute& c, int) {
          ++ops;
          for (const auto& gemm : c.gemms) flops += gemm.flops();
        });
    return flops;
  };
  auto allreduce_bytes = [](const TaskGraph& g) {
    for (const auto& op : g.ops())
      if (const auto* c = std::get_if<Collective>(&op.body); c && op.label == "allreduce.dense") return c->bytes[0];
    return -1.0;
  };
  int ops0 = 0, ops1 = 0;
  CHECK(output_flops(without, ops0) == 0);
  CHECK(ops0 == 0);
  const double T = m1.tokens_per_gpu(), d = m1.spec().d_model(), V = 50257, G = 16;
  CHECK(output_flops(with, ops1) == Approx(G * 3 * 2 * T * V * d));
  CHECK(ops1 == G);
  CHECK(allreduce_bytes(with) - allreduce_bytes(without) == Approx(V * d * m1.dtype_bytes()));
  const auto b = state_bytes(m1.dtype());
  CHECK(r1.memory.params - r0.memory.params == Approx(V * d * b.param));
  CHECK(r1.memory.optimizer - r0.memory.optimizer == Approx(V * d * b.optimizer));
}

TEST_CASE("memory model: every GPU's memory, the most its peak, more where it computes more tokens") {
  // EP under Zipf routing: each GPU owns the same experts, so its memory differs from another's by
  // the activations of the token-slots it computes. Inside two EP groups, the groups' GPUs in order.
  const test::SmallSetup t;
  PolicyReport report;
  t.build(test::policy("ep"), 3, report);
  REQUIRE(report.gpu_memory.size() == 16u);
  REQUIRE(report.gpu_load.size() == 16u);
  CHECK(*std::max_element(report.gpu_memory.begin(), report.gpu_memory.end()) == report.memory.total());
  for (std::size_t a = 0; a < 16; ++a)
    for (std::size_t b = 0; b < 16; ++b)
      if (report.gpu_load[a] < report.gpu_load[b]) CHECK(report.gpu_memory[a] < report.gpu_memory[b]);
  CHECK(*std::min_element(report.gpu_memory.begin(), report.gpu_memory.end()) < report.memory.total());  // skewed: not all alike
}

TEST_CASE("memory model: a figure without activations peaks at the GPU with the most model states") {
  // Hecate's copies go where its algorithm puts them; EP's hottest GPU holds the most activations.
  // The model-state peak (Hecate Fig. 13's) is chosen by the states alone: here a GPU with the
  // same copies and fewer activations than the GPU that needs the most in all.
  const test::SmallSetup t;
  spec::PolicySpec ps;
  ps.set_name("hecate");
  ps.mutable_hecate()->set_overlap_degree(4);
  ps.mutable_hecate()->set_memory_slots(4);
  auto policy = make_policy(ps);
  PolicyReport report;
  for (std::uint64_t seed : {3, 4, 5}) {  // the first iteration observes; the later ones materialize
    report = {};
    policy->build_iteration({t.cluster, t.model, t.gpu, ps, t.routing(seed), report});
  }
  const MemoryUse &peak = report.memory, &states = report.state_memory;
  REQUIRE(states.materialized > 0);
  CHECK(states.states() >= peak.states());
  CHECK(states.total() <= peak.total());
  CHECK(states.activations < peak.activations);  // another GPU than the one with the most in all
  CHECK(*std::max_element(report.gpu_memory.begin(), report.gpu_memory.end()) == peak.total());
}
