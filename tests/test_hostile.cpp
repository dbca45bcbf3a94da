// Specs, platforms, traces, results and sweeps from strangers: no name in them runs a command
// (gnuplot scripts, Slurm scripts) or becomes a path outside the output folder (each vector tried
// with a payload that would `touch` a marker file, which must never appear); no value hangs,
// crashes or silently overflows (each refused naming its field, or computed correctly).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cost_model.hpp"
#include "errors.hpp"
#include "gating.hpp"
#include "gpu.hpp"
#include "helpers.hpp"
#include "plot.hpp"
#include "results.hpp"
#include "results_db.hpp"
#include "spec.hpp"
#include "sweep.hpp"
#include "trace.hpp"
#include "trace_import.hpp"

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
  if (test::skip_without_gnuplot()) return;
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

TEST_CASE("hostile: a popularity so skewed that redrawing would never end still routes k distinct experts") {
  // Zipf 30: the second most popular expert has 2^-30 of the first's mass; 1e300: every expert but
  // the first underflows to 0. The sampler draws exactly once redrawing stops paying.
  for (const double s : {30.0, 1e300}) {
    INFO(s);
    spec::GatingSpec g;
    g.mutable_zipf()->set_exponent(s);
    const int sources = 4, experts = 16, tokens = 256, k = 4;
    const auto R = generate_routing(g, sources, experts, tokens, k, 1, 0, 0);
    for (int src = 0; src < sources; ++src) {
      std::int64_t row = 0;
      for (int e = 0; e < experts; ++e) {
        const auto c = R.counts()[std::size_t(src * experts + e)];
        CHECK(c <= tokens);  // an expert at most once per token
        row += c;
      }
      CHECK(row == std::int64_t(tokens) * k);
    }
  }
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"gating.zipf.exponent=inf"}), Contains("finite"));
}

TEST_CASE("hostile: platform values that hung, crashed or aborted SimGrid are refused naming the field") {
  auto check = [](const std::function<void(spec::ClusterSpec&)>& edit, const std::string& field) {
    auto s = test::platform("p4d-a100", 2);
    edit(s);
    INFO(field);
    try {
      Cluster c(s);
      FAIL("accepted");
    } catch (const FieldError& e) {
      CHECK(e.field() == field);
    }
  };
  constexpr double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  check([&](auto& s) { s.mutable_node()->mutable_links(0)->set_latency_us(inf); }, "node.links[0].latency_us");
  check([&](auto& s) { s.mutable_node()->mutable_links(0)->set_gbytes_per_s(1e308); }, "node.links[0].gbytes_per_s");
  check([&](auto& s) { s.mutable_node()->mutable_nics(0)->set_message_overhead_us(nan); }, "node.nics[0].message_overhead_us");
  check([&](auto& s) { s.mutable_node()->mutable_nics(0)->set_message_overhead_us(-1); }, "node.nics[0].message_overhead_us");
  check([&](auto& s) { *s.mutable_node()->add_links() = s.node().links(0); }, "node.links[" + std::to_string(test::platform("p4d-a100", 2).node().links_size()) + "]");
  check([&](auto& s) { s.mutable_node()->add_nics()->CopyFrom(s.node().nics(0)), s.mutable_node()->mutable_nics(4)->set_name("nic9"); },
        "node.nics[4].name");
  check([&](auto& s) { s.mutable_fabric()->set_nodes_per_leaf(0); }, "fabric.nodes_per_leaf");
  check([&](auto& s) { s.mutable_gpu()->set_memory_gib(inf); }, "gpu.memory_gib");
  // The host's times: a negative or NaN launch would start an op before its host issued it.
  check([&](auto& s) { s.mutable_gpu()->set_launch_us(nan); }, "gpu.launch_us");
  check([&](auto& s) { s.mutable_gpu()->set_launch_us(-1); }, "gpu.launch_us");
  check([&](auto& s) { s.mutable_gpu()->set_kernel_us(nan); }, "gpu.kernel_us");
  check([&](auto& s) { s.mutable_gpu()->set_kernel_us(-1); }, "gpu.kernel_us");
  check([&](auto& s) { s.mutable_gpu()->set_host_sync_us(inf); }, "gpu.host_sync_us");
  // One node without a fabric (nodes_per_leaf 0 divided the cost model's node count): one switch.
  auto one = test::platform("p4d-a100", 1);
  one.clear_fabric();
  const Cluster c(one);
  const GpuModel gpu(one.gpu(), spec::FP16);
  CHECK(CostModel(c, gpu).allreduce_time({0, 1, 2, 3}, 1 << 20) > 0);
}

TEST_CASE("hostile: model and gate values that overflowed are refused with their range") {
  for (const auto& [set, field] : std::vector<std::pair<std::string, std::string>>{
           {"model.tokens_per_gpu=2147483648", "tokens_per_gpu"},
           {"model.d_model=4000000000", "d_model"},
           {"model.experts=1000000000", "experts"},
           {"model.layers=100000", "layers"},
           {"gate.capacity_factor=1e308", "capacity_factor"}}) {
    INFO(set);
    CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {set}), Contains(field));
  }
  const auto dir = test::temp_dir("hostile-model");
  std::string text = test::read_file(test::kBaseSpec);
  REQUIRE(text.find("model {") != std::string::npos);
  text.replace(text.find("model {"), 7, "model {\n  extra_dense_gemms { m: 1152921504606846976 n: 1 k: 1 }");
  test::write_file(dir + "/g.textproto", text);
  CHECK_THROWS_WITH(load_experiment(dir + "/g.textproto", {}), Contains("extra_dense_gemms[0]"));
  // A grid of 2^32 points (four axes of 256 values) is refused, not wrapped to 0 points.
  std::string axes;
  for (const char* f : {"seed", "iterations", "model.layers", "cluster.nodes"}) {
    axes += std::string("axis { field: \"") + f + "\"";
    for (int v = 1; v <= 256; ++v) axes += " values: \"" + std::to_string(v) + "\"";
    axes += " }\n";
  }
  spec::SweepSpec grid;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(axes, &grid));
  CHECK_THROWS_WITH(expand_sweep(grid), Contains("more than"));
}

TEST_CASE("hostile: collective sweep sizes, GPU counts and claims out of range are refused, not run") {
  const auto dir = test::temp_dir("hostile-collective");
  const std::string head = "name: \"s\"\nplatform: \"dgx-a100\"\nalgorithms: [\"linear\", \"2dh\"]\n";
  const struct {
    std::string body, expect;
  } cases[] = {
      {"gpus: [16]\nsizes: [\"inf\"]\n", "size 'inf'"},          // crashed SimGrid
      {"gpus: [16]\nsizes: [\"1e300\"]\n", "size '1e300'"},      // ran to 1e296 µs and spoiled another point
      {"gpus: [16]\nsizes: [\"1e-300\"]\n", "size '1e-300'"},    // hung with 2dh
      {"gpus: [4294967288]\nsizes: [\"1M\"]\n", "gpus[0]"},     // read as -8, reported as --gpus
      {"gpus: [524288]\nsizes: [\"1M\"]\n", "gpus[0]"},         // hung
      {"gpus: [16]\nsizes: [\"1M\"]\npaper { claim: \"c\" gpus: 16 size: \"1M\" algorithm: \"2dh\" baseline: \"linear\" value: 1 "
       "tolerance: inf }\n",
       "tolerance"},  // passed every claim
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string spec = dir + "/c" + std::to_string(n) + ".textproto", out = dir + "/out" + std::to_string(n++);
    test::write_file(spec, head + c.body);
    std::string output;
    const int rc = test::run_command(std::string(MOESIM_BIN) + " collective " + spec + " -q --out " + out, output);
    INFO(c.body << output);
    CHECK(rc == 2);
    CHECK_THAT(output, Contains(c.expect));
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("hostile: CSV traces with a huge comment or numbers beyond 64 bits are input errors, not crashes") {
  const auto dir = test::temp_dir("hostile-csv");
  const std::string rows = "iter,layer,src,e0,e1\n0,0,0,1,1\n";
  test::write_file(dir + "/long.csv", "# model: x, top_k=1, num_experts=2 " + std::string(30000, 'a') + "\n" + rows);
  CHECK(import_csv(dir + "/long.csv", dir + "/long.trace", {}).top_k() == 1);
  test::write_file(dir + "/big.csv", "# top_k=99999999999999999999999\n" + rows);
  CHECK_THROWS_WITH(import_csv(dir + "/big.csv", dir + "/big.trace", {}), Contains("beyond 64 bits"));
  test::write_file(dir + "/k.csv", "# top_k=5000000000\n" + rows);
  CHECK_THROWS_WITH(import_csv(dir + "/k.csv", dir + "/k.trace", {}), Contains("at most"));
  // What the importer once wrote and the reader then refused: rows out of iteration order (a
  // stride of 2^32 - 1), a layer number of 2^31 - 1; an iteration beyond 2^31 - 1 is refused.
  const std::string head = "# top_k=1\niter,layer,src,e0,e1\n";
  test::write_file(dir + "/order.csv", head + "5,0,0,1,1\n2,0,0,1,1\n");
  CHECK_THROWS_WITH(import_csv(dir + "/order.csv", dir + "/o.trace", {}), Contains("sorted by iter, layer, mb"));
  test::write_file(dir + "/layers.csv", head + "0,1,0,1,1\n0,0,0,1,1\n");  // found by the fuzzer: layer 1, then 0
  CHECK_THROWS_WITH(import_csv(dir + "/layers.csv", dir + "/ls.trace", {}), Contains("sorted by iter, layer, mb"));
  test::write_file(dir + "/layer.csv", head + "0,2147483647,0,1,1\n");
  CHECK_THROWS_WITH(import_csv(dir + "/layer.csv", dir + "/l.trace", {}), Contains("column 'layer'"));
  // Found by the CSV fuzzer: a comment with a byte that is not UTF-8 made a trace whose header
  // protobuf would not read back; such bytes become '?'.
  test::write_file(dir + "/latin1.csv", "# caf\xe9, top_k=1\niter,layer,src,e0,e1\n0,0,0,1,1\n");
  import_csv(dir + "/latin1.csv", dir + "/latin1.trace", {});
  CHECK(TraceReader(dir + "/latin1.trace").header().comments(0) == "# caf?, top_k=1");
  // Found by the CSV fuzzer: a cell larger than the tokens the rows imply (8 / top-2 = 4 tokens, 5
  // to one expert), which the trace reader then refused.
  test::write_file(dir + "/cell.csv", "# top_k=2\niter,layer,src,e0,e1,e2,e3\n0,0,0,1,2,0,1\n1,0,0,2,1,5,0\n");
  CHECK_THROWS_WITH(import_csv(dir + "/cell.csv", dir + "/c.trace", {}), Contains("cell.csv:4") && Contains("at most once"));
  test::write_file(dir + "/far.csv", head + "0,0,0,1,1\n1099511627776,0,0,1,1\n");
  CHECK_THROWS_WITH(import_csv(dir + "/far.csv", dir + "/f.trace", {}), Contains("column 'iter'"));
}

TEST_CASE("hostile: results databases: read-only commands write nothing, a foreign file stays as it was") {
  const auto dir = test::temp_dir("hostile-db");
  // Another program's SQLite file, and an empty file.
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open((dir + "/other.db").c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "CREATE TABLE t(x); INSERT INTO t VALUES(1);", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  const std::string before = test::read_file(dir + "/other.db");
  test::write_file(dir + "/empty.db", "");
  for (const bool create : {false, true})
    for (const std::string name : {"other.db", "empty.db"}) {
      INFO(name << (create ? " opened to write" : " opened to read"));
      CHECK_THROWS_WITH(ResultsDb(dir + "/" + name, create), Contains("not a moesim results database"));
    }
  CHECK(test::read_file(dir + "/other.db") == before);
  CHECK(fs::file_size(dir + "/empty.db") == 0);
  // Found by the results-database fuzzer: moesim's table names with other columns.
  REQUIRE(sqlite3_open((dir + "/alike.db").c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "CREATE TABLE meta(key, value); CREATE TABLE points(id); CREATE TABLE runs(a); "
                              "CREATE TABLE iterations(b);", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  CHECK_THROWS_WITH(ResultsDb(dir + "/alike.db", false), Contains("not moesim's"));
  CHECK_FALSE(fs::exists(dir + "/other.db-wal"));
  // The command line: exit 2, and nothing half-written where -o points into no folder.
  std::string out;
  CHECK(test::run_command(std::string(MOESIM_BIN) + " results export " + dir + "/other.db", out) == 2);
  CHECK(test::read_file(dir + "/other.db") == before);
  // Corrupt JSON in a moesim database is an input error naming the point, not a crash.
  {
    ResultsDb db(dir + "/ours.db", true);
    db.set_meta("fields", "[\"seed\"]");
  }
  REQUIRE(sqlite3_open((dir + "/ours.db").c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "INSERT INTO points(id, label, overrides, spec, summary, wall_s) VALUES(3, 'x', '{not json', '', '{}', 0)",
                       nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  CHECK_THROWS_WITH(ResultsDb(dir + "/ours.db", false).points(), Contains("point 3") && Contains("corrupt"));
  // Found by the fuzzer: overrides stored as JSON null made the CSV export an internal error.
  REQUIRE(sqlite3_open((dir + "/ours.db").c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "UPDATE points SET overrides = 'null' WHERE id = 3", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  std::ostringstream csv;
  CHECK_THROWS_WITH(ResultsDb(dir + "/ours.db", false).export_csv(csv, false), Contains("not a JSON object"));
  CHECK(test::run_command(std::string(MOESIM_BIN) + " results export " + dir + "/ours.db -o " + dir + "/no/such/x.csv", out) == 2);
  CHECK_FALSE(fs::exists(dir + "/no"));
}

TEST_CASE("hostile: a second sweep on a database another sweep is writing stops at once") {
  const auto dir = test::temp_dir("hostile-lock");
  const std::string base = dir + "/base.textproto";
  test::write_file(base, test::read_file(test::kBaseSpec));
  test::write_file(dir + "/s.textproto", "base: \"base.textproto\"\nname: \"grid\"\nset: \"cluster.nodes=2\" "
                                         "set: \"model.layers=2\" set: \"model.experts=16\" set: \"iterations=2\"\n"
                                         "axis { field: \"seed\" values: [\"1\", \"2\"] }\n");
  const auto sw = load_sweep(dir + "/s.textproto");
  SweepOptions o;
  o.db = dir + "/r.db";
  o.jobs = 1;
  { ResultsDb create(o.db, true); }
  const int held = ::open(o.db.c_str(), O_RDONLY);  // the other sweep
  REQUIRE(::flock(held, LOCK_EX) == 0);
  o.resume = true;
  CHECK_THROWS_WITH(run_sweep(sw, o), Contains("another sweep"));
  ::close(held);
  CHECK(run_sweep(sw, o) == 0);
  CHECK(ResultsDb(o.db, false).finished().size() == 2);
}

TEST_CASE("hostile: a run's results appear whole: written aside, then moved in, summary last") {
  const auto dir = test::temp_dir("hostile-out");
  const auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "model.experts=16", "iterations=2"});
  const auto result = run_experiment(ex);
  write_results(dir + "/out", ex, result);  // new: the staged folder renamed
  test::write_file(dir + "/out/mine.txt", "kept");
  write_results(dir + "/out/", ex, result);  // existing: the files moved in, the folder's others kept
  CHECK(fs::exists(dir + "/out/summary.json"));
  CHECK(fs::exists(dir + "/out/timeline.json"));
  CHECK(test::read_file(dir + "/out/mine.txt") == "kept");
  test::write_file(dir + "/file", "not a folder");
  CHECK_THROWS_WITH(write_results(dir + "/file", ex, result), Contains("not a directory"));
  CHECK(test::read_file(dir + "/file") == "not a folder");
  for (const auto& f : fs::directory_iterator(dir))  // no staging folder left behind
    CHECK(f.path().filename().string().find(".writing-") == std::string::npos);
}

TEST_CASE("hostile: imported CSV traces are cached in a private per-user folder, keyed on content") {
  const auto dir = test::temp_dir("hostile-cache");
  const char* saved = std::getenv("XDG_CACHE_HOME");
  const std::string restore = saved ? saved : "";
  ::setenv("XDG_CACHE_HOME", (dir + "/cache").c_str(), 1);
  test::write_file(dir + "/t.csv", "# model: x, top_k=1, num_experts=2\niter,layer,src,e0,e1\n0,0,0,1,1\n");
  const std::string cached = replay_trace_path(dir + "/t.csv");
  CHECK(cached.rfind(dir + "/cache/moesim/", 0) == 0);
  struct stat st {};
  REQUIRE(::lstat((dir + "/cache/moesim").c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);
  CHECK(replay_trace_path(dir + "/t.csv") == cached);  // the same content: the same entry
  test::write_file(dir + "/t.csv", "# model: x, top_k=1, num_experts=2\niter,layer,src,e0,e1\n0,0,0,2,0\n");
  CHECK(replay_trace_path(dir + "/t.csv") != cached);  // edited: imported again
  // A cache folder that is a link (someone else's folder) is not used.
  fs::remove_all(dir + "/cache/moesim");
  fs::create_directories(dir + "/elsewhere");
  fs::create_directory_symlink(dir + "/elsewhere", dir + "/cache/moesim");
  const std::string aside = replay_trace_path(dir + "/t.csv");
  CHECK(aside.rfind(dir + "/cache/", 0) != 0);
  CHECK(fs::is_empty(dir + "/elsewhere"));
  fs::remove_all(fs::path(aside).parent_path());  // its private mkdtemp folder
  if (saved) ::setenv("XDG_CACHE_HOME", restore.c_str(), 1);
  else ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("hostile: --set with an index or a bad one is an input error, not an internal one") {
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"model[x].experts=3"}), Contains("without [index]"));
  CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, {"variants[0].name=z"}), Contains("without [index]"));
  std::string out;
  CHECK(test::run_command(std::string(MOESIM_BIN) + " run " + test::kBaseSpec + " --set 'model[x].experts=3'", out) == 2);
}

TEST_CASE("hostile: the corpus (tests/hostile/cases.tsv): each input exits 2 naming what is wrong, writing nothing") {
  const auto dir = test::temp_dir("hostile-corpus");
  const std::string root = MOESIM_SOURCE_DIR;
  const std::string platform = test::read_file(root + "/platforms/p4d-a100.textproto");
  std::ifstream cases(root + "/tests/hostile/cases.tsv");
  REQUIRE(cases);
  int n = 0;
  for (std::string line; std::getline(cases, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    REQUIRE(t2 != std::string::npos);
    const std::string kind = line.substr(0, t1), payload = line.substr(t1 + 1, t2 - t1 - 1), expect = line.substr(t2 + 1);
    INFO("case " << n << ": " << kind << " " << payload);
    const std::string out = dir + "/out" + std::to_string(n), spec = dir + "/spec" + std::to_string(n) + ".textproto";
    std::string extra;
    test::write_file(spec, test::read_file(test::kBaseSpec) + (kind == "spec" ? "\n" + payload + "\n" : ""));
    if (kind == "set")
      for (std::size_t from = 0, to; from != std::string::npos; from = to == std::string::npos ? to : to + 4) {
        to = payload.find(" && ", from);
        extra += " --set " + shell_word(payload.substr(from, to == std::string::npos ? to : to - from));
      }
    if (kind == "platform") {
      const auto arrow = payload.find("=>");
      REQUIRE(arrow != std::string::npos);
      std::string text = platform;
      const auto at = text.find(payload.substr(0, arrow));
      REQUIRE(at != std::string::npos);
      text.replace(at, arrow, payload.substr(arrow + 2));
      const std::string file = dir + "/platform" + std::to_string(n) + ".textproto";
      test::write_file(file, text);
      extra = " --set cluster.platform=" + shell_word(file);
    }
    std::string output;
    const int rc = test::run_command(std::string(MOESIM_BIN) + " run " + shell_word(spec) +
                                         " --set cluster.nodes=2 --set model.layers=2 --set model.experts=16 --set iterations=1" +
                                         extra + " --out " + shell_word(out),
                                     output);
    INFO(output);
    CHECK(rc == 2);
    CHECK_THAT(output, Contains(expect));
    CHECK_THAT(output, !Contains("internal error"));
    CHECK_FALSE(fs::exists(out));
    ++n;
  }
  CHECK(n >= 100);
}
