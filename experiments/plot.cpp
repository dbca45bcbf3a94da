#include "plot.hpp"

#include "results.hpp"
#include "runner.hpp"
#include "spec.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "collective_sweep.hpp"
#include "errors.hpp"
#include "gating.hpp"
#include "results_db.hpp"
#include "taskgraph.hpp"
#include "trace.hpp"

namespace moesim {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// What the figures read.

struct Run {
  std::string group, name;  // "GROUP/NAME" variants: group and name; otherwise group ""
  int gpus = 0;
  double time = 0;  // mean iteration time, seconds
  std::vector<double> seed_times;  // with several seeds, each seed's mean iteration time
  double breakdown[kNumPhases] = {};  // critical path per phase, seconds
  std::vector<double> gpu_load;                                 // token-slots computed per GPU
  std::vector<std::vector<std::vector<double>>> expert_load;    // iteration × layer × expert
};

struct Inputs {
  std::vector<std::vector<Run>> summaries;  // one list of runs per summary.json
  std::vector<std::string> summary_names;
  std::vector<std::string> series_suffix;   // scaling: what else a sweep point varies (results.db)
  // A sweep point's short name (results.db): the values of what else it varies, one field of those
  // zipped together ("gb200-nvl72"); it prefixes the groups of its GROUP/NAME variants in a speedup
  // figure.
  std::vector<std::string> point_names;
  std::vector<json> collectives;            // collective.json files
  std::string timeline;                     // a timeline.json
  std::string trace;                        // a gating trace
  fs::path first_dir;                       // where figures go by default
  // What the summaries ran, for a figure's caption: platform, model, routing; and the tokens per
  // GPU of each (one value: weak scaling).
  std::set<std::string> platforms, models, routings;
  std::set<int> gpus;
  std::set<long> tokens_per_gpu;
};

// A caption line: platform, model and routing of the summaries read (each, or "several"), and for
// several cluster sizes whether the scaling was weak (tokens per GPU fixed).
std::string caption(const Inputs& in, bool scaling) {
  auto one = [](const std::set<std::string>& v, const char* what) {
    return v.size() == 1 ? *v.begin() : fmt::format("{} {}", v.size(), what);
  };
  if (in.platforms.empty()) return "";
  const std::string gpus = in.gpus.size() == 1 ? fmt::format("{} GPUs", *in.gpus.begin())
                                                : fmt::format("{}-{} GPUs", *in.gpus.begin(), *in.gpus.rbegin());
  std::string c = fmt::format("{} × {}; ", one(in.platforms, "platforms"), gpus);
  if (scaling)  // first: the caption is cut at the end where it is long
    c += in.tokens_per_gpu.size() == 1 ? fmt::format("weak scaling, {} tokens per GPU; ", *in.tokens_per_gpu.begin())
                                       : "tokens per GPU vary; ";
  c += fmt::format("{}; {}", one(in.models, "models"), one(in.routings, "routings"));
  return c.size() > 96 ? c.substr(0, 93) + "..." : c;  // what fits above a figure of one paper column
}


Run run_from_json(const json& j, int gpus) {
  Run r;
  const std::string full = j.value("name", j.value("policy", std::string("run")));
  if (const auto slash = full.find('/'); slash != std::string::npos) {
    r.group = full.substr(0, slash);
    r.name = full.substr(slash + 1);
  } else {
    r.name = full;
  }
  r.gpus = gpus;
  r.time = j.at("iteration_time_s").get<double>();
  if (const auto s = j.find("iteration_time_over_seeds"); s != j.end() && s->contains("per_seed_s"))
    r.seed_times = s->at("per_seed_s").get<std::vector<double>>();
  for (int p = 0; p < kNumPhases; ++p) r.breakdown[p] = j.at("breakdown").value(phase_name(Phase(p)), 0.0);
  if (j.contains("gpu_load")) r.gpu_load = j["gpu_load"].get<std::vector<double>>();
  for (const auto& it : j.value("per_iteration", json::array()))
    if (it.contains("expert_load")) r.expert_load.push_back(it["expert_load"].get<std::vector<std::vector<double>>>());
  return r;
}

void add_summary(const json& j, const std::string& name, const std::string& where, Inputs& in) {
  try {
    const int gpus = j.at("gpus").get<int>();
    std::vector<Run> runs;
    if (j.contains("variants"))
      for (const auto& v : j["variants"]) runs.push_back(run_from_json(v, gpus));
    else {
      json named = j;  // a plain experiment's one run is named by its policy, not by the experiment
      if (named.contains("policy")) named["name"] = named["policy"];
      runs.push_back(run_from_json(named, gpus));
    }
    in.summaries.push_back(std::move(runs));
    in.summary_names.push_back(name);
    in.series_suffix.emplace_back();
    in.point_names.emplace_back();
    if (j.contains("platform") && j.contains("model")) {
      in.platforms.insert(j.value("platform", "?"));
      in.gpus.insert(gpus);
      auto add_model = [&](const json& m) {
        in.models.insert(fmt::format("{} ({} layers, {} experts, top-{})", m.value("name", "model"), m.value("layers", 0),
                                     m.value("experts", 0), m.value("top_k", 0)));
      };
      const auto& m = j["model"];
      bool spec_model_run = !j.contains("variants");
      for (const auto& v : j.value("variants", json::array()))  // variants of their own model, or the spec's
        if (v.contains("model")) add_model(v["model"]);
        else spec_model_run = true;
      if (spec_model_run) add_model(m);
      // The routing in a few words: a trace's file name (not where it lies, nor which iterations),
      // a generator's preset and seed (its parameters are in summary.json).
      auto add_routing = [&](std::string routing) {
        if (routing.rfind("trace ", 0) == 0) {
          routing = routing.substr(6, routing.find(": ") == std::string::npos ? std::string::npos : routing.find(": ") - 6);
          const fs::path path = routing;  // its folder and name: "smartmoe-gpt-e32-k2-r16/trace.csv"
          routing = "trace " + (path.parent_path().filename() / path.filename()).string();
        } else if (const auto open = routing.find(" ("), close = routing.find("), "); open != std::string::npos && close != std::string::npos) {
          routing = routing.substr(0, open) + routing.substr(close + 1);
        }
        in.routings.insert(routing);
      };
      bool spec_routing_run = !j.contains("variants");  // variants of their own routing, or the spec's
      for (const auto& v : j.value("variants", json::array()))
        if (v.contains("routing")) add_routing(v.value("routing", "?"));
        else spec_routing_run = true;
      if (spec_routing_run) add_routing(j.value("routing", j.value("gating", std::string("?"))));
      in.tokens_per_gpu.insert(m.value("tokens_per_gpu", 0L));
    }
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a moesim summary.json ({})", where, e.what()));
  }
}

void read_summary(const fs::path& path, Inputs& in) {
  const json j = read_json_file(path);
  add_summary(j, j.value("name", path.parent_path().filename().string()), path.string(), in);
}

void read_input(const fs::path& path, Inputs& in) {
  if (in.first_dir.empty())  // a file in the current directory ("results.db"): figures beside it, in "."
    in.first_dir = fs::is_directory(path) ? path : path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (fs::is_directory(path)) {
    bool any = false;
    for (const char* f : {"summary.json", "collective.json", "timeline.json"})
      if (fs::exists(path / f)) {
        read_input(path / f, in);
        any = true;
      }
    if (!any)
      throw InputError(path.string() + ": no summary.json, collective.json or timeline.json here; give the --out "
                                       "directory of `moesim run` or `moesim collective`");
    return;
  }
  if (!fs::exists(path))
    throw InputError(path.string() + ": no such file; give a results directory, a summary.json, collective.json, "
                                     "timeline.json, a sweep's results.db, or a gating trace (.trace, .csv)");
  const auto ext = path.extension().string();
  if (ext == ".db") {  // a sweep's results: each point a summary named by its label
    const auto points = ResultsDb(path.string(), false).points();
    // A field that takes one value per GPU count (the node count, or what is zipped with it) is the
    // x axis of a scaling figure; the policy is the run's name: neither names a series.
    std::map<std::string, std::map<int, std::set<std::string>>> by_gpus;
    for (const auto& p : points)
      for (const auto& [field, value] : p.overrides.items())
        by_gpus[field][p.summary.value("gpus", 0)].insert(value.get<std::string>());
    auto follows_gpus = [&](const std::string& field) {
      return std::all_of(by_gpus[field].begin(), by_gpus[field].end(), [](const auto& kv) { return kv.second.size() == 1; });
    };
    // The fields that name a point: those that vary but the policy, and of fields that vary
    // together (a zip) one.
    auto value_of = [](const StoredPoint& p, const std::string& field) {
      return p.overrides.contains(field) ? p.overrides[field].get<std::string>() : std::string();
    };
    // Fields of words before fields of numbers: "gb200-nvl72" names a point better than its "64".
    std::vector<std::string> fields;
    for (const auto& kv : by_gpus) fields.push_back(kv.first);
    auto numeric = [&](const std::string& field) {
      return std::all_of(points.begin(), points.end(), [&](const auto& p) {
        const std::string v = value_of(p, field);
        return !v.empty() && v.find_first_not_of("0123456789.eE+-") == std::string::npos;
      });
    };
    std::stable_partition(fields.begin(), fields.end(), [&](const std::string& f) { return !numeric(f); });
    std::vector<std::string> naming;
    for (const auto& field : fields) {
      if (field == "policy.name") continue;
      auto same_partition = [&](const std::string& other) {
        for (const auto& a : points)
          for (const auto& b : points)
            if ((value_of(a, field) == value_of(b, field)) != (value_of(a, other) == value_of(b, other))) return false;
        return true;
      };
      const bool varies = std::any_of(points.begin(), points.end(), [&](const auto& p) { return value_of(p, field) != value_of(points.front(), field); });
      if (varies && std::none_of(naming.begin(), naming.end(), same_partition)) naming.push_back(field);
    }
    for (const auto& p : points) {
      add_summary(p.summary, p.label, fmt::format("{} point {}", path.string(), p.id), in);
      std::string suffix, name;
      for (const auto& [field, value] : p.overrides.items())
        if (field != "policy.name" && !follows_gpus(field)) suffix += (suffix.empty() ? "" : " ") + field + "=" + value.get<std::string>();
      for (const auto& field : naming) name += (name.empty() ? "" : " ") + value_of(p, field);
      in.series_suffix.back() = suffix;
      in.point_names.back() = name;
    }
    if (in.summaries.empty()) throw InputError(path.string() + ": no finished points yet");
    return;
  }
  if (ext == ".trace" || ext == ".csv") {
    in.trace = path.string();
    return;
  }
  if (path.filename() == "timeline.json") {  // big: not parsed here, only by the timeline figure
    in.timeline = path.string();
    return;
  }
  const json j = read_json_file(path);
  if (j.contains("traceEvents")) in.timeline = path.string();
  else if (j.contains("points")) in.collectives.push_back(j);
  else read_summary(path, in);
}

// ---------------------------------------------------------------------------------------------
// The style every figure shares, and rendering.

struct Figure {
  std::string name;
  std::string body;  // data blocks and plot commands
};

// Okabe & Ito's palette (colour-blind safe), in the order series take it.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                    "#56B4E9", "#CC79A7", "#F0E442", "#000000"};

std::string terminal(const std::string& format) {
  const auto& s = kFigureSize;
  if (format == "png")
    return fmt::format("set terminal pngcairo noenhanced color font 'Helvetica,9' size {},{} fontscale {:.3f} "
                       "linewidth 4\n",
                       s.png_width, s.png_height, s.png_width / (s.width_in * 72) * 0.75);
  if (format == "svg")
    return fmt::format("set terminal svg noenhanced font 'Helvetica,9' size {},{} dynamic\n", int(s.width_in * 96),
                       int(s.height_in * 96));
  return fmt::format("set terminal pdfcairo noenhanced color font 'Helvetica,9' size {}in,{}in linewidth 1.5\n",
                     s.width_in, s.height_in);
}

std::string style() {
  std::string s =
      "set border 3 lw 1\n"
      "set tics nomirror out scale 0.5\n"
      "set grid ytics lc rgb '#d9d9d9' lw 0.5 dt 1\n"
      "set key noautotitle samplen 1.5 spacing 1.1 font ',8'\n"
      "set style fill solid 0.85 border rgb '#333333'\n"
      "set datafile separator whitespace\n"
      "set datafile missing '?'\n";
  for (int i = 0; i < 8; ++i)
    s += fmt::format("set linetype {} lc rgb '{}' lw 1 pt {} ps 0.6\n", i + 1, kPalette[i], 5 + 2 * (i % 4));
  s += "set linetype cycle 8\n";
  return s;
}

// A string from the inputs (a run's, an experiment's or a file's name) as a gnuplot string literal in
// the script: single quotes, inside which gnuplot substitutes nothing (no `backquote` command, no
// escapes; a quote is written twice). A control character becomes '?': a newline would end the
// command and start another.
std::string gp_string(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, std::iscntrl(static_cast<unsigned char>(c)) ? '?' : c);
  return q + "'";
}

// The same string as a field of an inline data block ($data << EOD): double-quoted, since data
// fields know no other quotes; a double quote inside becomes ' and a control character '?', so
// that no name can end its field or the block (a line "EOD" would make the rest commands).
std::string data_string(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? '\'' : std::iscntrl(static_cast<unsigned char>(c)) ? '?' : c;
  return q + "\"";
}

// Writes OUT/NAME.gp and renders OUT/NAME.FORMAT through a temporary file (nothing half-written).
std::string render(const Figure& f, const std::string& format, const fs::path& out) {
  const std::string gnuplot = gnuplot_path();
  if (gnuplot.empty())
    throw std::runtime_error("gnuplot is not installed: `apt-get install gnuplot-nox` (Debian), then run again");
  const fs::path figure = out / (f.name + "." + format), script = out / (f.name + ".gp");
  const fs::path tmp = figure.string() + ".tmp", log = out / (f.name + ".gnuplot.log");
  std::ofstream(script) << "# moesim plot: " << f.name << " (run `gnuplot " << script.filename().string()
                        << "` to render it again)\n"
                        << terminal(format)
                        << fmt::format("set output (exists('outfile') ? outfile : {})\n", gp_string(figure.filename().string()))
                        << style() << f.body;
  const std::string cmd = fmt::format("cd {} && {} -e {} {} 2>{}", shell_word(out.string()), gnuplot,
                                      shell_word("outfile=" + gp_string(tmp.filename().string())),
                                      shell_word(script.filename().string()), shell_word(log.filename().string()));
  const int rc = std::system(cmd.c_str());
  std::stringstream err;
  err << std::ifstream(log).rdbuf();
  fs::remove(log);
  if (rc != 0 || !fs::exists(tmp) || fs::file_size(tmp) == 0) {
    fs::remove(tmp);
    throw std::runtime_error(fmt::format("gnuplot failed on {} (status {}):\n{}", script.string(), rc, err.str()));
  }
  fs::rename(tmp, figure);
  return figure.string();
}

// ---------------------------------------------------------------------------------------------
// The figures.

// All runs of all summaries, each with its group: its own GROUP/ prefix, else the summary's name
// when there are several summaries. `by_point`: a sweep point's GROUP/NAME variants in groups of
// their own, "POINT GROUP" (a bar chart's; a scaling line runs across points).
std::vector<Run> all_runs(const Inputs& in, bool by_point = false) {
  std::vector<Run> runs;
  for (std::size_t s = 0; s < in.summaries.size(); ++s)
    for (Run r : in.summaries[s]) {
      if (r.group.empty() && in.summaries.size() > 1) r.group = in.summary_names[s];
      else if (by_point && !r.group.empty() && !in.point_names[s].empty()) r.group = in.point_names[s] + " " + r.group;
      runs.push_back(std::move(r));
    }
  return runs;
}

std::vector<std::string> ordered_unique(const std::vector<Run>& runs, std::string Run::*field) {
  std::vector<std::string> out;
  for (const auto& r : runs)
    if (std::find(out.begin(), out.end(), r.*field) == out.end()) out.push_back(r.*field);
  return out;
}

std::string label(const Run& r) { return r.group.empty() ? r.name : r.group + "/" + r.name; }

// The speedup of `run` over `base` and its 95% confidence half-width: with several seeds (the same
// number for both), the mean of the seeds' paired speedups (seed k over seed k); else the ratio of
// their times, 0.
std::pair<double, double> paired_speedup(const Run& base, const Run& run) {
  const auto &b = base.seed_times, &v = run.seed_times;
  if (b.size() < 2 || b.size() != v.size()) return {base.time / run.time, 0.0};
  std::vector<double> paired;
  for (std::size_t k = 0; k < b.size(); ++k) paired.push_back(b[k] / v[k]);
  return {std::accumulate(paired.begin(), paired.end(), 0.0) / double(paired.size()), ci95_half_width(paired)};
}

Figure speedup_figure(const Inputs& in, const PlotOptions& o) {
  const auto runs = all_runs(in, true);
  const auto groups = ordered_unique(runs, &Run::group);
  const auto names = ordered_unique(runs, &Run::name);
  const std::string baseline = o.baseline.empty() ? names.front() : o.baseline;
  if (std::find(names.begin(), names.end(), baseline) == names.end())
    throw InputError(fmt::format("--baseline {}: no run of that name (runs: {})", baseline, fmt::join(names, ", ")));
  std::map<std::pair<std::string, std::string>, const Run*> by_name;
  for (const auto& r : runs) by_name[{r.group, r.name}] = &r;
  // speedup(g, n) = time of the group's baseline / time of n; nullopt where either is missing. With
  // several seeds, the mean of the seeds' paired speedups, and its 95% confidence half-width.
  auto speedup_ci = [&](const std::string& g, const std::string& n) -> std::optional<std::pair<double, double>> {
    const auto base = by_name.find({g, baseline}), t = by_name.find({g, n});
    if (base == by_name.end() || t == by_name.end() || t->second->time <= 0) return std::nullopt;
    return paired_speedup(*base->second, *t->second);
  };
  double top = 1;  // the axis: up to the top of the highest error bar
  for (const auto& g : groups)
    for (const auto& n : names)
      if (const auto x = speedup_ci(g, n)) top = std::max(top, x->first + x->second);
  // More than 12 bars: their values stand upright above them (side by side they run into each
  // other), which takes more room above the highest.
  const bool upright = groups.size() == 1 && names.size() > 12;
  std::string body = fmt::format("set ylabel {}\nset yrange [0:{:.3f}]\n", gp_string("Speedup over " + baseline + " (x)"),
                                 top * (upright ? 1.3 : 1.18));
  body += "set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555' front\n";
  if (groups.size() == 1) {  // one bar per run, named on the axis, its value above it
    body += "$bars << EOD\n";
    bool seeds = false;
    for (const auto& n : names)
      if (const auto x = speedup_ci(groups[0], n)) {
        body += fmt::format("{} {:.4f} {:.4f}\n", data_string(n), x->first, x->second);
        seeds = seeds || x->second > 0;
      }
    const bool many = names.size() > 8;  // steeper, smaller names and values
    body += fmt::format("EOD\nset xtics rotate by {} right{}\nset boxwidth 0.7\nset xrange [-0.6:*]\n", many ? 45 : 30,
                        many ? " font ',7'" : "");
    body += fmt::format("plot $bars using 0:2:(int($0) % 8 + 1):xtic(1) with boxes lc variable{}, "
                        "'' using 0:($2+$3):(sprintf('%.2f', $2)) with labels {} font ',{}'\n",
                        seeds ? ", '' using 0:2:3 with yerrorbars lc rgb '#333333' pt 7 ps 0 notitle" : "",
                        upright ? "rotate by 90 left offset 0,0.3" : "offset 0,0.5", many ? 6 : 7);
    return {"speedup", body};
  }
  // A row per group; per run name two columns, the speedup and its 95% half-width (0: one seed).
  bool seeds = false;
  body += "$data << EOD\ngroup";
  for (const auto& n : names) body += " " + data_string(n) + " ci";
  body += "\n";
  for (const auto& g : groups) {
    body += data_string(g);
    for (const auto& n : names) {
      const auto x = speedup_ci(g, n);
      body += x ? fmt::format(" {:.4f} {:.4f}", x->first, x->second) : " ? ?";
      seeds = seeds || (x && x->second > 0);
    }
    body += "\n";
  }
  body += fmt::format("EOD\nset style data histograms\nset style histogram {} gap 1\nset boxwidth 0.9\n"
                      "set key {}\nset xtics rotate by {}\n",
                      seeds ? "errorbars lw 1" : "clustered",
                      // Many runs: a column of names right of the plot, where no bar runs into it.
                      names.size() > 4 ? "outside right top vertical Left reverse samplen 1 font ',7'" : "top left horizontal",
                      groups.size() > 4 ? "30 right font ',7'" : "20 right");
  body += seeds ? fmt::format("plot for [i=0:{}] $data using (column(2+2*i)):(column(3+2*i)):xtic(1) title columnheader(2+2*i)\n",
                              names.size() - 1)
                : fmt::format("plot for [i=0:{}] $data using (column(2+2*i)):xtic(1) title columnheader(2+2*i)\n", names.size() - 1);
  return {"speedup", body};
}

// Phases as the figures print them (taskgraph.hpp: Phase), and a colour each (Tableau 20's, so that
// neighbours in a stack differ).
constexpr std::array kPhaseColor = {"#4e79a7", "#f28e2b", "#edc948", "#59a14f", "#b07aa1", "#e15759",
                                    "#ff9da7", "#9c755f", "#76b7b2", "#86bcb6", "#8cd17d", "#d37295",
                                    "#499894", "#79706e", "#f1ce63", "#a0cbe8", "#d4a6c8", "#bab0ac"};
static_assert(kPhaseColor.size() == kNumPhases, "a colour for every phase");

Figure breakdown_figure(const Inputs& in, const PlotOptions&) {
  const auto runs = all_runs(in);
  std::vector<int> shown;  // the phases some run spends time in
  for (int p = 0; p < kNumPhases; ++p)
    if (std::any_of(runs.begin(), runs.end(), [&](const Run& r) { return r.breakdown[p] > 0; })) shown.push_back(p);
  std::string body = "$data << EOD\n";
  for (const auto& r : runs) {
    body += data_string(label(r));
    for (int p : shown) body += fmt::format(" {:.6f}", r.breakdown[p] * 1e3);
    body += "\n";
  }
  body += "EOD\nset ylabel 'Critical path, ms' font ',7'\nset ytics font ',7'\nset yrange [0:*]\n"
          "set style data histograms\nset style histogram rowstacked\nset boxwidth 0.7\nset style fill solid 0.9 noborder\n"
          "set key outside right top vertical reverse Left samplen 1 width -2 font ',6'\nset xtics rotate by 60 right font ',7'\n";
  body += "plot ";
  for (std::size_t k = 0; k < shown.size(); ++k)
    body += fmt::format("{}$data using {}{} title {} lc rgb '{}'", k ? ", " : "", k + 2, k ? "" : ":xtic(1)",
                        gp_string(phase_names(Phase(shown[k])).title), kPhaseColor[shown[k]]);
  return {"breakdown", body + "\n"};
}

// One line per series: (GPUs, value) points.
// Per series, per GPU count: the value and its 95% confidence half-width (0: one seed).
using Series = std::map<std::string, std::map<int, std::pair<double, double>>>;

Figure lines_figure(const std::string& name, const std::vector<std::string>& order, const Series& series,
                    const std::string& ylabel) {
  bool seeds = false;
  for (const auto& [s, points] : series)
    for (const auto& [gpus, v] : points) seeds = seeds || v.second > 0;
  std::string body, plot = "plot ";
  int k = 0;
  for (const auto& s : order) {
    body += fmt::format("$s{} << EOD\n", k);
    for (const auto& [gpus, v] : series.at(s)) body += fmt::format("{} {:.6g} {:.6g}\n", gpus, v.first, v.second);
    body += "EOD\n";
    plot += fmt::format("{}$s{} using 1:2{} with {} lt {} title {}", k ? ", " : "", k, seeds ? ":3" : "",
                        seeds ? "yerrorlines" : "linespoints", k % 8 + 1, gp_string(s));
    ++k;
  }
  // A log y axis where the values span a decade or more; else a linear one from 0, where a speedup
  // of 1.2 and of 1.3 look apart and the baseline's line at 1 is seen.
  double lo = std::numeric_limits<double>::infinity(), hi = 0, top = 0;  // top: of the highest bar
  for (const auto& [s, points] : series)
    for (const auto& [gpus, v] : points)
      if (v.first > 0) lo = std::min(lo, v.first), hi = std::max(hi, v.first), top = std::max(top, v.first + v.second);
  const bool log_y = hi > 0 && hi / lo >= 10;
  // A linear axis in at most 6 steps of 1, 2 or 5 × 10^k: a figure with many series has a short
  // plot (the key below takes its height), where gnuplot's own ticks run into each other.
  double step = 0;
  if (!log_y && top > 0)
    for (double decade = std::pow(10.0, std::floor(std::log10(top / 6))); step == 0; decade *= 10)
      for (double m : {1.0, 2.0, 5.0})
        if (step == 0 && m * decade * 6 >= top) step = m * decade;
  body += std::string("set logscale x 2\n") + (log_y ? "set logscale y 10\n" : fmt::format("set yrange [0:*]\nset ytics {:g}\n", step)) +
          "set xlabel 'GPUs'\nset ylabel " + gp_string(ylabel) +
          "\nset key below Left reverse font ',6'" +
          "\nset format y '%g'\n" + plot + "\n";
  return {name, body};
}

Figure scaling_figure(const Inputs& in, const PlotOptions& o) {
  Series series;
  std::vector<std::string> order;
  auto add = [&](const std::string& s, int gpus, double v, double ci = 0) {
    if (!series.count(s)) order.push_back(s);
    series[s][gpus] = {v, ci};
  };
  if (!in.collectives.empty()) {
    std::vector<CollectivePoint> points;
    for (const auto& c : in.collectives)
      for (auto& p : collective_points(c)) points.push_back(std::move(p));
    const bool one = std::all_of(points.begin(), points.end(), [&](const auto& p) { return p.collective == points.front().collective; });
    for (const auto& p : points)
      add(fmt::format("{}{} {}", one ? "" : std::string(collective_type_name(p.collective)) + " ", p.algorithm,
                      p.exchange.empty() ? format_size(p.bytes) : p.exchange),  // a routed point's bytes vary with the GPUs
          p.gpus, p.seconds * 1e3);
    const std::string what = one && !points.empty() && points.front().collective == CollectiveType::all_to_all ? "All-to-all"
                             : one && !points.empty() ? collective_type_name(points.front().collective)
                                                      : "Collective";
    return lines_figure("scaling", order, series, what + " time (ms)");
  }
  // The baseline's time at each GPU count, of the same group and the same other swept fields (a
  // sweep's series suffix): each series over its own baseline.
  // With several seeds, error bars: a time's 95% interval over its seeds; a speedup's as in the bar
  // chart (paired_speedup()).
  std::map<std::tuple<int, std::string, std::string>, const Run*> base;
  for (std::size_t s = 0; s < in.summaries.size(); ++s)
    for (const auto& r : in.summaries[s])
      if (r.name == o.baseline) base[{r.gpus, r.group, in.series_suffix[s]}] = &r;
  auto mean = [](const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0) / double(x.size()); };
  for (std::size_t s = 0; s < in.summaries.size(); ++s)
    for (const auto& r : in.summaries[s]) {
      const std::string name = label(r) + (in.series_suffix[s].empty() ? "" : " " + in.series_suffix[s]);
      const auto b = base.find({r.gpus, r.group, in.series_suffix[s]});
      if (o.baseline.empty()) {
        if (r.seed_times.size() >= 2) add(name, r.gpus, mean(r.seed_times) * 1e3, ci95_half_width(r.seed_times) * 1e3);
        else add(name, r.gpus, r.time * 1e3);
      } else if (b != base.end()) {
        const auto [speedup, ci] = paired_speedup(*b->second, r);
        add(name, r.gpus, speedup, ci);
      }
    }
  if (!o.baseline.empty() && base.empty()) throw InputError("--baseline " + o.baseline + ": no run of that name");
  return lines_figure("scaling", order, series, o.baseline.empty() ? "Iteration time (ms)" : "Speedup over " + o.baseline + " (x)");
}

Figure load_figure(const Inputs& in, const PlotOptions& o) {
  // The baseline (or the first run) and the fastest of the others.
  const auto& runs = in.summaries.front();
  const Run* base = &runs.front();
  for (const auto& r : runs)
    if (r.name == o.baseline) base = &r;
  const Run* fast = nullptr;
  for (const auto& r : runs)
    if (&r != base && !r.gpu_load.empty() && (!fast || r.time < fast->time)) fast = &r;
  std::vector<const Run*> shown{base};
  if (fast) shown.push_back(fast);
  const std::size_t gpus = base->gpu_load.size();
  const int every = gpus > 32 ? 8 : gpus > 8 ? 4 : 1;
  std::string body = "$data << EOD\ngpu";
  for (const auto* r : shown) body += " " + data_string(r->name);
  body += "\n";
  for (std::size_t g = 0; g < gpus; ++g) {
    body += fmt::format("{}", g % std::size_t(every) == 0 ? data_string(std::to_string(g)) : "\"\"");
    for (const auto* r : shown) body += fmt::format(" {:.3f}", g < r->gpu_load.size() ? r->gpu_load[g] / 1e3 : 0.0);
    body += "\n";
  }
  body += "EOD\nset style data histograms\nset style histogram clustered gap 1\nset boxwidth 1\n"
          "set style fill solid 0.85 noborder\nset xlabel 'GPU'\n"
          "set ylabel 'Token-slots computed (x1000)'\nset yrange [0:*]\nset key top right\n";
  body += fmt::format("plot for [i=2:{}] $data using i:xtic(1) title columnheader(i)\n", shown.size() + 1);
  return {"load", body};
}

// An iteration × expert matrix of one layer's load relative to the mean expert.
Figure heatmap_of(const std::vector<std::pair<double, std::vector<double>>>& columns, const std::string& what) {
  std::string body = "$data << EOD\n";
  double top = 1;
  for (const auto& [iteration, loads] : columns) {
    double mean = 0;
    for (double v : loads) mean += v / double(loads.size());
    for (std::size_t e = 0; e < loads.size(); ++e) {
      const double rel = mean > 0 ? loads[e] / mean : 0;
      top = std::max(top, rel);
      body += fmt::format("{} {} {:.4f}\n", iteration, e, rel);
    }
    body += "\n";
  }
  body += "EOD\n";
  body += "set palette defined (0 '#440154', 0.25 '#3B528B', 0.5 '#21918C', 0.75 '#5EC962', 1 '#FDE725')\n"
          "set xlabel 'Iteration'\nset ylabel 'Expert'\nset cblabel 'Load / mean expert load'\nunset grid\n"
          "set autoscale xfix\nset autoscale yfix\nset tics out\n";
  body += fmt::format("set cbrange [0:{:.3f}]\nset title {} font ',8'\n", top, gp_string(what));
  if (columns.size() <= 12) body += "set xtics 1\n";
  body += "plot $data using 1:2:3 with image\n";
  return {"heatmap", body};
}

Figure heatmap_figure(const Inputs& in, const PlotOptions& o) {
  std::vector<std::pair<double, std::vector<double>>> columns;
  if (!in.trace.empty()) {
    TraceReader reader(replay_trace_path(in.trace));
    if (o.layer < 0 || o.layer >= int(reader.header().layers()))
      throw InputError(fmt::format("--layer {}: the trace has layers 0..{}", o.layer, reader.header().layers() - 1));
    spec::TraceRecord rec;
    while (reader.next(rec)) {
      if (int(rec.layer()) != o.layer) continue;
      const auto m = record_matrix(reader.header(), rec);
      if (columns.empty() || columns.back().first != double(rec.iteration()))
        columns.emplace_back(double(rec.iteration()), std::vector<double>(std::size_t(m.experts), 0.0));
      const auto loads = m.expert_loads();
      for (int e = 0; e < m.experts; ++e) columns.back().second[std::size_t(e)] += double(loads[std::size_t(e)]);
    }
    return heatmap_of(columns, fmt::format("{}, layer {}", fs::path(in.trace).filename().string(), o.layer));
  }
  const auto& run = in.summaries.front().front();
  for (std::size_t it = 0; it < run.expert_load.size(); ++it) {
    if (o.layer < 0 || o.layer >= int(run.expert_load[it].size()))
      throw InputError(fmt::format("--layer {}: the run has layers 0..{}", o.layer, run.expert_load[it].size() - 1));
    columns.emplace_back(double(it), run.expert_load[it][std::size_t(o.layer)]);
  }
  return heatmap_of(columns, fmt::format("{}, layer {}", in.summary_names.front(), o.layer));
}

Figure timeline_figure(const Inputs& in, const PlotOptions& o) {
  const json j = read_json_file(in.timeline);
  struct Box {
    double t0, t1;
    int row;  // gpu × kNumStreams + stream
  };
  std::map<std::string, std::vector<Box>> boxes;  // phase -> boxes
  std::set<int> rows;                              // the streams that ran something
  double end = 0;
  int first = std::numeric_limits<int>::max();  // the timeline's first iteration (the first after the warm-up)
  for (const auto& e : j.at("traceEvents"))
    if (e.value("ph", "") == "X") first = std::min(first, e.at("args").value("iteration", 0));
  for (const auto& e : j.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const int pid = e.at("pid").get<int>(), tid = e.at("tid").get<int>();
    if (pid >= o.timeline_gpus || e.at("args").value("iteration", 0) != first) continue;  // the first run's first GPUs
    const double t0 = e.at("ts").get<double>() / 1e3, t1 = t0 + e.at("dur").get<double>() / 1e3;
    end = std::max(end, t1);
    boxes[e.value("cat", "other")].push_back({t0, t1, pid * kNumStreams + tid});
    rows.insert(pid * kNumStreams + tid);
  }
  if (boxes.empty()) throw InputError(in.timeline + ": no ops of its first iteration on GPUs 0.." + std::to_string(o.timeline_gpus - 1));
  std::map<int, int> y;  // row -> its place on the axis, top to bottom
  std::string ytics = "set ytics (";
  for (int row : rows) {
    const int at = int(y.size());
    y[row] = at;
    ytics += fmt::format("{}{} {}", at ? ", " : "", gp_string(fmt::format("GPU{} {}", row / kNumStreams, stream_name(Stream(row % kNumStreams)))), at);
  }
  std::string body, plot = "plot ";
  int k = 0;
  for (int c = 0; c < kNumPhases; ++c) {
    const auto it = boxes.find(phase_name(Phase(c)));
    if (it == boxes.end()) continue;
    body += fmt::format("$c{} << EOD\n", c);
    for (const auto& b : it->second) body += fmt::format("{:.6f} {:.6f} {:.2f} {:.2f}\n", b.t0, b.t1, y[b.row] - 0.38, y[b.row] + 0.38);
    body += "EOD\n";
    plot += fmt::format("{}$c{} using (($1+$2)/2):(($3+$4)/2):1:2:3:4 with boxxyerror fs solid 0.9 noborder lc rgb '{}' title {}",
                        k++ ? ", " : "", c, kPhaseColor[c], gp_string(phase_names(Phase(c)).title));
  }
  if (k == 0) throw InputError(in.timeline + ": its ops name no phase moesim knows (a timeline.json from an older moesim? run it again)");
  body += ytics + ") font ',6'\n" + fmt::format("set yrange [{}:-0.6]\n", double(y.size()) - 0.4);
  body += fmt::format("set xrange [0:{:.6f}]\nset xlabel 'Time (ms)'\nunset grid\nset grid xtics lc rgb '#d9d9d9' lw 0.5\n"
                      "set key outside top center horizontal font ',7'\n",
                      end);
  return {"timeline", body + plot + "\n"};
}

bool supports(const std::string& figure, const Inputs& in) {
  const bool summaries = !in.summaries.empty();
  std::size_t runs = 0;
  for (const auto& s : in.summaries) runs += s.size();
  if (figure == "speedup") return summaries && runs > 1;
  if (figure == "breakdown") return summaries;
  if (figure == "scaling") {
    if (!in.collectives.empty()) return true;
    std::vector<int> gpus;
    for (const auto& s : in.summaries) gpus.push_back(s.front().gpus);
    return std::set<int>(gpus.begin(), gpus.end()).size() > 1;
  }
  if (figure == "load") return summaries && !in.summaries.front().front().gpu_load.empty();
  if (figure == "heatmap")
    return !in.trace.empty() || (summaries && !in.summaries.front().front().expert_load.empty());
  if (figure == "timeline") return !in.timeline.empty();
  return false;
}

const char* needs(const std::string& figure) {
  if (figure == "speedup") return "a summary.json with variants, or several summaries";
  if (figure == "scaling") return "summaries at two or more GPU counts, or a collective.json";
  if (figure == "load") return "a summary.json whose policy reports per-GPU loads";
  if (figure == "heatmap") return "a summary.json with expert loads, or a gating trace";
  if (figure == "timeline") return "a timeline.json (or the results directory that holds one)";
  return "a summary.json";
}

}  // namespace

const std::vector<std::string>& figure_names() {
  static const std::vector<std::string> names{"speedup", "breakdown", "scaling", "load", "heatmap", "timeline"};
  return names;
}

std::string gnuplot_path() {
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty() && ::access((fs::path(dir) / "gnuplot").c_str(), X_OK) == 0) return (fs::path(dir) / "gnuplot").string();
  }
  return "";
}

std::vector<std::string> plot(const std::vector<std::string>& inputs, const PlotOptions& o) {
  if (inputs.empty()) throw InputError("plot: give at least one results directory or file");
  if (o.format != "pdf" && o.format != "png" && o.format != "svg")
    throw InputError("--format " + o.format + ": use pdf, png or svg");
  for (const auto& f : o.figures)
    if (std::find(figure_names().begin(), figure_names().end(), f) == figure_names().end())
      throw InputError(fmt::format("--figure {}: no such figure (figures: {})", f, fmt::join(figure_names(), ", ")));
  if (o.timeline_gpus < 1) throw InputError("--timeline-gpus must be >= 1");
  Inputs in;
  for (const auto& p : inputs) read_input(p, in);
  std::vector<std::string> wanted = o.figures;
  if (wanted.empty())
    for (const auto& f : figure_names())
      if (supports(f, in)) wanted.push_back(f);
  for (const auto& f : wanted)
    if (!supports(f, in)) throw InputError(fmt::format("--figure {}: needs {}", f, needs(f)));
  if (wanted.empty()) throw InputError("plot: nothing in the inputs to plot");
  const fs::path out = o.out.empty() ? in.first_dir : fs::path(o.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw InputError(out.string() + ": cannot create the output directory: " + ec.message());
  std::vector<std::string> written;
  for (const auto& f : wanted) {
    Figure fig = f == "speedup" ? speedup_figure(in, o)
                 : f == "breakdown" ? breakdown_figure(in, o)
                 : f == "scaling"   ? scaling_figure(in, o)
                 : f == "load"      ? load_figure(in, o)
                 : f == "heatmap"   ? heatmap_figure(in, o)
                                    : timeline_figure(in, o);
    if (const auto c = caption(in, f == "scaling"); !c.empty() && (f == "speedup" || f == "breakdown" || f == "scaling" || f == "load") &&
                                                     in.collectives.empty())
      fig.body = fmt::format("set title {} font ',5' noenhanced\n", gp_string(c)) + fig.body;
    written.push_back(render(fig, o.format, out));
  }
  return written;
}

}  // namespace moesim
