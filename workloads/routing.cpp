#include "routing.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace moesim {
namespace {

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Vose's alias method: O(1) draws from a discrete distribution.
class AliasTable {
 public:
  explicit AliasTable(const std::vector<double>& weights) : entries_(weights.size()) {
    const std::size_t n = weights.size();
    std::vector<double> prob(n);
    std::vector<std::size_t> alias(n);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<double> scaled(n);
    std::vector<std::size_t> small, large;
    for (std::size_t i = 0; i < n; ++i) {
      scaled[i] = weights[i] * double(n) / total;
      (scaled[i] < 1.0 ? small : large).push_back(i);
    }
    while (!small.empty() && !large.empty()) {
      const std::size_t s = small.back(), l = large.back();
      small.pop_back();
      prob[s] = scaled[s];
      alias[s] = l;
      scaled[l] -= 1.0 - scaled[s];
      if (scaled[l] < 1.0) {
        large.pop_back();
        small.push_back(l);
      }
    }
    for (auto i : large) prob[i] = 1.0;
    for (auto i : small) prob[i] = 1.0;
    // The coin u = k · 2^-53 (Rng::uniform(), k the top 53 bits of a draw) keeps i when u <
    // prob, that is when k < prob · 2^53 (exact: a power of two), that is k < ⌈prob · 2^53⌉.
    for (std::size_t i = 0; i < n; ++i) entries_[i] = {std::uint64_t(std::ceil(std::ldexp(prob[i], 53))), std::uint64_t(alias[i])};
    if (n > 1 && (n & (n - 1)) == 0) shift_ = 64 - std::countr_zero(n);
  }
  bool pow2() const { return shift_ < 64; }
  /// kPow2: the table's size is a power of two (pow2()): its index is the draw's top bits, as
  /// Rng::below() gives them (Lemire's rejection threshold is 0 there), without below()'s
  /// multiplication and test (12% of a draw; EP at 4,096 GPUs has 4,096 experts).
  template <bool kPow2 = false>
  std::size_t draw(Rng& rng) const {
    const Entry& e = entries_[kPow2 ? std::size_t(rng.next() >> shift_) : rng.below(entries_.size())];
    const std::size_t i = std::size_t(&e - entries_.data());
    // i or its alias without a branch: the coin is unpredictable, and a mispredicted branch
    // per draw was a third of the routing's time (100 million draws at 1,024 GPUs).
    const std::size_t keep = std::size_t(0) - std::size_t((rng.next() >> 11) < e.threshold);
    return (i & keep) | (e.alias & ~keep);
  }

 private:
  // An expert's coin threshold and alias side by side: one cache line a draw, where the two
  // arrays of a 4,096-expert table (32 KiB each) missed the L1 cache twice.
  struct Entry {
    std::uint64_t threshold;  // ⌈prob · 2^53⌉
    std::uint64_t alias;
  };
  std::vector<Entry> entries_;
  int shift_ = 64;  // 64 − log2(size) when the size is a power of two
};

}  // namespace

RoutingMatrix::RoutingMatrix(int s, int e, CountVector counts)
    : sources(s), experts(e), counts_(std::make_shared<CountVector>(std::move(counts))) {
  if (counts_->size() != std::size_t(s) * std::size_t(e)) throw std::logic_error("RoutingMatrix: counts of another shape");
}

std::vector<std::int32_t>& RoutingMatrix::mutable_counts() {
  if (counts_.use_count() > 1) counts_ = std::make_shared<CountVector>(*counts_);
  spreads_.reset();
  return counts_->widen();
}

const TokenSpread* RoutingMatrix::spread(int block) const {
  if (spreads_)
    for (const auto& t : *spreads_)
      if (t.block == block) return &t;
  return nullptr;
}

RoutingMatrix RoutingMatrix::rows(int from, int to) const {
  if (from < 0 || to > sources || from > to) throw std::logic_error("RoutingMatrix::rows: out of range");
  const auto E = std::size_t(experts);
  RoutingMatrix out(to - from, experts, counts().visit([&](const auto* all) {
    using T = std::remove_cvref_t<decltype(*all)>;
    return CountVector(std::vector<T>(all + std::size_t(from) * E, all + std::size_t(to) * E));
  }));
  if (spreads_) {
    std::vector<TokenSpread> mine;
    for (const auto& t : *spreads_) {
      const auto B = std::size_t(t.blocks);
      mine.push_back({t.block, t.blocks,
                      std::vector<std::int32_t>(t.counts.begin() + std::ptrdiff_t(std::size_t(from) * B),
                                                t.counts.begin() + std::ptrdiff_t(std::size_t(to) * B))});
    }
    out.set_spreads(std::move(mine));
  }
  return out;
}

void RoutingMatrix::set_spreads(std::vector<TokenSpread> spreads) {
  for (const auto& t : spreads)
    if (t.counts.size() != std::size_t(sources) * std::size_t(t.blocks) || t.blocks * t.block != experts)
      throw std::logic_error("RoutingMatrix: a token spread of another shape");
  spreads_ = std::make_shared<const std::vector<TokenSpread>>(std::move(spreads));
}

std::int64_t RoutingMatrix::largest_count() const {
  const auto& c = counts();
  return c.visit([&](const auto* all) { return c.empty() ? 0 : std::int64_t(*std::max_element(all, all + c.size())); });
}

std::int64_t RoutingMatrix::expert_load(int e) const {
  std::int64_t sum = 0;
  for (int s = 0; s < sources; ++s) sum += at(s, e);
  return sum;
}

std::vector<std::int64_t> RoutingMatrix::expert_loads() const {
  std::vector<std::int64_t> load(std::size_t(experts), 0);
  counts().visit([&](const auto* row) {
    for (int s = 0; s < sources; ++s, row += experts)
      for (int e = 0; e < experts; ++e) load[std::size_t(e)] += row[e];
  });
  return load;
}

std::int64_t RoutingMatrix::row_sum(int src) const {
  std::int64_t sum = 0;
  for (int e = 0; e < experts; ++e) sum += at(src, e);
  return sum;
}

Rng::Rng(std::uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

std::uint64_t Rng::below(std::uint64_t n) {
  // Lemire's nearly divisionless method with rejection: exact and portable.
  unsigned __int128 m = (unsigned __int128)next() * n;
  auto low = std::uint64_t(m);
  if (low < n) {
    const std::uint64_t threshold = -n % n;
    while (low < threshold) {
      m = (unsigned __int128)next() * n;
      low = std::uint64_t(m);
    }
  }
  return std::uint64_t(m >> 64);
}

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = seed;
  std::uint64_t h = splitmix64(x);
  x = h ^ (a * 0xd1b54a32d192ed03ull);
  h = splitmix64(x);
  x = h ^ (b * 0xabc98388fb8fac03ull);
  return splitmix64(x);
}

std::vector<double> expert_popularity(const spec::GatingSpec& gating, int experts, Rng& rng) {
  std::vector<double> p(experts, 1.0);
  if (gating.has_zipf()) {
    // Fisher-Yates permutation of ranks, then p_e = 1 / rank^s.
    std::vector<int> rank(experts);
    std::iota(rank.begin(), rank.end(), 1);
    for (int i = experts - 1; i > 0; --i) std::swap(rank[i], rank[rng.below(std::uint64_t(i) + 1)]);
    for (int e = 0; e < experts; ++e) p[e] = 1.0 / std::pow(double(rank[e]), gating.zipf().exponent());
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (auto& x : p) x /= total;
  return p;
}

namespace {

// Redraws of an already chosen expert before a token's draw is made exact (draw_excluding()):
// at any popularity a real model's gate would learn, 64 redraws in a row never happen.
constexpr int kRedraws = 64;

// An expert drawn in proportion to `popularity` among those `allowed`: by its cumulative mass;
// when that mass is 0 (popularities too small to sum), the most popular of them.
template <class Allowed>
int draw_excluding(const std::vector<double>& popularity, const Allowed& allowed, Rng& rng) {
  double mass = 0;
  int best = -1;
  for (int x = 0; x < int(popularity.size()); ++x)
    if (allowed(x)) {
      mass += popularity[std::size_t(x)];
      if (best < 0 || popularity[std::size_t(x)] > popularity[std::size_t(best)]) best = x;
    }
  if (!(mass > 0)) return best;
  double u = rng.uniform() * mass;
  for (int x = 0; x < int(popularity.size()); ++x)
    if (allowed(x) && (u -= popularity[std::size_t(x)]) < 0) return x;
  return best;  // u ran past the end by rounding
}

// A token's draw that chose an expert not `allowed` (one it already has, or outside its groups):
// drawn again, up to kRedraws draws in all, then exactly from the allowed experts. Out of line and
// given the generator by value (returned with the expert), so that the samplers' common path keeps
// it in registers.
struct Redrawn {
  int expert;
  Rng rng;
};
template <class Allowed>
[[gnu::noinline]] Redrawn redraw(const AliasTable& table, const std::vector<double>& popularity, const Allowed& allowed, Rng rng) {
  for (int tries = 1; tries < kRedraws; ++tries)
    if (const int x = int(table.draw(rng)); allowed(x)) return {x, rng};
  const int e = draw_excluding(popularity, allowed, rng);
  return {e, rng};
}

// Each token's top_k distinct experts, drawn in proportion to popularity without replacement,
// counted into row. Without replacement: an expert this token already chose is drawn again; a
// skewed enough popularity (the first choices hold nearly all the mass) would redraw for ever, so
// after kRedraws the draw is exact from the experts still allowed, renormalized.
// Group-limited: a token's draws come in the order of its affinities (the first is the likeliest
// to be its highest); the groups of its first draws are its groups, until it has `per_token` of
// them, after which only experts of those groups are drawn. DeepSeek-V3 chooses a token's nodes by
// the sum of its highest affinities on each; this is our reading of it for a gate modelled by
// popularity alone (docs/model.md).
// `on_token(chosen)`, after each token, is given its experts (TokenSpread's counting; a no-op
// otherwise, inlined away).
template <class Row, class OnToken>
void count_tokens_with(const AliasTable& table, const std::vector<double>& popularity, int tokens, int top_k,
                       const GroupLimit& limit, Rng& rng, Row& row, const OnToken& on_token) {
  std::vector<int> chosen(static_cast<std::size_t>(top_k)), groups;
  const int experts = int(popularity.size()), size = limit.on() ? experts / limit.groups : experts;
  for (int t = 0; t < tokens; ++t) {
    groups.clear();
    for (int j = 0; j < top_k; ++j) {
      auto allowed = [&](int x) {
        if (std::find(chosen.begin(), chosen.begin() + j, x) != chosen.begin() + j) return false;
        return !limit.on() || int(groups.size()) < limit.per_token ||
               std::find(groups.begin(), groups.end(), x / size) != groups.end();
      };
      int e = int(table.draw(rng));
      if (!allowed(e)) {
        const Redrawn r = redraw(table, popularity, allowed, rng);
        e = r.expert, rng = r.rng;
      }
      chosen[std::size_t(j)] = e;
      if (limit.on() && std::find(groups.begin(), groups.end(), e / size) == groups.end()) groups.push_back(e / size);
      ++row[std::size_t(e)];
    }
    on_token(chosen);
  }
}

struct NoTokenHook {
  void operator()(const std::vector<int>&) const {}
};

// count_tokens_with() without a group limit: the same draws (a test compares them where a limit
// never binds), in a loop that keeps the generator in registers, 22% faster a draw (EP's routing
// at 4,096 GPUs is 400 million draws).
template <bool kPow2, class Row, class OnToken>
void count_tokens_unlimited(const AliasTable& table, const std::vector<double>& popularity, int tokens, int top_k, Rng& shared,
                            Row& row, const OnToken& on_token) {
  Rng rng = shared;
  std::vector<int> chosen(static_cast<std::size_t>(top_k));
  int* const first = chosen.data();
  auto* const counts = row.data();
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k; ++j) {
      int e = int(table.template draw<kPow2>(rng));
      if (std::find(first, first + j, e) != first + j) [[unlikely]] {
        const Redrawn r = redraw(table, popularity, [&](int x) { return std::find(first, first + j, x) == first + j; }, rng);
        e = r.expert, rng = r.rng;
      }
      first[j] = e;
      ++counts[e];
    }
    on_token(chosen);
  }
  shared = rng;
}

template <class Row, class OnToken = NoTokenHook>
void count_tokens(const AliasTable& table, const std::vector<double>& popularity, int tokens, int top_k,
                  const GroupLimit& limit, Rng& shared, Row& row, const OnToken& on_token = {}) {
  if (!limit.on()) {
    if (table.pow2()) return count_tokens_unlimited<true>(table, popularity, tokens, top_k, shared, row, on_token);
    return count_tokens_unlimited<false>(table, popularity, tokens, top_k, shared, row, on_token);
  }
  Rng rng = shared;  // a local copy the compiler can keep in registers, not one stored back at every draw
  count_tokens_with(table, popularity, tokens, top_k, limit, rng, row, on_token);
  shared = rng;
}

}  // namespace

// A token's hook that counts it once per block it reaches (a block counts the token at its first
// expert there), into row `source` of each spread.
static auto spread_counter(std::vector<TokenSpread>& spreads, int source) {
  return [&spreads, source](const std::vector<int>& chosen) {
    for (auto& t : spreads)
      for (std::size_t j = 0; j < chosen.size(); ++j) {
        const int b = chosen[j] / t.block;
        if (std::none_of(chosen.begin(), chosen.begin() + std::ptrdiff_t(j), [&](int x) { return x / t.block == b; }))
          ++t.counts[std::size_t(source) * std::size_t(t.blocks) + std::size_t(b)];
      }
  };
}

RoutingMatrix sample_routing(const std::vector<double>& popularity, int sources, int tokens, int top_k, Rng& rng,
                             const GroupLimit& limit, std::vector<TokenSpread>* spreads) {
  const int experts = int(popularity.size());
  if (spreads)
    for (auto& t : *spreads) {
      if (t.block < 1 || experts % t.block != 0)
        throw std::invalid_argument("TokenSpread: a block of " + std::to_string(t.block) + " does not divide " +
                                    std::to_string(experts) + " experts");
      t.blocks = experts / t.block;
      t.counts.assign(std::size_t(sources) * std::size_t(t.blocks), 0);
    }
  const AliasTable table(popularity);
  // A source's row is counted in a buffer that stays in the L1 cache, then appended: counted in
  // place, each row's first touches missed the cache (a 4,096-expert matrix is 32 MiB).
  std::vector<std::int32_t> row(static_cast<std::size_t>(experts));
  auto sample = [&](auto counts) {  // counts: an empty vector of the width the cells need
    counts.reserve(std::size_t(sources) * std::size_t(experts));
    for (int s = 0; s < sources; ++s) {
      std::fill(row.begin(), row.end(), 0);
      if (!spreads || spreads->empty()) {
        count_tokens(table, popularity, tokens, top_k, limit, rng, row);
      } else {
        count_tokens(table, popularity, tokens, top_k, limit, rng, row, spread_counter(*spreads, s));
      }
      counts.insert(counts.end(), row.begin(), row.end());
    }
    return RoutingMatrix(sources, experts, CountVector(std::move(counts)));
  };
  // A token's k experts are distinct: a cell is at most `tokens`.
  if (tokens <= std::numeric_limits<std::uint16_t>::max()) return sample(std::vector<std::uint16_t>{});
  return sample(std::vector<std::int32_t>{});
}

void sample_tokens_into(const std::vector<double>& popularity, int tokens, int top_k, const GroupLimit& limit, Rng& rng,
                        std::vector<std::int64_t>& row) {
  const AliasTable table(popularity);
  count_tokens(table, popularity, tokens, top_k, limit, rng, row);
}

void sample_tokens_into(const std::vector<double>& popularity, int tokens, int top_k, const GroupLimit& limit, Rng& rng,
                        std::vector<std::int64_t>& row, std::vector<TokenSpread>& spreads, int source) {
  const AliasTable table(popularity);
  count_tokens(table, popularity, tokens, top_k, limit, rng, row, spread_counter(spreads, source));
}

RoutingMatrix generate_routing(const spec::GatingSpec& gating, int sources, int experts, int tokens, int top_k,
                               std::uint64_t seed, int iteration, int layer, const GroupLimit& limit,
                               const std::vector<int>& spread_blocks) {
  // Popularity is a property of the layer (fixed across iterations); sampling noise is per iteration.
  Rng layer_rng(derive_seed(seed, 0x6c61796572ull, std::uint64_t(layer)));
  const auto popularity = expert_popularity(gating, experts, layer_rng);
  Rng rng(derive_seed(seed, std::uint64_t(iteration) + 1, std::uint64_t(layer)));
  if (spread_blocks.empty()) return sample_routing(popularity, sources, tokens, top_k, rng, limit);
  std::vector<TokenSpread> spreads;
  for (int b : spread_blocks) spreads.push_back({b, 0, {}});
  RoutingMatrix R = sample_routing(popularity, sources, tokens, top_k, rng, limit, &spreads);
  R.set_spreads(std::move(spreads));
  return R;
}

}  // namespace moesim
