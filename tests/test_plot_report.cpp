// Figures, the validation report and the default demo: every figure type rendered by gnuplot for
// real (PDF and PNG of the paper's page size), the report's pass/fail arithmetic on hand cases, the
// report running and then reading an experiment, and the demo's table and files.
#include <catch2/catch.hpp>
#include <cmath>
#include <fmt/format.h>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "collective_sweep.hpp"
#include "errors.hpp"
#include "helpers.hpp"
#include "plot.hpp"
#include "policy.hpp"
#include "report.hpp"
#include "results.hpp"
#include "timeline_summary.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// The base experiment, small (16 GPUs, 2 layers, 3 iterations), as two variants.
std::string small_spec(const std::string& dir, const std::string& extra = "") {
  std::string text = test::read_file(test::kBaseSpec);
  for (const auto& [from, to] : {std::pair{"nodes: 8", "nodes: 2"}, {"layers: 12", "layers: 2"}, {"experts: 64", "experts: 16"}}) {
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, std::string(from).size(), to);
  }
  const std::string path = dir + "/small.textproto";
  test::write_file(path, text + "variants { name: \"ep\" set: \"policy.name=ep\" }\n"
                                "variants { name: \"fastermoe\" set: \"policy.name=fastermoe\" }\n" + extra);
  return path;
}

// Width and height from a PNG's IHDR chunk.
std::pair<int, int> png_size(const std::string& path) {
  const std::string data = test::read_file(path);
  REQUIRE(data.size() > 24);
  REQUIRE(data.substr(1, 3) == "PNG");
  auto be32 = [&](std::size_t at) {
    return (int(std::uint8_t(data[at])) << 24) | (int(std::uint8_t(data[at + 1])) << 16) |
           (int(std::uint8_t(data[at + 2])) << 8) | int(std::uint8_t(data[at + 3]));
  };
  return {be32(16), be32(20)};
}

// The page of a one-page PDF, in points.
std::pair<double, double> pdf_size(const std::string& path) {
  const std::string data = test::read_file(path);
  REQUIRE(data.rfind("%PDF", 0) == 0);
  std::smatch m;
  REQUIRE(std::regex_search(data, m, std::regex(R"(/MediaBox\s*\[\s*0\s+0\s+([0-9.]+)\s+([0-9.]+)\s*\])")));
  return {std::stod(m[1]), std::stod(m[2])};
}

}  // namespace

TEST_CASE("plot: every figure type renders to a PDF and a PNG of one paper column") {
  if (test::skip_without_gnuplot()) return;
  const auto dir = test::temp_dir("plot");
  const auto ex = load_experiment(small_spec(dir), {});
  write_results(dir + "/run", ex, run_experiment(ex));
  // A collective sweep by hand for the scaling lines, and a gating trace for the heatmap.
  std::vector<CollectivePoint> points;
  for (int gpus : {16, 64, 256})
    for (const char* a : {"linear", "2dh"})
      points.push_back({CollectiveType::all_to_all, gpus, 1 << 20, a, 1e-4 * gpus * (a[0] == 'l' ? 1.0 : 0.5), ""});
  test::write_file(dir + "/collective.json", collective_json("dgx-a100", points).dump());
  test::write_file(dir + "/t.csv",
                   "# model: test, top_k=1, num_experts=3\niter,layer,src,e0,e1,e2\n"
                   "0,0,0,3,1,0\n1,0,0,2,2,0\n2,0,0,1,1,2\n");
  const struct {
    std::string input, figure;
  } cases[] = {{dir + "/run", "speedup"}, {dir + "/run", "breakdown"}, {dir + "/collective.json", "scaling"},
               {dir + "/run", "load"},    {dir + "/run", "heatmap"},   {dir + "/run", "timeline"},
               {dir + "/t.csv", "heatmap"}};
  std::set<std::string> covered;
  for (const auto& c : cases)
    for (const char* format : {"pdf", "png"}) {
      INFO(c.figure << " from " << c.input << " as " << format);
      PlotOptions o;
      o.figures = {c.figure};
      o.format = format;
      o.out = dir + "/figures-" + format;
      const auto files = plot({c.input}, o);
      REQUIRE(files.size() == 1);
      CHECK(fs::file_size(files[0]) > 1000);
      CHECK(fs::exists(o.out + "/" + c.figure + ".gp"));  // the script, to restyle
      CHECK_FALSE(fs::exists(files[0] + ".tmp"));
      if (std::string(format) == "png") {
        const auto [w, h] = png_size(files[0]);
        CHECK(w == kFigureSize.png_width);
        CHECK(h == kFigureSize.png_height);
      } else {
        const auto [w, h] = pdf_size(files[0]);
        CHECK(w == Approx(kFigureSize.width_in * 72).margin(1));  // gnuplot rounds to whole points
        CHECK(h == Approx(kFigureSize.height_in * 72).margin(1));
      }
      covered.insert(c.figure);
    }
  CHECK(covered.size() == figure_names().size());
  // With no --figure, a results directory gets every figure it supports (not scaling: one size).
  PlotOptions all;
  all.out = dir + "/all";
  CHECK(plot({dir + "/run"}, all).size() == figure_names().size() - 1);
}

namespace {
// The same runs at 16 and 32 GPUs (summary.json files under DIR/16 and DIR/32, the model's experts
// one per GPU: weak scaling), plotted as the scaling figure over `baseline`; its gnuplot script.
std::string scaling_gp(const std::string& dir, const std::vector<nlohmann::json>& variants, const std::string& baseline) {
  for (int gpus : {16, 32}) {
    nlohmann::json s = {{"name", "s"}, {"gpus", gpus}, {"platform", "dgx-a100"},
                        {"model", {{"name", "m"}, {"layers", 2}, {"experts", gpus}, {"top_k", 2}, {"tokens_per_gpu", 1024}}},
                        {"routing", "Zipf popularity, exponent 1, seed 1"}, {"variants", variants}};
    fs::create_directories(dir + "/" + std::to_string(gpus));
    test::write_file(dir + "/" + std::to_string(gpus) + "/summary.json", s.dump());
  }
  PlotOptions o;
  o.figures = {"scaling"};
  o.baseline = baseline;
  o.out = dir + "/fig-" + (baseline.empty() ? "time" : baseline);
  plot({dir + "/16", dir + "/32"}, o);
  return test::read_file(o.out + "/scaling.gp");
}
}  // namespace

TEST_CASE("plot: a scaling speedup divides each group by its own baseline, on a linear axis under a decade") {
  if (test::skip_without_gnuplot()) return;
  // Two cluster sizes, groups x and y: a is 2× ep in x and 1.1× ep in y, at both sizes.
  const auto dir = test::temp_dir("plot-scaling");
  std::vector<nlohmann::json> variants;
  for (const auto& [name, t] : std::vector<std::pair<std::string, double>>{{"x/ep", 0.2}, {"x/a", 0.1}, {"y/ep", 0.11}, {"y/a", 0.1}})
    variants.push_back({{"name", name}, {"policy", "p"}, {"iteration_time_s", t}, {"breakdown", nlohmann::json::object()}});
  const std::string gp = scaling_gp(dir, variants, "ep");
  INFO(gp);
  CHECK_THAT(gp, Contains("16 2 0\n32 2 0\n"));      // x/a over x/ep, one seed: no interval
  CHECK_THAT(gp, Contains("16 1.1 0\n32 1.1 0\n"));  // y/a over y/ep, not over x/ep
  CHECK_THAT(gp, Contains("set yrange [0:*]") && !Contains("set logscale y") && !Contains("yerrorlines"));
  CHECK_THAT(gp, Contains("dgx-a100 × 16-32 GPUs") && Contains("weak scaling, 1024 tokens per GPU"));
}

TEST_CASE("plot: with several seeds the scaling lines carry 95% error bars, speedups paired seed by seed") {
  if (test::skip_without_gnuplot()) return;
  // Seeds of ep: 0.2, 0.4; of a: 0.1, 0.1. Paired speedups 2 and 4: mean 3, half-width
  // t(0.975, 1) · s / √2 = 12.706 · 1.414 / 1.414 = 12.706. Times of a in ms: 100 ± 0.
  const auto dir = test::temp_dir("plot-scaling-seeds");
  std::vector<nlohmann::json> variants;
  for (const auto& [name, seeds] : std::vector<std::pair<std::string, std::vector<double>>>{{"ep", {0.2, 0.4}}, {"a", {0.1, 0.1}}})
    variants.push_back({{"name", name}, {"policy", "p"}, {"iteration_time_s", (seeds[0] + seeds[1]) / 2},
                        {"iteration_time_over_seeds", {{"per_seed_s", seeds}}}, {"breakdown", nlohmann::json::object()}});
  const std::string gp = scaling_gp(dir, variants, "ep");
  INFO(gp);
  CHECK_THAT(gp, Contains("16 3 12.706") && Contains("using 1:2:3 with yerrorlines"));
  const std::string t = scaling_gp(dir, variants, "");
  INFO(t);
  CHECK_THAT(t, Contains("16 100 0\n") && Contains("16 300 1270.6"));  // ep: 300 ms ± 12.706 · 141.4 / 1.414
}

TEST_CASE("plot: bad input names the file or option and what to give instead") {
  const auto dir = test::temp_dir("plot-bad");
  PlotOptions o;
  CHECK_THROWS_WITH(plot({dir + "/missing"}, o), Contains("no such file"));
  CHECK_THROWS_WITH(plot({dir}, o), Contains("no summary.json"));
  test::write_file(dir + "/summary.json", "{ not json");
  CHECK_THROWS_WITH(plot({dir + "/summary.json"}, o), Contains("not JSON"));
  test::write_file(dir + "/summary.json", R"({"gpus": 16, "iteration_time_s": 1, "breakdown": {}, "policy": "ep"})");
  o.figures = {"scaling"};
  CHECK_THROWS_WITH(plot({dir + "/summary.json"}, o), Contains("two or more GPU counts"));
  o.figures = {"speedup"};
  o.format = "jpeg";
  CHECK_THROWS_AS(plot({dir + "/summary.json"}, o), InputError);
}

TEST_CASE("report: pass and fail and not run on hand cases") {
  auto claim = [](double paper, double simulated, double tolerance = 0) {
    spec::PaperValue p;
    p.set_claim("claim");
    p.set_value(paper);
    p.set_tolerance(tolerance);
    return PaperComparison{p, simulated};
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<PaperComparison> claims = {
      claim(2.0, 2.2),        // ratio 1.10: within ±15%
      claim(2.0, 2.5),        // 1.25: outside
      claim(2.0, 2.5, 0.3),   // 1.25 within the claim's own ±30%
      claim(2.0, 1.6),        // 0.80: outside, from below
      claim(2.0, 0.9),        // 0.45: more than 2x off
      claim(2.0, 4.0),        // 2.00: outside, but not more than 2x off
      claim(2.0, nan)};       // not run
  CHECK(claims[0].ratio() == Approx(1.1));
  CHECK(claims[0].pass());
  CHECK_FALSE(claims[1].pass());
  CHECK(claims[2].pass());
  CHECK_FALSE(claims[3].pass());
  const auto n = count_claims(claims);
  CHECK(n.pass == 2);
  CHECK(n.fail == 4);
  CHECK(n.fail_far == 1);
  CHECK(n.not_run == 1);
  CHECK(n.total() == 7);
  CHECK(n.pass_in_noise == 0);
  CHECK(n.pass_text() == "2 pass");
  CHECK(n.fail_text() == "4 fail (1 of them more than 2× off the paper)");
  // Over seeds: 2.2 ± 0.2 is within ±15% of 2.0 on the mean (ratio 1.10) but its interval reaches
  // 1.20: a pass inside the noise; 2.2 ± 0.05 is a pass outright; 2.5 ± 0.3 a miss inside the noise.
  auto noisy = [&](double simulated, double ci95) {
    PaperComparison c = claim(2.0, simulated);
    c.ci95 = ci95;
    return c;
  };
  const auto seeded = count_claims({noisy(2.2, 0.2), noisy(2.2, 0.05), noisy(2.5, 0.3)});
  CHECK(seeded.pass == 2);
  CHECK(seeded.pass_in_noise == 1);
  CHECK(seeded.fail == 1);
  CHECK(seeded.pass_text() == "2 pass (1 of them inside the noise of their seeds)");
  ReportEntry x;
  x.spec_path = "x.textproto", x.name = "x", x.description = "an experiment", x.claims = claims, x.figure = "figures/x/speedup.png";
  const std::string md = report_markdown({x}, "moesim report");
  CHECK_THAT(md, Contains("7 claims from 1 experiments: 2 pass, 4 fail (1 of them more than 2× off the paper), 1 not run"));
  CHECK_THAT(md, Contains("| claim | 2.00 | 2.200 | 1.100 | ±15% | pass |"));
  CHECK_THAT(md, Contains("| claim | 2.00 | 2.500 | 1.250 | ±30% | pass |"));
  CHECK_THAT(md, Contains("| claim | 2.00 | 1.600 | 0.800 | ±15% | **fail** |"));
  CHECK_THAT(md, Contains("| claim | 2.00 | — | — | ±15% | not run |"));
  CHECK_THAT(md, Contains("![x](figures/x/speedup.png)"));
}

namespace {

PaperComparison comparison(const std::string& claim, const std::string& variant, const std::string& baseline, double paper,
                           double simulated, spec::PaperValue::Quantity quantity = spec::PaperValue::SPEEDUP) {
  spec::PaperValue p;
  p.set_claim(claim);
  p.set_variant(variant);
  p.add_baseline(baseline);
  p.set_value(paper);
  p.set_quantity(quantity);
  return PaperComparison{p, simulated};
}

ReportEntry entry(const std::string& name, std::vector<PaperComparison> claims) {
  ReportEntry e;
  e.name = name;
  e.spec_path = name + ".textproto";
  e.claims = std::move(claims);
  return e;
}

}  // namespace

TEST_CASE("report: the ordering score counts the pairs of systems the simulation orders as the paper") {
  const std::vector<PaperComparison> claims = {
      comparison("a", "A", "base", 1.5, 1.2),   // A ahead of base in both: match
      comparison("b", "B", "base", 0.8, 1.1),   // B behind base in the paper, ahead simulated: no match
      comparison("c", "C", "base", 1.01, 0.5),  // within 2%: the paper states no order, left out
      comparison("d", "A", "other", 2.0, 3.0),  // another baseline: A vs other matches; not paired with a or b
      comparison("e", "E", "base", 1.5, 1.1, spec::PaperValue::BALANCE)};  // another quantity: pairs only with base
  // Each claim's variant against its baseline: a, d, e match, b does not, c is left out (3 of 4).
  // Variants against each other under "base" (SPEEDUP): A-B (1.5 > 0.8 and 1.2 > 1.1) and A-C (1.5 >
  // 1.01 and 1.2 > 0.5) match; B-C does not (0.8 < 1.01 but 1.1 > 0.5) (2 of 3).
  const auto o = ordering_score(claims);
  CHECK(o.pairs == 7);
  CHECK(o.match == 5);
  // The two that do not are named, the paper's ratio and the simulated one beside each.
  CHECK_THAT(o.out_of_order, Catch::Matchers::Equals(std::vector<std::string>{
                                 "b: paper 0.800, simulated 1.100", "(b) over (c): paper 0.792, simulated 2.200"}));
  const auto none = ordering_score({comparison("x", "X", "base", 2.0, std::numeric_limits<double>::quiet_NaN())});
  CHECK(none.pairs == 0);  // not run: no pair
  // A simulated tie (the same time, to the last bits or not) is in no order: counted, never a match.
  for (const double tie : {1.0, 1.0 + 1e-12, 1.0 - 1e-12}) {
    const auto t = ordering_score({comparison("t", "T", "base", 1.14, tie)});
    CHECK(t.pairs == 1);
    CHECK(t.match == 0);
  }
  const std::string md = report_markdown({entry("x", claims)}, "moesim report");
  CHECK_THAT(md, Contains("5 of 7 pairs of systems in the paper's order"));
  CHECK_THAT(md, Contains("| [x](#x) | 5 | 0 | 5 | 0 | 5/7 |"));
  CHECK_THAT(md, Contains("never per claim"));
}

TEST_CASE("report: the fidelity ledger gives each missed claim its causes, counts the unknown, flags regressions") {
  const auto dir = test::temp_dir("ledger");
  const std::vector<ReportEntry> entries = {
      entry("exp1", {comparison("one", "A", "base", 2.0, 1.0),     // misses, explained by two causes
                     comparison("two", "B", "base", 2.0, 2.1),     // passes
                     comparison("three", "C", "base", 2.0, 4.0)}),  // misses, no cause: unknown
      entry("exp2", {comparison("four", "A", "base", 1.5, 0.9)})};  // misses, covered by "exp2: *"
  test::write_file(dir + "/ledger.textproto", R"ledger(
cause { id: "weak-baseline" category: POLICY cause: "the baseline ran without X (paper, p. 3)"
        evidence: "moesim run e.textproto --set x=1" evidence_result: "one 0.50 -> 0.95" action: "X modelled"
        claims: "exp1: one" claims: "exp1: two" }
cause { id: "skew" category: WORKLOAD cause: "routing less skewed than the paper's" claims: "exp1: one" claims: "exp2: *" }
cause { id: "not-in-this-report" category: PAPER cause: "elsewhere" claims: "exp9: anything" }
)ledger");
  const auto ledger = load_ledger(dir + "/ledger.textproto");
  const Verdicts previous = {{"exp1: one", true}, {"exp1: three", false}};
  const std::string md = fidelity_markdown(entries, ledger, "ledger.textproto", previous);
  CHECK_THAT(md, Contains("**3 of the report's claims miss.** By the cause listed first: policy 1, unknown 1, workload 1."));
  CHECK_THAT(md, Contains("| exp1 | one | 2.00 | 1.00 | 0.50 | [weak-baseline](#weak-baseline) (policy); [skew](#skew) (workload) |"));
  CHECK_THAT(md, Contains("| exp1 | three | 2.00 | 4.00 | 2.00 | unknown |"));
  CHECK_THAT(md, Contains("| exp2 | four | 1.50 | 0.90 | 0.60 | [skew](#skew) (workload) |"));
  CHECK_THAT(md, Contains("- exp1: one: passed in the previous report, now 0.50× the paper"));
  CHECK_THAT(md, !Contains("exp1: three: passed"));
  CHECK_THAT(md, Contains("- exp1: two (1.05× the paper, passes now)"));
  CHECK_THAT(md, Contains("Evidence: `moesim run e.textproto --set x=1` → one 0.50 -> 0.95"));
  CHECK_THAT(md, Contains("### not-in-this-report"));
  // Pairs out of order, per experiment: a simulated tie (one) and a reversal (four).
  CHECK_THAT(md, Contains("- exp1: one: paper 2.000, simulated 1.000\n- exp2: four: paper 1.500, simulated 0.900\n"));
  // Verdicts round-trip through claims.json.
  test::write_file(dir + "/claims.json", verdicts_json(entries));
  const auto back = read_verdicts(dir + "/claims.json");
  CHECK(back.size() == 4);
  CHECK(back.at("exp1: two"));
  CHECK_FALSE(back.at("exp2: four"));
  CHECK(read_verdicts(dir + "/none.json").empty());
  test::write_file(dir + "/bad.json", "[1, 2]");
  CHECK_THROWS_AS(read_verdicts(dir + "/bad.json"), InputError);

  // A stale ledger (a claim the experiment no longer has) stops the report, naming the cause.
  spec::Ledger stale = ledger;
  stale.mutable_cause(1)->add_claims("exp2: five");
  CHECK_THROWS_WITH(fidelity_markdown(entries, stale, "ledger.textproto", {}), Contains("cause 'skew' names 'five'"));
  // Malformed causes: file, line and field.
  test::write_file(dir + "/dup.textproto", "cause { id: \"a\" cause: \"x\" claims: \"e: c\" }\ncause { id: \"a\" cause: \"y\" claims: \"e: c\" }\n");
  CHECK_THROWS_WITH(load_ledger(dir + "/dup.textproto"), Contains("dup.textproto:2") && Contains("cause[1].id"));
  test::write_file(dir + "/ref.textproto", "cause { id: \"a\" cause: \"x\"\n claims: \"no colon\" }\n");
  CHECK_THROWS_WITH(load_ledger(dir + "/ref.textproto"), Contains("ref.textproto:2") && Contains("EXPERIMENT: CLAIM"));
}

TEST_CASE("report: runs an experiment that has no results then reads the same numbers back") {
  const auto dir = test::temp_dir("report");
  fs::create_directories(dir + "/experiments/held-out");
  small_spec(dir + "/experiments",
             "paper { claim: \"FasterMoE vs EP\" variant: \"fastermoe\" baseline: \"ep\" value: 1.5 source: \"test\" }\n");
  small_spec(dir + "/experiments/held-out");  // no paper values: not in the report
  fs::create_directories(dir + "/experiments/second");  // a second one: each runs in its own process
  {
    const std::string second = small_spec(dir + "/experiments/second",
                                          "paper { claim: \"again\" variant: \"fastermoe\" baseline: \"ep\" value: 1.5 }\n");
    std::string text = test::read_file(second);
    text.replace(text.find("name: \"gpt-moe-s\""), 17, "name: \"second\"");
    test::write_file(second, text);
  }
  ReportOptions o;
  o.experiments = dir + "/experiments";
  o.results = dir + "/results";
  o.out = dir + "/report";
  o.run = true;
  o.ledger = dir + "/ledger.textproto";
  test::write_file(o.ledger, "cause { id: \"why\" category: SETUP cause: \"a test cause\" claims: \"second: *\" }\n");
  const auto ran = write_report(o);
  REQUIRE(ran.size() == 2);  // in path order: experiments/second/small.textproto, experiments/small.textproto
  CHECK(ran[0].name == "second");
  CHECK(ran[1].name == "gpt-moe-s");
  CHECK(std::isfinite(ran[0].claims.at(0).simulated));
  REQUIRE(ran[1].claims.size() == 1);
  CHECK(std::isfinite(ran[1].claims[0].simulated));
  CHECK(ran[1].claims[0].simulated > 1.0);  // shadowing helps on Zipf routing
  // By default each experiment runs with 8 seeds (the two at once, each in its own process): the
  // claim is their mean, with an interval.
  CHECK(ran[1].claims[0].per_seed.size() == 8);
  CHECK(ran[1].claims[0].ci95 > 0);
  CHECK(fs::exists(dir + "/results/gpt-moe-s/summary.json"));
  const std::string md = test::read_file(dir + "/report/report.md");
  CHECK_THAT(md, Contains("2 claims from 2 experiments"));
  CHECK_THAT(md, Contains("## Parameters these runs used"));
  CHECK_THAT(md, Contains("| dgx-a100 | A100-SXM4-80GB | 312 / 19.5 |"));  // the base spec's platform, with its parameters
  const std::string ledger = test::read_file(dir + "/report/fidelity.md");
  CHECK_THAT(ledger, Contains("### why"));
  CHECK(read_verdicts(dir + "/report/claims.json").size() == 2);
  if (!gnuplot_path().empty()) CHECK(fs::exists(dir + "/report/figures/gpt-moe-s/speedup.png"));
  o.run = false;
  const auto read = write_report(o);
  CHECK(read[1].claims[0].simulated == ran[1].claims[0].simulated);
  o.only = {"nothing-matches"};
  CHECK_THROWS_AS(write_report(o), InputError);
}

TEST_CASE("timeline summary: per layer and GPU class, phases in order with their overlap with expert compute") {
  // GPU 0 computes experts 0-2 ms while its combine runs 1-3 ms (half under experts); GPU 1
  // computes experts 0-1 ms and combines 1-3 ms (none under). A later iteration is left out.
  const auto dir = test::temp_dir("timeline-summary");
  auto x = [](int pid, int tid, const char* name, const char* cat, double ts, double dur, int it) {
    return nlohmann::json{{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"cat", cat},
                          {"ts", ts}, {"dur", dur}, {"args", {{"iteration", it}}}};
  };
  nlohmann::json events = nlohmann::json::array();
  for (int g = 0; g < 2; ++g)
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", g}, {"args", {{"name", "v: GPU " + std::to_string(g)}}}});
  events.push_back(x(0, 1, "L0.fwd.a2a_combine", "combine", 1000, 2000, 1));
  events.push_back(x(0, 0, "L0.fwd.experts", "expert_compute", 0, 2000, 1));
  events.push_back(x(0, 0, "optimizer", "optimizer", 3000, 1000, 1));
  events.push_back(x(1, 0, "L0.fwd.experts", "expert_compute", 0, 1000, 1));
  events.push_back(x(1, 1, "L0.fwd.a2a_combine", "combine", 1000, 2000, 1));
  events.push_back(x(1, 0, "L0.fwd.experts", "expert_compute", 5000, 9000, 2));  // iteration 2: not read
  test::write_file(dir + "/timeline.json", nlohmann::json{{"traceEvents", events}}.dump());

  const std::string out = timeline_summary(dir);
  INFO(out);
  CHECK_THAT(out, Contains("variant v, iteration 1, 2 GPUs") && Contains("hottest: GPU 0, 2.000 ms") &&
                      Contains("median one (GPU 1, 1.000 ms)"));
  const auto row = [&](const std::string& gpu, const std::string& phase) {
    const auto at = out.find(fmt::format("{:<10}{:<20}", gpu, phase));
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK_THAT(row("hottest 0", "combine"), Contains("1.000     2.000            50%"));
  CHECK_THAT(row("median 1", "combine"), Contains("1.000     2.000             0%"));
  CHECK_THAT(row("hottest 0", "expert_compute"), Contains("0.000     2.000              -"));
  CHECK(out.find("hottest 0 expert_compute") < out.find("hottest 0 combine"));  // in the order they start
  CHECK(out.find("L0 ") < out.find("other  hottest 0 optimizer"));              // the layers, then the rest
  CHECK_THROWS_WITH(timeline_summary(dir, {"", 5}), Contains("--layer 5"));
  CHECK_THROWS_WITH(timeline_summary(dir, {"w", -1}), Contains("--variant w") && Contains("it has: v"));
  CHECK_THROWS_WITH(timeline_summary(dir + "/nothing"), Contains("no timeline.json"));
}

TEST_CASE("demo: one table row per policy with its results and figures and where to go next") {
  const auto dir = test::temp_dir("demo");
  std::string out;
  // 4 of the demo's layers: the same table, files and figures in half the time (under the sanitizers
  // the whole demo took 160 s, the suite's longest test).
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " run -q --set iterations=2 --set model.layers=4 --out " + dir, out) == 0);
  INFO(out);
  for (const auto& policy : policy_names()) CHECK_THAT(out, Contains("  " + policy + " "));
  const auto summary = nlohmann::json::parse(test::read_file(dir + "/summary.json"));
  CHECK(summary["variants"].size() == policy_names().size());
  CHECK(fs::exists(dir + "/timeline.json"));
  if (!gnuplot_path().empty()) {
    CHECK(png_size(dir + "/speedup.png").first == kFigureSize.png_width);
    CHECK(png_size(dir + "/heatmap.png").first == kFigureSize.png_width);
  }
  CHECK_THAT(out, Contains("That was the default demo"));
}
