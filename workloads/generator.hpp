// The seeded synthetic gating generator (docs/spec/gating-traces.md §6): log-normal (or Zipf)
// base popularity per layer, dead experts, slow OU drift, fast noise, per-source offsets, warm-up
// and transient phases, rare regime switches, the hot-spot knob, and multinomial sampling with the
// top-k per-token cap so that rows sum exactly to tokens × k. Portable: same seed, same trace, on
// any machine (our own samplers over Rng, never std::*_distribution).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moesim.pb.h"
#include "routing.hpp"

namespace moesim {

/// Every parameter of the generator, after the preset and the spec's overrides (see GeneratorSpec
/// in proto/moesim.proto for their meaning).
struct GeneratorParams {
  double sigma_pop = 0;
  double zipf_exponent = 0;  // > 0: Zipf base popularity instead of log-normal
  double dead_fraction = 0;
  double sigma_slow = 0;
  double tau = 1;
  double sigma_fast = 0;
  double sigma_src = 0;
  int warmup_iterations = 0;
  int transient_iterations = 0;
  double pop_growth = 0;
  int growth_iterations = 0;
  double switch_probability = 0;
  double hot_fraction = 0;
  int hot_experts = 1;
};

/// Names of the presets: naive, aux, concentrated, pro-prophet.
std::vector<std::string> generator_presets();

/// A preset fitted to a statistic a paper reports of its own workload (`moesim trace fit NAME`):
/// sigma_pop found by bisection, the preset's other parameters as the table has them.
struct PresetFit {
  std::string preset, statistic, source;
  double target = 0;
  double table_sigma_pop = 0, table_reached = 0;  // the preset as the table has it, and its statistic
  double fitted_sigma_pop = 0, fitted_reached = 0;
  std::vector<std::pair<std::string, double>> others;  // other statistics of the table's preset, for the reader
};
/// The presets that are fitted: "pro-prophet".
std::vector<std::string> fitted_presets();
/// Evaluates `name`'s statistic as the table has it and fits sigma_pop to its target again.
/// FieldError("preset") for a preset that is not fitted.
PresetFit fit_preset(const std::string& name);

/// A preset a paper's setup draws without being fitted to that paper (`naive`: the notes'
/// calibration to the SmartMoE trace), beside what the paper says of its own workload.
struct PresetCheck {
  std::string preset, setup, calibration, source, statistic;
  double paper = 0, reached = 0;  // the paper's value and the preset's (median over 600 layers)
};
/// FasterMoE's setups (`naive`) against Fig. 4: the 4 hottest of 16 experts' share of the
/// token-slots, and the hottest one's over the mean.
std::vector<PresetCheck> preset_checks();

/// The spec's preset (default "naive") with the spec's set fields applied. FieldError with the
/// field name ("preset", "sigma_pop", ...) for an unknown preset or a value out of range.
GeneratorParams resolve_generator(const spec::GeneratorSpec& spec);

/// Generates routing matrices layer by layer. Each layer has its own random streams, seeded from
/// (seed, layer): layers are independent of each other and of the order in which they are asked
/// for. Within a layer, iterations come in order 0, 1, 2, ... (the drift is a process). The
/// popularity process (mu, dead experts, drift, switches) has a stream apart from the sampling, so
/// the same seed gives the same popularity trajectory whatever the sources, tokens or hot-spot knob.
/// At least top_k experts stay alive whatever dead_fraction; top_k <= experts.
class GatingGenerator {
 public:
  /// With a group limit on, each source's tokens are drawn one by one (sample_tokens_into()).
  GatingGenerator(const GeneratorParams& params, int experts, int top_k, int layers, int sources,
                  std::int64_t tokens_per_source, std::uint64_t seed, const GroupLimit& limit = {});
  ~GatingGenerator();
  GatingGenerator(GatingGenerator&&) noexcept;
  GatingGenerator& operator=(GatingGenerator&&) noexcept;

  /// The next iteration's matrix of `layer` (std::out_of_range past the layers): sources × experts;
  /// each row sums to tokens_per_source × top_k exactly and no cell exceeds tokens_per_source.
  RoutingMatrix next(int layer);
  /// With a group limit on, also count each matrix's token spreads of these blocks
  /// (RoutingMatrix::spread(): DeepEP's dispatch); the same draws.
  void count_spreads(std::vector<int> blocks) { spread_blocks_ = std::move(blocks); }
  /// Adds bias[e] to every source's logit of expert e in `layer` from the next draw on (a gate's
  /// per-expert bias: auxiliary-loss-free balancing, gating.cpp); the draws stay the same.
  void set_logit_bias(int layer, std::vector<double> bias);

 private:
  struct Layer;
  GeneratorParams params_;
  GroupLimit limit_;
  std::vector<int> spread_blocks_;
  int experts_, top_k_, sources_;
  std::int64_t tokens_;
  std::vector<Layer> layers_;
};

// Portable samplers over Rng.

/// Standard normal deviate.
double sample_normal(Rng& rng);
/// Binomial(n, p), exact.
std::int64_t sample_binomial(Rng& rng, std::int64_t n, double p);
/// Multinomial(n, p) by conditional binomials; p need not sum to one.
std::vector<std::int64_t> sample_multinomial(Rng& rng, std::int64_t n, const std::vector<double>& p);
/// Multinomial(tokens·k, p) with the top-k cap: no cell above `tokens`; the excess is water-filled
/// onto cells below the cap in proportion to p. The sum stays tokens·k exactly.
std::vector<std::int64_t> sample_capped(Rng& rng, std::int64_t tokens, int top_k, const std::vector<double>& p);

}  // namespace moesim
