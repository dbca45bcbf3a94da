#include "trace_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "errors.hpp"
#include "trace.hpp"

namespace moesim {

LoadStats load_stats(const std::vector<double>& load) {
  LoadStats s;
  const double n = double(load.size());
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (load.empty() || total <= 0) return s;
  const double mean = total / n;
  std::vector<double> sorted(load);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  s.max_mean = sorted.front() / mean;
  double var = 0, entropy = 0, weighted = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    var += (sorted[i] - mean) * (sorted[i] - mean);
    if (sorted[i] > 0) entropy -= sorted[i] / total * std::log(sorted[i] / total);
    weighted += double(i + 1) * sorted[sorted.size() - 1 - i];  // ascending order, rank 1..n
    s.zero_experts += sorted[i] == 0;
  }
  s.cv = std::sqrt(var / n) / mean;
  s.entropy = n > 1 ? entropy / std::log(n) : 1;
  s.gini = (2 * weighted / (n * total)) - (n + 1) / n;  // G = Σ (2i − n − 1) x_(i) / (n Σx)
  const int tops[4] = {1, 2, 4, 8};
  for (int t = 0; t < 4; ++t)
    s.top_share[t] = std::accumulate(sorted.begin(), sorted.begin() + std::min<std::ptrdiff_t>(tops[t], sorted.size()), 0.0) / total;
  return s;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0;
}

double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  const double sa = std::accumulate(a.begin(), a.end(), 0.0), sb = std::accumulate(b.begin(), b.end(), 0.0);
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d += std::abs(a[i] / sa - b[i] / sb);
  return d / 2;
}

double gpu_max_mean(const std::vector<double>& load, int gpus) {
  const int per = int(load.size()) / gpus;
  std::vector<double> g(gpus, 0.0);
  for (std::size_t e = 0; e < load.size(); ++e) g[e / per] += load[e];
  const double total = std::accumulate(g.begin(), g.end(), 0.0);
  return total > 0 ? *std::max_element(g.begin(), g.end()) / (total / gpus) : 0;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const auto lo = std::size_t(pos);
  const double frac = pos - double(lo);
  return lo + 1 < v.size() ? v[lo] * (1 - frac) + v[lo + 1] * frac : v[lo];
}

namespace {

double median(const std::vector<double>& v) { return quantile(v, 0.5); }

// Per-iteration measures, by name, in report order.
const char* const kMeasures[] = {"max_mean", "cv", "gini", "entropy", "top1_share", "top2_share",
                                 "top4_share", "top8_share", "zero_experts", "source_global_cosine", "gpu_max_mean"};
constexpr int kNumMeasures = 11;

}  // namespace

struct TraceStats::Layer {
  std::vector<double> values[kNumMeasures];
  std::map<std::uint64_t, std::vector<double>> history;  // iteration -> load, for the drift measures
};

TraceStats::TraceStats(const spec::TraceHeader& header, int gpus, std::uint64_t from_iteration,
                       std::vector<std::uint64_t> lags)
    : header_(header), gpus_(gpus), from_(from_iteration), lags_(std::move(lags)), layers_(header.layers()) {
  if (gpus > 0 && header.experts() % unsigned(gpus) != 0)
    throw InputError(fmt::format("--gpus {}: the {} experts do not divide evenly among them", gpus, header.experts()));
}

TraceStats::~TraceStats() = default;

void TraceStats::add(const spec::TraceRecord& r) {
  if (r.iteration() < from_) return;
  if (open_ && (r.iteration() != iteration_ || r.layer() != layer_)) close_record();
  const RoutingMatrix m = record_matrix(header_, r);
  if (!open_) {
    open_ = true;
    iteration_ = r.iteration();
    layer_ = r.layer();
    global_.assign(m.experts, 0.0);
    source_.assign(m.sources, std::vector<double>(m.experts, 0.0));
  }
  for (int s = 0; s < m.sources; ++s)
    for (int e = 0; e < m.experts; ++e) {
      global_[e] += double(m.at(s, e));
      source_[s][e] += double(m.at(s, e));
    }
}

void TraceStats::close_record() {
  open_ = false;
  auto& L = layers_[layer_];
  const LoadStats s = load_stats(global_);
  double src_cos = 0;
  for (const auto& row : source_) src_cos += cosine(row, global_) / double(source_.size());
  const double v[kNumMeasures] = {s.max_mean,     s.cv,           s.gini,          s.entropy,
                                  s.top_share[0], s.top_share[1], s.top_share[2],  s.top_share[3],
                                  double(s.zero_experts), src_cos, gpus_ > 0 ? gpu_max_mean(global_, gpus_) : 0};
  for (int i = 0; i < kNumMeasures; ++i) L.values[i].push_back(v[i]);
  L.history[iteration_] = global_;
}

nlohmann::json TraceStats::json() {
  if (open_) close_record();
  nlohmann::json out;
  std::vector<double> all[kNumMeasures];
  std::map<std::uint64_t, std::vector<double>> cos_all, tv_all, hot_all;
  auto& layers = out["layers"] = nlohmann::json::array();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const auto& L = layers_[l];
    nlohmann::json j{{"layer", l}, {"records", L.values[0].size()}};
    for (int i = 0; i < kNumMeasures; ++i) {
      if (i == kNumMeasures - 1 && gpus_ <= 0) continue;
      j[kMeasures[i]] = median(L.values[i]);
      all[i].insert(all[i].end(), L.values[i].begin(), L.values[i].end());
    }
    for (auto lag : lags_) {
      std::vector<double> cos, tv, hot;
      for (const auto& [t, load] : L.history) {
        auto later = L.history.find(t + lag);
        if (later == L.history.end()) continue;
        cos.push_back(cosine(load, later->second));
        tv.push_back(total_variation(load, later->second));
        hot.push_back(std::max_element(load.begin(), load.end()) - load.begin() ==
                              std::max_element(later->second.begin(), later->second.end()) - later->second.begin()
                          ? 1.0
                          : 0.0);
      }
      if (cos.empty()) continue;
      j["lag"][std::to_string(lag)] = {{"cosine", median(cos)}, {"total_variation", median(tv)},
                                       {"hottest_same", std::accumulate(hot.begin(), hot.end(), 0.0) / double(hot.size())}};
      cos_all[lag].insert(cos_all[lag].end(), cos.begin(), cos.end());
      tv_all[lag].insert(tv_all[lag].end(), tv.begin(), tv.end());
      hot_all[lag].insert(hot_all[lag].end(), hot.begin(), hot.end());
    }
    layers.push_back(j);
  }
  auto& overall = out["overall"];
  overall["records"] = all[0].size();
  for (int i = 0; i < kNumMeasures; ++i)
    if (i < kNumMeasures - 1 || gpus_ > 0) overall[kMeasures[i]] = median(all[i]);
  for (const auto& [lag, cos] : cos_all)
    overall["lag"][std::to_string(lag)] = {
        {"cosine", median(cos)},
        {"cosine_p5", quantile(cos, 0.05)},
        {"total_variation", median(tv_all.at(lag))},
        {"hottest_same", std::accumulate(hot_all.at(lag).begin(), hot_all.at(lag).end(), 0.0) / double(hot_all.at(lag).size())}};
  out["experts"] = header_.experts();
  out["sources"] = header_.sources();
  out["top_k"] = header_.top_k();
  out["from_iteration"] = from_;
  if (gpus_ > 0) out["gpus"] = gpus_;
  return out;
}

std::string TraceStats::text() {
  const auto j = json();
  auto num = [](const nlohmann::json& v, const char* fmt_spec) {
    return v.is_number() ? fmt::format(fmt::runtime(fmt_spec), v.get<double>()) : std::string("-");
  };
  std::string out = fmt::format("{} experts, {} sources, top-{}; medians over iterations{}\n", j["experts"].get<int>(),
                                j["sources"].get<int>(), j["top_k"].get<int>(),
                                from_ ? fmt::format(" from iteration {}", from_) : "");
  out += fmt::format("{:>7} {:>7} {:>8} {:>6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6} {:>5} {:>8} {:>8}\n", "layer", "records",
                     "max/mean", "CV", "Gini", "entropy", "top1", "top2", "top4", "top8", "zero", "src-cos",
                     gpus_ > 0 ? "GPU m/m" : "");
  auto row = [&](const std::string& name, const nlohmann::json& v) {
    out += fmt::format("{:>7} {:>7} {:>8} {:>6} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6} {:>5} {:>8} {:>8}\n", name,
                       v["records"].get<std::size_t>(), num(v["max_mean"], "{:.2f}"), num(v["cv"], "{:.2f}"),
                       num(v["gini"], "{:.3f}"), num(v["entropy"], "{:.3f}"), num(v["top1_share"], "{:.3f}"),
                       num(v["top2_share"], "{:.3f}"), num(v["top4_share"], "{:.3f}"), num(v["top8_share"], "{:.3f}"),
                       num(v["zero_experts"], "{:.0f}"), num(v["source_global_cosine"], "{:.4f}"),
                       gpus_ > 0 ? num(v["gpu_max_mean"], "{:.2f}") : "");
  };
  for (const auto& l : j["layers"]) row(std::to_string(l["layer"].get<int>()), l);
  row("all", j["overall"]);
  if (j["overall"].contains("lag")) {
    out += "drift (all layers): lag  cosine (median, p5)  total variation  hottest expert unchanged\n";
    for (const auto& [lag, v] : j["overall"]["lag"].items())
      out += fmt::format("{:>28}  {:.4f}, {:.4f}        {:.4f}           {:.1f}%\n", lag, v["cosine"].get<double>(),
                         v["cosine_p5"].get<double>(), v["total_variation"].get<double>(),
                         100 * v["hottest_same"].get<double>());
  }
  return out;
}

}  // namespace moesim
