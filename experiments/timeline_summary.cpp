#include "timeline_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "errors.hpp"
#include "results.hpp"
#include "taskgraph.hpp"

namespace moesim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Interval {
  double t0, t1;  // ms
};

// One GPU's ops of the chosen iteration: per (layer, phase) their intervals, and where experts ran.
struct Gpu {
  std::map<std::pair<int, std::string>, std::vector<Interval>> ops;
  std::vector<Interval> experts;  // merged: disjoint, in order
  double expert_ms = 0;
};

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.t0 < b.t0; });
  std::vector<Interval> out;
  for (const auto& i : v)
    if (!out.empty() && i.t0 <= out.back().t1) out.back().t1 = std::max(out.back().t1, i.t1);
    else out.push_back(i);
  return out;
}

// The length of [t0, t1] that lies inside the disjoint, ordered intervals `in`.
double inside(const Interval& x, const std::vector<Interval>& in) {
  double s = 0;
  for (const auto& i : in) s += std::max(0.0, std::min(x.t1, i.t1) - std::max(x.t0, i.t0));
  return s;
}

std::string layer_name(int layer) { return layer < 0 ? "other" : fmt::format("L{}", layer); }

}  // namespace

std::string timeline_summary(const std::string& run, const TimelineSummaryOptions& options) {
  fs::path path = run;
  if (fs::is_directory(path)) path /= "timeline.json";
  if (!fs::exists(path)) throw InputError(run + ": no timeline.json here; give a results directory `moesim run` wrote");
  const json t = read_json_file(path.string());
  if (!t.is_object() || !t.contains("traceEvents") || !t["traceEvents"].is_array())
    throw InputError(path.string() + ": not a timeline moesim wrote (no \"traceEvents\" list)");

  // Processes: "VARIANT: GPU r" (or "GPU r" for a run without variants).
  auto process = timeline_processes(t, path.string());
  std::vector<std::string> variants;  // in the order of their GPUs' pids: the run's
  for (const auto& [pid, p] : process)
    if (std::find(variants.begin(), variants.end(), p.first) == variants.end()) variants.push_back(p.first);
  if (variants.empty()) throw InputError(path.string() + ": names no GPU processes; not a timeline moesim wrote");
  const std::string variant = options.variant.empty() ? variants.front() : options.variant;
  if (std::find(variants.begin(), variants.end(), variant) == variants.end())
    throw InputError(fmt::format("--variant {}: not in {} (it has: {})", variant, path.string(), fmt::join(variants, ", ")));

  // The variant's first iteration in the file.
  int iteration = -1;
  for (const auto& e : t["traceEvents"])
    if (e.value("ph", "") == "X" && process.count(e.value("pid", -1)) && process[e["pid"].get<int>()].first == variant) {
      const int it = e.contains("args") ? e["args"].value("iteration", 0) : 0;
      iteration = iteration < 0 ? it : std::min(iteration, it);
    }
  if (iteration < 0) throw InputError(fmt::format("{}: no ops of variant '{}'", path.string(), variant));

  std::map<int, Gpu> gpus;
  std::set<int> layers;
  for (const auto& e : t["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const auto p = process.find(e.value("pid", -1));
    if (p == process.end() || p->second.first != variant) continue;
    if ((e.contains("args") ? e["args"].value("iteration", 0) : 0) != iteration) continue;
    const double t0 = e.value("ts", 0.0) / 1e3, t1 = t0 + e.value("dur", 0.0) / 1e3;
    const int layer = op_layer(e.value("name", ""));
    const std::string phase = e.value("cat", "?");
    auto& g = gpus[p->second.second];
    g.ops[{layer, phase}].push_back({t0, t1});
    layers.insert(layer);
    if (phase == phase_name(Phase::expert_compute)) {
      g.experts.push_back({t0, t1});
      g.expert_ms += t1 - t0;
    }
  }
  if (options.layer >= 0 && !layers.count(options.layer))
    throw InputError(fmt::format("--layer {}: the timeline has no ops of that layer", options.layer));
  for (auto& [id, g] : gpus) g.experts = merged(g.experts);

  // GPU classes: the most expert work, and the median.
  std::vector<std::pair<double, int>> by_work;
  for (const auto& [id, g] : gpus) by_work.push_back({g.expert_ms, id});
  std::sort(by_work.begin(), by_work.end());
  const int hottest = by_work.back().second, median = by_work[(by_work.size() - 1) / 2].second;

  std::string out = fmt::format(
      "{}: {}iteration {}, {} GPUs. Per layer, the phases in the order they start on the GPU that computes the most\n"
      "expert work (hottest: GPU {}, {:.3f} ms) and on the median one (GPU {}, {:.3f} ms). busy: the phase's ops' time on\n"
      "the GPU's streams; under experts: the part of it while the GPU computes experts (docs/timeline.md).\n\n",
      path.string(), variant.empty() ? "" : "variant " + variant + ", ", iteration, gpus.size(), hottest,
      gpus[hottest].expert_ms, median, gpus[median].expert_ms);
  out += fmt::format("{:<7}{:<10}{:<20}{:>10}{:>10}{:>15}\n", "layer", "GPU", "phase", "start ms", "busy ms", "under experts");
  std::vector<int> order(layers.begin(), layers.end());
  std::rotate(order.begin(), std::find_if(order.begin(), order.end(), [](int l) { return l >= 0; }), order.end());  // "other" last
  for (int layer : order) {
    if (options.layer >= 0 && layer != options.layer) continue;
    for (const auto& [cls, id] : {std::pair<const char*, int>{"hottest", hottest}, {"median", median}}) {
      if (cls == std::string("median") && id == hottest) continue;  // one GPU
      const auto& g = gpus[id];
      struct Row {
        double start, busy, under;
        std::string phase;
      };
      std::vector<Row> rows;
      for (const auto& [key, intervals] : g.ops) {
        if (key.first != layer) continue;
        Row r{intervals.front().t0, 0, 0, key.second};
        for (const auto& i : intervals) {
          r.start = std::min(r.start, i.t0);
          r.busy += i.t1 - i.t0;
          r.under += inside(i, g.experts);
        }
        rows.push_back(r);
      }
      std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.start < b.start; });
      for (const auto& r : rows)
        out += fmt::format("{:<7}{:<10}{:<20}{:>10.3f}{:>10.3f}{:>15}\n", layer_name(layer), fmt::format("{} {}", cls, id),
                           r.phase, r.start, r.busy,
                           r.phase == phase_name(Phase::expert_compute) || r.busy <= 0
                               ? "-"
                               : fmt::format("{:.0f}%", 100 * r.under / r.busy));
    }
  }
  return out;
}

}  // namespace moesim
