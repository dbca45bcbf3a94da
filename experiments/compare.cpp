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
  std::map<int, std::pair<std::string, int>> process;  // pid -> (variant, rank)
  for (const auto& e : t.at("traceEvents")) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      const std::string name = e.at("args").at("name");  // "VARIANT: GPU r" or "GPU r"
      const auto at = name.rfind("GPU ");
      const std::string variant = at >= 2 ? name.substr(0, at - 2) : "";
      process[e.at("pid")] = {variant, std::stoi(name.substr(at + 4))};
    }
  }
  for (const auto& e : t.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const auto& [variant, rank] = process[e.at("pid")];
    r.ops[{variant, e.at("args").value("iteration", 0), e.at("args").value("op", 0), rank}] = {
        e.at("name"), e.at("dur").get<double>() * 1e-6};
  }
  return r;
}

/// "L3.fwd.a2a_dispatch.part1" -> "L#.fwd.a2a_dispatch.part#": the numbers that end a segment.
std::string op_class(const std::string& label) {
  static const std::regex numbered("([A-Za-z_]*)[0-9]+(?=\\.|$)");
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

  // Iteration time and the critical path's phases, per variant present in both.
  out += fmt::format("\n{:<24} {:<18} {:>12} {:>12} {:>8}\n", "variant", "phase", "A ms", "B ms", "B/A");
  for (const auto& va : A.summary.at("variants")) {
    const std::string name = va.value("name", "");
    const json* vb = nullptr;
    for (const auto& v : B.summary.at("variants"))
      if (v.value("name", "") == name) vb = &v;
    if (!vb) continue;
    const double ta = va.at("iteration_time_s"), tb = vb->at("iteration_time_s");
    out += fmt::format("{:<24} {:<18} {:>12.3f} {:>12.3f} {:>8}\n", name.empty() ? "(run)" : name, "iteration", ta * 1e3,
                       tb * 1e3, ratio(ta, tb));
    for (const auto& [phase, x] : va.at("breakdown").items()) {  // the phases either run spends time in
      const double pa = x.get<double>(), pb = vb->at("breakdown").value(phase, 0.0);
      if (pa > 0 || pb > 0)
        out += fmt::format("{:<24} {:<18} {:>12.3f} {:>12.3f} {:>8}\n", "", phase, pa * 1e3, pb * 1e3, ratio(pa, pb));
    }
  }
  if (!A.has_timeline || !B.has_timeline) {
    out += "\n(no op-by-op comparison: timeline.json is missing beside " + std::string(A.has_timeline ? B.where : A.where) + ")\n";
    return out;
  }
  // Op classes: mean duration of an op of the class (over ranks, layers, iterations).
  struct Class {
    double a = 0, b = 0;
    long n = 0;
  };
  std::map<std::string, Class> classes;
  std::vector<std::tuple<double, std::string, double, double>> diffs;  // |b−a|, where, a, b
  long unmatched = 0;
  // Op classes over the iterations after the spec's warm-up where the timeline holds any (on a GPU
  // the first iterations pay for cuBLAS's kernel choices and CUDA's module loading).
  std::map<std::string, int> warmup, last;  // per variant
  for (const auto& v : A.summary.at("variants")) warmup[v.value("name", "")] = v.value("warmup_iterations", 0);
  for (const auto& [key, op] : A.ops) last[std::get<0>(key)] = std::max(last[std::get<0>(key)], std::get<1>(key));
  auto steady = [&](const std::string& variant, int iteration) {
    return iteration >= warmup[variant] || last[variant] < warmup[variant];
  };
  long skipped = 0;
  for (const auto& [key, op] : A.ops) {
    if (!steady(std::get<0>(key), std::get<1>(key))) {
      ++skipped;
      continue;
    }
    const auto it = B.ops.find(key);
    if (it == B.ops.end() || it->second.first != op.first) {
      ++unmatched;
      continue;
    }
    auto& c = classes[op_class(op.first)];
    c.a += op.second;
    c.b += it->second.second;
    ++c.n;
    const auto& [variant, iteration, id, rank] = key;
    diffs.emplace_back(std::abs(it->second.second - op.second),
                       fmt::format("{}{} it{} #{} GPU {}", variant.empty() ? "" : variant + ": ", op.first, iteration, id, rank),
                       op.second, it->second.second);
  }
  std::vector<std::pair<std::string, Class>> sorted(classes.begin(), classes.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.a > y.second.a; });
  out += fmt::format("\n{:<40} {:>8} {:>12} {:>12} {:>8}\n", "op class (mean per op)", "ops", "A ms", "B ms", "B/A");
  for (const auto& [name, c] : sorted)
    out += fmt::format("{:<40} {:>8} {:>12.4f} {:>12.4f} {:>8}\n", name, c.n, c.a / double(c.n) * 1e3,
                       c.b / double(c.n) * 1e3, ratio(c.a, c.b));
  std::sort(diffs.begin(), diffs.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
  out += fmt::format("\n{:<56} {:>12} {:>12}\n", fmt::format("the {} ops that differ most", options.top_ops), "A ms", "B ms");
  for (std::size_t i = 0; i < diffs.size() && i < std::size_t(options.top_ops); ++i)
    out += fmt::format("{:<56} {:>12.4f} {:>12.4f}\n", std::get<1>(diffs[i]), std::get<2>(diffs[i]) * 1e3,
                       std::get<3>(diffs[i]) * 1e3);
  out += fmt::format("\n{} op instances matched; {} of A's not found in B (other graph or fewer timeline iterations)\n",
                     diffs.size(), unmatched);
  if (skipped > 0) out += fmt::format("({} op instances of warm-up iterations left out)\n", skipped);
  for (const auto& [variant, w] : warmup)
    if (last.count(variant) && last[variant] < w) {
      out += fmt::format("(the timelines hold warm-up iterations only: --set sim.timeline_iterations={} to compare "
                         "steady ones)\n", w + 1);
      break;
    }
  return out;
}

}  // namespace moesim
