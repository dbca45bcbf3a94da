#include "report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "collective_sweep.hpp"
#include "errors.hpp"
#include "plot.hpp"
#include "results.hpp"
#include "spec.hpp"
#include "worker.hpp"

namespace moesim {
namespace fs = std::filesystem;
using nlohmann::json;

ReportCounts count_claims(const std::vector<PaperComparison>& claims) {
  ReportCounts n;
  for (const auto& c : claims) {
    if (!std::isfinite(c.simulated)) ++n.not_run;
    else if (c.pass()) ++n.pass;
    else ++n.fail;
  }
  return n;
}

namespace {

std::string anchor(const std::string& name) {  // GitHub's heading anchors: lower case, '-' for spaces
  std::string a;
  for (char c : name)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') a += char(std::tolower(static_cast<unsigned char>(c)));
  return a;
}

std::string claims_table(const std::vector<PaperComparison>& claims) {
  std::string out = "| claim | paper | simulated | ratio | tolerance | verdict | source |\n|---|---:|---:|---:|---:|---|---|\n";
  for (const auto& c : claims) {
    const bool ran = std::isfinite(c.simulated);
    out += fmt::format("| {} | {:.2f} | {} | {} | ±{:.0f}% | {} | {} |\n", c.paper.claim(), c.paper.value(),
                       ran ? fmt::format("{:.2f}", c.simulated) : "—", ran ? fmt::format("{:.2f}", c.ratio()) : "—",
                       c.tolerance() * 100, !ran ? "not run" : c.pass() ? "pass" : "**fail**", c.paper.source());
  }
  return out;
}

}  // namespace

std::string report_markdown(const std::vector<ReportEntry>& entries, const std::string& command) {
  std::vector<PaperComparison> all;
  for (const auto& e : entries) all.insert(all.end(), e.claims.begin(), e.claims.end());
  const auto n = count_claims(all);
  std::string md = "# moesim validation report\n\n";
  md += fmt::format("Each claim is a number a paper reports (a speedup, a balance ratio, a time or memory ratio) next to the same quantity "
                    "simulated by moesim; it passes when simulated / paper is within the claim's tolerance "
                    "(±15% unless the spec says otherwise). Regenerate with `{}`.\n\n",
                    command);
  md += fmt::format("**{} claims from {} experiments: {} pass, {} fail, {} not run.**\n\n", n.total(), entries.size(),
                    n.pass, n.fail, n.not_run);
  md += "| experiment | claims | pass | fail | not run |\n|---|---:|---:|---:|---:|\n";
  for (const auto& e : entries) {
    const auto k = count_claims(e.claims);
    md += fmt::format("| [{}](#{}) | {} | {} | {} | {} |\n", e.name, anchor(e.name), k.total(), k.pass, k.fail, k.not_run);
  }
  md += fmt::format("| **all** | **{}** | **{}** | **{}** | **{}** |\n", n.total(), n.pass, n.fail, n.not_run);
  for (const auto& e : entries) {
    md += fmt::format("\n## {}\n\n{}\n\n`{} {}`\n\n", e.name, e.description, e.collective ? "moesim collective" : "moesim run",
                      e.spec_path);
    md += claims_table(e.claims);
    if (!e.figure.empty()) md += fmt::format("\n![{}]({})\n", e.name, e.figure);
  }
  return md;
}

namespace {

// The spec's claims, with the simulated values of its results when they exist.
ReportEntry experiment_entry(const std::string& path, const fs::path& results) {
  const auto ex = load_experiment(path, {});
  ReportEntry e{path, ex.spec.name(), ex.spec.description(), false, {}, ""};
  json summary = json::object();
  if (const auto file = results / ex.spec.name() / "summary.json"; fs::exists(file)) std::ifstream(file) >> summary;
  for (const auto& p : ex.spec.paper()) {
    double simulated = std::numeric_limits<double>::quiet_NaN();
    for (const auto& row : summary.value("paper", json::array()))  // the same claim of the same variant
      if (row.value("claim", "") == p.claim() && row.value("variant", "") == p.variant())
        if (const auto v = row.find("simulated_value"); v != row.end() && v->is_number()) simulated = v->get<double>();
    e.claims.push_back({p, simulated});
  }
  return e;
}

ReportEntry collective_entry(const std::string& path, const fs::path& results) {
  const auto file = load_collective_sweep(path);
  ReportEntry e{path, file.name, file.description, true, {}, ""};
  std::vector<CollectivePoint> points;
  if (const auto f = results / file.name / "collective.json"; fs::exists(f)) {
    json j;
    std::ifstream(f) >> j;
    points = collective_points(j);
  }
  e.claims = collective_comparisons(file, points);
  return e;
}

// The message a spec file holds, from its "# proto-message:" header line ("" without one).
std::string proto_message(const std::string& path) {
  std::ifstream in(path);
  const std::string key = "proto-message: moesim.spec.";
  for (std::string line; std::getline(in, line) && line.rfind('#', 0) == 0;)
    if (const auto at = line.find(key); at != std::string::npos) return line.substr(at + key.size());
  return "";
}

bool matches(const std::string& path, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const auto& p) { return path.find(p) != std::string::npos; });
}

}  // namespace

std::vector<ReportEntry> write_report(const ReportOptions& o, const std::function<void(const std::string&)>& progress) {
  if (!fs::is_directory(o.experiments))
    throw InputError("--experiments " + o.experiments + ": no such directory (run from the checkout, or give its experiments/)");
  std::vector<std::string> specs;
  for (const auto& f : fs::recursive_directory_iterator(o.experiments))
    if (f.path().extension() == ".textproto") specs.push_back(f.path().string());
  std::sort(specs.begin(), specs.end());
  const fs::path results(o.results), out(o.out);
  std::vector<ReportEntry> entries;
  for (const auto& path : specs) {
    if ((!o.only.empty() && !matches(path, o.only)) || matches(path, o.exclude)) continue;
    const std::string message = proto_message(path);
    if (message == "SweepSpec") continue;  // grids of experiments (`moesim sweep`), no paper numbers
    const bool collective = message == "CollectiveSweepSpec";
    ReportEntry e = collective ? collective_entry(path, results) : experiment_entry(path, results);
    if (e.claims.empty()) continue;  // held out, or no paper numbers
    if (e.name.empty()) throw InputError(path + ": name is not set; the report keeps each experiment's results under its name");
    const bool ran = count_claims(e.claims).not_run < int(e.claims.size());
    if (!ran && o.run) {  // in a child process: one SimGrid engine per process
      if (progress) progress("running " + path);
      fs::create_directories(results);
      const std::string dir = (results / e.name).string(), error = dir + ".err";
      const std::string why = wait_worker(fork_worker(
                                              [&] {
                                                if (collective) {
                                                  const auto file = load_collective_sweep(path);
                                                  write_collective_results(dir, file.sweep, run_collective_sweep(file.sweep), &file);
                                                } else {
                                                  const auto ex = load_experiment(path, {});
                                                  write_results(dir, ex, run_experiment(ex));
                                                }
                                              },
                                              error),
                                          error);
      if (!why.empty()) throw std::runtime_error(path + ": " + why);
      e = collective ? collective_entry(path, results) : experiment_entry(path, results);
    }
    // Its figure: speedups of the variants, or the collective's scaling lines.
    const fs::path dir = results / e.name;
    if (!gnuplot_path().empty() && (fs::exists(dir / "summary.json") || fs::exists(dir / "collective.json"))) {
      PlotOptions figure;
      figure.figures = {e.collective ? "scaling" : "speedup"};
      figure.format = "png";
      figure.out = (out / "figures" / e.name).string();
      try {
        plot({(dir / (e.collective ? "collective.json" : "summary.json")).string()}, figure);
        e.figure = "figures/" + e.name + "/" + figure.figures[0] + ".png";
      } catch (const InputError& err) {
        if (progress) progress(fmt::format("{}: no figure ({})", e.name, err.what()));
      }
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) throw InputError("report: no experiment with paper values under " + o.experiments + " matches");
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw InputError(o.out + ": cannot create the output directory: " + ec.message());
  const fs::path md = out / "report.md", tmp = out / "report.md.tmp";
  {
    std::ofstream f(tmp);
    f << report_markdown(entries, o.command);
    if (!f.flush()) throw InputError(tmp.string() + ": write failed");
  }
  fs::rename(tmp, md);
  return entries;
}

}  // namespace moesim
