#include "results.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "errors.hpp"

namespace moesim {
namespace fs = std::filesystem;

namespace {

nlohmann::json breakdown_json(const Breakdown& b) {
  nlohmann::json j;
  for (int p = 0; p < kNumPhases; ++p) j[phase_name(Phase(p))] = b.seconds[p];
  return j;
}

// The load spread a policy leaves (one definition, docs/timeline.md): per layer, the most
// token-slots a GPU computes over the mean; its mean and max over the layers. {0, 0}: not reported.
std::pair<double, double> load_spread(const RunResult& r) {
  const auto per_layer = r.mean_load_max_mean();
  if (per_layer.empty()) return {0, 0};
  return {std::accumulate(per_layer.begin(), per_layer.end(), 0.0) / double(per_layer.size()),
          *std::max_element(per_layer.begin(), per_layer.end())};
}

// Per layer, its critical-path and busy seconds per phase (Attribution).
nlohmann::json per_layer_json(const Attribution& a) {
  auto rows = nlohmann::json::array();
  for (std::size_t l = 0; l < a.layer_critical.size(); ++l)
    rows.push_back({{"layer", l}, {"critical_path", breakdown_json(a.layer_critical[l])}, {"busy", breakdown_json(a.layer_busy[l])}});
  return rows;
}

}  // namespace

void write_atomically(const std::string& path_text, const std::string& text) {
  const fs::path path = path_text, tmp = path_text + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) throw InputError(tmp.string() + ": cannot write (check --out and its permissions)");
    out << text;
    if (!out.flush()) throw InputError(tmp.string() + ": write failed (disk full?)");
  }
  fs::rename(tmp, path);
}


namespace {

// Whether the run's most demanding GPU fits in the GPU's memory (memory_model.hpp).
bool fits(const Experiment& ex, const RunResult& r) {
  return r.peak_memory().total() <= ex.cluster_spec.gpu().memory_gib() * double(1ull << 30);
}

// The GPUs over their memory in the iteration with the most of them.
const std::vector<int>& over_memory(const RunResult& r) {
  static const std::vector<int> none;
  const std::vector<int>* most = &none;
  for (const auto& it : r.iterations)
    if (it.over_memory.size() > most->size()) most = &it.over_memory;
  return *most;
}

// Ascending ranks as ranges: "0-7, 16".
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += fmt::format("{}{}", out.empty() ? "" : ", ", i == j ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return out;
}

// The numbers of one run: its policy, mean time and breakdown, and one row per iteration.
nlohmann::json run_json(const RunResult& r) {
  nlohmann::json j;
  if (!r.name.empty()) j["name"] = r.name;
  j["policy"] = r.policy;
  j["iterations"] = r.iterations.size();
  if (r.warmup > 0) j["warmup_iterations"] = r.warmup;  // left out of the means below
  j["iteration_time_s"] = r.mean_time();
  j["mfu"] = r.mfu();  // the model's FLOPs per GPU over the time and the GPU's dense peak
  j["model_flops_per_gpu"] = r.model_flops_per_gpu;
  if (!r.seed_times.empty())  // several seeds; everything else here is the first seed's
    j["iteration_time_over_seeds"] = {{"seeds", r.seed_times.size()}, {"mean_s", r.seeds_mean_time()},
                                      {"ci95_s", r.seeds_ci95()}, {"per_seed_s", r.seed_times}};
  const Attribution a = r.mean_attribution();
  j["breakdown"] = breakdown_json(a.critical);  // the critical path per phase: adds up to iteration_time_s
  j["busy"] = breakdown_json(a.busy);           // per phase, seconds a GPU's streams are busy (mean over GPUs)
  j["per_layer"] = per_layer_json(a);
  if (const auto load = r.mean_gpu_load(); !load.empty()) j["gpu_load"] = load;  // token-slots computed per GPU
  if (const auto per_layer = r.mean_load_max_mean(); !per_layer.empty()) {
    const auto [mean, max] = load_spread(r);
    j["load_spread"] = {{"per_layer", per_layer}, {"mean_over_layers", mean}, {"max_over_layers", max}};
  }
  if (const auto m = r.peak_memory(); m.total() > 0)  // the GPU that needs the most, in the iteration that needs the most
    j["peak_memory_bytes"] = {{"total", m.total()},         {"params", m.params},           {"grads", m.grads},
                              {"optimizer", m.optimizer},   {"activations", m.activations}, {"materialized", m.materialized},
                              {"materialized_params", m.materialized_params}};
  if (const auto m = r.peak_state_memory(); m.states() > 0)  // the GPU whose model states need the most
    j["peak_state_memory_bytes"] = {{"states", m.states()},     {"params", m.params},       {"grads", m.grads},
                                    {"optimizer", m.optimizer}, {"materialized", m.materialized},
                                    {"materialized_params", m.materialized_params}};
  auto& roof = j["roofline"] = nlohmann::json::array();  // FasterMoE §1.6, first iteration, EP placement
  for (const auto& [layer, x] : r.roofline)
    roof.push_back({{"layer", layer}, {"lat_comp_s", x.lat_comp}, {"lat_comm_s", x.lat_comm}, {"r_cc", x.r_cc},
                    {"lat_e2e_s", x.lat_e2e}, {"p_bar_flops", x.p_bar}, {"p_worker_flops", x.p_worker},
                    {"p_ideal_flops", x.p_ideal}, {"p_semi_flops", x.p_semi}});
  auto& rows = j["per_iteration"] = nlohmann::json::array();
  const std::size_t measured_from = r.iterations.size() - r.measured().size();
  for (const auto& it : r.iterations)
    rows.push_back({{"iteration", it.iteration},
                    {"warmup", rows.size() < measured_from},  // left out of the means above
                    {"iteration_time_s", it.time},
                    {"breakdown", breakdown_json(it.attribution.critical)},
                    {"max_mean_load", it.max_mean_load},
                    {"trace_iteration", it.trace_iteration},
                    {"dropped_tokens", it.dropped},
                    {"dropped_per_layer", it.dropped_per_layer},
                    {"capacity_factor", it.capacity_factor},
                    {"rerouted_tokens", it.rerouted},
                    {"shadowed_experts", it.shadowed},
                    {"moved_experts", it.moved},
                    {"load_stddev_per_layer", it.load_stddev_per_layer},
                    {"expert_load", it.expert_load}});
  double device_peak = 0;
  for (std::size_t i = 0; i < r.iterations.size(); ++i) {
    if (r.iterations[i].device_memory_peak <= 0) continue;
    rows[i]["device_memory_peak_bytes"] = r.iterations[i].device_memory_peak;
    device_peak = std::max(device_peak, r.iterations[i].device_memory_peak);
  }
  if (device_peak > 0) j["device_memory_peak_bytes"] = device_peak;  // measured by a hardware backend
  return j;
}

}  // namespace

nlohmann::json summary_json(const Experiment& ex, const ExperimentResult& result) {
  const auto& s = ex.spec;
  nlohmann::json j;
  j["name"] = s.name();
  j["backend"] = result.backend;  // sim, host or hw: what produced the times
  j["spec"] = ex.spec_path;
  j["platform"] = ex.cluster_spec.name();
  j["nodes"] = ex.cluster_spec.nodes();
  j["gpus"] = result.runs.front().gpus;
  j["seed"] = s.seed();
  auto model_json = [](const spec::ModelSpec& m) {
    return nlohmann::json{{"name", m.name()},       {"layers", m.layers()}, {"d_model", m.d_model()},
                          {"d_ffn", m.d_ffn()},     {"experts", m.experts()}, {"top_k", m.top_k()},
                          {"tokens_per_gpu", m.tokens_per_gpu()}};
  };
  j["model"] = model_json(s.model());
  const char* sources[] = {"uniform", "uniform", "zipf", "generator", "trace"};
  j["gating"] = sources[s.gating().source_case() <= 4 ? s.gating().source_case() : 0];
  if (!ex.gating.empty()) j["routing"] = ex.gating;  // trace path and iterations, or preset, parameters and seed
  if (!ex.notes.empty()) j["notes"] = ex.notes;      // what the console said before the run
  if (s.gate().has_capacity_factor())
    j["gate"] = {{"capacity_factor", s.gate().capacity_factor()},
                 {"drop_policy", spec::GateSpec::DropPolicy_Name(s.gate().drop_policy())},
                 {"pad_to_capacity", s.gate().pad_to_capacity()}};
  j["gpu_memory_bytes"] = ex.cluster_spec.gpu().memory_gib() * double(1ull << 30);
  auto run = [&](const RunResult& r) {
    auto rj = run_json(r);
    rj["oom"] = !fits(ex, r);  // simulated all the same, and flagged
    rj["over_memory_gpus"] = over_memory(r);  // which, in the iteration with the most
    return rj;
  };
  if (ex.variants.empty()) {
    j.update(run(result.runs.front()));
    return j;
  }
  auto& variants = j["variants"] = nlohmann::json::array();
  for (std::size_t v = 0; v < result.runs.size(); ++v) {
    variants.push_back(run(result.runs[v]));
    if (v < ex.variants.size() && ex.variants[v].second.model().SerializeAsString() != s.model().SerializeAsString())
      variants.back()["model"] = model_json(ex.variants[v].second.model());  // a variant's own model
    if (v < ex.variant_gating.size() && ex.variant_gating[v] != ex.gating)
      variants.back()["routing"] = ex.variant_gating[v];  // a variant's own routing
  }
  auto& paper = j["paper"] = nlohmann::json::array();
  for (const auto& c : result.paper) {
    paper.push_back({{"claim", c.paper.claim()},
                     {"variant", c.paper.variant()},
                     {"baseline", std::vector<std::string>(c.paper.baseline().begin(), c.paper.baseline().end())},
                     {"quantity", spec::PaperValue::Quantity_Name(c.paper.quantity())},
                     {"groups", std::vector<std::string>(c.paper.groups().begin(), c.paper.groups().end())},
                     {"aggregate", spec::PaperValue::Aggregate_Name(c.paper.aggregate())},
                     {"source", c.paper.source()},
                     {"paper_value", c.paper.value()},
                     {"tolerance", c.tolerance()},
                     {"simulated_value", c.simulated},
                     {"ratio", c.ratio()},
                     {"pass", c.pass()},
                     {"verdict", c.verdict()}});
    if (c.per_seed.size() > 1) {
      paper.back()["simulated_ci95"] = c.ci95;
      paper.back()["simulated_per_seed"] = c.per_seed;
    }
  }
  return j;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(fmt::format("{}: not JSON ({}); give a file moesim wrote", path, e.what()));
  }
}

int timeline_stride(const ExperimentResult& result, std::size_t max_events) {
  std::size_t events = 0;
  for (const auto& r : result.runs)
    for (const auto& g : r.graphs)
      for (const auto& op : g.ops())
        if (const auto* parts = std::get_if<Computes>(&op.body)) events += parts->parts();
        else if (const auto* c = std::get_if<Collective>(&op.body)) events += c->group.size();
        else ++events;
  return int(std::max<std::size_t>(1, (events + max_events - 1) / max_events));
}

std::string every_nth_gpu(int stride) {
  const int last = stride % 10, tens = stride % 100 / 10;
  const char* suffix = tens == 1 || last == 0 || last > 3 ? "th" : last == 1 ? "st" : last == 2 ? "nd" : "rd";
  return fmt::format("every {}{} GPU", stride, suffix);
}

void write_timeline(std::ostream& out, const ExperimentResult& result, std::size_t max_events) {
  // Streamed event by event: a DOM of every event of every variant would take about 2 KB per
  // event (a gigabyte for the demo's twelve 64-GPU variants).
  bool first = true;
  const int stride = timeline_stride(result, max_events);
  auto shown = [&](int rank) { return rank % stride == 0; };
  auto emit = [&](const nlohmann::json& event) {
    out << (first ? "\n" : ",\n") << event.dump();
    first = false;
  };
  out << "{\"displayTimeUnit\": \"ms\", ";
  if (stride > 1)
    out << fmt::format("\"otherData\": {{\"gpus\": \"{} (the timeline keeps under {} events)\"}}, ", every_nth_gpu(stride), max_events);
  out << "\"traceEvents\": [";
  for (std::size_t v = 0; v < result.runs.size(); ++v) {
    const auto& r = result.runs[v];
    const std::string prefix = r.name.empty() ? "" : r.name + ": ";
    const int base = int(v) * r.gpus;  // one block of processes per variant
    for (int rank = 0; rank < r.gpus; rank += stride) {
      emit({{"ph", "M"}, {"name", "process_name"}, {"pid", base + rank}, {"args", {{"name", fmt::format("{}GPU {}", prefix, rank)}}}});
      emit({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", base + rank}, {"args", {{"sort_index", base + rank}}}});
      for (int s = 0; s < kNumStreams; ++s)
        emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", base + rank}, {"tid", s}, {"args", {{"name", stream_name(Stream(s))}}}});
    }
    const std::size_t first = std::size_t(r.first_graph);
    const double origin = r.iterations.size() > first ? r.iterations[first].start : 0;  // each variant from 0
    for (std::size_t i = 0; i < r.graphs.size(); ++i) {
      const double t0 = r.iterations[first + i].start - origin;
      for (const auto& op : r.graphs[i].ops()) {
        const double start = t0 + r.timings[i].start[op.id], end = t0 + r.timings[i].end[op.id];
        nlohmann::json args = {{"iteration", first + i}, {"op", op.id}};
        if (const auto* parts = std::get_if<Computes>(&op.body)) {  // each part as a compute op on its rank
          for (std::size_t p = 0; p < parts->parts(); ++p) {
            if (!shown(parts->ranks[p])) continue;
            const Compute& c = parts->work(p);
            const std::size_t k = parts->first_part + p;
            const double s = t0 + r.timings[i].part_start[k], e = t0 + r.timings[i].part_end[k];
            nlohmann::json part_args = {{"iteration", first + i}, {"op", op.id}, {"kind", compute_kind_name(c.kind)}, {"gflop", c.flops() / 1e9}};
            if (c.tokens) part_args["tokens"] = c.tokens;
            emit({{"name", op.label}, {"cat", phase_name(op.phase)}, {"ph", "X"}, {"ts", s * 1e6}, {"dur", (e - s) * 1e6},
                  {"pid", base + parts->ranks[p]}, {"tid", int(op.stream)}, {"args", part_args}});
          }
          continue;
        }
        if (const auto* c = std::get_if<Compute>(&op.body)) {
          args["kind"] = compute_kind_name(c->kind);
          args["gflop"] = c->flops() / 1e9;
          if (c->tokens) args["tokens"] = c->tokens;
        } else if (const auto* c = std::get_if<Collective>(&op.body)) {
          args["algorithm"] = c->algorithm;
          // What this GPU sends: an all-to-all's row (the whole collective in mbytes_total), a ring
          // collective's buffer.
          args["mbytes"] = c->total_bytes() / 1e6;
          if (!c->sent.empty()) args["mbytes_total"] = c->total_bytes() / 1e6;
        } else {
          args["mbytes"] = std::get<Transfer>(op.body).bytes / 1e6;
        }
        const auto* coll = std::get_if<Collective>(&op.body);
        const auto ranks = op.ranks();
        for (std::size_t i = 0; i < ranks.size(); ++i) {
          if (!shown(ranks[i])) continue;
          if (coll && !coll->sent.empty()) args["mbytes"] = coll->sent[i] / 1e6;
          emit({{"name", op.label}, {"cat", phase_name(op.phase)}, {"ph", "X"}, {"ts", start * 1e6},
                {"dur", (end - start) * 1e6}, {"pid", base + ranks[i]}, {"tid", int(op.stream)}, {"args", args}});
        }
      }
    }
  }
  out << "\n]}\n";
}

std::map<int, std::pair<std::string, int>> timeline_processes(const nlohmann::json& t, const std::string& path) {
  std::map<int, std::pair<std::string, int>> process;
  try {
    for (const auto& e : t.at("traceEvents"))
      if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
        const std::string name = e.at("args").at("name");
        const auto at = name.rfind("GPU ");
        if (at == std::string::npos) continue;
        process[e.at("pid").get<int>()] = {at >= 2 ? name.substr(0, at - 2) : "", std::stoi(name.substr(at + 4))};
      }
  } catch (const std::exception& e) {
    throw InputError(fmt::format("{}: a process name is not one moesim writes ({})", path, e.what()));
  }
  return process;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string paper_table(const std::vector<PaperComparison>& rows) {
  // With several seeds the simulated value is their mean ± its 95% confidence half-width, and the
  // verdict is on that interval (PaperComparison::verdict).
  std::string out = "| claim | paper | simulated | ratio | verdict | source |\n|---|---:|---:|---:|---|---|\n";
  for (const auto& c : rows) {
    const char* unit = c.paper.quantity() == spec::PaperValue::BANDWIDTH ? " GB/s" : "×";
    out += !std::isfinite(c.simulated)
               ? fmt::format("| {} | {:.2f}{} | not run | | | {} |\n", c.paper.claim(), c.paper.value(), unit, c.paper.source())
               : fmt::format("| {} | {:.2f}{} | {:.3f}{}{} | {:.3f} | {} | {} |\n", c.paper.claim(), c.paper.value(), unit,
                             c.simulated, unit, c.per_seed.size() > 1 ? fmt::format(" ± {:.3f}", c.ci95) : "", c.ratio(),
                             c.verdict(), c.paper.source());
  }
  return out;
}

namespace {

// A CSV header's phase columns: "<prefix><phase>_s" for each phase.
std::string phase_header(const std::string& prefix) {
  std::string h;
  for (int p = 0; p < kNumPhases; ++p) h += fmt::format(",{}{}_s", prefix, phase_name(Phase(p)));
  return h;
}

std::string phase_cells(const Breakdown& b) {
  std::string c;
  for (double x : b.seconds) c += fmt::format(",{:.9g}", x);
  return c;
}

// iterations.csv: one row per variant and iteration, warm-up marked, the critical path per phase.
std::string iterations_csv(const ExperimentResult& result) {
  std::string out = "variant,policy,iteration,warmup,time_s" + phase_header("") + ",max_mean_load,dropped_tokens\n";
  for (const auto& r : result.runs) {
    const std::size_t measured_from = r.iterations.size() - r.measured().size();  // RunResult::measured()
    for (std::size_t i = 0; i < r.iterations.size(); ++i) {
      const auto& it = r.iterations[i];
      out += fmt::format("{},{},{},{},{:.9g}{},{:.6g},{}\n", csv_field(r.name), r.policy, it.iteration,
                         i < measured_from ? 1 : 0, it.time, phase_cells(it.attribution.critical), it.max_mean_load, it.dropped);
    }
  }
  return out;
}

// layers.csv: one row per variant and layer, the means over the measured iterations of the layer's
// critical-path and busy seconds per phase.
std::string layers_csv(const ExperimentResult& result) {
  std::string out = "variant,policy,layer" + phase_header("critical_") + phase_header("busy_") + "\n";
  for (const auto& r : result.runs) {
    const auto a = r.mean_attribution();
    for (std::size_t l = 0; l < a.layer_critical.size(); ++l)
      out += fmt::format("{},{},{}{}{}\n", csv_field(r.name), r.policy, l, phase_cells(a.layer_critical[l]),
                         phase_cells(a.layer_busy[l]));
  }
  return out;
}

}  // namespace

void write_results(const std::string& dir, const Experiment& ex, const ExperimentResult& r) {
  // Every file is written in full into a private folder beside DIR first, so that an error (a full
  // disk) leaves DIR as it was; then the folder becomes DIR (new) or its files move in, each rename
  // atomic, summary.json last: a summary always describes the timeline beside it.
  fs::path out = fs::absolute(dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  const fs::path stage = out.parent_path() / fmt::format(".{}.writing-{}", out.filename().string(), ::getpid());
  std::error_code ec;
  fs::remove_all(stage, ec);
  fs::create_directories(stage, ec);
  if (ec) throw InputError(dir + ": cannot create the output directory: " + ec.message());
  try {
    std::ofstream timeline(stage / "timeline.json", std::ios::binary);
    if (!timeline) throw InputError(dir + ": cannot write (check --out and its permissions)");
    write_timeline(timeline, r);
    if (!timeline.flush()) throw InputError(dir + ": writing timeline.json failed (disk full?)");
    timeline.close();
    if (!r.paper.empty())
      write_atomically((stage / "paper.md").string(),
                       "# " + ex.spec.name() + "\n\n" + ex.spec.description() + "\n\n" + paper_table(r.paper));
    write_atomically((stage / "iterations.csv").string(), iterations_csv(r));
    write_atomically((stage / "layers.csv").string(), layers_csv(r));
    write_atomically((stage / "summary.json").string(), summary_json(ex, r).dump(2) + "\n");
    if (!fs::exists(out)) {
      fs::rename(stage, out);
      return;
    }
    if (!fs::is_directory(out)) throw InputError(dir + ": exists and is not a directory");
    for (const char* name : {"timeline.json", "iterations.csv", "layers.csv", "paper.md", "summary.json"})
      if (fs::exists(stage / name)) fs::rename(stage / name, out / name);
      else fs::remove(out / name);  // a paper table of an earlier run would describe another
    fs::remove_all(stage, ec);
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
}

namespace {

std::string memory_cell(const Experiment& ex, const RunResult& r) {
  const double gib = r.peak_memory().total() / double(1ull << 30);
  return gib <= 0 ? "-" : fmt::format("{:.1f}{}", gib, fits(ex, r) ? "" : " OOM");
}

// Max over mean of the token-slots each GPU computes (0 when the policy does not report it).
std::string spread_cell(const RunResult& r) {
  const auto [mean, max] = load_spread(r);
  return mean > 0 ? fmt::format("{:.2f} ({:.2f})", mean, max) : "-";
}

// One run in detail: its time, the critical path and busy time per phase, the load.
std::string run_block(const Experiment& ex, const RunResult& r) {
  const auto a = r.mean_attribution();
  const double t = r.mean_time();
  std::string out = fmt::format("{}{}: {} GPUs ({} × {}), policy {}, {} iteration(s)\n", ex.spec.name(),
                                r.name.empty() ? "" : " / " + r.name, r.gpus, ex.cluster_spec.nodes(),
                                ex.cluster_spec.name(), r.policy, r.iterations.size());
  out += fmt::format("  {:<18}{:>12}\n", "iteration time", fmt::format("{:.3f} ms", t * 1e3));
  if (r.seed_times.size() > 1)
    out += fmt::format("  {:<18}{:>12}  ± {:.3f} ms (95% confidence), the rest of this block the first seed's\n",
                       fmt::format("over {} seeds", r.seed_times.size()), fmt::format("{:.3f} ms", r.seeds_mean_time() * 1e3),
                       r.seeds_ci95() * 1e3);
  out += fmt::format("  {:<18}{:>12}  {:>6}  {:>12}  (docs/timeline.md)\n", "phase", "critical path", "", "busy per GPU");
  for (int p = 0; p < kNumPhases; ++p)
    if (a.critical.seconds[p] > 0 || a.busy.seconds[p] > 0)
      out += fmt::format("  {:<18}{:>12}  {:5.1f}%  {:>12}\n", phase_name(Phase(p)), fmt::format("{:.3f} ms", a.critical.seconds[p] * 1e3),
                         t > 0 ? 100 * a.critical.seconds[p] / t : 0.0, fmt::format("{:.3f} ms", a.busy.seconds[p] * 1e3));
  std::int64_t dropped = 0;
  for (const auto& it : r.iterations) dropped += it.dropped;
  out += fmt::format("  {:<18}{:>12}  max/mean token-slots computed per GPU: mean over layers (max)\n", "load spread",
                     spread_cell(r));
  if (r.mfu() > 0)
    out += fmt::format("  {:<18}{:>12}  the model's FLOPs per GPU ({:.3g}) over the time and the GPU's dense peak\n", "MFU",
                       fmt::format("{:.1f}%", 100 * r.mfu()), r.model_flops_per_gpu);
  const auto& over = over_memory(r);
  out += fmt::format("  {:<18}{:>12}  GiB on the GPU that needs the most, of {:.0f}{}\n", "peak memory", memory_cell(ex, r),
                     ex.cluster_spec.gpu().memory_gib(),
                     fits(ex, r) ? ""
                                 : fmt::format(": the configuration does not fit ({} of {} GPUs over: {})", over.size(), r.gpus,
                                               over.size() > 64 ? rank_ranges({over.begin(), over.begin() + 64}) + ", ..."
                                                                : rank_ranges(over)));
  if (ex.spec.gate().has_capacity_factor())
    out += fmt::format("  {:<18}{:>12}  tokens over capacity, all iterations\n", "dropped", dropped);
  return out;
}

// Where each variant's time goes: its critical path per phase, in ms, for the phases any variant
// spends time in (a column each; the rows add up to the iteration time).
std::string phase_table(const ExperimentResult& result) {
  std::vector<Breakdown> b;
  for (const auto& r : result.runs) b.push_back(r.mean_breakdown());
  std::vector<int> shown;
  for (int p = 0; p < kNumPhases; ++p)
    if (std::any_of(b.begin(), b.end(), [&](const Breakdown& x) { return x.seconds[p] >= 5e-6; })) shown.push_back(p);
  std::string out = "  critical path per phase, ms (docs/timeline.md names each phase's ops)\n";
  out += fmt::format("  {:<28}", "variant");
  for (int p : shown) out += fmt::format("{:>10}", phase_names(Phase(p)).column);
  out += "\n";
  for (std::size_t v = 0; v < b.size(); ++v) {
    out += fmt::format("  {:<28}", result.runs[v].name);
    for (int p : shown) out += fmt::format("{:>10.1f}", b[v].seconds[p] * 1e3);
    out += "\n";
  }
  return out;
}

// Variants side by side: time, speedup over the first, all-to-all share, computed load balance.
std::string comparison_table(const Experiment& ex, const ExperimentResult& result) {
  const auto& first = result.runs.front();
  std::string out = fmt::format("{}: {} GPUs ({} × {}), {} iteration(s){}, speedup over {}\n\n", ex.spec.name(),
                                first.gpus, ex.cluster_spec.nodes(), ex.cluster_spec.name(), first.iterations.size(),
                                first.warmup ? fmt::format(" ({} warm-up left out)", first.warmup) : "", first.name);
  out += fmt::format("  {:<28}{:<22}{:>12}{:>10}{:>12}{:>14}{:>12}\n", "variant", "policy", "iteration", "speedup",
                     "all-to-all", "load spread", "peak mem");
  out += fmt::format("  {:<28}{:<22}{:>12}{:>10}{:>12}{:>14}{:>12}\n", "", "", "ms", "", "% of path", "mean (max)", "GiB");
  for (const auto& r : result.runs) {
    const double t = r.mean_time();
    out += fmt::format("  {:<28}{:<22}{:>12.1f}{:>9.2f}×{:>11.1f}%{:>14}{:>12}\n", r.name, r.policy, t * 1e3,
                       first.mean_time() / t, t > 0 ? 100 * all_to_all_seconds(r.mean_breakdown()) / t : 0.0,
                       spread_cell(r), memory_cell(ex, r));
  }
  if (first.seed_times.size() > 1) {  // the first seed above; over the seeds, mean and 95% interval
    out += fmt::format("\n  over {} seeds (mean ± 95% confidence half-width; the speedup paired seed by seed)\n",
                       first.seed_times.size());
    out += fmt::format("  {:<28}{:>22}{:>22}\n", "variant", "iteration ms", "speedup");
    for (const auto& r : result.runs) {
      std::vector<double> speedups;
      for (std::size_t k = 0; k < r.seed_times.size(); ++k) speedups.push_back(first.seed_times[k] / r.seed_times[k]);
      const double mean = std::accumulate(speedups.begin(), speedups.end(), 0.0) / double(speedups.size());
      out += fmt::format("  {:<28}{:>22}{:>22}\n", r.name,
                         fmt::format("{:.1f} ± {:.1f}", r.seeds_mean_time() * 1e3, r.seeds_ci95() * 1e3),
                         fmt::format("{:.3f} ± {:.3f}×", mean, ci95_half_width(speedups)));
    }
  }
  if (std::any_of(result.runs.begin(), result.runs.end(), [&](const RunResult& r) { return !fits(ex, r); }))
    out += fmt::format("\n  OOM: needs more than the {:.0f} GiB of one {} (memory model: docs/model.md, Memory)\n",
                       ex.cluster_spec.gpu().memory_gib(), ex.cluster_spec.gpu().model());
  return out + "\n" + phase_table(result);
}

}  // namespace

void write_collective_results(const std::string& dir, const CollectiveSweep& sweep,
                              const std::vector<CollectivePoint>& points, const CollectiveSweepFile* file) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir + ": cannot create the output directory: " + ec.message());
  write_atomically(fs::path(dir) / "collective.json", collective_json(sweep.platform, points).dump(2) + "\n");
  if (file && !file->paper.empty())
    write_atomically(fs::path(dir) / "paper.md", "# " + file->name + "\n\n" + file->description + "\n\n" +
                                                    paper_table(collective_comparisons(*file, points)));
}

std::string summary_table(const Experiment& ex, const ExperimentResult& result) {
  std::string out;
  if (result.runs.size() > 1) out = comparison_table(ex, result);
  else out = run_block(ex, result.runs.front());
  if (!ex.gating.empty()) out += "\n  routing: " + ex.gating + "\n";
  if (!result.paper.empty()) out += "\n" + paper_table(result.paper);
  return out;
}

}  // namespace moesim
