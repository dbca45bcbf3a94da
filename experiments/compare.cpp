#include "compare.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <tuple>

#include <fmt/format.h>

#include "errors.hpp"
#include "results.hpp"

namespace moesim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Run {
  std::string where;
  json summary;
  // Per op instance (variant, iteration, op, rank): its label and duration in seconds.
  std::map<std::tuple<std::string, int, int, int>, std::pair<std::string, double>> ops;
  bool has_timeline = false;
};

Run load(const std::string& arg) {
  fs::path summary = arg;
  if (fs::is_directory(summary)) summary /= "summary.json";
  if (!fs::exists(summary))
    throw InputError(fmt::format("{}: no summary.json here; give a results directory `moesim run` wrote", arg));
  Run r;
  r.where = arg;
  r.summary = read_json_file(summary.string());
  if (!r.summary.contains("name") || !(r.summary.contains("variants") || r.summary.contains("iteration_time_s")))
    throw InputError(summary.string() + ": not a moesim summary.json (no \"variants\" or \"iteration_time_s\")");
  if (!r.summary.contains("variants")) {  // a spec without variants: its one run, unnamed as in the timeline
    json run = r.summary;
    run["name"] = "";
    r.summary["variants"] = json::array({run});
  }
  const fs::path timeline = summary.parent_path() / "timeline.json";
  if (!fs::exists(timeline)) return r;
  r.has_timeline = true;
  const json t = read_json_file(timeline.string());
  auto process = timeline_processes(t, timeline.string());  // pid -> (variant, rank)
  for (const auto& e : t.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const auto& [variant, rank] = process[e.at("pid")];
    r.ops[{variant, e.at("args").value("iteration", 0), e.at("args").value("op", 0), rank}] = {
        e.at("name"), e.at("dur").get<double>() * 1e-6};
  }
  return r;
}

/// "L3.fwd.a2a_dispatch.part1" -> "L#.fwd.a2a_dispatch.part#": the numbers that end a segment, a
/// list of them too ("L3.fwd.replica_bcast.e4+9" -> "L#.fwd.replica_bcast.e#").
std::string op_class(const std::string& label) {
  static const std::regex numbered("([A-Za-z_]*)[0-9]+(?:\\+[0-9]+)*(?=\\.|$)");
  return std::regex_replace(label, numbered, "$1#");
}

std::string ratio(double a, double b) { return a > 0 ? fmt::format("{:.2f}", b / a) : "-"; }

}  // namespace

std::string compare_runs(const std::string& a_path, const std::string& b_path, const CompareOptions& options) {
  const Run A = load(a_path), B = load(b_path);
  std::string out;
  const std::string an = A.summary.at("name"), bn = B.summary.at("name");
  out += fmt::format("A: {} ({}, backend {})\nB: {} ({}, backend {})\n", A.where, an, A.summary.value("backend", "sim"),
                     B.where, bn, B.summary.value("backend", "sim"));
  if (an != bn || A.summary.value("gpus", 0) != B.summary.value("gpus", 0))
    out += "warning: the two runs are not of the same spec and cluster size; ops are matched by id all the same\n";

  // The variants compared: the two named, or each of A's that B has too.
  auto find = [](const Run& r, const std::string& name) -> const json* {
    for (const auto& v : r.summary.at("variants"))
      if (v.value("name", "") == name) return &v;
    return nullptr;
  };
  auto names = [](const Run& r) {
    std::string s;
    for (const auto& v : r.summary.at("variants")) s += (s.empty() ? "" : ", ") + v.value("name", std::string("(run)"));
    return s;
  };
  std::vector<std::pair<std::string, std::string>> pairs;  // (A's variant, B's)
  if (!options.a_variant.empty() || !options.b_variant.empty()) {
    const std::string va = options.a_variant.empty() ? options.b_variant : options.a_variant;
    const std::string vb = options.b_variant.empty() ? options.a_variant : options.b_variant;
    if (!find(A, va)) throw InputError(fmt::format("--a-variant {}: {} has no such variant (it has: {})", va, a_path, names(A)));
    if (!find(B, vb)) throw InputError(fmt::format("--b-variant {}: {} has no such variant (it has: {})", vb, b_path, names(B)));
    pairs.push_back({va, vb});
  } else {
    for (const auto& v : A.summary.at("variants"))
      if (find(B, v.value("name", ""))) pairs.push_back({v.value("name", ""), v.value("name", "")});
    if (pairs.empty())
      throw InputError(fmt::format("{} and {} have no variant in common ({}; {}): name one of each with --a-variant and "
                                   "--b-variant", a_path, b_path, names(A), names(B)));
  }
  auto title = [](const std::string& a, const std::string& b) {
    const std::string x = a.empty() ? "(run)" : a;
    return a == b ? x : x + " vs " + (b.empty() ? "(run)" : b);
  };

  // Iteration time and the critical path's phases, per pair.
  out += fmt::format("\n{:<24} {:<18} {:>12} {:>12} {:>8}\n", "variant", "phase", "A ms", "B ms", "B/A");
  for (const auto& [na, nb] : pairs) {
    const json &va = *find(A, na), &vb = *find(B, nb);
    const double ta = va.at("iteration_time_s"), tb = vb.at("iteration_time_s");
    out += fmt::format("{:<24} {:<18} {:>12.3f} {:>12.3f} {:>8}\n", title(na, nb), "iteration", ta * 1e3, tb * 1e3, ratio(ta, tb));
    for (const auto& [phase, x] : va.at("breakdown").items()) {  // the phases either run spends time in
      const double pa = x.get<double>(), pb = vb.at("breakdown").value(phase, 0.0);
      if (pa > 0 || pb > 0)
        out += fmt::format("{:<24} {:<18} {:>12.3f} {:>12.3f} {:>8}\n", "", phase, pa * 1e3, pb * 1e3, ratio(pa, pb));
    }
  }
  if (!A.has_timeline || !B.has_timeline) {
    out += "\n(no op-by-op comparison: timeline.json is missing beside " + std::string(A.has_timeline ? B.where : A.where) + ")\n";
    return out;
  }

  // Ops of the iterations after each run's warm-up where the timeline holds any (on a GPU the first
  // iterations pay for cuBLAS's kernel choices and CUDA's module loading).
  struct Steady {
    std::map<std::string, int> warmup, last;  // per variant
    explicit Steady(const Run& r) {
      for (const auto& v : r.summary.at("variants")) warmup[v.value("name", "")] = v.value("warmup_iterations", 0);
      for (const auto& [key, op] : r.ops) last[std::get<0>(key)] = std::max(last[std::get<0>(key)], std::get<1>(key));
    }
    // Whether the timeline holds the variant's warm-up iterations only.
    bool warmup_only(const std::string& variant) const {
      return last.count(variant) && warmup.count(variant) && last.at(variant) < warmup.at(variant);
    }
    bool operator()(const std::string& variant, int iteration) const {
      return iteration >= (warmup.count(variant) ? warmup.at(variant) : 0) || warmup_only(variant);
    }
  };
  const Steady steady_a(A), steady_b(B);

  // Op classes: the mean duration of an op of the class (over ranks, layers, iterations), in each
  // run apart, so that two policies' graphs compare too.
  struct Class {
    double a = 0, b = 0;
    long na = 0, nb = 0;
  };
  std::map<std::string, Class> classes;
  std::vector<std::tuple<double, std::string, double, double>> diffs;  // |b−a|, where, a, b
  long unmatched = 0, matched = 0, skipped = 0;
  for (const auto& [na, nb] : pairs) {
    for (const auto& [key, op] : B.ops)
      if (std::get<0>(key) == nb && steady_b(nb, std::get<1>(key))) {
        auto& c = classes[op_class(op.first)];
        c.b += op.second;
        ++c.nb;
      }
    for (const auto& [key, op] : A.ops) {
      const auto& [variant, iteration, id, rank] = key;
      if (variant != na) continue;
      if (!steady_a(na, iteration)) {
        ++skipped;
        continue;
      }
      auto& c = classes[op_class(op.first)];
      c.a += op.second;
      ++c.na;
      const auto it = B.ops.find({nb, iteration, id, rank});
      if (it == B.ops.end() || it->second.first != op.first) {
        ++unmatched;
        continue;
      }
      ++matched;
      const double a = op.second, b = it->second.second;
      if (std::abs(b - a) > 1e-12 + 1e-9 * std::max(a, b))  // only ops that differ
        diffs.emplace_back(std::abs(b - a),
                           fmt::format("{}{} it{} #{} GPU {}", na.empty() ? "" : title(na, nb) + ": ", op.first, iteration, id, rank),
                           a, b);
    }
  }
  std::vector<std::pair<std::string, Class>> sorted(classes.begin(), classes.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.a > y.second.a; });
  out += fmt::format("\n{:<40} {:>8} {:>8} {:>12} {:>12} {:>8}\n", "op class (mean per op)", "A ops", "B ops", "A ms", "B ms", "B/A");
  for (const auto& [name, c] : sorted) {
    const double ma = c.na ? c.a / double(c.na) : 0, mb = c.nb ? c.b / double(c.nb) : 0;
    out += fmt::format("{:<40} {:>8} {:>8} {:>12.4f} {:>12.4f} {:>8}\n", name, c.na, c.nb, ma * 1e3, mb * 1e3,
                       c.na && c.nb ? ratio(ma, mb) : "-");
  }
  std::sort(diffs.begin(), diffs.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
  if (matched == 0) {
    out += "\nno op matched by iteration, id and rank (two different graphs): compare the op classes above\n";
  } else if (diffs.empty()) {
    out += fmt::format("\nno op differs between the {} op instances matched\n", matched);
  } else {
    out += fmt::format("\n{:<56} {:>12} {:>12}\n",
                       fmt::format("the {} ops that differ most (of {} that differ)", std::min<std::size_t>(diffs.size(), std::size_t(options.top_ops)),
                                   diffs.size()),
                       "A ms", "B ms");
    for (std::size_t i = 0; i < diffs.size() && i < std::size_t(options.top_ops); ++i)
      out += fmt::format("{:<56} {:>12.4f} {:>12.4f}\n", std::get<1>(diffs[i]), std::get<2>(diffs[i]) * 1e3,
                         std::get<3>(diffs[i]) * 1e3);
  }
  out += fmt::format("\n{} op instances matched; {} of A's not found in B (other graph or fewer timeline iterations)\n",
                     matched, unmatched);
  if (skipped > 0) out += fmt::format("({} op instances of warm-up iterations left out)\n", skipped);
  for (const auto& [na, nb] : pairs)
    if (steady_a.warmup_only(na)) {
      out += fmt::format("(the timelines hold warm-up iterations only: --set sim.timeline_iterations={} to compare "
                         "steady ones)\n", steady_a.warmup.at(na) + 1);
      break;
    }
  return out;
}

}  // namespace moesim
