// Where tokens go: per MoE layer, a source-GPU × expert matrix of token counts, and seeded
// generators for it. Portable: the same seed gives the same matrix with any compiler or library
// (a fixed PRNG and our own samplers, never std::*_distribution).
#pragma once
#include <cstdint>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

/// counts[src · experts + e] = tokens that GPU `src` routes to expert `e` (one token-slot per
/// token and chosen expert, so a row sums to tokens × k).
struct RoutingMatrix {
  int sources = 0, experts = 0;
  std::vector<std::int32_t> counts;  // a cell is at most tokens × top_k of one GPU: int32 halves the biggest matrices

  RoutingMatrix() = default;
  RoutingMatrix(int s, int e) : sources(s), experts(e), counts(std::size_t(s) * e, 0) {}
  std::int32_t& at(int src, int e) { return counts[std::size_t(src) * experts + e]; }
  std::int64_t at(int src, int e) const { return counts[std::size_t(src) * experts + e]; }
  std::int64_t expert_load(int e) const;
  std::int64_t row_sum(int src) const;
  /// The largest (source, expert) count: the capacity that drops nothing.
  std::int64_t largest_count() const;
};

/// xoshiro256** seeded by splitmix64: small, fast, identical everywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  std::uint64_t next();
  double uniform();                      // [0, 1) with 53 random bits
  std::uint64_t below(std::uint64_t n);  // uniform in [0, n), unbiased
 private:
  std::uint64_t s_[4];
};

/// Mixes a seed with stream coordinates (iteration, layer, ...) into an independent seed.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0);

/// Expert popularity of one layer under a gating spec: uniform, or Zipf over a seeded permutation.
std::vector<double> expert_popularity(const spec::GatingSpec& gating, int experts, Rng& rng);

/// Each of `tokens` tokens on each source picks `top_k` distinct experts with probability ∝
/// `popularity` (sampling without replacement, as a top-k gate does).
RoutingMatrix sample_routing(const std::vector<double>& popularity, int sources, int tokens, int top_k, Rng& rng);

/// The routing of one layer in one iteration, reproducible from (seed, iteration, layer).
RoutingMatrix generate_routing(const spec::GatingSpec& gating, int sources, int experts, int tokens, int top_k,
                               std::uint64_t seed, int iteration, int layer);

}  // namespace moesim
