// Specs, results and sweeps from strangers: no name in them runs a command (gnuplot scripts, Slurm
// scripts) or becomes a path outside the output folder. Each vector is tried with a payload that
// would `touch` a marker file; the marker must never appear.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "errors.hpp"
#include "helpers.hpp"
#include "plot.hpp"
#include "results.hpp"
#include "spec.hpp"
#include "sweep.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Names that ran a command through gnuplot before: a backquote inside double quotes, a single quote
// that closes the string it is in, and a newline that ends an inline data block ("EOD") so that the
// next line is a command (`!` runs a shell command). `marker` is the file each would create.
std::vector<std::string> hostile_names(const std::string& marker) {
  return {"a`touch " + marker + "-1`", "ep'; print system('touch " + marker + "-2'); x='",
          "b\"; system(\"touch " + marker + "-3\"); x=\"", "c\nEOD\n!touch " + marker + "-4\nprint 1"};
}

bool any_marker(const std::string& marker) {
  for (int k = 1; k <= 4; ++k)
    if (fs::exists(marker + "-" + std::to_string(k))) return true;
  return false;
}

}  // namespace

TEST_CASE("hostile: run names in a results file reach gnuplot as text, never as commands") {
  if (gnuplot_path().empty()) {
    WARN("skipped: gnuplot is not installed (apt-get install gnuplot-nox; the quickstart installs it)");
    return;
  }
  const auto dir = test::temp_dir("hostile-plot");
  // gnuplot runs in the figures' folder: a payload there names its marker without a '/' (which
  // plot would read as GROUP/NAME).
  fs::create_directories(dir + "/figures");
  const std::string marker = "ran";
  // A real small run, then its variants renamed as a stranger's summary.json could name them.
  test::write_file(dir + "/spec.textproto", test::read_file(test::kBaseSpec) +
                                                "variants { name: \"ep\" set: \"policy.name=ep\" }\n"
                                                "variants { name: \"fastermoe\" set: \"policy.name=fastermoe\" }\n");
  const auto ex = load_experiment(dir + "/spec.textproto", {"cluster.nodes=2", "model.layers=2", "model.experts=16",
                                                            "iterations=2"});
  write_results(dir + "/run", ex, run_experiment(ex));
  nlohmann::json summary;
  std::ifstream(dir + "/run/summary.json") >> summary;
  const auto names = hostile_names(marker);
  auto base = summary["variants"].at(0);
  summary["variants"] = nlohmann::json::array();
  for (const auto& n : names) {
    base["name"] = n;
    summary["variants"].push_back(base);
  }
  summary["name"] = names[1];
  test::write_file(dir + "/run/summary.json", summary.dump());
  for (const auto& figure : figure_names()) {
    PlotOptions o;
    o.figures = {figure};
    o.format = "png";
    o.out = dir + "/figures";
    o.baseline = names[1];
    try {
      plot({dir + "/run"}, o);
    } catch (const InputError&) {  // a figure this input cannot make (scaling): fine, as long as nothing ran
    }
    INFO(figure);
    CHECK_FALSE(any_marker(dir + "/figures/" + marker));
  }
  for (const std::string drawn : {"speedup", "breakdown", "load", "heatmap", "timeline"}) {  // each drew those names
    INFO(drawn);
    CHECK(fs::exists(dir + "/figures/" + drawn + ".png"));
  }
  // The kept scripts run nothing either when rendered again by hand.
  for (const auto& f : fs::directory_iterator(dir + "/figures"))
    if (f.path().extension() == ".gp") {
      std::string out;
      test::run_command("cd " + dir + "/figures && gnuplot " + f.path().filename().string(), out);
    }
  CHECK_FALSE(any_marker(dir + "/figures/" + marker));
}

TEST_CASE("hostile: a spec's or sweep's name that is not a plain word is refused where it would become a path") {
  const auto dir = test::temp_dir("hostile-names");
  for (const std::string bad : {"../../x", "a/b", "$(touch x)", ".hidden", "a b", "-rf", "x\ny", "\xff"}) {
    INFO(bad);
    CHECK(path_name_problem(bad) != "");
  }
  for (const std::string bad : {"../../x", "a/b", "$(touch x)", ".hidden", "a b", "-rf"})
    CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"name=" + bad}), Contains("name") && Contains("letters, digits"));
  CHECK(path_name_problem("hecate-fig9-16") == "");
  CHECK(path_name_problem("tutel_2dh.v2+zfp") == "");
  // In a file, escapes give what --set cannot: a newline, bytes that are not UTF-8.
  const std::string base = test::read_file(test::kBaseSpec);
  test::write_file(dir + "/nl.textproto", base + "name: \"x\\ny\"\n");
  CHECK_THROWS_WITH(load_experiment(dir + "/nl.textproto", {}), Contains("name"));
  test::write_file(dir + "/variant.textproto", base + "variants { name: \"a\\nb\" set: \"seed=2\" }\n");
  CHECK_THROWS_WITH(load_experiment(dir + "/variant.textproto", {}), Contains("control character"));
  test::write_file(dir + "/utf8.textproto", base + "variants { name: \"a\\377b\" set: \"seed=2\" }\n");
  CHECK_THROWS_WITH(load_experiment(dir + "/utf8.textproto", {}), Contains("UTF-8"));
  // The command line: exit 2 naming the field, nothing written under --out.
  std::string out;
  const std::string spec = dir + "/bad.textproto";
  test::write_file(spec, test::read_file(test::kBaseSpec) + "\nname: \"../escaped\"\n");
  CHECK(test::run_command(std::string(MOESIM_BIN) + " run " + spec + " --out " + dir + "/out", out) == 2);
  CHECK_THAT(out, Contains("name"));
  CHECK_FALSE(fs::exists(dir + "/out"));
  CHECK_FALSE(fs::exists(dir + "/escaped"));
}

TEST_CASE("hostile: the Slurm script quotes every path and refuses a sweep name that is not a word") {
  const auto dir = test::temp_dir("hostile slurm $(touch ran)");  // a space and a command in the folder name
  const std::string base = dir + "/base.textproto";
  test::write_file(base, test::read_file(test::kBaseSpec));
  const std::string sweep = dir + "/s'q.textproto";
  test::write_file(sweep, "base: \"base.textproto\"\nname: \"grid\"\naxis { field: \"seed\" values: \"1\" values: \"2\" }\n");
  const auto sw = load_sweep(sweep);
  // The script, run with the job's variables and `echo` in place of moesim: the paths arrive whole.
  const std::string script = slurm_script(sw, 2, 1, "/bin/echo");
  test::write_file(dir + "/job.sh", script);
  std::string out;
  CHECK(test::run_command("cd '" + dir + "' && SLURM_ARRAY_TASK_ID=1 bash job.sh", out) == 0);
  CHECK_THAT(out, Contains("sweep " + fs::absolute(sweep).lexically_normal().string() + " --shard 1/2"));
  CHECK_THAT(out, Contains("--db grid-shard-1.db"));
  CHECK_FALSE(fs::exists("ran"));
  CHECK_FALSE(fs::exists(dir + "/ran"));
  // A name with a command in it never gets that far.
  test::write_file(sweep, "base: \"base.textproto\"\nname: \"t$(touch ran)\"\naxis { field: \"seed\" values: \"1\" }\n");
  CHECK_THROWS_WITH(load_sweep(sweep), Contains("name"));
}
