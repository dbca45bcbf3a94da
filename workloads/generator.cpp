// The seeded synthetic gating generator of docs/spec/gating-traces.md §6. Per layer and
// iteration t, source s sends its n·k token-slots to expert e with probability
//
//   p[s][e] = softmax_e( scale(t) · (growth(t) · mu[e] + d_t[e] + eps[t][s][e] + delta[s][e]) )
//
// mu: base log-popularity (log-normal, sigma_pop; or Zipf), -inf for dead experts; d: slow OU
// drift (sigma_slow, tau); eps: fast noise (sigma_fast); delta: fixed source offsets (sigma_src).
// The counts are Multinomial(n·k, p) with the top-k cap (no cell above n). The samplers below are
// our own (normal, binomial, multinomial) over Rng so that a seed gives the same trace anywhere.
#include "generator.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>

#include "errors.hpp"
#include "trace_stats.hpp"

namespace moesim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Two streams per layer: the popularity process (mu, dead experts, d, switches) and the sampling
// (delta, eps, counts). Choice: apart, so that runs that differ in sources, tokens or the hot-spot
// knob see the same popularity trajectory for the same seed.
constexpr std::uint64_t kProcessStream = 0x706f70756c6172ull;  // "popular"
constexpr std::uint64_t kSamplingStream = 0x73616d706c65ull;   // "sample"
constexpr double kWarmupScale = 0.05;  // logits × 0.05 before warmup_iterations (near-uniform init)

// ---- presets and validation ----------------------------------------------------------------

struct Preset {
  const char* name;
  GeneratorParams params;
};

// The notes' table (§6). Unlisted parameters stay at their defaults (0, hot_experts 1).
// `concentrated`: the notes give sigma_pop 0.55-0.70; 0.62 is the middle (Gini ~0.34 by erf(sigma/2)).
const Preset kPresets[] = {
    {"naive", {.sigma_pop = 2.2, .dead_fraction = 0.15, .sigma_slow = 0.2, .tau = 1500, .sigma_fast = 0.08, .sigma_src = 0.01}},
    {"aux", {.sigma_pop = 0.27, .sigma_slow = 0.15, .tau = 300, .sigma_fast = 0.05, .sigma_src = 0.05}},
    {"concentrated", {.sigma_pop = 0.62, .sigma_slow = 0.15, .tau = 300, .sigma_fast = 0.05, .sigma_src = 0.05}},
    // Pro-Prophet's runs (docs/spec/pro-prophet.md §4, Fig. 3): sigma_pop fitted by `moesim trace fit
    // pro-prophet` (fit_preset below) so that in two thirds of the layers the 3 hottest of 16 experts
    // take over half of the tokens; no dead experts (the paper's 3 coldest hold "less than 5%", not
    // none); the drift and noise of `naive` (no balance loss is stated).
    {"pro-prophet", {.sigma_pop = 1.11, .sigma_slow = 0.2, .tau = 1500, .sigma_fast = 0.08, .sigma_src = 0.01}},
};

// The checks below state what is valid, so that NaN (false in every comparison) fails them too.
void require(bool ok, const char* field, const std::string& message) {
  if (!ok) throw FieldError(field, message);
}

// Scales of log-popularity (standard deviations, the growth factor): at most 100, where one expert
// already takes every token; far beyond it the logits overflow and the tokens vanish as NaN.
constexpr double kMaxLogScale = 100;

void require_nonnegative(double x, const char* field, double max = std::numeric_limits<double>::max()) {
  require(x >= 0 && x <= max, field, fmt::format("must be in [0, {:g}], got {}; 0 turns it off", max, x));
}

void require_fraction(double x, const char* field) {
  require(x >= 0 && x < 1, field, fmt::format("is a fraction in [0, 1), got {}", x));
}

void validate(const GeneratorParams& p) {
  require_nonnegative(p.sigma_pop, "sigma_pop", kMaxLogScale);
  require_nonnegative(p.zipf_exponent, "zipf_exponent");
  require_fraction(p.dead_fraction, "dead_fraction");
  require_nonnegative(p.sigma_slow, "sigma_slow", kMaxLogScale);
  require(p.tau > 0, "tau", fmt::format("is the drift's time constant in iterations and must be > 0, got {}", p.tau));
  require_nonnegative(p.sigma_fast, "sigma_fast", kMaxLogScale);
  require_nonnegative(p.sigma_src, "sigma_src", kMaxLogScale);
  require_nonnegative(p.pop_growth, "pop_growth", kMaxLogScale);
  require(p.pop_growth == 0 || p.growth_iterations > 0, "growth_iterations",
          "must be > 0 when pop_growth is set: it is the number of iterations over which sigma_pop grows");
  require(p.switch_probability >= 0 && p.switch_probability <= 1, "switch_probability",
          fmt::format("is a probability in [0, 1], got {}", p.switch_probability));
  require_fraction(p.hot_fraction, "hot_fraction");
  require(p.hot_experts >= 1, "hot_experts", fmt::format("must be >= 1, got {}", p.hot_experts));
}

// A uint32 spec field as the params' int (past INT_MAX means "forever" anyway).
int to_int(std::uint32_t v) { return int(std::min<std::uint32_t>(v, std::numeric_limits<int>::max())); }

// ---- samplers --------------------------------------------------------------------------------

// Marsaglia & Tsang's ziggurat ("The ziggurat method for generating random variables", 2000)
// with 128 layers: one 64-bit draw and a table look-up 99% of the time. The layer comes from the
// low 7 bits and the signed abscissa from the top 53 (separate bits, Doornik's fix).
struct Ziggurat {
  static constexpr int kLayers = 128;
  static constexpr double kR = 3.442619855899, kV = 9.91256303526217e-3, kScale = 0x1.0p52;
  std::array<double, kLayers> k{}, w{}, f{};
  Ziggurat() {
    double dn = kR, tn = dn;
    const double q = kV / std::exp(-0.5 * dn * dn);
    k[0] = dn / q * kScale;
    w[0] = q / kScale;
    w[kLayers - 1] = dn / kScale;
    f[0] = 1;
    f[kLayers - 1] = std::exp(-0.5 * dn * dn);
    for (int i = kLayers - 2; i >= 1; --i) {
      dn = std::sqrt(-2 * std::log(kV / dn + std::exp(-0.5 * dn * dn)));
      k[i + 1] = dn / tn * kScale;
      tn = dn;
      f[i] = std::exp(-0.5 * dn * dn);
      w[i] = dn / kScale;
    }
  }
};

double normal(Rng& rng) {
  static const Ziggurat z;
  for (;;) {
    const std::uint64_t bits = rng.next();
    const std::size_t i = bits & (Ziggurat::kLayers - 1);
    const double j = double(std::int64_t(bits) >> 11), x = j * z.w[i];
    if (std::abs(j) < z.k[i]) return x;
    if (i == 0) {  // the tail beyond R
      double tx, ty;
      do {
        tx = -std::log1p(-rng.uniform()) / Ziggurat::kR;
        ty = -std::log1p(-rng.uniform());
      } while (ty + ty < tx * tx);
      return j > 0 ? Ziggurat::kR + tx : -Ziggurat::kR - tx;
    }
    if (z.f[i] + rng.uniform() * (z.f[i - 1] - z.f[i]) < std::exp(-0.5 * x * x)) return x;
  }
}

void fill_normal(Rng& rng, std::span<double> out) {
  for (auto& x : out) x = normal(rng);
}

// Binomial(n, p), p <= 1/2, n·p < 10: inversion (Kachitvichyanukul & Schmeiser's BINV), walking
// the pmf from 0 with f(x) = f(x - 1)·((n + 1)/x - 1)·p/q. The walk restarts past
// n·p + 10·sqrt(n·p·q + 1) (a tail below 1e-20) so that rounding in the pmf sum can never run it
// away. Its cost grows with the mean: this is most of the generator's time.
std::int64_t binomial_inversion(Rng& rng, std::int64_t n, double p) {
  const double q = 1 - p, s = p / q, a = double(n + 1) * s;
  const double r0 = std::exp(double(n) * std::log1p(-p));
  const auto bound = std::int64_t(std::min(double(n), double(n) * p + 10 * std::sqrt(double(n) * p * q + 1)));
  for (;;) {
    double u = rng.uniform(), r = r0;
    std::int64_t x = 0;
    while (u > r) {
      u -= r;
      if (++x > bound) break;
      r *= a / double(x) - s;
    }
    if (x <= bound) return x;
  }
}

// log(k!) - [(k + 1/2) log(k + 1) - (k + 1) + log(sqrt(2 pi))]: the Stirling series' tail.
double stirling_tail(double k) {
  static const double table[] = {0.0810614667953272,  0.0413406959554092,  0.0276779256849983, 0.02079067210376509,
                                 0.0166446911898211,  0.0138761288230707,  0.0118967099458917, 0.0104112652619720,
                                 0.00925546218271273, 0.00833056343336287};
  if (k <= 9) return table[int(k)];
  const double k1 = k + 1, k1sq = k1 * k1;
  return (1.0 / 12 - (1.0 / 360 - 1.0 / 1260 / k1sq) / k1sq) / k1;
}

// Binomial(n, p), p <= 1/2, n·p >= 10: Hörmann's BTRS (transformed rejection with squeeze,
// "The generation of binomial random variates", 1993), exact: the final test compares with the
// log pmf ratio to the mode, written with Stirling tails.
std::int64_t binomial_btrs(Rng& rng, std::int64_t n, double p) {
  const double N = double(n), spq = std::sqrt(N * p * (1 - p));
  const double b = 1.15 + 2.53 * spq, a = -0.0873 + 0.0248 * b + 0.01 * p, c = N * p + 0.5;
  const double v_r = 0.92 - 4.2 / b, r = p / (1 - p), alpha = (2.83 + 5.1 / b) * spq;
  const double m = std::floor((N + 1) * p);
  for (;;) {
    const double u = rng.uniform() - 0.5;
    double v = rng.uniform();
    const double us = 0.5 - std::abs(u);
    const double k = std::floor((2 * a / us + b) * u + c);
    if (k < 0 || k > N) continue;
    if (us >= 0.07 && v <= v_r) return std::int64_t(k);
    v = std::log(v * alpha / (a / (us * us) + b));
    const double bound = (m + 0.5) * std::log((m + 1) / (r * (N - m + 1))) +
                         (N + 1) * std::log((N - m + 1) / (N - k + 1)) +
                         (k + 0.5) * std::log(r * (N - k + 1) / (k + 1)) + stirling_tail(m) +
                         stirling_tail(N - m) - stirling_tail(k) - stirling_tail(N - k);
    if (v <= bound) return std::int64_t(k);
  }
}

// Multinomial(n, p) into `out` by conditional binomials: x_e ~ Binomial(n left, p_e / p left).
// The last expert with p > 0 takes what is left, so a p = 0 cell never gets a slot.
void multinomial_into(Rng& rng, std::int64_t n, std::span<const double> p, std::span<std::int64_t> out) {
  std::fill(out.begin(), out.end(), 0);
  std::size_t last = p.size();
  double rest = 0;
  for (std::size_t e = 0; e < p.size(); ++e) {
    if (p[e] > 0) {
      rest += p[e];
      last = e;
    }
  }
  for (std::size_t e = 0; e < p.size() && n > 0; ++e) {
    if (!(p[e] > 0)) continue;
    const std::int64_t x = e == last ? n : sample_binomial(rng, n, rest > p[e] ? p[e] / rest : 1.0);
    out[e] = x;
    n -= x;
    rest -= p[e];
  }
}

// One cell to receive an excess that water-filling could not place: most room, p > 0 first.
std::size_t roomiest(std::span<const double> p, std::span<const std::int64_t> c, std::int64_t cap) {
  std::size_t best = 0;
  auto key = [&](std::size_t e) { return std::pair(p[e] > 0 && c[e] < cap, cap - c[e]); };
  for (std::size_t e = 1; e < c.size(); ++e)
    if (key(e) > key(best)) best = e;
  return best;
}

// Clips the cells above `cap` to it; returns what was clipped.
std::int64_t clip(std::span<std::int64_t> c, std::int64_t cap) {
  std::int64_t excess = 0;
  for (auto& x : c) {
    if (x > cap) {
      excess += x - cap;
      x = cap;
    }
  }
  return excess;
}

// Multinomial(tokens·k, p) into `out` with no cell above `tokens`: clip the cells over the cap and
// draw the excess again onto the cells below it in proportion to p, up to k + 2 rounds; whatever
// is still left then goes deterministically to the cells with most room. Needs k <= cells.
void capped_into(Rng& rng, std::int64_t tokens, int top_k, std::span<const double> p, std::span<std::int64_t> out) {
  multinomial_into(rng, tokens * top_k, p, out);
  std::int64_t excess = clip(out, tokens);
  if (excess == 0) return;
  std::vector<double> open(p.size());
  std::vector<std::int64_t> extra(p.size());
  for (int round = 0; excess > 0 && round < top_k + 2; ++round) {
    for (std::size_t e = 0; e < p.size(); ++e) open[e] = out[e] < tokens ? p[e] : 0;
    if (std::none_of(open.begin(), open.end(), [](double x) { return x > 0; })) break;
    multinomial_into(rng, excess, open, extra);
    for (std::size_t e = 0; e < p.size(); ++e) out[e] += extra[e];
    excess = clip(out, tokens);
  }
  while (excess > 0) {
    const std::size_t e = roomiest(p, out, tokens);
    const std::int64_t x = std::min(excess, tokens - out[e]);
    out[e] += x;
    excess -= x;
  }
}

// ---- the generator's per-row steps -------------------------------------------------------------

void softmax(std::span<double> x) {
  const double top = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (auto& v : x) sum += (v = std::exp(v - top));
  for (auto& v : x) v /= sum;
}

// Hot-spot knob (HarMoEny style): p' = (1 - h) p + h/m on each of the m hot experts. A hot expert
// gets at most 1/k (the cap: one slot per token) unless p alone already gave it more; what the cap
// refuses goes back to the other experts in proportion to their p'.
void apply_hot_spot(std::span<double> p, const std::vector<int>& hot, double h, int top_k) {
  const double cap = 1.0 / top_k;
  std::vector<double> before(hot.size());
  for (std::size_t i = 0; i < hot.size(); ++i) before[i] = p[hot[i]];
  for (auto& v : p) v *= 1 - h;
  double refused = 0, hot_mass = 0;
  for (std::size_t i = 0; i < hot.size(); ++i) {
    double& v = p[hot[i]];
    v += h / double(hot.size());
    const double limit = std::max(cap, before[i]);
    if (v > limit) {
      refused += v - limit;
      v = limit;
    }
    hot_mass += v;
  }
  const double others = 1 - hot_mass - refused;
  if (refused == 0 || others <= 0) return;
  std::vector<bool> is_hot(p.size(), false);
  for (int e : hot) is_hot[e] = true;
  for (std::size_t e = 0; e < p.size(); ++e)
    if (!is_hot[e]) p[e] *= 1 + refused / others;
}

}  // namespace

// ---- public samplers ------------------------------------------------------------------------

double sample_normal(Rng& rng) { return normal(rng); }

std::int64_t sample_binomial(Rng& rng, std::int64_t n, double p) {
  if (n <= 0 || !(p > 0)) return 0;
  if (p >= 1) return n;
  const bool flip = p > 0.5;  // sample the rarer outcome
  const double q = flip ? 1 - p : p;
  const std::int64_t x = double(n) * q < 10 ? binomial_inversion(rng, n, q) : binomial_btrs(rng, n, q);
  return flip ? n - x : x;
}

std::vector<std::int64_t> sample_multinomial(Rng& rng, std::int64_t n, const std::vector<double>& p) {
  std::vector<std::int64_t> out(p.size());
  multinomial_into(rng, n, p, out);
  return out;
}

std::vector<std::int64_t> sample_capped(Rng& rng, std::int64_t tokens, int top_k, const std::vector<double>& p) {
  std::vector<std::int64_t> out(p.size());
  capped_into(rng, tokens, top_k, p, out);
  return out;
}

// ---- presets --------------------------------------------------------------------------------

std::vector<std::string> generator_presets() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

GeneratorParams resolve_generator(const spec::GeneratorSpec& spec) {
  const std::string name = spec.preset().empty() ? "naive" : spec.preset();
  const auto* preset = std::find_if(std::begin(kPresets), std::end(kPresets), [&](const Preset& p) { return name == p.name; });
  require(preset != std::end(kPresets), "preset",
          fmt::format("unknown preset '{}'; use one of: {}", name, fmt::join(generator_presets(), ", ")));
  GeneratorParams p = preset->params;
  if (spec.has_sigma_pop()) p.sigma_pop = spec.sigma_pop();
  if (spec.has_zipf_exponent()) p.zipf_exponent = spec.zipf_exponent();
  if (spec.has_dead_fraction()) p.dead_fraction = spec.dead_fraction();
  if (spec.has_sigma_slow()) p.sigma_slow = spec.sigma_slow();
  if (spec.has_tau()) p.tau = spec.tau();
  if (spec.has_sigma_fast()) p.sigma_fast = spec.sigma_fast();
  if (spec.has_sigma_src()) p.sigma_src = spec.sigma_src();
  if (spec.has_warmup_iterations()) p.warmup_iterations = to_int(spec.warmup_iterations());
  if (spec.has_transient_iterations()) p.transient_iterations = to_int(spec.transient_iterations());
  if (spec.has_pop_growth()) p.pop_growth = spec.pop_growth();
  if (spec.has_growth_iterations()) p.growth_iterations = to_int(spec.growth_iterations());
  if (spec.has_switch_probability()) p.switch_probability = spec.switch_probability();
  if (spec.has_hot_fraction()) p.hot_fraction = spec.hot_fraction();
  if (spec.has_hot_experts()) p.hot_experts = to_int(spec.hot_experts());
  validate(p);
  return p;
}

// ---- presets fitted to a paper's workload ---------------------------------------------------

namespace {

constexpr int kCheckExperts = 16;

// The preset's layers as the papers' 16-expert figures count them: 600 layers (one iteration each)
// of 16 experts and 16 sources of 1,024 tokens, top-k; per layer each expert's share of the
// token-slots, hottest first.
std::vector<std::vector<double>> layer_shares(const GeneratorParams& p, int top_k) {
  constexpr int kLayers = 600;
  GatingGenerator g(p, kCheckExperts, top_k, kLayers, kCheckExperts, 1024, 1);
  std::vector<std::vector<double>> shares;
  for (int l = 0; l < kLayers; ++l) {
    const auto loads = g.next(l).expert_loads();
    std::vector<double> share(loads.begin(), loads.end());
    std::sort(share.rbegin(), share.rend());
    const double total = std::accumulate(share.begin(), share.end(), 0.0);
    for (auto& x : share) x /= total;
    shares.push_back(std::move(share));
  }
  return shares;
}

// The median over layers (or another quantile) of f(a layer's shares, hottest first).
template <class F>
double over_layers(const std::vector<std::vector<double>>& shares, double q, F f) {
  std::vector<double> v;
  for (const auto& s : shares) v.push_back(f(s));
  return quantile(std::move(v), q);
}

// Pro-Prophet Fig. 3 (docs/spec/pro-prophet.md §4): "In most MoE layers, the three heaviest experts hold over
// 50% of inputs, while the three least less than 5%", on a model of 12 MoE layers x 16 experts, one
// per device. Measured here on 600 layers (50 such models, one iteration each) of 16 sources of 1,024
// tokens (Pro-Prophet's tokens per GPU), top-1: "most layers" read as two thirds, so the statistic is
// the lower tercile of the layers' top-3 share, targeted at 0.50.
struct Fig3 {
  double top3_tercile, top3_median, bottom3_median;
};
Fig3 pro_prophet_fig3(const GeneratorParams& p) {
  const auto shares = layer_shares(p, 1);
  auto top3 = [](const std::vector<double>& s) { return s[0] + s[1] + s[2]; };
  auto bottom3 = [](const std::vector<double>& s) { return s[13] + s[14] + s[15]; };
  return {over_layers(shares, 1.0 / 3, top3), over_layers(shares, 0.5, top3), over_layers(shares, 0.5, bottom3)};
}

}  // namespace

std::vector<std::string> fitted_presets() { return {"pro-prophet"}; }

PresetFit fit_preset(const std::string& name) {
  require(name == "pro-prophet", "preset", fmt::format("'{}' is not a fitted preset; fitted: {}", name, fmt::join(fitted_presets(), ", ")));
  spec::GeneratorSpec s;
  s.set_preset(name);
  GeneratorParams p = resolve_generator(s);
  PresetFit fit;
  fit.preset = name;
  fit.statistic =
      "lower tercile over layers of the 3 hottest of 16 experts' share of tokens (\"in most MoE layers, the three heaviest "
      "experts hold over 50% of inputs\")";
  fit.source = "docs/spec/pro-prophet.md §4, Fig. 3";
  fit.target = 0.50;
  fit.table_sigma_pop = p.sigma_pop;
  const Fig3 table = pro_prophet_fig3(p);
  fit.table_reached = table.top3_tercile;
  fit.others = {{"median top-3 share (paper: over 50% in most layers)", table.top3_median},
                {"median bottom-3 share (paper: less than 5%)", table.bottom3_median}};
  double lo = 0.05, hi = 5;  // the share grows with sigma_pop
  for (int i = 0; i < 30; ++i) {
    p.sigma_pop = (lo + hi) / 2;
    (pro_prophet_fig3(p).top3_tercile < fit.target ? lo : hi) = p.sigma_pop;
  }
  p.sigma_pop = (lo + hi) / 2;
  fit.fitted_sigma_pop = p.sigma_pop;
  fit.fitted_reached = pro_prophet_fig3(p).top3_tercile;
  return fit;
}

// FasterMoE Fig. 4 (docs/spec/fastermoe.md §7): "4 out of 16 experts are processing about 20% of all
// tokens, 3.2x the average", each of them (3.2 x 1/16 = 20%), so about 80% together. Measured on
// layer_shares' 600 layers, top-2 (FasterMoE's gate; 1,024 tokens a source, as its GPT runs): the
// medians over the layers.
std::vector<PresetCheck> preset_checks() {
  spec::GeneratorSpec s;
  s.set_preset("naive");
  const auto shares = layer_shares(resolve_generator(s), 2);
  const double top4 = over_layers(shares, 0.5, [](const std::vector<double>& x) { return x[0] + x[1] + x[2] + x[3]; });
  const double hottest = over_layers(shares, 0.5, [](const std::vector<double>& x) { return x[0] * kCheckExperts; });
  const std::string setup = "FasterMoE's (johnny and trevor)", calibration = "the SmartMoE trace (docs/spec/gating-traces.md §6)",
                    source = "FasterMoE Fig. 4, docs/spec/fastermoe.md §7";
  return {{"naive", setup, calibration, source, "the 4 hottest of 16 experts' share of the token-slots", 0.80, top4},
          {"naive", setup, calibration, source, "the hottest expert's token-slots over the mean", 3.2, hottest}};
}

// ---- the generator --------------------------------------------------------------------------

struct GatingGenerator::Layer {
  Layer(std::uint64_t seed, int layer)
      : process(derive_seed(seed, kProcessStream, std::uint64_t(layer))),
        sampling(derive_seed(seed, kSamplingStream, std::uint64_t(layer))) {}
  Rng process, sampling;
  std::int64_t iteration = 0;
  std::vector<double> mu;     // base log-popularity before growth; -inf = dead
  std::vector<int> live;      // experts with finite mu
  std::vector<double> d;      // slow OU drift
  std::vector<float> delta;   // sources × experts source offsets (float: half the memory)
  std::vector<double> bias;   // added to every source's logits (set_logit_bias); empty: none
};

namespace {

// mu: sigma_pop · N(0, 1), or log(1/rank^s) over a seeded permutation (the Zipf popularity of
// routing.hpp, whose normalisation is a constant offset that softmax ignores).
std::vector<double> base_popularity(const GeneratorParams& params, int experts, Rng& rng) {
  std::vector<double> mu(experts);
  if (params.zipf_exponent > 0) {
    spec::GatingSpec zipf;
    zipf.mutable_zipf()->set_exponent(params.zipf_exponent);
    const auto p = expert_popularity(zipf, experts, rng);
    std::transform(p.begin(), p.end(), mu.begin(), [](double x) { return std::log(x); });
  } else {
    for (auto& m : mu) m = params.sigma_pop * sample_normal(rng);
  }
  return mu;
}

// Dead experts: each dies with probability dead_fraction. Choice where the notes are silent: at
// least top_k stay alive (a token needs k distinct experts), random dead ones revive until so.
std::vector<int> kill_experts(double dead_fraction, int top_k, std::vector<double>& mu, Rng& rng) {
  std::vector<int> live, dead;
  for (int e = 0; e < int(mu.size()); ++e) (rng.uniform() < dead_fraction ? dead : live).push_back(e);
  while (int(live.size()) < top_k) {
    const auto i = rng.below(dead.size());
    live.push_back(dead[i]);
    dead.erase(dead.begin() + std::ptrdiff_t(i));
  }
  for (int e : dead) mu[e] = -kInf;
  std::sort(live.begin(), live.end());
  return live;
}

// OU parameters at iteration t: the transient phase has sigma_slow × 3 and tau / 10.
std::pair<double, double> drift_sigma_tau(const GeneratorParams& p, std::int64_t t) {
  const bool transient = t < p.transient_iterations;
  return {p.sigma_slow * (transient ? 3 : 1), p.tau / (transient ? 10 : 1)};
}

// The m hottest experts by the layer's logits (growth · mu + d, before noise and source offsets:
// all sources push the same experts). m is at most the number of live experts.
std::vector<int> hottest(const std::vector<double>& logits, int m, int live) {
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto mid = order.begin() + std::min(m, live);
  std::partial_sort(order.begin(), mid, order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  order.erase(mid, order.end());
  return order;
}

}  // namespace

GatingGenerator::GatingGenerator(const GeneratorParams& params, int experts, int top_k, int layers, int sources,
                                 std::int64_t tokens_per_source, std::uint64_t seed, const GroupLimit& limit)
    : params_(params), limit_(limit), experts_(experts), top_k_(top_k), sources_(sources), tokens_(tokens_per_source) {
  layers_.reserve(layers);
  for (int l = 0; l < layers; ++l) {
    Layer& L = layers_.emplace_back(seed, l);
    L.mu = base_popularity(params_, experts_, L.process);
    L.live = kill_experts(params_.dead_fraction, top_k_, L.mu, L.process);
    // d starts from its stationary law N(0, sigma_slow²) (the notes do not say; this way the
    // drift statistics hold from iteration 0).
    L.d.resize(experts_);
    fill_normal(L.process, L.d);
    const double sigma_slow = drift_sigma_tau(params_, 0).first;
    for (auto& x : L.d) x *= sigma_slow;
    std::vector<double> z(std::size_t(sources_) * experts_);
    fill_normal(L.sampling, z);
    L.delta.resize(z.size());
    std::transform(z.begin(), z.end(), L.delta.begin(), [&](double x) { return float(params_.sigma_src * x); });
  }
}

GatingGenerator::~GatingGenerator() = default;
GatingGenerator::GatingGenerator(GatingGenerator&&) noexcept = default;
GatingGenerator& GatingGenerator::operator=(GatingGenerator&&) noexcept = default;

void GatingGenerator::set_logit_bias(int layer, std::vector<double> bias) { layers_.at(std::size_t(layer)).bias = std::move(bias); }

RoutingMatrix GatingGenerator::next(int layer) {
  Layer& L = layers_.at(std::size_t(layer));
  const std::int64_t t = L.iteration++;
  const auto& P = params_;
  // Regime switch: swap the mu of two live experts.
  Rng& rng = L.process;
  if (P.switch_probability > 0 && L.live.size() >= 2 && rng.uniform() < P.switch_probability) {
    const auto i = rng.below(L.live.size()), j = (i + 1 + rng.below(L.live.size() - 1)) % L.live.size();
    std::swap(L.mu[L.live[i]], L.mu[L.live[j]]);
  }
  // The layer's logits growth(t) · mu + d_t, common to all sources.
  const double growth = P.pop_growth == 0 ? 1 : 1 + P.pop_growth * std::min(1.0, double(t) / P.growth_iterations);
  std::vector<double> common(experts_);
  for (int e = 0; e < experts_; ++e) common[e] = growth * L.mu[e] + L.d[e];
  // A dead expert whose bias has risen (auxiliary-loss-free balancing) is the coldest live one less
  // max(σ_pop, 1): its −inf stands for a gate that has stopped picking it, which is what the bias
  // corrects; finite, the bias can raise it (choice: docs/gating.md).
  if (!L.bias.empty() && int(L.live.size()) < experts_) {
    double coldest = std::numeric_limits<double>::infinity();
    for (int e : L.live) coldest = std::min(coldest, common[e]);
    for (int e = 0; e < experts_; ++e)
      if (std::isinf(common[e]) && L.bias[std::size_t(e)] > 0) common[e] = coldest - std::max(P.sigma_pop, 1.0);
  }
  const auto hot = P.hot_fraction > 0 ? hottest(common, P.hot_experts, int(L.live.size())) : std::vector<int>{};
  const double scale = t < P.warmup_iterations ? kWarmupScale : 1;

  RoutingMatrix R(sources_, experts_);
  std::vector<double> p(experts_);
  std::vector<std::int64_t> row(static_cast<std::size_t>(experts_));
  std::vector<TokenSpread> spreads;  // counted where tokens are drawn one by one
  if (limit_.on())
    for (int b : spread_blocks_) spreads.push_back({b, experts_ / b, std::vector<std::int32_t>(std::size_t(sources_) * std::size_t(experts_ / b), 0)});
  for (int s = 0; s < sources_; ++s) {
    fill_normal(L.sampling, p);  // eps / sigma_fast
    const float* delta = &L.delta[std::size_t(s) * experts_];
    for (int e = 0; e < experts_; ++e) p[e] = scale * (common[e] + P.sigma_fast * p[e] + delta[e]);
    if (!L.bias.empty())
      for (int e = 0; e < experts_; ++e) p[e] += L.bias[std::size_t(e)];
    softmax(p);
    if (!hot.empty()) apply_hot_spot(p, hot, P.hot_fraction, top_k_);
    if (limit_.on()) {  // token by token, each within its groups
      std::fill(row.begin(), row.end(), 0);
      if (spreads.empty())
        sample_tokens_into(p, int(tokens_), top_k_, limit_, L.sampling, row);
      else
        sample_tokens_into(p, int(tokens_), top_k_, limit_, L.sampling, row, spreads, s);
    } else {
      capped_into(L.sampling, tokens_, top_k_, p, row);
    }
    std::copy(row.begin(), row.end(), R.mutable_counts().begin() + std::ptrdiff_t(s) * experts_);  // each at most tokens_
  }
  if (!spreads.empty()) R.set_spreads(std::move(spreads));
  // OU step to d_{t+1}: d = a d + sigma_slow sqrt(1 - a²) N(0, 1), a = exp(-1/tau).
  const auto [sigma, tau] = drift_sigma_tau(P, t);
  const double a = std::exp(-1 / tau), b = sigma * std::sqrt(1 - a * a);
  fill_normal(L.process, p);
  for (int e = 0; e < experts_; ++e) L.d[e] = a * L.d[e] + b * p[e];
  return R;
}

}  // namespace moesim
