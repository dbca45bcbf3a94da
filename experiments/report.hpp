// The validation report (`moesim report`): every experiment under experiments/ that carries a
// paper's numbers, its results read from RESULTS/<name>/ (or run first with --run), and one
// Markdown file with, per experiment, each claim's paper value, simulated value, ratio and whether
// the ratio is within the claim's tolerance (±15% unless the spec says otherwise), a figure, and a
// count over everything at the top.
#pragma once
#include <functional>
#include <map>
#include <optional>
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
  std::optional<spec::ClusterSpec> cluster;  // the platform it ran on (for the parameter table)
  std::string workload;                   // its model and gating, in a few words
};

struct ReportCounts {
  int pass = 0, fail = 0, not_run = 0;
  int pass_in_noise = 0;  // of `pass`, those whose seeds' 95% interval crosses the tolerance's edge
  int fail_far = 0;       // of `fail`, those more than 2x off the paper either way (simulated / paper > 2 or < 1/2)
  int total() const { return pass + fail + not_run; }
  /// "53 pass (3 of them inside the noise of their seeds)", or "53 pass".
  std::string pass_text() const;
  /// "47 fail (10 of them more than 2× off the paper)", or "47 fail".
  std::string fail_text() const;
};
/// Claims within tolerance (on the mean over the seeds), outside it, and without a simulated value.
ReportCounts count_claims(const std::vector<PaperComparison>& claims);

/// How often the simulation orders two systems as the paper does. The pairs of one experiment's
/// claims (those simulated): each claim's variant against its baseline (faster or slower: value
/// above or below 1), and two claims of one quantity, baseline set, groups and aggregate but
/// different variants against each other (which of the two gains more). A pair the paper puts
/// within 2% of each other states no order and is left out, as is a bandwidth claim (GB/s).
/// `out_of_order` names each pair the simulation orders otherwise, with both orders' ratios.
struct OrderScore {
  int match = 0, pairs = 0;
  std::vector<std::string> out_of_order;
};
OrderScore ordering_score(const std::vector<PaperComparison>& claims);

/// The fidelity ledger (Ledger in proto/moesim.proto), validated: every cause has a unique id and
/// text, and every claim it names reads "EXPERIMENT: CLAIM" or "EXPERIMENT: *".
spec::Ledger load_ledger(const std::string& path);

/// Verdicts of an earlier report (OUT/claims.json): "EXPERIMENT: CLAIM" -> passed.
using Verdicts = std::map<std::string, bool>;

/// The report's Markdown: the rules, the headline table (per experiment and in all, with the
/// ordering score), a section per experiment with its claims and figure, and the parameters the
/// experiments ran with.
std::string report_markdown(const std::vector<ReportEntry>& entries, const std::string& command);

/// The ledger's Markdown (OUT/fidelity.md): each claim that misses with the causes the ledger gives
/// it (none: unknown), counts per category, regressions (claims `previous` has passing that now
/// fail), and each cause with its evidence and what was done. Throws InputError (the ledger's path,
/// the cause's id and the claim) where a cause names a claim its experiment, one of `entries`, does
/// not have.
std::string fidelity_markdown(const std::vector<ReportEntry>& entries, const spec::Ledger& ledger,
                              const std::string& ledger_path, const Verdicts& previous);

/// The verdicts as OUT/claims.json holds them, and read back.
std::string verdicts_json(const std::vector<ReportEntry>& entries);
Verdicts read_verdicts(const std::string& path);

struct ReportOptions {
  std::string experiments = "experiments";  // where the specs are (searched recursively)
  std::string results = "results";          // RESULTS/<name>/summary.json or collective.json
  std::string out = "report";               // OUT/report.md, OUT/fidelity.md, OUT/claims.json and OUT/figures/
  std::string ledger = "report/ledger.textproto";  // the causes fidelity.md gives; "" or missing: none
  bool run = false;                         // run the experiments that have no results yet
  // With `run`: each experiment with this many seeds. 8: a claim's 95% interval is then 0.83
  // standard deviations of its seeds either way (t(7) 2.36 / sqrt 8), where 3 seeds gave 2.48
  // (t(2) 4.30 / sqrt 3), and the report stays within half its 10-minute budget on 2 cores.
  unsigned seeds = 8;
  unsigned jobs = 0;                        // with `run`: experiments at once, each a process (0: the cores)
  std::vector<std::string> only, exclude;   // substrings of spec paths to keep / leave out
  std::string command;                      // the command line, quoted in the report
};

/// Collects, (runs,) draws and writes OUT/report.md, OUT/fidelity.md and OUT/claims.json; returns
/// the entries. `progress(line)` reports what it is doing.
std::vector<ReportEntry> write_report(const ReportOptions& options,
                                      const std::function<void(const std::string&)>& progress = {});

}  // namespace moesim
