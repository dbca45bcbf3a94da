// Golden scenarios: small runs whose op timeline is kept beside them (tests/golden/NAME.expected)
// so that any change in behaviour shows up in review. Regenerate with MOESIM_UPDATE_GOLDEN=1.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fmt/format.h>

#include "helpers.hpp"
#include "runner.hpp"

using namespace moesim;

namespace {

// Rank 0's and the last rank's ops, one line each: start and end in µs, label.
std::string timeline_text(const RunResult& r) {
  std::string out;
  const auto& g = r.graphs.at(0);
  const auto& t = r.timings.at(0);
  for (int rank : {0, r.gpus - 1})
    for (const auto& op : g.ops()) {
      const auto ranks = op.ranks();
      const auto at = std::find(ranks.begin(), ranks.end(), rank);
      if (at == ranks.end()) continue;
      double start = t.start[op.id], end = t.end[op.id];
      if (const auto* parts = std::get_if<Computes>(&op.body)) {  // this rank's part
        const auto part = parts->first_part + std::size_t(at - ranks.begin());
        start = t.part_start[part], end = t.part_end[part];
      }
      out += fmt::format("gpu{:<3} {:<8} {:12.3f} {:12.3f}  {}\n", rank, stream_name(op.stream), start * 1e6, end * 1e6, op.label);
    }
  out += fmt::format("iteration {:.3f} us\n", r.iterations.at(std::size_t(r.first_graph)).time * 1e6);
  return out;
}

void check_golden(const std::string& name) {
  const std::string dir = std::string(MOESIM_SOURCE_DIR) + "/tests/golden/";
  const auto ex = load_experiment(dir + name + ".textproto", {});
  const auto text = timeline_text(run_experiment(ex).runs.front());
  if (std::getenv("MOESIM_UPDATE_GOLDEN")) test::write_file(dir + name + ".expected", text);
  CHECK(text == test::read_file(dir + name + ".expected"));
}

}  // namespace

TEST_CASE("golden: one MoE layer on two DGX-A100 nodes") { check_golden("ep_2node_a100"); }
TEST_CASE("golden: the same layer with the 2DH all-to-all") { check_golden("2dh_2node_a100"); }
TEST_CASE("golden: the same layer under ScheMoE with OptSche and ZFP") { check_golden("schemoe_2node_a100"); }
TEST_CASE("golden: FasterMoE smart schedule in four groups of four") { check_golden("smart_2node_a100"); }
TEST_CASE("golden: Pro-Prophet's block-wise schedule over two layers") { check_golden("blockwise_2node_a100"); }
TEST_CASE("golden: Hecate's FSSDP with re-materialization") { check_golden("fssdp_rematerialize_2node_a100"); }
TEST_CASE("golden: Tutel sharded experts with r = 2") { check_golden("tutel_sharded_r2"); }
TEST_CASE("golden: Tutel pipelined layer of degree 2") { check_golden("tutel_pipelined_d2"); }
TEST_CASE("golden: ZeRO-3 over the layers' tensors") { check_golden("zero3_2node_a100"); }
TEST_CASE("golden: two pipeline stages, three micro-batches in 1F1B order") { check_golden("pipeline_1f1b_2node_a100"); }
TEST_CASE("golden: the layer with tensor parallelism 2") { check_golden("tp2_2node_a100"); }
TEST_CASE("golden: the layer with context parallelism 2") { check_golden("cp2_2node_a100"); }
TEST_CASE("golden: EPLB's redundant experts, placed from the first iteration's loads") { check_golden("eplb_2node_a100"); }
