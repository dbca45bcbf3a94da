// moesim trace import|export|gen|fit|stats|rescale: gating traces.
#include <fmt/format.h>

#include <filesystem>

#include "command.hpp"
#include "errors.hpp"
#include "gating.hpp"
#include "generator.hpp"
#include "rescale.hpp"
#include "textproto.hpp"
#include "trace.hpp"
#include "trace_import.hpp"
#include "trace_stats.hpp"

namespace moesim::cli {
namespace {

struct GenOptions {
  std::string preset = "naive", out;
  int experts = 32, top_k = 2, layers = 12, sources = 16, tokens = 4096, iterations = 100;
  std::uint64_t seed = 1;
  std::vector<std::string> sets;
  bool quiet = false;
};

// A seeded synthetic trace, as `trace import` writes real ones.
int generate(const GenOptions& o) {
  spec::GeneratorSpec g;
  g.set_preset(o.preset);
  for (const auto& s : o.sets) apply_override(g, s);
  GeneratorParams params;
  try {
    params = resolve_generator(g);
  } catch (const FieldError& e) {
    throw InputError("trace gen: " + std::string(e.what()));
  }
  if (o.experts < 1 || o.top_k < 1 || o.top_k > o.experts || o.layers < 1 || o.sources < 1 || o.tokens < 1 ||
      o.iterations < 1)
    throw InputError("trace gen: experts, layers, sources, tokens and iterations must be >= 1, top-k in [1, experts]");
  spec::TraceHeader h;
  h.set_version(1);
  h.set_model(fmt::format("moesim synthetic generator, preset {}", o.preset));
  h.set_provenance(fmt::format("moesim trace gen --preset {} --seed {}; parameters: {}", o.preset, o.seed,
                               to_text(g).empty() ? "preset defaults" : to_text(g)));
  h.set_experts(o.experts);
  h.set_top_k(o.top_k);
  h.set_layers(o.layers);
  h.set_sources(o.sources);
  h.set_tokens_per_source(o.tokens);
  h.set_iteration_stride(1);
  h.set_rows_sum_to_tokens_times_k(true);
  h.add_comments("# moe-gating-trace v1");
  h.add_comments(fmt::format("# source: moesim trace gen --preset {} --seed {} (synthetic)", o.preset, o.seed));
  h.add_comments(fmt::format("# model: synthetic, top_k={}, num_experts={}, moe_layers={}, src_ranks={}", o.top_k,
                             o.experts, o.layers, o.sources));
  GatingGenerator gen(params, o.experts, o.top_k, o.layers, o.sources, o.tokens, o.seed);
  TraceWriter writer(o.out, h);
  const Progress progress(o.quiet, "iteration");
  spec::TraceRecord rec;
  for (int it = 0; it < o.iterations; ++it) {
    for (int l = 0; l < o.layers; ++l) {
      rec.Clear();
      rec.set_iteration(std::uint64_t(it));
      rec.set_layer(std::uint32_t(l));
      set_record_counts(rec, gen.next(l));
      writer.write(rec);
    }
    progress(it + 1, o.iterations);
  }
  writer.close();
  const double s = progress.elapsed();
  const double cells = double(o.iterations) * o.layers * o.sources * o.experts;
  fmt::print("{}: {} iterations × {} layers × {} sources × {} experts in {:.2f} s ({:.1f} M cells/s, {:.1f} MB/s)\n",
             o.out, o.iterations, o.layers, o.sources, o.experts, s, cells / s / 1e6,
             double(std::filesystem::file_size(o.out)) / s / 1e6);
  return 0;
}

struct ImportArgs {
  std::vector<std::string> inputs;
  std::string out, format = "csv";
  ImportOptions options;
};

int import(ImportArgs a, const CLI::App& cmd) {
  const std::string& first = a.inputs.front();
  if (!cmd.count("--from")) a.format = std::filesystem::is_directory(first) ? "smartmoe" : first.ends_with(".trace") ? "ranks" : "csv";
  if (a.format != "csv" && a.format != "smartmoe" && a.format != "ranks")
    throw FieldError("--from", "'" + a.format + "' is not a format; use csv, smartmoe or ranks");
  if (a.format != "ranks" && a.inputs.size() != 1)
    throw FieldError("input", fmt::format("{} inputs given; --from {} takes one (several: the rank files of a recorded run)",
                                          a.inputs.size(), a.format));
  const auto h = a.format == "ranks"      ? import_rank_traces(a.inputs, a.out, a.options)
                 : a.format == "smartmoe" ? import_smartmoe_logs(first, a.out, a.options)
                                          : import_csv(first, a.out, a.options);
  fmt::print("{}: {} layers × {} sources × {} experts, top-{}, {} tokens per source, iteration stride {}\n", a.out, h.layers(),
             h.sources(), h.experts(), h.top_k(), h.tokens_per_source(), h.iteration_stride());
  return 0;
}

int fit(const std::vector<std::string>& names) {
  for (const auto& name : names.empty() ? fitted_presets() : names) {
    PresetFit f;
    try {
      f = fit_preset(name);
    } catch (const FieldError& e) {
      throw InputError("trace fit: " + e.message());
    }
    fmt::print("preset {} ({})\n  statistic: {}\n  target {:.3f}; the preset (sigma_pop {:.3f}) reaches {:.3f}; fitted again: "
               "sigma_pop {:.3f} reaches {:.3f}\n",
               f.preset, f.source, f.statistic, f.target, f.table_sigma_pop, f.table_reached, f.fitted_sigma_pop, f.fitted_reached);
    for (const auto& [what, value] : f.others) fmt::print("  {}: {:.3f}\n", what, value);
  }
  if (!names.empty()) return 0;
  std::string heading;  // the presets drawn without a fit, against their paper's own statistics
  for (const auto& c : preset_checks()) {
    const std::string h = fmt::format("preset {} for {} setups: not fitted to them, calibrated to {}", c.preset, c.setup, c.calibration);
    if (h != heading) fmt::print("{}\n", heading = h);
    fmt::print("  {}: {}: paper {:.2f}, the preset {:.2f}\n", c.source, c.statistic, c.paper, c.reached);
  }
  return 0;
}

}  // namespace

void add_trace(CLI::App& app, Commands& commands) {
  auto* trace = app.add_subcommand("trace", "Gating traces: import, export, generate, inspect, rescale");
  trace->require_subcommand(1);

  auto* imp = trace->add_subcommand(
      "import", "Convert a CSV trace, SmartMoE/FastMoE logs, or the rank files of a recorded PyTorch run to moesim's .trace format");
  auto ia = std::make_shared<ImportArgs>();
  imp->add_option("input", ia->inputs,
                  "CSV file (iter,layer,src[,mb][,loss],e0..eN), a directory of table_iter*_rank*.log, or every rank's "
                  ".trace file of one run recorded by python/moesim_trace (docs/gating.md, Recording a PyTorch run)")
      ->required();
  imp->add_option("--out,-o", ia->out, "Output .trace file")->required();
  imp->add_option("--from", ia->format, "csv, smartmoe or ranks (default: smartmoe for a directory, ranks for .trace files, else csv)");
  imp->add_option("--top-k", ia->options.top_k, "top-k of the gate, when the file's metadata lacks top_k=K");
  imp->add_option("--model", ia->options.model, "Describe what produced the trace (header.model)");
  commands.push_back({imp, [ia, imp] { return import(*ia, *imp); }});

  struct StatsArgs {
    std::string input;
    int gpus = 0;
    std::uint64_t from = 0;
    bool json = false;
  };
  auto sa = std::make_shared<StatsArgs>();
  auto* stats = trace->add_subcommand("stats", "Skew, drift and source similarity of a trace, per layer and overall");
  stats->add_option("trace", sa->input, "Input .trace file (or a CSV, imported on the fly)")->required();
  stats->add_option("--gpus", sa->gpus, "Also GPU-level max/mean with experts placed contiguously on this many GPUs");
  stats->add_option("--from-iteration", sa->from, "Skip records before this iteration (e.g. a warm-up)");
  stats->add_flag("--json", sa->json, "Machine-readable output");
  commands.push_back({stats, [sa] {
                        TraceReader reader(replay_trace_path(sa->input));  // a CSV is read as `trace import` makes it
                        TraceStats s(reader.header(), sa->gpus, sa->from);
                        spec::TraceRecord record;
                        while (reader.next(record)) s.add(record);
                        fmt::print("{}\n", sa->json ? s.json().dump(2) : s.text());
                        return 0;
                      }});

  auto* gen = trace->add_subcommand("gen", "Generate a seeded synthetic trace (docs/spec/gating-traces.md §6)");
  auto g = std::make_shared<GenOptions>();
  gen->add_option("--out,-o", g->out, "Output .trace file")->required();
  gen->add_option("--preset", g->preset,
                  "naive (no balance loss, SmartMoE-like; FasterMoE's runs), aux (balanced), concentrated, pro-prophet "
                  "(fitted to Pro-Prophet Fig. 3: `moesim trace fit`)")
      ->capture_default_str();
  gen->add_option("--experts", g->experts, "Experts per layer")->capture_default_str();
  gen->add_option("--top-k", g->top_k, "Experts per token")->capture_default_str();
  gen->add_option("--layers", g->layers, "MoE layers")->capture_default_str();
  gen->add_option("--sources", g->sources, "Sources (GPUs)")->capture_default_str();
  gen->add_option("--tokens", g->tokens, "Tokens per source per iteration")->capture_default_str();
  gen->add_option("--iterations", g->iterations, "Iterations")->capture_default_str();
  gen->add_option("--seed", g->seed, "Seed: the same seed gives the same trace on any machine")->capture_default_str();
  gen->add_option("--set,-s", g->sets, "Override a generator parameter, e.g. --set sigma_pop=1.5 --set tau=500");
  gen->add_flag("--quiet,-q", g->quiet, "No progress on stderr");
  commands.push_back({gen, [g] { return generate(*g); }});

  auto* fit_cmd = trace->add_subcommand(
      "fit",
      R"(The presets fitted to what a paper reports of its own workload: each one's statistic, its target, the value the
preset reaches as the table has it, and sigma_pop fitted again; then the presets a paper's setups draw
without a fit (naive for FasterMoE's), beside what that paper says of its own workload
  moesim trace fit                   every fitted preset, then the unfitted ones' statistics
  moesim trace fit pro-prophet       one)");
  auto names = std::make_shared<std::vector<std::string>>();
  fit_cmd->add_option("preset", *names, "Fitted presets (default: all)");
  commands.push_back({fit_cmd, [names] { return fit(*names); }});

  struct RescaleArgs {
    std::string input, out;
    RescaleOptions options;
  };
  auto ra = std::make_shared<RescaleArgs>();
  auto* rescale = trace->add_subcommand("rescale", "Map a trace to more sources and experts (see docs/gating.md)");
  rescale->add_option("trace", ra->input, "Input .trace file")->required();
  rescale->add_option("--out,-o", ra->out, "Output .trace file")->required();
  rescale->add_option("--sources", ra->options.sources, "Sources (GPUs) of the new trace")->required();
  rescale->add_option("--experts", ra->options.experts, "Experts of the new trace: a multiple of the trace's")->required();
  rescale->add_option("--tokens", ra->options.tokens_per_source, "Tokens per source (default: the trace's)");
  rescale->add_option("--seed", ra->options.seed, "Seed of the resampling")->capture_default_str();
  commands.push_back({rescale, [ra] {
                        const auto h = rescale_trace(ra->input, ra->out, ra->options);
                        fmt::print("{}: {} sources × {} experts, {} tokens per source\n", ra->out, h.sources(), h.experts(),
                                   h.tokens_per_source());
                        return 0;
                      }});

  auto ea = std::make_shared<std::pair<std::string, std::string>>();
  auto* exp = trace->add_subcommand("export", "Write a .trace file as CSV");
  exp->add_option("trace", ea->first, "Input .trace file")->required();
  exp->add_option("--out,-o", ea->second, "Output CSV file")->required();
  commands.push_back({exp, [ea] {
                        export_csv(ea->first, ea->second);
                        return 0;
                      }});
}

}  // namespace moesim::cli
