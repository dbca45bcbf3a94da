// The validation report (`moesim report`): every experiment under experiments/ that carries a
// paper's numbers, its results read from RESULTS/<name>/ (or run first with --run), and one
// Markdown file with, per experiment, each claim's paper value, simulated value, ratio and whether
// the ratio is within the claim's tolerance (±15% unless the spec says otherwise), a figure, and a
// count over everything at the top.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runner.hpp"

namespace moesim {

/// One experiment of the report.
struct ReportEntry {
  std::string spec_path, name, description;
  bool collective = false;                // a CollectiveSweepSpec (`moesim collective`)
  std::vector<PaperComparison> claims;    // simulated not finite: not run
  std::string figure;                     // path of its figure relative to the report, or ""
};

struct ReportCounts {
  int pass = 0, fail = 0, not_run = 0;
  int total() const { return pass + fail + not_run; }
};
/// Claims within tolerance, outside it, and without a simulated value.
ReportCounts count_claims(const std::vector<PaperComparison>& claims);

/// The report's Markdown: the headline table (per experiment and in all), then a section per
/// experiment with its claims and figure.
std::string report_markdown(const std::vector<ReportEntry>& entries, const std::string& command);

struct ReportOptions {
  std::string experiments = "experiments";  // where the specs are (searched recursively)
  std::string results = "results";          // RESULTS/<name>/summary.json or collective.json
  std::string out = "report";               // OUT/report.md and OUT/figures/
  bool run = false;                         // run the experiments that have no results yet
  std::vector<std::string> only, exclude;   // substrings of spec paths to keep / leave out
  std::string command;                      // the command line, quoted in the report
};

/// Collects, (runs,) draws and writes OUT/report.md; returns the entries. `progress(line)` reports
/// what it is doing.
std::vector<ReportEntry> write_report(const ReportOptions& options,
                                      const std::function<void(const std::string&)>& progress = {});

}  // namespace moesim
