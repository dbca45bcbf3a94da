// moesim report: every experiment with a paper's numbers, paper vs simulated, pass/fail, and the
// ledger of why the misses miss.
#include <fmt/format.h>

#include "command.hpp"
#include "report.hpp"

namespace moesim::cli {

void add_report(CLI::App& app, Commands& commands, const Invocation& invocation) {
  auto* cmd = app.add_subcommand(
      "report",
      R"(The validation report: every experiment with a paper's numbers, paper vs simulated, pass/fail
  moesim report --run --exclude fig23-layer-2048     run what has no results yet, then write report/report.md
  moesim report --results results                    only read RESULTS/<name>/ (as `moesim run --out` wrote it)
  moesim report --only schemoe --run                 one paper's experiments)");
  struct Options {
    ReportOptions report;
    bool quiet = false;
  };
  auto o = std::make_shared<Options>();
  auto& r = o->report;
  cmd->add_option("--experiments", r.experiments, "Where the specs are (searched recursively)")->capture_default_str();
  cmd->add_option("--results", r.results, "Results of each experiment in RESULTS/<name>/")->capture_default_str();
  cmd->add_option("--out,-o", r.out, "Writes OUT/report.md and OUT/figures/")->capture_default_str();
  cmd->add_option("--ledger", r.ledger, "The causes OUT/fidelity.md gives the claims that miss (Ledger in proto/moesim.proto)")
      ->capture_default_str();
  cmd->add_flag("--run", r.run, "Run (and save under RESULTS) the experiments that have no results yet");
  cmd->add_option("--seeds", r.seeds,
                  "With --run, run each experiment with N seeds: every claim as mean ± 95% interval, its verdict on "
                  "the interval (N times the time); a spec that sets `seeds` keeps its own")
      ->check(CLI::Range(1u, 1000u))
      ->capture_default_str();
  cmd->add_option("--jobs,-j", r.jobs, "With --run, experiments run at once, each in its own process (default: the cores)")
      ->check(CLI::Range(1u, 256u));
  cmd->add_option("--only", r.only, "Only specs whose path contains one of these")->delimiter(',');
  cmd->add_option("--exclude", r.exclude, "Leave out specs whose path contains one of these")->delimiter(',');
  cmd->add_flag("--quiet,-q", o->quiet, "No progress on stderr");
  commands.push_back({cmd, [o, invocation] {
                        o->report.command = invocation.command(true);  // report.md's "Regenerate with"
                        const auto entries = write_report(o->report, [&](const std::string& line) {
                          if (!o->quiet) fmt::print(stderr, "  {}\n", line);
                        });
                        std::vector<PaperComparison> all;
                        for (const auto& e : entries) all.insert(all.end(), e.claims.begin(), e.claims.end());
                        const auto n = count_claims(all);
                        fmt::print("{} claims from {} experiments: {}, {}, {} not run\n  wrote {}/report.md, "
                                   "fidelity.md, claims.json\n",
                                   n.total(), entries.size(), n.pass_text(), n.fail_text(), n.not_run, o->report.out);
                        return 0;
                      }});
}

}  // namespace moesim::cli
