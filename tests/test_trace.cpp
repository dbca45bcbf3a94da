// Gating traces: the file format, importers and exporter, statistics, rescaling, replay, and the
// gate's capacity. Tests that read ../shared/traces skip with a reason when it is absent.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <numeric>
#include <optional>

#include "errors.hpp"
#include "gate.hpp"
#include "gating.hpp"
#include "helpers.hpp"
#include "rescale.hpp"
#include "runner.hpp"
#include "trace.hpp"
#include "trace_import.hpp"
#include "trace_stats.hpp"

using namespace moesim;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kShared = std::string(MOESIM_SOURCE_DIR) + "/../shared/traces/";
const std::string kSmartMoE = kShared + "smartmoe-gpt-e32-k2-r16/trace.csv";

bool have(const std::string& path) {
  if (fs::exists(path)) return true;
  test::skip(path + " is absent (the shared traces are not next to this checkout)");
  return false;
}

spec::TraceHeader small_header() {
  spec::TraceHeader h;
  h.set_version(1);
  h.set_experts(4);
  h.set_top_k(2);
  h.set_layers(2);
  h.set_sources(3);
  h.set_tokens_per_source(5);
  h.set_iteration_stride(1);
  h.set_rows_sum_to_tokens_times_k(true);
  return h;
}

// A valid matrix for small_header(): row s puts 5 tokens on expert s and 5 on expert s+1.
RoutingMatrix small_matrix(int shift) {
  RoutingMatrix m(3, 4);
  for (int s = 0; s < 3; ++s) {
    m.mutable_at(s, (s + shift) % 4) = 5;
    m.mutable_at(s, (s + shift + 1) % 4) = 5;
  }
  return m;
}

std::string write_small_trace(const std::string& path, int iterations) {
  TraceWriter w(path, small_header());
  for (int it = 0; it < iterations; ++it)
    for (int l = 0; l < 2; ++l) {
      spec::TraceRecord r;
      r.set_iteration(it);
      r.set_layer(l);
      set_record_counts(r, small_matrix(it + l));
      w.write(r);
    }
  w.close();
  return path;
}

// Expects reading `path` to fail with all the parts in the message.
void expect_bad_trace(const std::string& path, const std::vector<std::string>& parts) {
  try {
    TraceReader r(path);
    spec::TraceRecord rec;
    while (r.next(rec)) {
    }
    FAIL("the trace was accepted: " << path);
  } catch (const InputError& e) {
    for (const auto& p : parts) CHECK_THAT(e.what(), Contains(p));
  }
}

}  // namespace

TEST_CASE("a trace written record by record reads back identically") {
  const auto dir = test::temp_dir("trace-rw");
  const auto path = write_small_trace(dir + "/t.trace", 3);
  TraceReader r(path);
  CHECK(r.header().experts() == 4);
  spec::TraceRecord rec;
  int n = 0;
  while (r.next(rec)) {
    CHECK(rec.iteration() == std::uint64_t(n / 2));
    CHECK(record_matrix(r.header(), rec).counts() == small_matrix(int(rec.iteration() + rec.layer())).counts());
    ++n;
  }
  CHECK(n == 6);
  // Half the cells are zero: dense. A matrix with one non-zero cell in 12 is stored sparse.
  RoutingMatrix sparse(3, 4);
  sparse.mutable_at(1, 2) = 7;
  spec::TraceRecord sr;
  set_record_counts(sr, sparse);
  CHECK(sr.dense_size() == 0);
  CHECK(sr.sparse_cell_size() == 1);
  CHECK(record_matrix(small_header(), sr).counts() == sparse.counts());
}

TEST_CASE("truncated, corrupt and inconsistent traces are rejected with the record index") {
  const auto dir = test::temp_dir("trace-bad");
  const auto good = write_small_trace(dir + "/good.trace", 2);
  const std::string bytes = test::read_file(good);

  test::write_file(dir + "/cut.trace", bytes.substr(0, bytes.size() - 3));
  expect_bad_trace(dir + "/cut.trace", {"record 3", "truncated"});
  test::write_file(dir + "/magic.trace", "NOTATRACE" + bytes);
  expect_bad_trace(dir + "/magic.trace", {"not a moesim trace"});

  auto write_with = [&](const std::string& name, spec::TraceHeader h, const std::vector<spec::TraceRecord>& records) {
    TraceWriter w(dir + "/" + name, h);
    for (const auto& r : records) w.write(r);
    w.close();
    return dir + "/" + name;
  };
  spec::TraceRecord r;
  set_record_counts(r, small_matrix(0));
  spec::TraceRecord later = r;
  later.set_layer(5);  // the header says 2 layers
  expect_bad_trace(write_with("layer.trace", small_header(), {r, later}), {"record 1", "layer 5", "2 layers"});

  spec::TraceRecord negative = r;
  negative.set_dense(0, -5);
  expect_bad_trace(write_with("neg.trace", small_header(), {negative}), {"record 0", "negative count"});
  spec::TraceRecord huge = r;
  huge.set_dense(0, 3000000000);  // over what a routing cell (int32) holds
  expect_bad_trace(write_with("huge.trace", small_header(), {huge}), {"record 0", "3000000000", "2^31 - 1"});

  spec::TraceRecord short_row = r;
  short_row.set_dense(0, 4);  // source 0 now sums to 9, not 5 × 2
  expect_bad_trace(write_with("sum.trace", small_header(), {short_row}), {"record 0", "sum to 9", "10"});

  spec::TraceRecord wrong_size = r;
  wrong_size.mutable_dense()->RemoveLast();
  expect_bad_trace(write_with("size.trace", small_header(), {wrong_size}), {"record 0", "11 dense counts"});

  expect_bad_trace(write_with("order.trace", small_header(), {r, r}), {"record 1", "ascending order"});
}

TEST_CASE("CSV import and export round-trip a file exactly") {
  const auto dir = test::temp_dir("csv");
  const std::string csv =
      "# moe-gating-trace v1\n"
      "# model: test, top_k=2, num_experts=3\n"
      "iter,layer,src,loss,e0,e1,e2\n"
      "0,0,0,2.5,2,1,1\n0,0,1,2.5,2,2,0\n"
      "0,1,0,2.5,0,2,2\n0,1,1,2.5,1,1,2\n"
      "10,0,0,1.25,2,0,2\n10,0,1,1.25,2,1,1\n"
      "10,1,0,1.25,2,2,0\n10,1,1,1.25,0,2,2\n";
  test::write_file(dir + "/in.csv", csv);
  const auto h = import_csv(dir + "/in.csv", dir + "/t.trace", {});
  CHECK(h.sources() == 2);
  CHECK(h.experts() == 3);
  CHECK(h.layers() == 2);
  CHECK(h.top_k() == 2);
  CHECK(h.tokens_per_source() == 2);
  CHECK(h.iteration_stride() == 10);
  CHECK(h.rows_sum_to_tokens_times_k());
  export_csv(dir + "/t.trace", dir + "/out.csv");
  CHECK(test::read_file(dir + "/out.csv") == csv);
}

TEST_CASE("the real traces round-trip CSV to trace to CSV byte for byte") {
  for (const char* name : {"smartmoe-gpt-e32-k2-r16/trace.csv", "smartmoe-gpt-e32-k2-r16/global.csv",
                           "tinymoe-cpu/tinymoe_aux.csv", "tinymoe-cpu/tinymoe_noaux.csv"}) {
    const std::string path = kShared + name;
    if (!have(path)) continue;
    const auto dir = test::temp_dir("real-roundtrip");
    import_csv(path, dir + "/t.trace", {});
    export_csv(dir + "/t.trace", dir + "/out.csv");
    CHECK(test::read_file(dir + "/out.csv") == test::read_file(path));
  }
}

TEST_CASE("bad CSV rows name the file, line and column") {
  const auto dir = test::temp_dir("csv-bad");
  const std::string head = "# top_k=1\niter,layer,src,e0,e1\n";
  auto rejects = [&](const std::string& body, const std::vector<std::string>& parts) {
    test::write_file(dir + "/bad.csv", head + body);
    try {
      import_csv(dir + "/bad.csv", dir + "/t.trace", {});
      FAIL("accepted: " << body);
    } catch (const InputError& e) {
      for (const auto& p : parts) CHECK_THAT(e.what(), Contains(p));
    }
    CHECK_FALSE(fs::exists(dir + "/t.trace"));  // nothing half-written
  };
  rejects("0,0,0,1,x\n", {"bad.csv:3", "column 'e1'"});
  rejects("0,0,0,1,-1\n", {"bad.csv:3", "column 'e1'", "a count from 0"});
  rejects("0,0,0,1,3000000000\n", {"bad.csv:3", "column 'e1'", "2^31 - 1"});  // a routing cell is int32
  rejects("0,0,0,1,1\n0,0,1,2\n", {"bad.csv:4", "fields"});
  rejects("0,0,1,1,1\n0,1,0,2,0\n0,1,1,1,1\n", {"no row for source 0"});
  test::write_file(dir + "/nok.csv", "iter,layer,src,e0\n0,0,0,1\n");
  CHECK_THROWS_WITH(import_csv(dir + "/nok.csv", dir + "/t.trace", {}), Contains("--top-k"));
}

TEST_CASE("SmartMoE logs import to the same trace as the equivalent CSV") {
  const auto dir = test::temp_dir("smartmoe");
  fs::create_directories(dir + "/logs");
  // 2 iterations (1, 11) × 2 ranks × 2 layers × 2 micro-batches × 3 experts; each list sums to 4 (2 tokens, top-2).
  std::string csv = "# top_k=2\niter,layer,src,mb,e0,e1,e2\n";
  for (int it : {1, 11})
    for (int rank = 0; rank < 2; ++rank) {
      std::ofstream log(fmt::format("{}/logs/table_iter{}_rank{}.log", dir, it, rank));
      for (int layer = 0; layer < 2; ++layer) {
        log << layer << ":[";
        for (int mb = 0; mb < 2; ++mb) {
          const int a = (it + rank + layer + mb) % 3;  // 2 slots on expert a, 1 on each other
          int c[3] = {1, 1, 1};
          c[a] = 2;
          log << (mb ? ", " : "") << fmt::format("[{}.0, {}.0, {}.0]", c[0], c[1], c[2]);
        }
        log << "]\n";
      }
    }
  for (int it : {1, 11})
    for (int layer = 0; layer < 2; ++layer)
      for (int mb = 0; mb < 2; ++mb)
        for (int rank = 0; rank < 2; ++rank) {
          const int a = (it + rank + layer + mb) % 3;
          int c[3] = {1, 1, 1};
          c[a] = 2;
          csv += fmt::format("{},{},{},{},{},{},{}\n", it, layer, rank, mb, c[0], c[1], c[2]);
        }
  test::write_file(dir + "/same.csv", csv);
  ImportOptions k2;
  k2.top_k = 2;
  const auto h = import_smartmoe_logs(dir + "/logs", dir + "/logs.trace", k2);
  CHECK(h.micro_batches() == 2);
  CHECK(h.sources() == 2);
  CHECK(h.iteration_stride() == 10);
  import_csv(dir + "/same.csv", dir + "/csv.trace", k2);
  TraceReader a(dir + "/logs.trace"), b(dir + "/csv.trace");
  spec::TraceRecord ra, rb;
  int n = 0;
  while (a.next(ra)) {
    REQUIRE(b.next(rb));
    CHECK(record_matrix(a.header(), ra).counts() == record_matrix(b.header(), rb).counts());
    CHECK(ra.micro_batch() == rb.micro_batch());
    ++n;
  }
  CHECK_FALSE(b.next(rb));
  CHECK(n == 8);
}

TEST_CASE("load statistics on hand cases") {
  const auto one = load_stats({4, 0, 0, 0});
  CHECK(one.max_mean == Approx(4));
  CHECK(one.gini == Approx(0.75));  // (n − 1) / n
  CHECK(one.entropy == Approx(0).margin(1e-12));
  CHECK(one.zero_experts == 3);
  CHECK(one.top_share[0] == Approx(1));
  const auto even = load_stats({2, 2, 2, 2});
  CHECK(even.max_mean == Approx(1));
  CHECK(even.gini == Approx(0).margin(1e-12));
  CHECK(even.cv == Approx(0).margin(1e-12));
  CHECK(even.entropy == Approx(1));
  CHECK(even.top_share[1] == Approx(0.5));
  const auto mixed = load_stats({1, 2, 3, 4});  // mean 2.5, sd sqrt(1.25)
  CHECK(mixed.cv == Approx(std::sqrt(1.25) / 2.5));
  CHECK(mixed.gini == Approx(0.25));  // Σ|xi − xj| / (2 n² mean) = 20 / 80
  CHECK(cosine({1, 0}, {0, 1}) == Approx(0).margin(1e-12));
  CHECK(cosine({1, 2}, {2, 4}) == Approx(1));
  CHECK(total_variation({1, 1}, {3, 1}) == Approx(0.25));
  CHECK(gpu_max_mean({4, 0, 1, 1}, 2) == Approx(4.0 / 3));
}

TEST_CASE("the real trace's stable phase matches the notes' measured statistics") {
  if (!have(kSmartMoE)) return;
  const auto dir = test::temp_dir("real-stats");
  import_csv(kSmartMoE, dir + "/t.trace", {});
  TraceReader r(dir + "/t.trace");
  TraceStats stats(r.header(), 16, 1001);
  spec::TraceRecord rec;
  while (r.next(rec)) stats.add(rec);
  const auto j = stats.json()["overall"];
  // docs/spec/gating-traces.md §3: max/mean 12-15, top-1 share 0.417, cos(lag 10) 0.9995,
  // Gini 0.826, 5 experts with no token, GPU-level max/mean 7.0 on 16 GPUs.
  CHECK(j["max_mean"].get<double>() >= 12);
  CHECK(j["max_mean"].get<double>() <= 15);
  CHECK(j["top1_share"].get<double>() == Approx(0.42).margin(0.03));
  CHECK(j["lag"]["10"]["cosine"].get<double>() >= 0.999);
  CHECK(j["gini"].get<double>() == Approx(0.826).margin(0.02));
  CHECK(j["zero_experts"].get<double>() == 5);
  CHECK(j["gpu_max_mean"].get<double>() == Approx(7.0).margin(0.3));
  CHECK(j["source_global_cosine"].get<double>() >= 0.999);
}

TEST_CASE("capacity conventions on a hand case") {
  // E = 2, k = 1, T = 6: C = k·f·T/E = 3f. GPU 0 needs 5 slots of expert 0.
  RoutingMatrix R(2, 2);
  R.mutable_at(0, 0) = 5, R.mutable_at(0, 1) = 1, R.mutable_at(1, 0) = 3, R.mutable_at(1, 1) = 3;
  auto gate = [&](std::optional<double> f, bool pad = false) {
    spec::GateSpec g;
    if (f) g.set_capacity_factor(*f);
    g.set_pad_to_capacity(pad);
    return apply_gate(g, R, 6, 1);
  };
  const auto fixed = gate(1.0);
  CHECK(fixed.capacity == 3);
  CHECK(fixed.dropped == 2);
  CHECK(fixed.kept.at(0, 0) == 3);
  CHECK(fixed.kept.at(1, 1) == 3);
  const auto dropless = gate(0.0);
  CHECK(dropless.capacity == 5);
  CHECK(dropless.dropped == 0);
  CHECK(dropless.factor == Approx(5.0 / 3));
  const auto capped = gate(-1.0);  // needs 5/3, capped at 1
  CHECK(capped.factor == Approx(1));
  CHECK(capped.capacity == 3);
  CHECK(capped.dropped == 2);
  const auto roomy = gate(-2.0);  // needs 5/3 < 2: drops nothing
  CHECK(roomy.factor == Approx(5.0 / 3));
  CHECK(roomy.dropped == 0);
  CHECK(gate(std::nullopt).dropped == 0);
  const auto padded = gate(2.0, true);  // C = 6: buffers of 6 everywhere, nothing dropped
  CHECK(padded.capacity == 6);
  CHECK(padded.routed.at(1, 1) == 6);
  CHECK(padded.kept.counts() == R.counts());
  // DeepSpeed-MoE without dropping (sharded_moe.py, drop_tokens=False): no factor, every cell padded
  // to the largest count in the group, 5, so GPU 1 sends and expert 1 computes as much as GPU 0's
  // expert 0.
  const auto deepspeed_dropless = gate(std::nullopt, true);
  CHECK(deepspeed_dropless.capacity == 5);
  CHECK(deepspeed_dropless.dropped == 0);
  CHECK(deepspeed_dropless.routed.counts() == CountVector(std::vector<std::int32_t>{5, 5, 5, 5}));
}

TEST_CASE("rows are rescaled exactly and never over the per-token cap") {
  CHECK(rescale_row({1, 3}, 8, 100) == std::vector<std::int64_t>{2, 6});
  CHECK(rescale_row({1, 3}, 8, 5) == std::vector<std::int64_t>{3, 5});
  CHECK(rescale_row({0, 0, 0}, 4, 2) == std::vector<std::int64_t>{2, 1, 1});  // no signal: even
  const auto r = rescale_row({7, 1, 1, 1, 0}, 37, 10);
  CHECK(std::accumulate(r.begin(), r.end(), std::int64_t(0)) == 37);
  for (auto c : r) CHECK(c <= 10);
  RoutingMatrix t(4, 3);
  for (int s = 0; s < 4; ++s) t.mutable_at(s, s % 3) = 2, t.mutable_at(s, (s + 1) % 3) = 2;
  const auto summed = map_sources(t, 2, 4, 2);  // 4 sources onto 2 GPUs: pairs summed
  CHECK(summed.at(0, 1) == 4);                   // sources 0 and 1 both send 2 to expert 1
  for (int g = 0; g < 2; ++g) CHECK(summed.row_sum(g) == 8);
  const auto spread = map_sources(t, 8, 2, 2);  // 4 sources onto 8 GPUs: GPU g replays source g mod 4
  for (int g = 0; g < 8; ++g) CHECK(spread.at(g, g % 4 % 3) == 2);
}

TEST_CASE("replaying 20 iterations of the real trace on 16 GPUs gives one row per iteration") {
  if (!have(kSmartMoE)) return;
  const auto dir = test::temp_dir("replay");
  import_csv(kSmartMoE, dir + "/t.trace", {});
  const auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.experts=32", "model.layers=24",
                                                 "model.top_k=2", "iterations=20", "gating.trace.path=" + dir + "/t.trace",
                                                 "gating.trace.first_iteration=1001", "gate.capacity_factor=1.0"});
  const auto r = run_experiment(ex).runs.front();
  REQUIRE(r.iterations.size() == 20);
  for (int i = 0; i < 20; ++i) {
    CHECK(r.iterations[i].trace_iteration == std::uint64_t(1001 + 10 * i));
    CHECK(r.iterations[i].time > 0);
    CHECK(r.iterations[i].max_mean_load > 3);  // 2 experts per GPU of a heavily skewed trace
    CHECK(r.iterations[i].dropped > 0);        // f = 1 cannot hold a 13× hot expert
    std::int64_t per_layer = 0;
    for (auto d : r.iterations[i].dropped_per_layer) per_layer += d;
    CHECK(per_layer == r.iterations[i].dropped);
  }
}

TEST_CASE("a trace that does not match the model is rejected before any work") {
  const auto dir = test::temp_dir("replay-bad");
  const auto path = write_small_trace(dir + "/t.trace", 3);
  auto rejects = [&](std::vector<std::string> sets, const std::string& part) {
    sets.push_back("gating.trace.path=" + path);
    CHECK_THROWS_WITH(load_experiment(test::kBaseSpec, sets), Contains(part));
  };
  rejects({"cluster.nodes=1", "model.experts=8", "model.layers=2"}, "the trace has 4 experts, the model 8");
  rejects({"cluster.platform=rtx2080ti-pcie", "cluster.nodes=1", "model.experts=4", "model.layers=3"},
          "the trace has 2 layers, the model 3");
  rejects({"cluster.nodes=1", "model.experts=8", "model.layers=2"}, "set gating.trace.split_experts");
  rejects({"cluster.nodes=1", "model.experts=4", "model.layers=2", "cluster.platform=rtx2080ti-pcie", "iterations=5"},
          "holds 3 iteration(s)");
}

TEST_CASE("a trace's experts merge into coarser ones, or split into finer ones with a larger top-k") {
  // merge_experts by hand: 4 experts into 2, runs of 2 summed.
  RoutingMatrix t(2, 4);
  t.mutable_at(0, 0) = 3, t.mutable_at(0, 1) = 2, t.mutable_at(0, 3) = 5;
  t.mutable_at(1, 2) = 4, t.mutable_at(1, 3) = 6;
  const auto merged = merge_experts(t, 2);
  CHECK(merged.at(0, 0) == 5);
  CHECK(merged.at(0, 1) == 5);
  CHECK(merged.at(1, 0) == 0);
  CHECK(merged.at(1, 1) == 10);

  const auto dir = test::temp_dir("replay-resize");
  const auto path = write_small_trace(dir + "/t.trace", 3);  // 3 sources, 4 experts, top-2, 5 tokens a source
  const std::vector<std::string> small = {"cluster.platform=rtx2080ti-pcie", "cluster.nodes=1", "model.layers=2",
                                          "iterations=2", "gating.trace.path=" + path};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), small.begin(), small.end());
    return load_experiment(test::kBaseSpec, more);
  };
  // Coarser: 2 experts of the trace's 4, top-2 kept. Source 0 of iteration 0 chose experts 0 and 1
  // (5 tokens each): both are expert 0 now, 10 slots for 5 tokens, so the row is capped at 5 a cell
  // and the excess goes to the other expert.
  auto ex = with({"model.experts=2", "cluster.gpus_per_node=2", "gating.trace.merge_experts=true"});
  {
    const MoeModel model(ex.spec.model());  // the source keeps a reference to it
    auto source = make_gating_source(ex.spec.gating(), model, 2, 1);
    const RoutingMatrix R = source->next().front();
    for (int g = 0; g < 2; ++g) CHECK(R.row_sum(g) == ex.spec.model().tokens_per_gpu() * 2);
    for (int g = 0; g < 2; ++g)
      for (int e = 0; e < 2; ++e) CHECK(R.at(g, e) <= ex.spec.model().tokens_per_gpu());
  }
  // Finer: 16 experts (each split 4 ways), top-8 = 4 × the trace's 2: each GPU's slots scale to
  // tokens × 8, none above its tokens. GPU 0 replays source 0, whose tokens all chose trace experts
  // 0 and 1: their 8 parts take (nearly: the rounding of 5 slots over 4 parts spills a few) every
  // token each.
  ex = with({"model.experts=16", "model.top_k=8", "gating.trace.split_experts=true"});
  {
    const MoeModel model(ex.spec.model());  // the source keeps a reference to it
    auto source = make_gating_source(ex.spec.gating(), model, 2, 1);
    const RoutingMatrix R = source->next().front();
    const std::int64_t T = ex.spec.model().tokens_per_gpu();
    for (int g = 0; g < 2; ++g) CHECK(R.row_sum(g) == T * 8);
    std::int64_t parts = 0;
    for (int e = 0; e < 16; ++e) {
      CHECK(R.at(0, e) <= T);
      if (e < 8) parts += R.at(0, e);
    }
    CHECK(double(parts) > 0.999 * double(T * 8));
  }
  // Refused: a top-k beyond m·k, or not a multiple of k; top-k changed without a split; both flags.
  CHECK_THROWS_WITH(with({"model.experts=16", "model.top_k=10", "gating.trace.split_experts=true"}),
                    Contains("the trace is top-2, the model top-10") && Contains("a multiple of 2 up to 8"));
  CHECK_THROWS_WITH(with({"model.experts=16", "model.top_k=3", "gating.trace.split_experts=true"}), Contains("top-3"));
  CHECK_THROWS_WITH(with({"model.experts=2", "cluster.gpus_per_node=2", "model.top_k=1", "gating.trace.merge_experts=true"}),
                    Contains("the model top-1"));
  CHECK_THROWS_WITH(with({"model.experts=2", "cluster.gpus_per_node=2"}), Contains("set gating.trace.merge_experts"));
  CHECK_THROWS_WITH(with({"model.experts=2", "cluster.gpus_per_node=2", "gating.trace.merge_experts=true",
                          "gating.trace.split_experts=true"}),
                    Contains("gating.trace.merge_experts") && Contains("both"));
}

TEST_CASE("what the routing is, and what a replay or a --set leaves out, is said before the run") {
  const auto dir = test::temp_dir("replay-notes");
  const auto path = write_small_trace(dir + "/t.trace", 3);  // 2 layers, 4 experts, iterations 0-2
  const std::vector<std::string> small = {"cluster.platform=rtx2080ti-pcie", "cluster.nodes=1", "model.experts=4",
                                          "iterations=2", "gating.trace.path=" + path};
  auto with = [&](std::vector<std::string> sets, std::vector<std::string> more) {
    sets.insert(sets.end(), more.begin(), more.end());
    return load_experiment(test::kBaseSpec, sets);
  };
  // The whole trace: the source named with its path and the iterations replayed; one note, that
  // the trace replaces the spec file's Zipf gating.
  const auto all = with(small, {"model.layers=2"});
  REQUIRE(all.notes.size() == 1);
  CHECK_THAT(all.notes[0], Contains("--set gating.trace.path=") && Contains("replaces the spec's gating source (Zipf)"));
  CHECK(all.gating_source == "trace");
  CHECK_THAT(all.gating, Contains(path) && Contains("iterations 0-1") && Contains("2-layer"));
  // A model with fewer layers than the trace replays its first ones, and says so.
  const auto one = with(small, {"model.layers=1"});
  REQUIRE(one.notes.size() == 2);
  CHECK_THAT(one.notes[1], Contains("the trace has 2 layers, the model 1") && Contains("first 1"));
  const auto gen = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "gating.generator.preset=aux", "seed=7"});
  REQUIRE(gen.notes.size() == 1);
  CHECK_THAT(gen.notes[0], Contains("--set gating.generator.preset=aux") && Contains("Zipf"));
  CHECK_THAT(gen.gating, Contains("generator preset aux") && Contains("seed 7"));
  // A --set of the source the spec has already is no switch.
  CHECK(load_experiment(test::kBaseSpec, {"cluster.nodes=2", "gating.zipf.exponent=1.2"}).notes.empty());
}

TEST_CASE("rescaling keeps the load distribution, its drift and the source similarity") {
  // A synthetic naive trace (16 sources × 32 experts), rescaled to 64 sources × 128 experts.
  const auto dir = test::temp_dir("rescale");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " trace gen -q --preset naive --experts 32 --layers 2 --sources 16 "
                                                      "--tokens 4096 --iterations 60 --seed 5 -o " + dir + "/a.trace",
                            out) == 0);
  RescaleOptions o;
  o.sources = 64;
  o.experts = 128;
  o.tokens_per_source = 2048;
  const auto h = rescale_trace(dir + "/a.trace", dir + "/b.trace", o);
  CHECK(h.sources() == 64);
  CHECK(h.experts() == 128);
  auto stats_of = [](const std::string& path) {
    TraceReader r(path);
    TraceStats s(r.header(), 0, 0, {10});
    spec::TraceRecord rec;
    while (r.next(rec)) s.add(rec);  // the reader checks rows sum to tokens × k and the cap
    return s.json()["overall"];
  };
  const auto before = stats_of(dir + "/a.trace"), after = stats_of(dir + "/b.trace");
  INFO(before.dump() << "\n" << after.dump());
  CHECK(after["max_mean"].get<double>() == Approx(before["max_mean"].get<double>()).epsilon(0.1));
  CHECK(after["gini"].get<double>() == Approx(before["gini"].get<double>()).epsilon(0.05));
  CHECK(after["cv"].get<double>() == Approx(before["cv"].get<double>()).epsilon(0.1));
  CHECK(after["zero_experts"].get<double>() == Approx(4 * before["zero_experts"].get<double>()).margin(4));
  CHECK(after["lag"]["10"]["cosine"].get<double>() >= 0.99);
  CHECK(after["source_global_cosine"].get<double>() >= 0.99);
  CHECK(after["source_global_cosine"].get<double>() ==
        Approx(before["source_global_cosine"].get<double>()).epsilon(0.01));
}

TEST_CASE("moesim trace commands: same seed same file, bad input exits 2") {
  const auto dir = test::temp_dir("trace-cli");
  const std::string bin = MOESIM_BIN;
  const std::string gen = bin + " trace gen -q --preset aux --experts 16 --layers 3 --sources 4 --tokens 256 --iterations 20 ";
  std::string out;
  REQUIRE(test::run_command(gen + "--seed 9 -o " + dir + "/a.trace", out) == 0);
  REQUIRE(test::run_command(gen + "--seed 9 -o " + dir + "/b.trace", out) == 0);
  REQUIRE(test::run_command(gen + "--seed 10 -o " + dir + "/c.trace", out) == 0);
  CHECK(test::read_file(dir + "/a.trace") == test::read_file(dir + "/b.trace"));
  CHECK(test::read_file(dir + "/a.trace") != test::read_file(dir + "/c.trace"));
  REQUIRE(test::run_command(bin + " trace stats --json " + dir + "/a.trace", out) == 0);
  const auto j = nlohmann::json::parse(out);
  CHECK(j["overall"]["records"] == 60);
  // A CSV is read as its import: the same statistics as the .trace exported from it.
  REQUIRE(test::run_command(bin + " trace export " + dir + "/a.trace -o " + dir + "/a.csv", out) == 0);
  REQUIRE(test::run_command(bin + " trace stats --json " + dir + "/a.csv", out) == 0);
  CHECK(nlohmann::json::parse(out)["overall"] == j["overall"]);
  CHECK(test::run_command(gen + "--set sigma_pop=-1 -o " + dir + "/d.trace", out) == 2);
  CHECK_THAT(out, Contains("sigma_pop"));
  CHECK_FALSE(fs::exists(dir + "/d.trace"));
  test::write_file(dir + "/cut.trace", test::read_file(dir + "/a.trace").substr(0, 500));
  CHECK(test::run_command(bin + " trace stats " + dir + "/cut.trace", out) == 2);
  CHECK_THAT(out, Contains("cut.trace: record") && Contains("truncated"));
  CHECK(test::run_command(bin + " trace import " + dir + "/missing.csv -o " + dir + "/x.trace", out) == 2);
}

TEST_CASE("the rank files of a recorded run merge into one trace, rank r as source r, other runs are refused") {
  const auto dir = test::temp_dir("ranks");
  // Rank r of run "A" (3 ranks, 4 experts, 2 layers, 2 iterations): cell (r, e) of record (i, l)
  // holds 100·r + 10·i + l + e, so that every cell says where it came from.
  auto write_rank = [&](const std::string& run, std::uint32_t rank, std::uint32_t world, std::uint32_t iterations = 2) {
    spec::TraceHeader h;
    h.set_version(1), h.set_experts(4), h.set_top_k(2), h.set_layers(2), h.set_sources(1), h.set_iteration_stride(1);
    h.set_run(run), h.set_rank(rank), h.set_world_size(world);
    const std::string path = fmt::format("{}/{}.rank{}.trace", dir, run, rank);
    TraceWriter w(path, h);
    for (std::uint32_t i = 0; i < iterations; ++i)
      for (std::uint32_t l = 0; l < 2; ++l) {
        spec::TraceRecord r;
        r.set_iteration(i), r.set_layer(l);
        for (int e = 0; e < 4; ++e) r.add_dense(100 * rank + 10 * i + l + e);
        w.write(r);
      }
    w.close();
    return path;
  };
  const std::vector<std::string> a = {write_rank("A", 2, 3), write_rank("A", 0, 3), write_rank("A", 1, 3)};  // any order
  const auto h = import_rank_traces(a, dir + "/A.trace", {});
  CHECK(h.sources() == 3);
  CHECK(h.world_size() == 0);  // a merged trace is no rank file
  TraceReader reader(dir + "/A.trace");
  spec::TraceRecord r;
  int records = 0;
  while (reader.next(r)) {
    const RoutingMatrix m = record_matrix(reader.header(), r);
    for (int s = 0; s < 3; ++s)
      for (int e = 0; e < 4; ++e) CHECK(m.at(s, e) == 100 * s + 10 * std::int64_t(r.iteration()) + r.layer() + e);
    ++records;
  }
  CHECK(records == 4);
  // Refused: another run's file (naming both), a missing rank, a rank twice, records that part.
  const auto b = write_rank("B", 1, 3);
  CHECK_THROWS_WITH(import_rank_traces({a[1], b, a[0]}, dir + "/x.trace", {}),
                    Catch::Contains(a[1]) && Catch::Contains(b) && Catch::Contains("different recordings"));
  CHECK_THROWS_WITH(import_rank_traces({a[0], a[1]}, dir + "/x.trace", {}), Catch::Contains("rank 1") && Catch::Contains("missing"));
  CHECK_THROWS_WITH(import_rank_traces({a[0], a[1], a[2], a[1]}, dir + "/x.trace", {}), Catch::Contains("both rank 0"));
  const auto short_rank = write_rank("C", 0, 2, 1), long_rank = write_rank("C", 1, 2, 2);
  CHECK_THROWS_WITH(import_rank_traces({short_rank, long_rank}, dir + "/x.trace", {}), Catch::Contains("the rank files part"));
  CHECK_FALSE(std::filesystem::exists(dir + "/x.trace"));  // nothing half-written
  CHECK_THROWS_WITH(import_rank_traces({dir + "/A.trace"}, dir + "/x.trace", {}), Catch::Contains("not a rank file"));
}
