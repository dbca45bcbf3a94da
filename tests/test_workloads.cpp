// The model's shapes and parameter counts, and the seeded routing generators.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "helpers.hpp"
#include "errors.hpp"
#include "model.hpp"
#include "routing.hpp"

using namespace moesim;

namespace {
spec::ModelSpec small_model() {
  auto m = test::model_spec(2, 512, 2048, 16, 2, 256, 1024, 8);
  m.set_name("t");
  return m;
}
spec::GatingSpec zipf(double s) {
  spec::GatingSpec g;
  g.mutable_zipf()->set_exponent(s);
  return g;
}
}  // namespace

TEST_CASE("model shapes and parameter counts follow the transformer formulas") {
  const MoeModel m(small_model());
  const double T = 1024, d = 512, s = 256, E = 16, f = 2048;
  double dense = 0;
  for (const auto& g : m.dense_forward_gemms()) dense += g.flops();
  // QKV 2·T·3d·d + output 2·T·d·d + scores and context 2 · 2·T·s·d.
  CHECK(dense == Approx(2 * T * 4 * d * d + 2 * 2 * T * s * d));
  CHECK(m.gate_gemm().flops() == Approx(2 * T * E * d));
  double expert = 0;
  for (const auto& g : m.expert_gemms(100)) expert += g.flops();
  CHECK(expert == Approx(2 * 2 * 100 * d * f));
  CHECK(m.expert_params() == 2 * d * f);
  CHECK(m.dense_params_per_layer() == 4 * d * d + d * E);
  CHECK(m.token_bytes() == d * 2);
}

TEST_CASE("the language-model ends: an output GEMM over the vocabulary, one or two tables of parameters") {
  auto spec = small_model();
  CHECK(MoeModel(spec).output_forward_gemms().empty());  // vocab 0: the blocks alone
  CHECK(MoeModel(spec).embedding_params() == 0);
  CHECK(MoeModel(spec).output_memory_bytes() == 0);
  spec.set_vocab(50257);  // GPT-2's vocabulary
  const MoeModel tied(spec);
  const double T = 1024, d = 512, V = 50257;
  REQUIRE(tied.output_forward_gemms().size() == 1);
  CHECK(tied.output_forward_gemms()[0].flops() == Approx(2 * T * V * d));
  CHECK(tied.embedding_params() == V * d);
  // The lookup and its gradient (t·d read and written each, fp16), the loss over fp32 logits.
  CHECK(tied.output_memory_bytes() == 4 * T * d * 2 + 8 * T * V);
  spec.set_untied_output(true);
  CHECK(MoeModel(spec).embedding_params() == 2 * V * d);
}

TEST_CASE("the attention's memory-bound bytes: scores softmax and dropout, norms, residuals") {
  // Hecate's GPT-MoE-S (docs/spec/hecate.md §10.2): d 768, 2 sequences of 2048 tokens, 12 heads, fp16.
  const MoeModel m(test::model_spec(12, 768, 1536, 64, 2, 2048, 4096, 12));
  // h·(t/s)·s²·(4b+1) = 12·2·2048²·9 and t·d·(10b+2) = 4096·768·22.
  CHECK(m.dense_forward_memory_bytes() == 905969664.0 + 69206016.0);
  // The scores dominate: quadratic in the sequence length.
  const MoeModel shorter(test::model_spec(12, 768, 1536, 64, 2, 512, 4096, 12));
  CHECK(shorter.dense_forward_memory_bytes() == 12.0 * 8 * 512 * 512 * 9 + 69206016.0);
}

TEST_CASE("model validation names the field") {
  auto m = small_model();
  m.set_top_k(17);
  try {
    MoeModel x(m);
    FAIL("top_k > experts accepted");
  } catch (const FieldError& e) {
    CHECK(e.field() == "top_k");
  }
  m = small_model();
  m.set_tokens_per_gpu(1000);
  CHECK_THROWS_AS(MoeModel(m), FieldError);
}

TEST_CASE("routing rows sum to tokens times k and a token never picks an expert twice") {
  const auto r = generate_routing(zipf(1.2), 8, 16, 1000, 2, 7, 0, 0);
  for (int s = 0; s < 8; ++s) {
    CHECK(r.row_sum(s) == 2000);
    for (int e = 0; e < 16; ++e) CHECK(r.at(s, e) <= 1000);
  }
  // Every expert's load at once: each column's sum, and together every token-slot.
  const auto loads = r.expert_loads();
  REQUIRE(loads.size() == 16);
  for (int e = 0; e < 16; ++e) {
    std::int64_t column = 0;
    for (int s = 0; s < 8; ++s) column += r.at(s, e);
    CHECK(loads[std::size_t(e)] == column);
    CHECK(r.expert_load(e) == column);
  }
  CHECK(std::accumulate(loads.begin(), loads.end(), std::int64_t(0)) == 8 * 2000);
}

TEST_CASE("routing is a function of seed, iteration and layer") {
  spec::GatingSpec uniform;
  uniform.mutable_uniform();
  const auto a = generate_routing(uniform, 4, 8, 500, 2, 42, 3, 1);
  CHECK(generate_routing(uniform, 4, 8, 500, 2, 42, 3, 1).counts() == a.counts());
  CHECK(generate_routing(uniform, 4, 8, 500, 2, 43, 3, 1).counts() != a.counts());
  CHECK(generate_routing(uniform, 4, 8, 500, 2, 42, 4, 1).counts() != a.counts());
  CHECK(generate_routing(uniform, 4, 8, 500, 2, 42, 3, 2).counts() != a.counts());
}

TEST_CASE("copies of a routing share its counts until one is changed, which changes only that copy") {
  RoutingMatrix a(2, 3);
  a.mutable_at(1, 2) = 7;
  const RoutingMatrix b = a;  // shares
  const auto snapshot = a.shared_counts();
  CHECK(b.shared_counts() == snapshot);
  a.mutable_at(1, 2) = 9;  // copies first
  CHECK(a.at(1, 2) == 9);
  CHECK(b.at(1, 2) == 7);
  CHECK((*snapshot)[5] == 7);  // what an all-to-all took from it never changes
  CHECK(a.shared_counts() != snapshot);
  RoutingMatrix c = b;
  c.mutable_counts().assign(6, 1);
  CHECK(b.row_sum(1) == 7);
  CHECK(c.row_sum(1) == 3);
  CHECK_THROWS_AS(RoutingMatrix(2, 3, std::vector<std::int32_t>(5)), std::logic_error);
}

TEST_CASE("a sampled routing keeps its counts in 16 bits, a change widens them to 32, the counts unchanged") {
  const auto r = generate_routing(zipf(1.2), 8, 16, 1000, 2, 7, 0, 0);
  REQUIRE(r.counts().narrow());  // a cell is at most 1,000 tokens
  const RoutingMatrix wide(8, 16, std::vector<std::int32_t>(r.counts().begin(), r.counts().end()));
  CHECK_FALSE(wide.counts().narrow());
  CHECK(wide.counts() == r.counts());  // equal across widths
  CHECK(r.rows(2, 5).counts().narrow());
  CHECK(r.rows(2, 5).at(1, 3) == r.at(3, 3));
  CHECK(r.largest_count() == *std::max_element(wide.counts().begin(), wide.counts().end()));
  RoutingMatrix changed = r;
  changed.mutable_at(0, 0) += 70000;  // past 16 bits
  CHECK_FALSE(changed.counts().narrow());
  CHECK(changed.at(0, 0) == r.at(0, 0) + 70000);
  CHECK(changed.at(7, 15) == r.at(7, 15));
  CHECK(r.counts().narrow());  // the copy it was made from is untouched
  // More tokens than 16 bits hold: 32 bits from the start.
  CHECK_FALSE(generate_routing(zipf(1.2), 1, 4, 70000, 1, 7, 0, 0).counts().narrow());
}

TEST_CASE("routing without a group limit draws as the limited sampler does where its limit never binds") {
  // 4 groups, at most 2 a token, top-2: a token never reaches a third group, so the limited
  // sampler (count_tokens_with) and the unlimited one (count_tokens_unlimited) make the same draws.
  const auto popularity = [] {
    std::vector<double> p(16);
    for (int e = 0; e < 16; ++e) p[std::size_t(e)] = 1.0 / (1 + e);
    return p;
  }();
  Rng a(11), b(11);
  const auto unlimited = sample_routing(popularity, 6, 3000, 2, a);
  const auto limited = sample_routing(popularity, 6, 3000, 2, b, GroupLimit{4, 2});
  CHECK(unlimited.counts() == limited.counts());
  CHECK(a.next() == b.next());  // and left the generator in the same state
}

TEST_CASE("zipf routing gives the hottest expert its expected share") {
  // Top-1: expert e gets Binomial(N, p_e) tokens with p_e = (1/rank^s) / H. The hottest has
  // rank 1: mean N/H, standard deviation sqrt(N p (1-p)).
  const int E = 64, N = 200000;
  const double s = 1.0;
  double H = 0;
  for (int r = 1; r <= E; ++r) H += 1 / std::pow(r, s);
  const double p = 1 / H;
  const auto r = generate_routing(zipf(s), 1, E, N, 1, 3, 0, 0);
  std::int64_t hottest = 0;
  for (int e = 0; e < E; ++e) hottest = std::max(hottest, r.expert_load(e));
  CHECK(std::abs(double(hottest) - N * p) < 4 * std::sqrt(N * p * (1 - p)));
  // Uniform routing at the same size stays within a few percent of the mean everywhere.
  spec::GatingSpec uniform;
  uniform.mutable_uniform();
  const auto u = generate_routing(uniform, 1, E, N, 1, 3, 0, 0);
  for (int e = 0; e < E; ++e) CHECK(std::abs(u.expert_load(e) - N / E) < 0.1 * N / E);
}

TEST_CASE("the random generator is uniform over a small range") {
  Rng rng(1);
  int counts[7] = {0};
  for (int i = 0; i < 70000; ++i) ++counts[rng.below(7)];
  for (int c : counts) CHECK(std::abs(c - 10000) < 400);  // > 4 sigma
  for (int i = 0; i < 1000; ++i) {
    const double u = rng.uniform();
    CHECK(u >= 0);
    CHECK(u < 1);
  }
}
