// The synthetic gating generator (docs/spec/gating-traces.md §6): its samplers, the invariants
// of every matrix (rows of n·k, no cell above n), determinism, the presets' statistics against
// the notes' table, the drift, the phases and the hot-spot knob, and preset resolution.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "errors.hpp"
#include "generator.hpp"

using namespace moesim;

namespace {

GeneratorParams preset(const std::string& name) {
  spec::GeneratorSpec g;
  g.set_preset(name);
  return resolve_generator(g);
}

std::vector<double> global_load(const RoutingMatrix& r) {
  std::vector<double> load(r.experts);
  for (int e = 0; e < r.experts; ++e) load[e] = double(r.expert_load(e));
  return load;
}

double total(const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0); }
double max_over_mean(const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()) * x.size() / total(x); }
double top1_share(const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()) / total(x); }
double zeros(const std::vector<double>& x) { return double(std::count(x.begin(), x.end(), 0.0)); }

// Gini = Σ (2i - n - 1) x_(i) / (n Σ x), x sorted ascending, i = 1..n.
double gini(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const double n = double(x.size());
  double weighted = 0;
  for (std::size_t i = 0; i < x.size(); ++i) weighted += (2.0 * double(i + 1) - n - 1) * x[i];
  return weighted / (n * total(x));
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return ab / std::sqrt(aa * bb);
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void check_rows(const RoutingMatrix& r, std::int64_t tokens, int top_k) {
  for (int s = 0; s < r.sources; ++s) {
    CHECK(r.row_sum(s) == tokens * top_k);
    for (int e = 0; e < r.experts; ++e) {
      CHECK(r.at(s, e) >= 0);
      CHECK(r.at(s, e) <= tokens);
    }
  }
}

// Sample mean and variance of `draws` binomials.
std::pair<double, double> binomial_moments(Rng& rng, std::int64_t n, double p, int draws) {
  double sum = 0, sq = 0;
  for (int i = 0; i < draws; ++i) {
    const double x = double(sample_binomial(rng, n, p));
    sum += x;
    sq += x * x;
  }
  const double mean = sum / draws;
  return {mean, sq / draws - mean * mean};
}

double binomial_pmf(int n, double p, int x) {
  return std::exp(std::lgamma(n + 1.0) - std::lgamma(x + 1.0) - std::lgamma(n - x + 1.0) + x * std::log(p) +
                  (n - x) * std::log1p(-p));
}

// Medians over layer-iterations of the global load's statistics, the way the notes measure the
// SmartMoE trace (§3): E = 32, k = 2, S = 16, n = 8192, every 10th iteration.
struct PresetStats {
  double max_mean, top1, zero, gini;
};

PresetStats measure(const std::string& name) {
  // The base popularity is drawn once per layer, so the median over the 24 layers of one model
  // still varies with the seed (naive: max/mean 10.7-15.0 over 8 seeds); 192 layers × 5 samples
  // keep the spread within the tolerances (12.5-13.9 over 8 seeds).
  const int E = 32, k = 2, L = 192, S = 16, samples = 5;
  const std::int64_t n = 8192;
  GatingGenerator gen(preset(name), E, k, L, S, n, 2026);
  std::vector<double> max_mean, top1, zero, gi;
  for (int l = 0; l < L; ++l) {
    for (int t = 0; t < 10 * samples; ++t) {
      const auto r = gen.next(l);
      if (t % 10 != 9) continue;
      const auto load = global_load(r);
      max_mean.push_back(max_over_mean(load));
      top1.push_back(top1_share(load));
      zero.push_back(zeros(load));
      gi.push_back(gini(load));
    }
  }
  return {median(max_mean), median(top1), median(zero), median(gi)};
}

}  // namespace

// ---- samplers ---------------------------------------------------------------------------------

TEST_CASE("generator: standard normals have the right moments and tails") {
  Rng rng(11);
  const int N = 1000000;
  double sum = 0, sq = 0;
  int beyond1 = 0, beyond2 = 0, beyond35 = 0;
  for (int i = 0; i < N; ++i) {
    const double x = sample_normal(rng);
    sum += x;
    sq += x * x;
    beyond1 += std::abs(x) > 1;
    beyond2 += std::abs(x) > 2;
    beyond35 += std::abs(x) > 3.5;  // beyond the ziggurat's base layer (3.44)
  }
  CHECK(std::abs(sum / N) < 0.005);
  CHECK(sq / N == Approx(1).epsilon(0.005));
  // Two-sided tails 0.31731, 0.045500, 4.6525e-4; binomial counts within 5 standard deviations.
  auto tail_ok = [&](int count, double p) { return std::abs(count - N * p) < 5 * std::sqrt(N * p * (1 - p)); };
  CHECK(tail_ok(beyond1, 0.31731));
  CHECK(tail_ok(beyond2, 0.045500));
  CHECK(tail_ok(beyond35, 4.6525e-4));
}

TEST_CASE("generator: binomial mean and variance in the inversion and rejection regimes") {
  Rng rng(5);
  struct Case {
    std::int64_t n;
    double p;
  };
  // n·min(p, 1-p) below 10 (inversion) and above (BTRS), p close to 1 (sampled as n - Bin(n, 1-p)).
  for (const Case c : {Case{20, 0.3}, Case{8192, 1.0 / 1024}, Case{100000, 0.01}, Case{1000, 0.999},
                       Case{100000, 0.99}, Case{40, 0.4}, Case{1000000000, 0.5}}) {
    INFO("n = " << c.n << ", p = " << c.p);
    const int draws = 200000;
    const auto [mean, var] = binomial_moments(rng, c.n, c.p, draws);
    const double m = double(c.n) * c.p, v = m * (1 - c.p);
    CHECK(std::abs(mean - m) < 5 * std::sqrt(v / draws));
    CHECK(var == Approx(v).epsilon(0.03));
  }
  CHECK(sample_binomial(rng, 0, 0.5) == 0);
  CHECK(sample_binomial(rng, 100, 0) == 0);
  CHECK(sample_binomial(rng, 100, 1) == 100);
}

TEST_CASE("generator: binomial frequencies follow the pmf") {
  Rng rng(9);
  const int draws = 200000;
  for (const auto& [n, p] : {std::pair{20, 0.3}, std::pair{40, 0.4}}) {  // inversion; BTRS (mean 16)
    std::vector<int> count(n + 1, 0);
    for (int i = 0; i < draws; ++i) ++count[sample_binomial(rng, n, p)];
    for (int x = 0; x <= n; ++x) {
      const double f = binomial_pmf(n, p, x);
      INFO("n = " << n << ", p = " << p << ", x = " << x);
      CHECK(std::abs(count[x] - draws * f) < 5 * std::sqrt(draws * f * (1 - f)) + 1);
    }
  }
}

TEST_CASE("generator: multinomial draws sum to n and follow p, capped draws respect the cap") {
  Rng rng(3);
  const std::vector<double> p = {0.5, 0, 2, 1.5, 0, 1};  // need not sum to one
  std::vector<double> sum(p.size(), 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const auto x = sample_multinomial(rng, 1000, p);
    CHECK(std::accumulate(x.begin(), x.end(), std::int64_t(0)) == 1000);
    CHECK(x[1] == 0);
    CHECK(x[4] == 0);
    for (std::size_t e = 0; e < p.size(); ++e) sum[e] += double(x[e]);
  }
  for (std::size_t e = 0; e < p.size(); ++e) CHECK(sum[e] / (1000.0 * draws) == Approx(p[e] / 5).margin(0.002));
  // One expert wants 97% of the slots, more than n for k >= 2: it gets exactly n, the rest is
  // spread, rows stay n·k.
  const std::vector<double> skewed = {97, 1, 1, 0.5, 0.5};
  for (int k : {2, 3}) {
    const auto x = sample_capped(rng, 1000, k, skewed);
    CHECK(std::accumulate(x.begin(), x.end(), std::int64_t(0)) == 1000 * k);
    CHECK(*std::max_element(x.begin(), x.end()) <= 1000);
    CHECK(x[0] == 1000);
  }
  // k = number of experts: every token goes to every expert.
  CHECK(sample_capped(rng, 500, 4, {10, 1, 0.01, 0.001}) == std::vector<std::int64_t>(4, 500));
}

// ---- the generator ----------------------------------------------------------------------------

TEST_CASE("generator: rows sum to tokens times k and no cell exceeds tokens, for every preset and extreme settings") {
  for (const auto& name : generator_presets()) {
    INFO(name);
    GatingGenerator gen(preset(name), 32, 2, 2, 8, 1000, 1);
    for (int t = 0; t < 5; ++t)
      for (int l = 0; l < 2; ++l) check_rows(gen.next(l), 1000, 2);
  }
  auto extreme = preset("naive");
  extreme.sigma_pop = 4;  // a few experts want far more than n: the cap binds hard
  for (int E : {3, 4, 8}) {
    INFO("sigma_pop 4, E = " << E);
    GatingGenerator gen(extreme, E, 2, 4, 4, 500, 7);
    for (int t = 0; t < 5; ++t)
      for (int l = 0; l < 4; ++l) check_rows(gen.next(l), 500, 2);
  }
  // Nearly all experts dead: top_k = 4 of 16 are kept alive, and only live experts get slots
  // (more than 6 live has probability 3e-5 per layer).
  extreme.dead_fraction = 0.95;
  GatingGenerator dead(extreme, 16, 4, 8, 2, 100, 3);
  for (int l = 0; l < 8; ++l) {
    std::vector<double> used(16, 0);
    for (int t = 0; t < 5; ++t) {
      const auto r = dead.next(l);
      check_rows(r, 100, 4);
      const auto load = global_load(r);
      for (int e = 0; e < 16; ++e) used[e] += load[e];
    }
    CHECK(16 - zeros(used) >= 4);
    CHECK(16 - zeros(used) <= 6);
  }
  auto zipf = preset("aux");
  zipf.zipf_exponent = 3;
  zipf.hot_fraction = 0.9;
  GatingGenerator z(zipf, 8, 3, 1, 4, 300, 5);
  for (int t = 0; t < 5; ++t) check_rows(z.next(0), 300, 3);
}

TEST_CASE("generator: same seed, same matrices, whatever the order in which layers are asked for") {
  const auto P = preset("naive");
  GatingGenerator a(P, 16, 2, 3, 4, 256, 42), b(P, 16, 2, 3, 4, 256, 42), c(P, 16, 2, 3, 4, 256, 43);
  std::vector<RoutingMatrix> forward, backward(3);
  for (int l = 0; l < 3; ++l) forward.push_back(a.next(l));
  for (int l = 2; l >= 0; --l) backward[l] = b.next(l);
  for (int l = 0; l < 3; ++l) {
    CHECK(forward[l].counts() == backward[l].counts());
    CHECK(c.next(l).counts() != forward[l].counts());
  }
  CHECK(forward[0].counts() != forward[1].counts());
  // The second iteration too: the drift and the streams advance per layer.
  CHECK(a.next(1).counts() == b.next(1).counts());
}

TEST_CASE("generator: the naive preset reproduces the SmartMoE trace's skew") {
  // Notes §6 (prototype): max/mean 13.1, top-1 0.41, zero experts 5, Gini 0.80 [trace 0.83].
  const auto s = measure("naive");
  INFO("max/mean " << s.max_mean << ", top-1 " << s.top1 << ", zeros " << s.zero << ", Gini " << s.gini);
  CHECK(std::abs(s.max_mean - 13) <= 2);
  CHECK(std::abs(s.top1 - 0.41) <= 0.05);
  CHECK(std::abs(s.zero - 5) <= 2);
  CHECK(std::abs(s.gini - 0.82) <= 0.05);
}

TEST_CASE("generator: the aux and concentrated presets reproduce their Gini and max/mean") {
  // Notes §6: aux max/mean 1.78, Gini 0.16 (the log-normal alone gives erf(0.27/2) = 0.15; drift
  // and noise add a little); concentrated Gini 0.29-0.38 by erf(sigma_pop/2).
  const auto aux = measure("aux");
  INFO("aux: max/mean " << aux.max_mean << ", Gini " << aux.gini);
  CHECK(aux.max_mean >= 1.5);
  CHECK(aux.max_mean <= 2.2);
  CHECK(std::abs(aux.gini - 0.16) <= 0.04);
  CHECK(aux.zero == 0);
  const auto conc = measure("concentrated");
  INFO("concentrated: max/mean " << conc.max_mean << ", Gini " << conc.gini);
  CHECK(conc.gini >= 0.25);
  CHECK(conc.gini <= 0.40);
  CHECK(conc.max_mean > aux.max_mean);
}

TEST_CASE("generator: the naive drift is slow: cosine 0.999 at lag 10, lower at lag 1000") {
  // Notes §6: cos@10 0.9999, cos@1000 0.9965 (S = 16, n = 8192). Fewer sources and tokens here:
  // the fast noise and the sampling noise average less, so the median at lag 10 is ~0.9995.
  const int E = 32, L = 4, S = 8;
  GatingGenerator gen(preset("naive"), E, 2, L, S, 4096, 8);
  std::vector<double> lag10, lag1000;
  for (int l = 0; l < L; ++l) {
    std::vector<std::vector<double>> load;
    for (int t = 0; t <= 1010; ++t) load.push_back(global_load(gen.next(l)));
    for (int t = 0; t <= 1000; t += 100) lag10.push_back(cosine(load[t], load[t + 10]));
    for (int t : {0, 5, 10}) lag1000.push_back(cosine(load[t], load[t + 1000]));
  }
  INFO("cos@10 " << median(lag10) << ", cos@1000 " << median(lag1000));
  CHECK(median(lag10) >= 0.999);
  CHECK(median(lag1000) < median(lag10) - 0.002);
}

TEST_CASE("generator: warm-up is near uniform, growth raises the skew, regime switches move the hot expert") {
  auto P = preset("naive");
  P.warmup_iterations = 3;
  GatingGenerator warm(P, 32, 2, 1, 16, 8192, 4);
  CHECK(max_over_mean(global_load(warm.next(0))) < 2);  // SmartMoE at init: 1.52
  for (int t = 1; t < 3; ++t) warm.next(0);
  CHECK(max_over_mean(global_load(warm.next(0))) > 5);

  auto G = preset("aux");
  G.pop_growth = 2;  // sigma_pop × 3 after 100 iterations
  G.growth_iterations = 100;
  GatingGenerator grow(G, 32, 2, 1, 4, 4096, 4);
  const double before = gini(global_load(grow.next(0)));
  for (int t = 1; t < 100; ++t) grow.next(0);
  CHECK(gini(global_load(grow.next(0))) > before + 0.15);

  auto W = preset("naive");
  W.switch_probability = 0.5;
  GatingGenerator sw(W, 32, 2, 1, 4, 4096, 4);
  auto hottest = [](const std::vector<double>& x) { return std::max_element(x.begin(), x.end()) - x.begin(); };
  const auto first = hottest(global_load(sw.next(0)));
  int moved = 0;
  for (int t = 1; t < 40; ++t) moved += hottest(global_load(sw.next(0))) != first;
  CHECK(moved > 10);
}

TEST_CASE("generator: the hot-spot knob moves hot_fraction of the slots onto the hottest experts") {
  // p' = (1 - h) p + h/m on each of the m hot experts. With and without the knob the same seed gives
  // the same popularity process, so the hot experts of each iteration are the same in both runs.
  const int E = 32, k = 2, S = 8, T = 20;
  const std::int64_t n = 4096, slots = S * n * k;
  auto P = preset("aux");
  for (int m : {1, 2}) {
    auto H = P;
    H.hot_fraction = 0.3;
    H.hot_experts = m;
    GatingGenerator plain(P, E, k, 1, S, n, 17), hot(H, E, k, 1, S, n, 17);
    double hot_share = 0, plain_share = 0;  // of the hot experts, averaged over iterations
    for (int t = 0; t < T; ++t) {
      const auto with = global_load(hot.next(0)), without = global_load(plain.next(0));
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) { return with[a] > with[b]; });
      for (int i = 0; i < m; ++i) {
        hot_share += with[order[i]] / double(slots * T);
        plain_share += without[order[i]] / double(slots * T);
      }
    }
    INFO("m = " << m << ": hot experts' share " << hot_share << ", without the knob " << plain_share);
    CHECK(hot_share == Approx(0.7 * plain_share + 0.3).margin(0.005));
  }
  // Asking for more than the cap: the hot expert gets at most one slot of every token (share 1/k).
  P.hot_fraction = 0.9;
  GatingGenerator capped(P, E, k, 1, S, n, 17);
  const auto r = capped.next(0);
  check_rows(r, n, k);
  CHECK(top1_share(global_load(r)) <= 0.5);
  CHECK(top1_share(global_load(r)) >= 0.49);
}

// ---- presets ----------------------------------------------------------------------------------

TEST_CASE("generator: presets resolve, overrides replace their values, bad values name the field") {
  CHECK(generator_presets() == std::vector<std::string>{"naive", "aux", "concentrated", "pro-prophet"});
  spec::GeneratorSpec g;
  const auto naive = resolve_generator(g);  // the default preset
  CHECK(naive.sigma_pop == 2.2);
  CHECK(naive.dead_fraction == 0.15);
  CHECK(naive.tau == 1500);
  CHECK(naive.hot_experts == 1);
  g.set_preset("aux");
  g.set_sigma_pop(0.5);
  g.set_hot_fraction(0.2);
  const auto aux = resolve_generator(g);
  CHECK(aux.sigma_pop == 0.5);
  CHECK(aux.hot_fraction == 0.2);
  CHECK(aux.tau == 300);
  CHECK(aux.sigma_src == 0.05);

  auto field_of = [](const spec::GeneratorSpec& s) -> std::string {
    try {
      resolve_generator(s);
    } catch (const FieldError& e) {
      return e.field() + " | " + e.message();
    }
    return "accepted";
  };
  spec::GeneratorSpec bad;
  bad.set_preset("balanced");
  const auto unknown = field_of(bad);
  CHECK(unknown.rfind("preset |", 0) == 0);
  CHECK(unknown.find("naive, aux, concentrated") != std::string::npos);

  auto with = [](auto set) {
    spec::GeneratorSpec s;
    set(s);
    return s;
  };
  CHECK(field_of(with([](auto& s) { s.set_sigma_pop(-1); })).rfind("sigma_pop |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_dead_fraction(1); })).rfind("dead_fraction |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_tau(0); })).rfind("tau |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_sigma_fast(std::nan("")); })).rfind("sigma_fast |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_hot_fraction(1); })).rfind("hot_fraction |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_hot_experts(0); })).rfind("hot_experts |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_switch_probability(1.5); })).rfind("switch_probability |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_pop_growth(1); })).rfind("growth_iterations |", 0) == 0);
  CHECK(field_of(with([](auto& s) { s.set_dead_fraction(0.5); })) == "accepted");
}

TEST_CASE("generator: each fitted preset reaches its paper's statistic as the table has it") {
  for (const auto& name : fitted_presets()) {
    INFO(name);
    const PresetFit f = fit_preset(name);
    CHECK(std::abs(f.table_reached - f.target) <= 0.01);           // the table's sigma_pop hits the target
    CHECK(std::abs(f.fitted_sigma_pop - f.table_sigma_pop) <= 0.02);  // and is what the fit finds again
    CHECK(std::abs(f.fitted_reached - f.target) <= 0.01);
  }
  // Pro-Prophet Fig. 3's other half: the three coldest of 16 experts hold less than 5%.
  const PresetFit p = fit_preset("pro-prophet");
  REQUIRE(p.others.size() == 2);
  CHECK(p.others[0].second > 0.5);  // the median layer's top-3 share: over half
  CHECK(p.others[1].second < 0.05);
  CHECK(p.others[1].second > 0);    // not dead experts
  CHECK_THROWS_AS(fit_preset("naive"), FieldError);
}

TEST_CASE("generator: the naive preset beside FasterMoE Fig. 4, the setups that draw it unfitted") {
  const auto checks = preset_checks();
  REQUIRE(checks.size() == 2);
  // The same statistics by hand, from the same draws.
  spec::GeneratorSpec s;
  s.set_preset("naive");
  GatingGenerator g(resolve_generator(s), 16, 2, 600, 16, 1024, 1);
  std::vector<double> top4, hottest;
  for (int l = 0; l < 600; ++l) {
    const auto loads = g.next(l).expert_loads();
    std::vector<double> v(loads.begin(), loads.end());
    std::sort(v.begin(), v.end(), std::greater<>());
    const double total = std::accumulate(v.begin(), v.end(), 0.0);
    REQUIRE(total == 16 * 1024 * 2);  // every token's two slots
    top4.push_back((v[0] + v[1] + v[2] + v[3]) / total);
    hottest.push_back(v[0] * 16 / total);
  }
  auto median = [](std::vector<double> x) {  // 600 values: halfway between the 300th and the 301st
    std::sort(x.begin(), x.end());
    return (x[299] + x[300]) / 2;
  };
  CHECK(checks[0].reached == Approx(median(top4)));
  CHECK(checks[1].reached == Approx(median(hottest)));
  CHECK(checks[0].paper == 0.80);  // 4 experts of 16 at 3.2x the mean each: 4 x 3.2 / 16
  CHECK(checks[1].paper == 3.2);
  CHECK(checks[1].reached <= 8);   // top-2: an expert takes at most half the slots, 8x the mean of 16
}

TEST_CASE("the generator under a group limit counts token spreads from the same draws") {
  // One token per source: a block's count is 1 where the row has one of the block's experts. Top-8
  // of 64 experts within 1 of 2 groups: every token reaches exactly one 32-expert block.
  GatingGenerator plain(preset("naive"), 64, 8, 1, 40, 1, 5, {2, 1}), counted(preset("naive"), 64, 8, 1, 40, 1, 5, {2, 1});
  counted.count_spreads({8, 32});
  const RoutingMatrix a = plain.next(0), R = counted.next(0);
  CHECK(a.counts() == R.counts());
  REQUIRE(R.spread(8) != nullptr);
  REQUIRE(R.spread(32) != nullptr);
  for (int s = 0; s < 40; ++s) {
    for (int b = 0; b < 8; ++b) {
      std::int64_t slots = 0;
      for (int e = b * 8; e < b * 8 + 8; ++e) slots += R.at(s, e);
      CHECK(R.spread(8)->at(s, b) == (slots > 0 ? 1 : 0));
    }
    CHECK(R.spread(32)->at(s, 0) + R.spread(32)->at(s, 1) == 1);
  }
  // Without a limit the generator draws counts, not tokens: no spreads.
  GatingGenerator free_(preset("naive"), 64, 8, 1, 40, 1, 5);
  free_.count_spreads({8});
  CHECK(free_.next(0).spread(8) == nullptr);
}
