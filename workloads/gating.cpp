#include "gating.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <numeric>
#include <optional>

#include "errors.hpp"
#include "generator.hpp"
#include "trace.hpp"
#include "trace_import.hpp"

#include <filesystem>
#include <functional>

namespace moesim {

std::vector<std::int64_t> rescale_row(const std::vector<std::int64_t>& row, std::int64_t total, std::int64_t cap) {
  const std::size_t n = row.size();
  std::vector<double> weight(row.begin(), row.end());
  if (std::accumulate(weight.begin(), weight.end(), 0.0) <= 0) std::fill(weight.begin(), weight.end(), 1.0);
  std::vector<std::int64_t> out(n, 0);
  std::vector<bool> full(n, false);
  std::int64_t left = total;
  // Hand out `left` slots to the cells that are not full, in proportion to weight, largest
  // remainder first; cells that reach the cap are full and the rest goes round again.
  while (left > 0) {
    double w = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!full[i]) w += weight[i];
    if (w <= 0) {  // only zero-weight cells have room: spread evenly over them
      for (std::size_t i = 0; i < n; ++i)
        if (!full[i]) weight[i] = 1, w += 1;
      if (w <= 0) break;  // every cell is full: total > cap × n, cannot be met
    }
    std::vector<std::pair<double, std::size_t>> remainders;
    std::int64_t given = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (full[i]) continue;
      const double share = double(left) * weight[i] / w;
      const auto whole = std::min<std::int64_t>(std::int64_t(share), cap - out[i]);
      out[i] += whole;
      given += whole;
      remainders.emplace_back(-(share - std::floor(share)), i);
    }
    std::sort(remainders.begin(), remainders.end());
    for (const auto& [r, i] : remainders) {
      if (given >= left) break;
      if (out[i] < cap) ++out[i], ++given;
    }
    left -= given;
    for (std::size_t i = 0; i < n; ++i) full[i] = full[i] || out[i] >= cap;
    if (given == 0) break;
  }
  return out;
}

RoutingMatrix split_experts(const RoutingMatrix& trace, int experts) {
  if (experts == trace.experts) return trace;
  const int m = experts / trace.experts;
  RoutingMatrix out(trace.sources, experts);
  for (int s = 0; s < trace.sources; ++s)
    for (int e = 0; e < trace.experts; ++e) {
      const std::int64_t c = trace.at(s, e);
      for (int i = 0; i < m; ++i) out.mutable_at(s, e * m + i) = c / m + (i < c % m ? 1 : 0);  // even, remainder first
    }
  return out;
}

RoutingMatrix merge_experts(const RoutingMatrix& trace, int experts) {
  if (experts == trace.experts) return trace;
  const int m = trace.experts / experts;
  RoutingMatrix out(trace.sources, experts);
  for (int s = 0; s < trace.sources; ++s)
    for (int e = 0; e < trace.experts; ++e) out.mutable_at(s, e / m) += trace.at(s, e);
  return out;
}

RoutingMatrix map_sources(const RoutingMatrix& trace, int gpus, std::int64_t tokens, int top_k) {
  RoutingMatrix out(gpus, trace.experts);
  const int S = trace.sources;
  std::vector<std::int64_t> row(trace.experts);
  for (int g = 0; g < gpus; ++g) {
    std::fill(row.begin(), row.end(), 0);
    const int group = S % gpus == 0 ? S / gpus : 1;
    const int first = S % gpus == 0 ? g * group : g % S;
    for (int s = first; s < first + group; ++s)
      for (int e = 0; e < trace.experts; ++e) row[e] += trace.at(s, e);
    const auto scaled = rescale_row(row, tokens * top_k, tokens);
    std::copy(scaled.begin(), scaled.end(), out.mutable_counts().begin() + std::ptrdiff_t(g) * trace.experts);
  }
  return out;
}

namespace {

// The folder for imported CSV traces: $XDG_CACHE_HOME/moesim, else ~/.cache/moesim, created private
// (0700). Used only when it is a real directory (not a link) owned by this user and closed to
// others, so that no other local user can plant or read a cached trace; "" otherwise.
std::filesystem::path trace_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if ((!xdg || !*xdg) && (!home || !*home)) return {};
  const std::filesystem::path base = xdg && *xdg ? std::filesystem::path(xdg) : std::filesystem::path(home) / ".cache";
  const auto dir = base / "moesim";
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  ::mkdir(dir.c_str(), 0700);  // EEXIST is fine: checked below
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0) return {};
  return dir;
}

}  // namespace

std::string replay_trace_path(const std::string& path) {
  if (path.size() < 4 || path.substr(path.size() - 4) != ".csv") return path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open (check the path)");
  std::stringstream text;
  text << in.rdbuf();
  // Keyed on the content: an edited file is imported again, a copy elsewhere is not.
  const std::string content = text.str();
  const auto key = derive_seed(std::hash<std::string>{}(content), content.size(), 0x6373762d74726163ull);
  const auto dir = trace_cache_dir();
  if (dir.empty()) {  // no private cache: a private folder (mkdtemp: 0700) for this import, left behind
    char tmpl[] = "/tmp/moesim-trace-XXXXXX";
    const std::filesystem::path fresh = ::mkdtemp(tmpl) ? std::filesystem::path(tmpl) : std::filesystem::path();
    if (fresh.empty()) throw InputError(path + ": no private folder to import the CSV into (set XDG_CACHE_HOME)");
    import_csv(path, (fresh / "trace.trace").string(), {});
    return (fresh / "trace.trace").string();
  }
  const auto cached = dir / fmt::format("{:016x}.trace", key);
  if (!std::filesystem::exists(cached)) {  // imported whole under a unique name, then renamed in
    const auto tmp = dir / fmt::format("{:016x}.{}.tmp", key, ::getpid());
    try {
      import_csv(path, tmp.string(), {});
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    }
    std::filesystem::rename(tmp, cached);
  }
  return cached.string();
}

namespace {

// Uniform and Zipf: per-token top-k sampling from a fixed popularity (routing.hpp).
class DistributionSource final : public GatingSource {
 public:
  DistributionSource(const spec::GatingSpec& g, const MoeModel& m, int gpus, std::uint64_t seed, std::vector<int> spread_blocks)
      : gating_(g), model_(m), gpus_(gpus), seed_(seed), spread_blocks_(std::move(spread_blocks)) {}
  std::vector<RoutingMatrix> next() override {
    std::vector<RoutingMatrix> out;
    for (int l = 0; l < model_.layers(); ++l)
      out.push_back(generate_routing(gating_, gpus_, model_.experts(), model_.tokens_per_gpu(), model_.top_k(), seed_,
                                     int(iteration_), l, model_.group_limit(), spread_blocks_));
    ++iteration_;
    return out;
  }
  std::uint64_t label() const override { return iteration_ - 1; }

 private:
  spec::GatingSpec gating_;
  const MoeModel& model_;
  int gpus_;
  std::uint64_t seed_, iteration_ = 0;
  std::vector<int> spread_blocks_;
};

class GeneratorSource final : public GatingSource {
 public:
  GeneratorSource(const spec::GeneratorSpec& g, const MoeModel& m, int gpus, std::uint64_t seed, std::vector<int> spread_blocks)
      : layers_(m.layers()),
        gen_(resolve_generator(g), m.experts(), m.top_k(), m.layers(), gpus, m.tokens_per_gpu(), seed, m.group_limit()) {
    gen_.count_spreads(std::move(spread_blocks));
  }
  std::vector<RoutingMatrix> next() override {
    std::vector<RoutingMatrix> out;
    for (int l = 0; l < layers_; ++l) out.push_back(gen_.next(l));
    ++iteration_;
    return out;
  }
  std::uint64_t label() const override { return iteration_ - 1; }
  bool bias_logits(const std::vector<std::vector<double>>& bias) override {
    for (int l = 0; l < layers_; ++l) gen_.set_logit_bias(l, bias[std::size_t(l)]);
    return true;
  }

 private:
  int layers_;
  GatingGenerator gen_;
  std::uint64_t iteration_ = 0;
};

// Replays a trace's records in order, summing micro-batches, mapping sources to GPUs.
class TraceSource final : public GatingSource {
 public:
  TraceSource(const spec::TraceReplay& t, const MoeModel& m, int gpus)
      : replay_(t), model_(m), gpus_(gpus), reader_(replay_trace_path(t.path())) {}

  std::vector<RoutingMatrix> next() override {
    const auto& h = reader_.header();
    const std::uint64_t stride = std::max(1u, replay_.stride());
    while (true) {
      auto layers = read_iteration();
      if (layers.empty())
        throw InputError(fmt::format("{}: the trace ends after iteration {}; select fewer iterations", replay_.path(), label_));
      if ((label_ - first_) / h.iteration_stride() % stride != 0) continue;
      std::vector<RoutingMatrix> out;  // a deeper trace gives its first model.layers() layers
      for (int l = 0; l < model_.layers(); ++l)
        out.push_back(map_sources(layers[l].experts < model_.experts() ? split_experts(layers[l], model_.experts())
                                                                       : merge_experts(layers[l], model_.experts()),
                                  gpus_, model_.tokens_per_gpu(), model_.top_k()));
      return out;
    }
  }
  std::uint64_t label() const override { return label_; }

 private:
  // The next recorded iteration at or after first_iteration: one matrix per layer.
  std::vector<RoutingMatrix> read_iteration() {
    const auto& h = reader_.header();
    std::vector<RoutingMatrix> layers;
    while (true) {
      if (!have_pending_ && !(have_pending_ = reader_.next(pending_))) break;
      if (pending_.iteration() < replay_.first_iteration()) {
        have_pending_ = false;
        continue;
      }
      if (!layers.empty() && pending_.iteration() != label_) break;
      if (replay_.last_iteration() && pending_.iteration() > replay_.last_iteration()) break;
      if (layers.empty()) {
        label_ = pending_.iteration();
        if (!started_) first_ = label_, started_ = true;
        layers.assign(h.layers(), RoutingMatrix(int(h.sources()), int(h.experts())));
      }
      const RoutingMatrix m = record_matrix(h, pending_);
      auto& acc = layers[pending_.layer()].mutable_counts();
      const auto& add = m.counts();
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += add[i];
      have_pending_ = false;
    }
    return layers;
  }

  spec::TraceReplay replay_;
  const MoeModel& model_;
  int gpus_;
  TraceReader reader_;
  spec::TraceRecord pending_;
  bool have_pending_ = false, started_ = false;
  std::uint64_t label_ = 0, first_ = 0;
};

// DeepSeek-V3's auxiliary-loss-free balancing over another source (AuxFreeBalancing): b_e / τ
// added to the generator's logits before it draws (so group-limited draws and their token spreads
// follow it), or each layer's rows of given counts re-weighted by exp(b_e / τ); then
// b_e -= γ · sign(load_e − mean load).
// γ and τ as set, or their defaults (AuxFreeBalancing).
double bias_update(const spec::AuxFreeBalancing& a) { return a.bias_update() > 0 ? a.bias_update() : 0.001; }
double score_scale(const spec::AuxFreeBalancing& a) { return a.score_scale() > 0 ? a.score_scale() : 0.01; }

class AuxFreeSource final : public GatingSource {
 public:
  AuxFreeSource(std::unique_ptr<GatingSource> inner, const spec::AuxFreeBalancing& a, const MoeModel& m)
      : inner_(std::move(inner)),
        gamma_(bias_update(a)),
        tau_(score_scale(a)),
        tokens_(m.tokens_per_gpu()),
        bias_(std::size_t(m.layers()), std::vector<double>(std::size_t(m.experts()), 0.0)) {}

  std::vector<RoutingMatrix> next() override {
    std::vector<std::vector<double>> logits(bias_.size());
    for (std::size_t l = 0; l < bias_.size(); ++l)
      for (double b : bias_[l]) logits[l].push_back(b / tau_);
    const bool drawn = inner_->bias_logits(logits);
    auto layers = inner_->next();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      RoutingMatrix& R = layers[l];
      const auto& b = bias_[l];
      if (!drawn) reweight(R, b);
      const auto loads = R.expert_loads();
      const std::vector<double> load(loads.begin(), loads.end());
      const double mean = std::accumulate(load.begin(), load.end(), 0.0) / double(load.size());
      for (std::size_t e = 0; e < b.size(); ++e) bias_[l][e] += load[e] > mean ? -gamma_ : load[e] < mean ? gamma_ : 0.0;
    }
    return layers;
  }
  std::uint64_t label() const override { return inner_->label(); }

 private:
  // Given counts: each row re-weighted by the odds exp(b_e / τ), scaled back to its token-slots.
  void reweight(RoutingMatrix& R, const std::vector<double>& b) const {
    // Relative odds, the largest 1 (only their ratios matter; no overflow however long b grows).
    const double top = *std::max_element(b.begin(), b.end());
    std::vector<double> odds(b.size());
    for (std::size_t e = 0; e < b.size(); ++e) odds[e] = std::exp((b[e] - top) / tau_);
    auto& counts = R.mutable_counts();
    for (std::size_t s = 0; s < std::size_t(R.sources); ++s) {
      std::int32_t* cells = counts.data() + s * b.size();
      std::vector<std::int64_t> weighted(b.size());
      std::int64_t total = 0;
      for (std::size_t e = 0; e < b.size(); ++e) {
        total += cells[e];
        weighted[e] = std::llround(double(cells[e]) * odds[e] * 0x1p30);  // rescale_row takes integers: < 2^55
      }
      const auto row = rescale_row(weighted, total, tokens_);
      for (std::size_t e = 0; e < b.size(); ++e) cells[e] = std::int32_t(row[e]);
    }
  }

  std::unique_ptr<GatingSource> inner_;
  double gamma_, tau_;
  std::int64_t tokens_;
  std::vector<std::vector<double>> bias_;  // per layer and expert
};

}  // namespace

// validate_gating() of the source alone.
static GatingCheck validate_source(const spec::GatingSpec& g, const MoeModel& model, int iterations, std::uint64_t seed) {
  if (g.has_trace() && model.group_limit().on())
    throw FieldError("model.group_limit", "a replayed trace carries its own routing (recorded with whatever limit its "
                                          "gate had); leave expert_groups and group_limit out, or generate the routing");
  if (g.has_zipf() && !(g.zipf().exponent() >= 0 && std::isfinite(g.zipf().exponent())))
    throw FieldError("gating.zipf.exponent", "must be a finite number >= 0 (0 is uniform popularity)");
  if (g.has_generator()) {
    GeneratorParams p;
    try {
      p = resolve_generator(g.generator());
    } catch (const FieldError& e) {
      throw FieldError("gating.generator." + e.field(), e.message());
    }
    const std::string preset = g.generator().preset().empty() ? "naive" : g.generator().preset();
    return {"generator",
            fmt::format("generator preset {} (as resolved: sigma_pop {:g}, zipf_exponent {:g}, sigma_slow {:g}, "
                        "sigma_fast {:g}, hot_fraction {:g}), seed {}",
                        preset, p.sigma_pop, p.zipf_exponent, p.sigma_slow, p.sigma_fast, p.hot_fraction, seed),
            ""};
  }
  if (g.has_zipf()) return {"zipf", fmt::format("Zipf popularity, exponent {:g}, seed {}", g.zipf().exponent(), seed), ""};
  if (!g.has_trace()) return {"uniform", fmt::format("uniform: every expert alike, seed {}", seed), ""};
  const auto& t = g.trace();
  if (t.path().empty()) throw FieldError("gating.trace.path", "is empty; name a .trace file (`moesim trace import` makes one)");
  std::optional<TraceReader> reader;
  try {
    reader.emplace(replay_trace_path(t.path()));
  } catch (const InputError& e) {
    throw FieldError("gating.trace.path", e.what());
  }
  const auto& h = reader->header();
  const std::string hint = "; make a matching trace with `moesim trace rescale`";
  const int E = int(h.experts()), k = int(h.top_k());
  const bool splits = t.split_experts() && model.experts() % E == 0;
  const bool merges = t.merge_experts() && E % model.experts() == 0;
  if (t.split_experts() && t.merge_experts())
    throw FieldError("gating.trace.merge_experts", "and split_experts both set: the model has more experts than the trace, or fewer");
  if (E != model.experts() && !splits && !merges)
    throw FieldError("gating.trace.path",
                     fmt::format("the trace has {} experts, the model {}{}{}", E, model.experts(),
                                 model.experts() % E == 0   ? " (set gating.trace.split_experts)"
                                 : E % model.experts() == 0 ? " (set gating.trace.merge_experts)"
                                                            : "",
                                 hint));
  if (int(h.layers()) < model.layers())
    throw FieldError("gating.trace.path",
                     fmt::format("the trace has {} layers, the model {} (set model.layers){}", h.layers(), model.layers(), hint));
  // Split m ways, a token's k choices may become up to m·k finer ones (fine-grained segmentation).
  const int m = splits ? model.experts() / E : 1;
  if (model.top_k() != k && !(splits && model.top_k() % k == 0 && model.top_k() <= m * k))
    throw FieldError("gating.trace.path",
                     fmt::format("the trace is top-{}, the model top-{} (set model.top_k{})", k, model.top_k(),
                                 splits ? fmt::format(", or to a multiple of {} up to {} with the experts split {} ways", k, m * k, m)
                                        : ""));
  if (t.last_iteration() && t.last_iteration() < t.first_iteration())
    throw FieldError("gating.trace.last_iteration", "is before first_iteration");
  // Enough recorded iterations in the range? Count them without holding them.
  const std::uint64_t stride = std::max(1u, t.stride());
  std::uint64_t available = 0, last = 0, first = 0;
  bool any = false;
  spec::TraceRecord r;
  while (available < std::uint64_t(iterations) && reader->next(r)) {
    if (r.iteration() < t.first_iteration() || (t.last_iteration() && r.iteration() > t.last_iteration())) continue;
    if (!any || r.iteration() != last) {
      if (!any) first = r.iteration();
      any = true;
      last = r.iteration();
      if ((last - first) / h.iteration_stride() % stride == 0) ++available;
    }
  }
  if (available < std::uint64_t(iterations))
    throw FieldError("gating.trace",
                     fmt::format("the selected range holds {} iteration(s) of the trace, the experiment asks for {}; "
                                 "lower `iterations` or widen the range",
                                 available, iterations));
  GatingCheck check{"trace",
                    fmt::format("trace {}: iterations {}-{}{} of its {}-layer, {}-expert records{}", t.path(), first, last,
                                stride > 1 ? fmt::format(" (one in {})", stride) : "", h.layers(), h.experts(),
                                splits && E != model.experts()
                                    ? fmt::format(", each expert split over {}{}", model.experts() / E,
                                                  model.top_k() != k ? fmt::format(", top-{} as top-{}", k, model.top_k()) : "")
                                : merges && E != model.experts() ? fmt::format(", each {} experts merged into one", E / model.experts())
                                                                 : ""),
                    ""};
  if (int(h.layers()) > model.layers())
    check.note = fmt::format("gating.trace: the trace has {} layers, the model {}: its first {} are replayed (set "
                             "model.layers={} for all of them)",
                             h.layers(), model.layers(), model.layers(), h.layers());
  return check;
}

GatingCheck validate_gating(const spec::GatingSpec& g, const MoeModel& model, int iterations, std::uint64_t seed) {
  if (!g.has_aux_free()) return validate_source(g, model, iterations, seed);
  const auto& a = g.aux_free();
  for (const auto& [v, field] : {std::pair{a.bias_update(), "gating.aux_free.bias_update"}, {a.score_scale(), "gating.aux_free.score_scale"}})
    if (!(v >= 0 && v <= 1e3)) throw FieldError(field, fmt::format("must be in [0, 1000] (0: the default), got {}", v));
  if (model.group_limit().on() && !g.has_generator())
    throw FieldError("gating.aux_free", "with group-limited routing only the generator takes the bias before it draws (the "
                                        "token spreads DeepEP's bytes follow); use gating.generator");
  GatingCheck check = validate_source(g, model, iterations, seed);
  check.description +=
      fmt::format(", through auxiliary-loss-free balancing (bias update {:g}, score scale {:g})", bias_update(a), score_scale(a));
  return check;
}

std::unique_ptr<GatingSource> make_gating_source(const spec::GatingSpec& g, const MoeModel& model, int gpus,
                                                 std::uint64_t seed, const std::vector<int>& spread_blocks) {
  std::unique_ptr<GatingSource> source;
  if (g.has_trace()) source = std::make_unique<TraceSource>(g.trace(), model, gpus);
  else if (g.has_generator()) source = std::make_unique<GeneratorSource>(g.generator(), model, gpus, seed, spread_blocks);
  else source = std::make_unique<DistributionSource>(g, model, gpus, seed, spread_blocks);
  if (g.has_aux_free()) source = std::make_unique<AuxFreeSource>(std::move(source), g.aux_free(), model);
  return source;
}

}  // namespace moesim
