#include "report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "collective_sweep.hpp"
#include "errors.hpp"
#include "gpu.hpp"
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
    else if (c.pass()) ++n.pass, n.pass_in_noise += c.verdict() == "inside the noise";
    else ++n.fail, n.fail_far += c.ratio() > 2 || c.ratio() < 0.5;
  }
  return n;
}

std::string ReportCounts::pass_text() const {
  return pass_in_noise ? fmt::format("{} pass ({} of them inside the noise of their seeds)", pass, pass_in_noise)
                       : fmt::format("{} pass", pass);
}

std::string ReportCounts::fail_text() const {
  return fail_far ? fmt::format("{} fail ({} of them more than 2× off the paper)", fail, fail_far) : fmt::format("{} fail", fail);
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
    const std::string verdict = ran ? c.verdict() : "not run";
    out += fmt::format("| {} | {:.2f} | {} | {} | ±{:.0f}% | {} | {} |\n", c.paper.claim(), c.paper.value(),
                       !ran ? "—" : c.per_seed.size() > 1 ? fmt::format("{:.3f} ± {:.3f}", c.simulated, c.ci95)
                                                        : fmt::format("{:.3f}", c.simulated),
                       ran ? fmt::format("{:.3f}", c.ratio()) : "—", c.tolerance() * 100,
                       verdict == "fail" ? "**fail**" : verdict, c.paper.source());
  }
  return out;
}

// The rules every number of the report is held to, printed in its header and the ledger's.
constexpr const char* kRules =
    "Rules: a model parameter is set per platform or per paper setup, never per claim, and names its source "
    "(the platform files' comments, the specs' headers; [report.md](report.md) ends with the parameters these "
    "runs used). Every claim that misses has its cause, the evidence and what was done in "
    "[fidelity.md](fidelity.md) (\"unknown\" where none is found); a claim that passed and fails after a change is a "
    "regression, listed there.";

std::string claim_key(const std::string& experiment, const std::string& claim) { return experiment + ": " + claim; }

std::string order_cell(const OrderScore& o) {
  return o.pairs ? fmt::format("{}/{}", o.match, o.pairs) : std::string("—");
}

std::string category_name(spec::Ledger::Category c) {
  std::string n = spec::Ledger::Category_Name(c);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return n;
}

// The platforms the entries ran on, one row each, with the parameters that set their costs.
std::string parameter_table(const std::vector<ReportEntry>& entries) {
  std::map<std::string, std::pair<spec::ClusterSpec, std::vector<std::string>>> platforms;
  for (const auto& e : entries)
    if (e.cluster) {
      auto& [cluster, used_by] = platforms[e.cluster->name()];
      cluster = *e.cluster;
      used_by.push_back(e.name);
    }
  std::string md =
      "\n## Parameters these runs used\n\nPer platform (each value's source is the comment beside it in the "
      "platform file, `moesim platform show NAME`); per experiment, its model and gating are in its section's header "
      "and spec.\n\n"
      "| platform | GPU | peak FP16 / FP32 TFLOP/s | best GEMM efficiency | memory GB/s × efficiency | GPUs per "
      "node | NICs × Gb/s | NIC latency µs | per-message µs | NCCL call µs | host sync µs | launch µs | network transport | experiments |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
  for (const auto& [name, value] : platforms) {
    const auto& [c, used_by] = value;
    double fp16 = 0, fp32 = 0, best = 0;
    for (const auto& p : c.gpu().peak()) {
      double& peak = p.dtype() == spec::FP32 ? fp32 : fp16;
      peak = std::max(peak, p.tflops());
    }
    for (const auto& e : c.gpu().gemm_efficiency()) best = std::max(best, e.efficiency());
    const Cluster cluster(c);  // the defaults the platform file leaves out
    std::string nics = "—", latency = "—", overhead = "—", transport = "—";
    if (c.node().nics_size()) {
      const auto& n = c.node().nics(0);
      nics = fmt::format("{} × {:g}", c.node().nics_size(), n.gbits_per_s());
      latency = fmt::format("{:g}", n.latency_us());
      overhead = fmt::format("{:g}", cluster.nics()[0].message_overhead * 1e6);
      transport = n.staging_memory().empty() ? "GPUDirect RDMA" : "staged through " + n.staging_memory();
    }
    std::string users;
    for (const auto& u : used_by) users += (users.empty() ? "" : ", ") + u;
    const GpuModel gpu(c.gpu(), c.gpu().peak(0).dtype());  // with its defaults
    md += fmt::format("| {} | {} | {:g} / {:g} | {:g} | {:g} × {:g} | {} | {} | {} | {} | {:g} | {:g} | {:g} | {} | {} |\n", name,
                      c.gpu().model(), fp16, fp32, best, c.gpu().memory_gbytes_per_s(), c.gpu().memory_efficiency(),
                      c.node().gpus(), nics, latency, overhead, cluster.nccl_call_latency() * 1e6, gpu.host_sync_seconds() * 1e6,
                      gpu.launch_seconds() * 1e6, transport, users);
  }
  return md;
}

}  // namespace

OrderScore ordering_score(const std::vector<PaperComparison>& claims) {
  constexpr double kTie = 0.02;  // a paper's ratios within 2% state no order
  // Two systems the simulation times alike (the same schedule chosen, both bound by the same link)
  // are in no order, so not in the paper's: a tie's last bits would otherwise decide it.
  constexpr double kSimulatedTie = 1e-9;
  OrderScore o;
  auto count = [&](double paper, double simulated, const std::string& pair) {  // log-ratios: > 0 the first system ahead
    if (std::abs(paper) < std::log1p(kTie)) return;
    ++o.pairs;
    if (std::abs(simulated) > kSimulatedTie && (paper > 0) == (simulated > 0))
      ++o.match;
    else
      o.out_of_order.push_back(fmt::format("{}: paper {:.3f}, simulated {:.3f}", pair, std::exp(paper), std::exp(simulated)));
  };
  std::vector<const PaperComparison*> ran;
  // A bandwidth (a routed collective's, in GB/s) states no order of two systems: left out.
  for (const auto& c : claims)
    if (std::isfinite(c.simulated) && c.simulated > 0 && c.paper.value() > 0 && c.paper.quantity() != spec::PaperValue::BANDWIDTH)
      ran.push_back(&c);
  for (const auto* c : ran) count(std::log(c->paper.value()), std::log(c->simulated), c->paper.claim());
  for (std::size_t i = 0; i < ran.size(); ++i)
    for (std::size_t j = i + 1; j < ran.size(); ++j) {
      const auto &a = ran[i]->paper, &b = ran[j]->paper;
      const bool comparable = a.variant() != b.variant() && a.quantity() == b.quantity() && a.aggregate() == b.aggregate() &&
                              std::equal(a.baseline().begin(), a.baseline().end(), b.baseline().begin(), b.baseline().end()) &&
                              std::equal(a.groups().begin(), a.groups().end(), b.groups().begin(), b.groups().end());
      if (comparable)
        count(std::log(a.value() / b.value()), std::log(ran[i]->simulated / ran[j]->simulated),
              "(" + a.claim() + ") over (" + b.claim() + ")");
    }
  return o;
}

spec::Ledger load_ledger(const std::string& path) {
  spec::Ledger ledger;
  const ParsedFile file = parse_file(path, ledger);
  std::set<std::string> ids;
  for (int i = 0; i < ledger.cause_size(); ++i) {
    const auto& c = ledger.cause(i);
    const std::string at = fmt::format("cause[{}]", i);
    if (const auto problem = path_name_problem(c.id()); !problem.empty()) throw InputError(file.describe(at + ".id", problem));
    if (!ids.insert(c.id()).second) throw InputError(file.describe(at + ".id", "'" + c.id() + "' is the id of an earlier cause"));
    if (c.cause().empty()) throw InputError(file.describe(at + ".cause", "is empty: say what differs and its source"));
    if (c.claims().empty()) throw InputError(file.describe(at + ".claims", "names no claim: \"EXPERIMENT: CLAIM\" or \"EXPERIMENT: *\""));
    for (int k = 0; k < c.claims_size(); ++k)
      if (c.claims(k).find(": ") == std::string::npos)
        throw InputError(file.describe(fmt::format("{}.claims[{}]", at, k),
                                       "'" + c.claims(k) + "' is not \"EXPERIMENT: CLAIM\" (or \"EXPERIMENT: *\")"));
  }
  return ledger;
}

std::string verdicts_json(const std::vector<ReportEntry>& entries) {
  json claims = json::array();
  for (const auto& e : entries)
    for (const auto& c : e.claims)
      if (std::isfinite(c.simulated))
        claims.push_back({{"experiment", e.name}, {"claim", c.paper.claim()}, {"paper", c.paper.value()},
                          {"simulated", c.simulated}, {"pass", c.pass()}, {"verdict", c.verdict()}});
  return json{{"claims", claims}}.dump(1) + "\n";
}

Verdicts read_verdicts(const std::string& path) {
  Verdicts v;
  std::ifstream in(path);
  if (!in) return v;
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("claims") || !j["claims"].is_array())
    throw InputError(path + ": not a claims file written by moesim report (delete it to start afresh)");
  for (const auto& c : j["claims"])
    if (c.is_object() && c.value("experiment", json()).is_string() && c.value("claim", json()).is_string() &&
        c.value("pass", json()).is_boolean())
      v[claim_key(c["experiment"].get<std::string>(), c["claim"].get<std::string>())] = c["pass"].get<bool>();
  return v;
}

std::string fidelity_markdown(const std::vector<ReportEntry>& entries, const spec::Ledger& ledger,
                              const std::string& ledger_path, const Verdicts& previous) {
  // Which causes explain each claim; a cause naming a claim of a reported experiment that does not
  // exist is an error (the ledger went stale), one of an experiment not in this report is skipped.
  std::map<std::string, std::vector<const spec::Ledger::Cause*>> explained;
  std::map<std::string, const ReportEntry*> by_name;
  for (const auto& e : entries) by_name[e.name] = &e;
  for (const auto& cause : ledger.cause())
    for (const auto& ref : cause.claims()) {
      const auto colon = ref.find(": ");
      const std::string experiment = ref.substr(0, colon), claim = ref.substr(colon + 2);
      const auto e = by_name.find(experiment);
      if (e == by_name.end()) continue;
      bool found = false;
      for (const auto& c : e->second->claims)
        if (claim == "*" || c.paper.claim() == claim) {
          auto& list = explained[claim_key(experiment, c.paper.claim())];
          if (std::find(list.begin(), list.end(), &cause) == list.end()) list.push_back(&cause);
          found = true;
        }
      if (!found)
        throw InputError(fmt::format("{}: cause '{}' names '{}', which experiment {} does not have (its claims are in "
                                     "its spec's paper {{}} blocks)",
                                     ledger_path, cause.id(), claim, experiment));
    }

  std::map<std::string, int> per_category;
  int misses = 0;
  std::string rows, regressions;
  for (const auto& e : entries)
    for (const auto& c : e.claims) {
      if (!std::isfinite(c.simulated) || c.pass()) continue;
      ++misses;
      const std::string key = claim_key(e.name, c.paper.claim());
      const auto it = explained.find(key);
      std::string causes;
      if (it == explained.end()) {
        ++per_category["unknown"];
        causes = "unknown";
      } else {
        for (const auto* cause : it->second)
          causes += fmt::format("{}[{}](#{}) ({})", causes.empty() ? "" : "; ", cause->id(), anchor(cause->id()),
                                category_name(cause->category()));
        ++per_category[category_name(it->second.front()->category())];
      }
      rows += fmt::format("| {} | {} | {:.2f} | {:.2f} | {:.2f} | {} |\n", e.name, c.paper.claim(), c.paper.value(),
                          c.simulated, c.ratio(), causes);
      if (const auto p = previous.find(key); p != previous.end() && p->second)
        regressions += fmt::format("- {}: passed in the previous report, now {:.2f}× the paper ({})\n", key, c.ratio(), causes);
    }

  std::string md = "# moesim fidelity ledger\n\n";
  md += fmt::format("Why claims of the [validation report](report.md) miss. Written by `moesim report` from `{}`: "
                    "each cause there names the claims it explains, the evidence (a what-if run: its command and what "
                    "it gave) and what was done. A claim that misses with no cause is counted as unknown.\n\n",
                    ledger_path);
  md += std::string(kRules) + "\n\n";
  md += fmt::format("**{} of the report's claims miss.** By the cause listed first:", misses);
  std::string counts;
  for (const auto& [category, n] : per_category) counts += fmt::format("{} {} {}", counts.empty() ? "" : ",", category, n);
  md += (counts.empty() ? " none" : counts) + ".\n\n";
  md += "## Regressions\n\nClaims that passed in the previous report (its `claims.json`) and miss now.\n\n";
  md += regressions.empty() ? "None.\n" : regressions;
  md += "\n## Claims that miss\n\n| experiment | claim | paper | simulated | ratio | cause |\n|---|---|---:|---:|---:|---|\n" + rows;
  std::string misordered;
  for (const auto& e : entries)
    for (const auto& pair : ordering_score(e.claims).out_of_order) misordered += fmt::format("- {}: {}\n", e.name, pair);
  md += "\n## Pairs out of the paper's order\n\nPairs of systems (a claim's variant over its baseline, or two claims' "
        "ratios) that the simulation orders otherwise than the paper, or times alike.\n\n";
  md += misordered.empty() ? "None.\n" : misordered;
  md += "\n## Causes\n";
  for (const auto& cause : ledger.cause()) {
    md += fmt::format("\n### {}\n\n**{}.** {}\n\n", cause.id(), category_name(cause.category()), cause.cause());
    if (!cause.evidence().empty())
      md += fmt::format("Evidence: `{}` → {}\n\n", cause.evidence(), cause.evidence_result().empty() ? "—" : cause.evidence_result());
    md += fmt::format("Done: {}\n\nClaims:", cause.action().empty() ? "nothing yet" : cause.action());
    std::string list;
    for (const auto& e : entries)
      for (const auto& c : e.claims) {
        const auto it = explained.find(claim_key(e.name, c.paper.claim()));
        if (it == explained.end() || std::find(it->second.begin(), it->second.end(), &cause) == it->second.end()) continue;
        list += fmt::format("\n- {}: {} ({:.2f}× the paper{})", e.name, c.paper.claim(), c.ratio(),
                            !std::isfinite(c.simulated) ? ", not run" : c.pass() ? ", passes now" : "");
      }
    md += (list.empty() ? " none in this report" : list) + "\n";
  }
  return md;
}

std::string report_markdown(const std::vector<ReportEntry>& entries, const std::string& command) {
  std::vector<PaperComparison> all;
  for (const auto& e : entries) all.insert(all.end(), e.claims.begin(), e.claims.end());
  const auto n = count_claims(all);
  std::string md = "# moesim validation report\n\n";
  md += fmt::format("Each claim is a number a paper reports (a speedup, a balance ratio, a time or memory ratio, a bandwidth) next to the same quantity "
                    "simulated by moesim; it passes when simulated / paper is within the claim's tolerance "
                    "(±15% unless the spec says otherwise), simulated being the mean over the run's seeds; its verdict "
                    "is on the seeds' 95% interval, \"inside the noise\" where that crosses the tolerance's edge. Order: of the pairs of systems the experiment's claims compare, "
                    "those the simulation puts in the paper's order (which is faster, which gains more). "
                    "Regenerate with `{}`.\n\n",
                    command);
  md += std::string(kRules) + "\n\n";
  std::vector<OrderScore> orders;  // per entry, and their sum
  OrderScore order;
  for (const auto& e : entries) {
    orders.push_back(ordering_score(e.claims));
    order.match += orders.back().match;
    order.pairs += orders.back().pairs;
  }
  md += fmt::format("**{} claims from {} experiments: {}, {}, {} not run; {} of {} pairs of systems in the paper's "
                    "order.**\n\n",
                    n.total(), entries.size(), n.pass_text(), n.fail_text(), n.not_run, order.match, order.pairs);
  md += "| experiment | claims | pass | fail | not run | order |\n|---|---:|---:|---:|---:|---:|\n";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const auto k = count_claims(e.claims);
    md += fmt::format("| [{}](#{}) | {} | {} | {} | {} | {} |\n", e.name, anchor(e.name), k.total(), k.pass, k.fail, k.not_run,
                      order_cell(orders[i]));
  }
  md += fmt::format("| **all** | **{}** | **{}** | **{}** | **{}** | **{}** |\n", n.total(), n.pass, n.fail, n.not_run,
                    order_cell(order));
  for (const auto& e : entries) {
    md += fmt::format("\n## {}\n\n{}\n\n`{} {}`{}\n\n", e.name, e.description, e.collective ? "moesim collective" : "moesim run",
                      e.spec_path, e.workload.empty() ? "" : " — " + e.workload + " (before the variants' overrides)");
    md += claims_table(e.claims);
    if (!e.figure.empty()) md += fmt::format("\n![{}]({})\n", e.name, e.figure);
  }
  return md + parameter_table(entries);
}

namespace {

// "MODEL, GATING" of a spec, as the report's sections show it.
std::string workload_words(const spec::ExperimentSpec& s) {
  const auto& g = s.gating();
  std::string gating = "uniform routing";
  if (g.has_zipf()) gating = fmt::format("Zipf({:g}) routing", g.zipf().exponent());
  if (g.has_generator()) gating = fmt::format("generated routing, preset '{}'", g.generator().preset().empty() ? "naive" : g.generator().preset());
  if (g.has_trace()) gating = "routing replayed from " + fs::path(g.trace().path()).filename().string();
  return fmt::format("{} ({} layers, {} experts, top-{}, {} tokens per GPU), {}", s.model().name(), s.model().layers(),
                     s.model().experts(), s.model().top_k(), s.model().tokens_per_gpu(), gating);
}

// The spec's claims, with the simulated values of its results when they exist.
ReportEntry experiment_entry(const std::string& path, const Experiment& ex, const fs::path& results) {
  ReportEntry e{path, ex.spec.name(), ex.spec.description(), false, {}, "", ex.cluster_spec, workload_words(ex.spec)};
  json summary = json::object();
  if (const auto file = results / ex.spec.name() / "summary.json"; fs::exists(file)) std::ifstream(file) >> summary;
  for (const auto& p : ex.spec.paper()) {
    PaperComparison c{p, std::numeric_limits<double>::quiet_NaN()};
    for (const auto& row : summary.value("paper", json::array()))  // the same claim of the same variant
      if (row.value("claim", "") == p.claim() && row.value("variant", "") == p.variant())
        if (const auto v = row.find("simulated_value"); v != row.end() && v->is_number()) {
          c.simulated = v->get<double>();
          c.ci95 = row.value("simulated_ci95", 0.0);
          if (const auto s = row.find("simulated_per_seed"); s != row.end() && s->is_array())
            for (const auto& x : *s)
              if (x.is_number()) c.per_seed.push_back(x.get<double>());
        }
    e.claims.push_back(c);
  }
  return e;
}

ReportEntry collective_entry(const std::string& path, const CollectiveSweepFile& file, const fs::path& results) {
  ReportEntry e{path, file.name, file.description, true, {}, "", load_platform(file.sweep.platform), ""};
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
  // The experiments with paper values, and which of them have no results yet.
  // Each spec loaded once: an experiment, or a collective sweep.
  struct Item {
    std::string path;
    bool collective;
    ReportEntry entry;
    std::optional<Experiment> experiment;
    std::optional<CollectiveSweepFile> sweep;
    bool ran = false;  // run here: its results are read again afterwards
    ReportEntry read(const fs::path& results) const {
      return collective ? collective_entry(path, *sweep, results) : experiment_entry(path, *experiment, results);
    }
  };
  std::vector<Item> items;
  for (const auto& path : specs) {
    if ((!o.only.empty() && !matches(path, o.only)) || matches(path, o.exclude)) continue;
    const std::string message = proto_message(path);
    // Grids of experiments (`moesim sweep`), measured GPU profiles, platforms: no paper numbers.
    if (!message.empty() && message != "ExperimentSpec" && message != "CollectiveSweepSpec") continue;
    Item item{path, message == "CollectiveSweepSpec", {}, {}, {}, false};
    if (item.collective) item.sweep = load_collective_sweep(path);
    else item.experiment = load_experiment(path, {});
    item.entry = item.read(results);
    if (item.entry.claims.empty()) continue;  // held out, or no paper numbers
    if (item.entry.name.empty())
      throw InputError(path + ": name is not set; the report keeps each experiment's results under its name");
    items.push_back(std::move(item));
  }
  // Those without results run, `jobs` at a time, each in a child process (one SimGrid engine per
  // process), longest first as far as the spec says (its GPUs × iterations × variants × seeds).
  if (o.run) {
    std::vector<std::size_t> todo;
    std::map<std::size_t, double> cost;
    std::map<std::size_t, unsigned> seeds;  // a spec that sets its own seed count keeps it
    for (std::size_t i = 0; i < items.size(); ++i)
      if (count_claims(items[i].entry.claims).not_run == int(items[i].entry.claims.size())) {
        todo.push_back(i);
        items[i].ran = true;
        if (!items[i].collective) {
          const Experiment& ex = *items[i].experiment;
          seeds[i] = ex.spec.seeds() ? ex.spec.seeds() : o.seeds;
          cost[i] = double(ex.cluster_spec.nodes()) * double(ex.cluster_spec.node().gpus()) * double(ex.spec.iterations()) *
                    double(std::max<std::size_t>(1, ex.variants.size())) * seeds[i];
        }
      }
    std::stable_sort(todo.begin(), todo.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
    const std::size_t jobs = o.jobs ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::tuple<pid_t, std::size_t, std::string>> running;  // pid, item, error file
    auto finish_one = [&] {  // whichever ends first
      int status = 0;
      const pid_t ended = wait_any_worker(status);
      const auto at = std::find_if(running.begin(), running.end(), [&](const auto& r) { return std::get<0>(r) == ended; });
      if (at == running.end()) return;  // not one of ours
      const auto [pid, i, error] = *at;
      running.erase(at);
      if (const std::string why = worker_failure(status, error); !why.empty()) {
        for (const auto& [other, j, e] : running) wait_worker(other, e);  // no orphans, no half-written results
        throw std::runtime_error(items[i].path + ": " + why);
      }
      if (progress) progress("done " + items[i].path);
    };
    if (!todo.empty()) fs::create_directories(results);
    for (const std::size_t i : todo) {
      if (running.size() >= jobs) finish_one();
      const auto& item = items[i];
      if (progress) progress("running " + item.path);
      const std::string dir = (results / item.entry.name).string(), error = dir + ".err";
      running.emplace_back(fork_worker(
                               [&, dir] {
                                 if (item.collective) {
                                   const CollectiveSweepFile& file = *item.sweep;
                                   write_collective_results(dir, file.sweep, run_collective_sweep(file.sweep), &file);
                                 } else {
                                   const auto ex = load_experiment(item.path, {fmt::format("seeds={}", seeds[i])});
                                   write_results(dir, ex, run_experiment(ex));
                                 }
                               },
                               error),
                           i, error);
    }
    while (!running.empty()) finish_one();
  }
  std::vector<ReportEntry> entries;
  for (auto& item : items) {
    ReportEntry e = item.ran ? item.read(results) : std::move(item.entry);
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
  // The ledger first: a stale one stops the report before anything is replaced.
  const bool has_ledger = !o.ledger.empty() && fs::exists(o.ledger);
  const std::string fidelity = fidelity_markdown(entries, has_ledger ? load_ledger(o.ledger) : spec::Ledger{},
                                                 has_ledger ? o.ledger : "(no ledger file)", read_verdicts((out / "claims.json").string()));
  write_atomically((out / "report.md").string(), report_markdown(entries, o.command));
  write_atomically((out / "fidelity.md").string(), fidelity);
  write_atomically((out / "claims.json").string(), verdicts_json(entries));
  return entries;
}

}  // namespace moesim
