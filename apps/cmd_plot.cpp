// moesim plot: paper-style figures from results, timelines or gating traces (gnuplot).
#include <fmt/format.h>

#include "command.hpp"
#include "plot.hpp"

namespace moesim::cli {

void add_plot(CLI::App& app, Commands& commands) {
  auto* cmd = app.add_subcommand(
      "plot",
      R"(Paper-style figures with gnuplot, one style for all (NAME.gp is kept beside NAME.pdf to restyle)
  moesim plot moesim-out                       every figure a results directory supports
  moesim plot res/fig23-16 res/fig23-64 res/fig23-256 --figure scaling --baseline fairseq
  moesim plot ../shared/traces/smartmoe-gpt-e32-k2-r16/trace.csv --figure heatmap --layer 3
Figures: speedup (bars over a baseline, grouped by GROUP/ in variant names or by summary),
breakdown (stacked critical path), scaling (time or speedup vs GPUs; also collective.json),
load (per-GPU computed tokens), heatmap (expert x iteration load), timeline (timeline.json))");
  struct Options {
    std::vector<std::string> inputs;
    PlotOptions plot;
  };
  auto o = std::make_shared<Options>();
  cmd->add_option("results", o->inputs, "Results directories or files: summary.json, collective.json, "
                                        "timeline.json, a gating trace (.trace, .csv)")
      ->required();
  cmd->add_option("--figure,-f", o->plot.figures, "Only these figures (default: every one the inputs support)")
      ->delimiter(',')
      ->check(CLI::IsMember(figure_names()));
  cmd->add_option("--format", o->plot.format, "pdf, png or svg")->check(CLI::IsMember({"pdf", "png", "svg"}))->capture_default_str();
  cmd->add_option("--out,-o", o->plot.out, "Output directory (default: the first input's directory)");
  cmd->add_option("--baseline", o->plot.baseline,
                  "Speedups over this run (variant NAME; default: the first); with scaling, plot speedup instead of time");
  cmd->add_option("--layer", o->plot.layer, "heatmap: the MoE layer")->capture_default_str();
  cmd->add_option("--timeline-gpus", o->plot.timeline_gpus, "timeline: how many GPUs")->capture_default_str();
  commands.push_back({cmd, [o] {
                        for (const auto& f : plot(o->inputs, o->plot)) fmt::print("  wrote {}\n", f);
                        return 0;
                      }});
}

}  // namespace moesim::cli
