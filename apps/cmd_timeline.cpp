// moesim timeline summary: a run's timeline.json read per layer and phase.
#include <fmt/format.h>

#include "command.hpp"
#include "timeline_summary.hpp"

namespace moesim::cli {

void add_timeline(CLI::App& app, Commands& commands) {
  auto* timeline = app.add_subcommand("timeline", "Read a run's timeline.json");
  timeline->require_subcommand(1);
  auto* summary = timeline->add_subcommand(
      "summary",
      R"(Per layer, each phase in the order it starts on the hottest and the median GPU, its busy time and how much
of it hides under expert compute (docs/timeline.md):
  moesim run --out res && moesim timeline summary res --variant tutel --layer 3)");
  struct Options {
    std::string run;
    TimelineSummaryOptions summary;
  };
  auto o = std::make_shared<Options>();
  summary->add_option("run", o->run, "A results directory (or its timeline.json)")->required();
  summary->add_option("--variant", o->summary.variant, "Which variant (default: the first)");
  summary->add_option("--layer", o->summary.layer, "One layer (default: all, then the ops outside the layers)")
      ->check(CLI::NonNegativeNumber);
  commands.push_back({summary, [o] {
                        fmt::print("{}", timeline_summary(o->run, o->summary));
                        return 0;
                      }});
}

}  // namespace moesim::cli
