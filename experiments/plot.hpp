// Paper-style figures with gnuplot (`moesim plot`). Each figure is one gnuplot script with its data
// inline, kept beside the figure (NAME.gp) so that a user can restyle it and run `gnuplot NAME.gp`;
// one style for all of them (fonts, sizes, the Okabe-Ito colour-blind-safe palette, axes with units).
//
// Figures, and what they read:
//   speedup    grouped bars: each run's iteration-time speedup over a baseline run, per group
//              (variants named GROUP/NAME, or one group per summary)           summary.json
//   breakdown  stacked bars: the critical path of each run by category           summary.json
//   scaling    lines on log axes: time (or speedup) vs GPU count, one per run    several summaries,
//              or one per algorithm and size of a collective sweep               a results.db, or
//                                                                                collective.json
//   load       bars: the token-slots each GPU computes per iteration, baseline and fastest run
//   heatmap    expert × iteration load (relative to the mean expert) of one layer: summary.json or
//              a gating trace (.trace or .csv)
//   timeline   the first iteration's ops of the first GPUs, one row per stream   timeline.json
#pragma once
#include <string>
#include <vector>

namespace moesim {

struct PlotOptions {
  std::vector<std::string> figures;  // empty: every figure the inputs support
  std::string format = "pdf";        // pdf | png | svg
  std::string out;                   // output directory; "" = the first input's directory
  std::string baseline;              // speedup over this run's NAME (default: each group's first run)
  int layer = 0;                     // heatmap: the MoE layer
  int timeline_gpus = 4;             // timeline: how many GPUs
};

/// The figure names, in the order `moesim plot` makes them.
const std::vector<std::string>& figure_names();

/// The page of every figure: 3.5 in × 2.4 in (one paper column); PNG at 300 dpi.
struct FigureSize {
  double width_in = 3.5, height_in = 2.4;
  int png_width = 1050, png_height = 720;
};
constexpr FigureSize kFigureSize{};

/// Reads the inputs (results directories, summary.json, collective.json, timeline.json, a sweep's
/// results.db whose points each count as a summary, gating traces), writes OUT/NAME.gp and OUT/NAME.FORMAT for every figure asked for (or every
/// one the inputs support) and returns the figure files written. Bad input: InputError.
std::vector<std::string> plot(const std::vector<std::string>& inputs, const PlotOptions& options);

/// gnuplot's path on PATH, or "" when it is not installed.
std::string gnuplot_path();

}  // namespace moesim
