// Where tokens go: per MoE layer, a source-GPU × expert matrix of token counts, and seeded
// generators for it. Portable: the same seed gives the same matrix with any compiler or library
// (a fixed PRNG and our own samplers, never std::*_distribution).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "count_vector.hpp"
#include "moesim.pb.h"

namespace moesim {

/// Distinct tokens per source and block of `block` consecutive experts: a token that chose several
/// experts of one block counts once there. With a GPU's experts as the block these are DeepEP's
/// num_tokens_per_rank, with a node's its num_tokens_per_rdma_rank (deepseek-ai/DeepEP
/// get_dispatch_layout): what a dispatcher that sends a token once per GPU, or once per node, sends.
struct TokenSpread {
  int block = 1;                      // experts per block; it must divide the experts
  int blocks = 0;                     // experts / block (set by the sampler)
  std::vector<std::int32_t> counts;   // [source · blocks + b]
  std::int64_t at(int source, int b) const { return counts[std::size_t(source) * std::size_t(blocks) + std::size_t(b)]; }
};

/// counts()[src · experts + e] = tokens that GPU `src` routes to expert `e` (one token-slot per
/// token and chosen expert, so a row sums to tokens × k).
///
/// Copies share the counts until one is changed (copy on write, through mutable_counts() or
/// mutable_at()): a policy's plans copy each layer's routing and an expert-per-GPU all-to-all sends
/// the very same matrix (shared_counts()), which at 4,096 GPUs is 32 MiB a layer (sampled: 16
/// bits a count; a change widens it to 32).
class RoutingMatrix {
 public:
  int sources = 0, experts = 0;

  RoutingMatrix() : counts_(std::make_shared<CountVector>()) {}
  RoutingMatrix(int s, int e)
      : sources(s), experts(e), counts_(std::make_shared<CountVector>(std::vector<std::int32_t>(std::size_t(s) * std::size_t(e), 0))) {}
  /// Takes `counts`, sources × experts of them, row by row.
  RoutingMatrix(int s, int e, CountVector counts);
  RoutingMatrix(int s, int e, std::vector<std::int32_t> counts) : RoutingMatrix(s, e, CountVector(std::move(counts))) {}

  const CountVector& counts() const { return *counts_; }
  std::int64_t at(int src, int e) const { return (*counts_)[std::size_t(src) * std::size_t(experts) + std::size_t(e)]; }
  /// The counts, to change: this matrix's own (copied first if another matrix shares them).
  std::vector<std::int32_t>& mutable_counts();
  std::int32_t& mutable_at(int src, int e) { return mutable_counts()[std::size_t(src) * std::size_t(experts) + std::size_t(e)]; }
  /// The counts, shared read-only (with an all-to-all's bytes): they never change, as a change to
  /// this matrix copies them first.
  std::shared_ptr<const CountVector> shared_counts() const { return counts_; }

  /// Token spreads the sampler counted with these counts (shared between copies), or nullptr for
  /// a block it did not count; a change to the counts drops them all, as they would no longer hold.
  const TokenSpread* spread(int block) const;
  void set_spreads(std::vector<TokenSpread> spreads);

  /// Sources [from, to), with their token spreads (an EP group's GPUs).
  RoutingMatrix rows(int from, int to) const;

  std::int64_t expert_load(int e) const;
  /// expert_load() of every expert, in one pass over the rows (a column's entries are a row apart).
  std::vector<std::int64_t> expert_loads() const;
  std::int64_t row_sum(int src) const;
  /// The largest (source, expert) count: the capacity that drops nothing.
  std::int64_t largest_count() const;

 private:
  std::shared_ptr<CountVector> counts_;
  std::shared_ptr<const std::vector<TokenSpread>> spreads_;
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

/// Group-limited (DeepSeek-V3's node-limited) routing: the experts in `groups` equal groups of
/// consecutive experts, each token's top-k within at most `per_token` of them (ModelSpec
/// expert_groups, group_limit). Off when either is 0.
struct GroupLimit {
  int groups = 0, per_token = 0;
  bool on() const { return groups > 0 && per_token > 0 && per_token < groups; }
};


/// Each of `tokens` tokens on each source picks `top_k` distinct experts with probability ∝
/// `popularity` (sampling without replacement, as a top-k gate does), within its groups' limit.
/// `spreads`: also counted, each for its block (std::invalid_argument for a block that does not
/// divide the experts); the same draws, so the same matrix, as without.
RoutingMatrix sample_routing(const std::vector<double>& popularity, int sources, int tokens, int top_k, Rng& rng,
                             const GroupLimit& limit = {}, std::vector<TokenSpread>* spreads = nullptr);
/// One source's row of sample_routing(): `tokens` tokens' top-k added to row[expert].
void sample_tokens_into(const std::vector<double>& popularity, int tokens, int top_k, const GroupLimit& limit, Rng& rng,
                        std::vector<std::int64_t>& row);
/// The same, also counting the tokens into row `source` of each spread (sized by the caller:
/// blocks set, counts sources × blocks).
void sample_tokens_into(const std::vector<double>& popularity, int tokens, int top_k, const GroupLimit& limit, Rng& rng,
                        std::vector<std::int64_t>& row, std::vector<TokenSpread>& spreads, int source);

/// The routing of one layer in one iteration, reproducible from (seed, iteration, layer).
/// `spread_blocks`: the token spreads to count with it (RoutingMatrix::spread()), e.g. a GPU's and
/// a node's experts for DeepEP's dispatch.
RoutingMatrix generate_routing(const spec::GatingSpec& gating, int sources, int experts, int tokens, int top_k,
                               std::uint64_t seed, int iteration, int layer, const GroupLimit& limit = {},
                               const std::vector<int>& spread_blocks = {});

}  // namespace moesim
