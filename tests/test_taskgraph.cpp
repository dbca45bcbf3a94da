// The TaskGraph contract and the critical-path walk.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <tuple>

#include "helpers.hpp"
#include "policy.hpp"
#include "taskgraph.hpp"

using namespace moesim;

TEST_CASE("stream order makes ops on one stream of one rank predecessors") {
  TaskGraph g(2);
  const OpId a = g.add_compute(0, "a", {});
  const OpId b = g.add_compute(1, "b", {});
  const OpId c = g.add_collective(Stream::comm, "c", {CollectiveType::all_reduce, {0, 1}, {8}, "ring"});
  const OpId d = g.add_compute(0, "d", {}, {c});
  const auto p = g.predecessors();
  CHECK(p[a].empty());
  CHECK(p[b].empty());
  CHECK(p[c].empty());                           // nothing before it on the comm streams
  CHECK(p[d] == std::vector<OpId>{a, c});        // explicit dep and rank 0's compute stream
  CHECK_THROWS(g.add_compute(0, "bad", {}, {99}));  // deps must come earlier
  CHECK_THROWS(g.add_compute(2, "bad", {}));        // rank out of range
}

TEST_CASE("a Computes op's parts each follow what precedes them on their rank's stream") {
  // Rank 0: a, then part 0 of P, then d; rank 1: part 1 of P, then Q's part. P's parts are the
  // graph's parts 0 and 1, Q's part 2; nodes count the graph's ops first.
  TaskGraph g(2);
  const OpId a = g.add_compute(0, "a", {});
  const OpId p = g.add_computes("L0.fwd.C0", {{0, 1}, make_works({Compute{}}), {0, 0}});
  const OpId q = g.add_computes("L0.fwd.C1", {{1}, make_works({Compute{}}), {0}}, {a});
  const OpId d = g.add_compute(0, "d", {});
  CHECK(g.num_parts() == 3);
  CHECK(std::get<Computes>(g.op(q).body).first_part == 2);
  CHECK(std::ranges::equal(g.op(p).ranks(), std::vector<int>{0, 1}));
  CHECK(g.op(p).phase == Phase::expert_compute);
  const auto w = g.waits();
  const auto node = [&](std::size_t part) { return Node(g.size() + part); };
  CHECK(w.stream_pred == std::vector<Node>{a, kNoNode, node(1)});
  CHECK(w.op_of == std::vector<OpId>{p, p, q});
  CHECK(w.of_op[p].empty());                       // its parts wait for the rest
  CHECK(w.of_op[q] == std::vector<Node>{a});        // its deps
  CHECK(w.of_op[d] == std::vector<Node>{node(0)});  // rank 0's part of P, not all of P
  const auto preds = g.predecessors();              // op by op: a part's wait is its op's
  CHECK(preds[p] == std::vector<OpId>{a});
  CHECK(preds[q] == std::vector<OpId>{a, p});
  CHECK(preds[d] == std::vector<OpId>{p});
  CHECK_THROWS(g.add_computes("two on one rank", {{0, 0}, make_works({Compute{}}), {0, 0}}));
  CHECK_THROWS(g.add_computes("no work", {{0}, make_works({Compute{}}), {1}}));
  CHECK_THROWS(g.add_computes("nothing", {}));
}

TEST_CASE("the critical path adds up to the makespan on a hand case, per phase and per layer") {
  // Two ranks. Layer 0: rank 0's attention 0-1, a dispatch 1-3 over both, a gap (rank 1's gate
  // ends at 3.5), rank 0's experts 3.5-4; outside the layers rank 1's optimizer 4-6, after both.
  TaskGraph g(2);
  const OpId a = g.add_compute(0, "L0.fwd.attention", {});
  const OpId d = g.add_collective(Stream::comm, "L0.fwd.a2a_dispatch", {CollectiveType::all_to_all, {0, 1}, {0, 0, 0, 0}, "linear"}, {a});
  const OpId gate = g.add_compute(1, "L0.fwd.gate", {ComputeKind::gate, {}, 0});
  const OpId e = g.add_compute(0, "L0.fwd.experts", {ComputeKind::grouped_gemm, {}, 0}, {d, gate});
  const OpId o = g.add_compute(1, "optimizer", {ComputeKind::optimizer, {}, 0}, {e});
  Timing t{{0, 1, 0, 3.5, 4}, {1, 3, 3.5, 4, 6}, {}, {}, {}};
  const auto at = attribute(g, t);
  CHECK(g.op(a).phase == Phase::dense_compute);
  CHECK(g.op(o).phase == Phase::optimizer);
  // The path: optimizer ← experts ← gate (ended at 3.5, after the dispatch's 3) ← nothing.
  CHECK(at.critical[Phase::optimizer] == Approx(2));
  CHECK(at.critical[Phase::expert_compute] == Approx(0.5));
  CHECK(at.critical[Phase::routing] == Approx(3.5));
  CHECK(at.critical[Phase::dispatch] == 0);
  CHECK(at.critical.total() == Approx(t.makespan()));
  REQUIRE(at.layer_critical.size() == 1);
  CHECK(at.layer_critical[0].total() == Approx(4));  // all but the optimizer
  // Busy, per GPU: the dispatch occupies both GPUs 2 s (2 × 2 / 2), the others one GPU each.
  CHECK(at.busy[Phase::dispatch] == Approx(2));
  CHECK(at.busy[Phase::dense_compute] == Approx(0.5));
  CHECK(at.busy[Phase::routing] == Approx(1.75));
  CHECK(at.busy[Phase::optimizer] == Approx(1));
  CHECK(at.layer_busy[0][Phase::optimizer] == 0);

  // A gap between an op and the one it waited for is idle, in the layer of the op that waited.
  TaskGraph h(1);
  const OpId x = h.add_compute(0, "L1.bwd.attention", {});
  h.add_compute(0, "L0.bwd.experts", {ComputeKind::grouped_gemm, {}, 0}, {x});
  const auto gap = attribute(h, Timing{{0, 3}, {1, 4}, {}, {}, {}});
  CHECK(gap.critical[Phase::idle] == Approx(2));
  CHECK(gap.layer_critical.at(0)[Phase::idle] == Approx(2));
  CHECK(gap.layer_critical.at(1)[Phase::idle] == 0);
}

TEST_CASE("an op's phase follows from its name, and from its kind where the name is not moesim's") {
  TaskGraph g(2);
  const std::vector<int> both{0, 1};
  auto coll = [&](const char* label, CollectiveType type) {
    return g.op(g.add_collective(Stream::comm, label, {type, both, {0, 0, 0, 0}, "linear"})).phase;
  };
  CHECK(coll("L3.bwd.S2", CollectiveType::all_to_all) == Phase::dispatch);      // FasterMoE's step 2 send
  CHECK(coll("L3.bwd.R12", CollectiveType::all_to_all) == Phase::combine);
  CHECK(coll("L3.fwd.a2a_combine.p1", CollectiveType::all_to_all) == Phase::combine);
  CHECK(coll("L3.fwd.count_exchange", CollectiveType::all_to_all) == Phase::routing);
  CHECK(coll("L0.fwd.smart_done", CollectiveType::all_to_all) == Phase::sync);
  CHECK(coll("migrations_done", CollectiveType::all_to_all) == Phase::expert_moves);
  CHECK(coll("L2.fwd.replica_bcast.e7", CollectiveType::broadcast) == Phase::replica_broadcast);
  CHECK(coll("L2.bwd.replica_reduce.e7", CollectiveType::reduce) == Phase::replica_reduce);
  CHECK(coll("L2.fwd.experts_allgather", CollectiveType::all_gather) == Phase::parameter_gather);
  CHECK(coll("allreduce.dense", CollectiveType::all_reduce) == Phase::dense_allreduce);
  CHECK(coll("mystery", CollectiveType::all_gather) == Phase::parameter_gather);  // by kind
  // C<j> is a FasterMoE expert step; ScheMoE's C1/C2 parts are compression by their kind.
  CHECK(g.op(g.add_compute(0, "L1.fwd.C3", {ComputeKind::grouped_gemm, {}, 0})).phase == Phase::expert_compute);
  CHECK(g.op(g.add_compute(0, "L1.fwd.C1.p0", {ComputeKind::compress, {}, 0})).phase == Phase::compression);
  CHECK(g.op(g.add_compute(0, "L1.fwd.host_sync", {ComputeKind::elementwise, {}, 0})).phase == Phase::routing);
  CHECK(g.op(g.add_compute(0, "calibrate.cover", {ComputeKind::elementwise, {}, 0})).phase == Phase::dense_compute);
  CHECK(known_op_name("L12.bwd.expert_reduce_scatter.g3"));
  CHECK_FALSE(known_op_name("calibrate.cover"));
  CHECK(op_layer("L12.bwd.gate") == 12);
  CHECK(op_layer("optimizer") == -1);
  CHECK(op_layer("L.x") == -1);
  CHECK(op_layer("L3") == -1);
}

// An all-to-all's matrix is stored once and viewed: as counts × bytes per token, transposed for
// the way back, scaled for a pipeline's parts. Every view must read what a plain matrix of the
// same bytes would, in any order it is read.
TEST_CASE("collective byte views read as the matrices they stand for") {
  const std::size_t n = 3;
  std::vector<std::int32_t> counts = {0, 1, 2, 3, 4, 5, 6, 7, 8};  // (i, j) = 3i + j
  const double unit = 2048;
  const CollectiveBytes a(counts, unit), t = a.transposed(), h = t.scaled(0.5);
  auto expect = [&](std::size_t i, std::size_t j) { return double(3 * i + j) * unit; };
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      CHECK(a.at(i, j, n) == expect(i, j));
      CHECK(a[i * n + j] == expect(i, j));
      CHECK(t.at(i, j, n) == expect(j, i));
      CHECK(t[i * n + j] == expect(j, i));
      CHECK(h.at(i, j, n) == 0.5 * expect(j, i));
    }
  std::vector<std::pair<std::size_t, std::size_t>> order;
  t.for_each(n, [&](std::size_t i, std::size_t j, double b) {
    CHECK(b == expect(j, i));
    order.emplace_back(i, j);
    return order.size() < 4;  // stops when told
  });
  REQUIRE(order.size() == 4);
  CHECK(order[0] == std::pair<std::size_t, std::size_t>{0, 0});
  CHECK(order[1] == std::pair<std::size_t, std::size_t>{1, 0});  // storage order: (0,1) stored is (1,0) viewed
  CHECK(order[3] == std::pair<std::size_t, std::size_t>{0, 1});
  CHECK(a.total() == Approx(36 * unit));
  CHECK(h.total() == Approx(18 * unit));
  CHECK(a.same_view(CollectiveBytes(a)));
  CHECK(!a.same_view(t));
  CHECK(t.transposed().same_view(a));
  CHECK(!a.same_view(CollectiveBytes(counts, unit)));  // equal values, other storage
  const CollectiveBytes plain(std::vector<double>{0, 2048, 4096, 6144, 8192, 10240, 12288, 14336, 16384});
  for (std::size_t k = 0; k < n * n; ++k) CHECK(plain.transposed()[k] == t[k]);
  CHECK_THROWS(CollectiveBytes{1.0, 2.0}.transposed());  // not a square matrix
}

TEST_CASE("a group step of a byte matrix keeps the entries from each group to the step's group") {
  // 6 ranks in groups of 2 (m = 3 groups); step j: group a sends to group (a − j) mod 3.
  const std::size_t n = 6, gs = 2;
  std::vector<std::int32_t> counts(n * n);
  for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = std::int32_t(k + 1);  // (i, j) = 6i + j + 1
  const CollectiveBytes whole(counts, 10.0);
  double sum_of_steps = 0;
  for (std::size_t step = 0; step < 3; ++step) {
    const CollectiveBytes s = whole.group_step(gs, step), back = s.transposed();
    auto in_step = [&](std::size_t i, std::size_t j) { return (i / gs + 3 - step) % 3 == j / gs; };
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        const double expect = in_step(i, j) ? double(6 * i + j + 1) * 10.0 : 0.0;
        CHECK(s.at(i, j, n) == expect);
        CHECK(s[i * n + j] == expect);
        CHECK(back.at(j, i, n) == expect);
      }
    std::size_t visited = 0, last = 0;
    back.for_each(n, [&](std::size_t i, std::size_t j, double b) {
      CHECK(in_step(j, i));  // only the step's entries, viewed transposed
      CHECK(b == double(6 * j + i + 1) * 10.0);
      CHECK(j * n + i >= last);  // in storage order
      last = j * n + i, ++visited;
      return true;
    });
    CHECK(visited == n * gs);
    // rounds_possible(): the distinct (j − i) mod n, j ≠ i, of the entries kept, counted here.
    for (const CollectiveBytes* view : {&s, &back}) {
      std::set<std::size_t> rounds;
      view->for_each(n, [&](std::size_t i, std::size_t j, double) {
        if (i != j) rounds.insert((j + n - i) % n);
        return true;
      });
      CHECK(view->rounds_possible(n) == rounds.size());
    }
    sum_of_steps += s.total();
    CHECK(!s.same_view(whole));
    CHECK(!s.same_view(whole.group_step(gs, (step + 1) % 3)));
  }
  CHECK(sum_of_steps == whole.total());  // the steps part the matrix
  CHECK(whole.rounds_possible(n) == n - 1);
  CHECK_THROWS(whole.group_step(4, 0));            // 4 does not divide 6
  CHECK_THROWS(whole.group_step(2, 3));            // only 3 steps
  CHECK_THROWS(whole.transposed().group_step(2, 0));
  CHECK_THROWS(whole.group_step(2, 1).group_step(2, 1));
}

TEST_CASE("with_stored_rows visits what for_each visits, in the same order, for every kind of view and width") {
  // 6 ranks in groups of 2; counts (i, j) = 6i + j, some above 16 bits in the wide copy.
  const std::size_t n = 6;
  std::vector<std::int32_t> wide(n * n);
  std::vector<std::uint16_t> narrow(n * n);
  for (std::size_t k = 0; k < n * n; ++k) wide[k] = std::int32_t(k) * 3001, narrow[k] = std::uint16_t(k);
  const CollectiveBytes sources[] = {CollectiveBytes(CountVector(wide), 2048.0), CollectiveBytes(CountVector(narrow), 2048.0),
                                     CollectiveBytes(std::vector<double>(wide.begin(), wide.end()))};
  for (const auto& m : sources) {
    const CollectiveBytes views[] = {m, m.transposed(), m.scaled(0.25).transposed(), m.group_step(2, 1),
                                     m.group_step(2, 2).transposed(), m.group_step(2, 0).scaled(3)};
    for (const auto& v : views) {
      std::vector<std::tuple<std::size_t, std::size_t, double>> walked, rowed;
      v.for_each(n, [&](std::size_t i, std::size_t j, double b) { return walked.emplace_back(i, j, b), true; });
      v.with_stored_rows(n, [&](const auto& row_of, const auto& value) {
        for (std::size_t p = 0; p < n; ++p) {
          const auto [values, first, count] = row_of(p);
          for (std::size_t k = 0; k < count; ++k) {
            const std::size_t q = first + k;
            rowed.emplace_back(v.is_transposed() ? q : p, v.is_transposed() ? p : q, value(values[k]));
          }
        }
      });
      CHECK(rowed == walked);  // the same entries, bytes to the last bit, in the same order
      CHECK(rowed.size() == (v.is_group_step() ? n * 2 : n * n));
    }
  }
}

TEST_CASE("every op of every policy has a known name, and docs/timeline.md explains each name") {
  // Each policy at its defaults, and Tutel with sharded experts (r = 2 on 16 GPUs, 8 experts).
  std::set<std::string> seen;
  auto check = [&](const test::SmallSetup& t, spec::PolicySpec ps) {
    INFO(ps.name());
    PolicyReport report;
    const auto g = t.build(ps, 3, report);
    for (const auto& op : g.ops()) {
      INFO(op.label);
      CHECK(known_op_name(op.label));
      seen.insert(op.label);
    }
  };
  const test::SmallSetup small;
  for (const auto& name : policy_names()) {
    spec::PolicySpec ps;
    ps.set_name(name);
    check(small, ps);
  }
  spec::PolicySpec sharded;
  sharded.set_name("tutel");
  sharded.mutable_tutel()->set_parallel_r(2);
  check(test::SmallSetup({"model.experts=8", "policy.name=tutel"}), sharded);
  CHECK(seen.size() > 100);

  const std::string doc = test::read_file(std::string(MOESIM_SOURCE_DIR) + "/docs/timeline.md");
  for (const auto& [name, phase] : known_op_names()) {
    INFO(name);
    CHECK_THAT(doc, Catch::Matchers::Contains("| `" + name + "` | " + phase_name(phase) + " |"));
  }
}

TEST_CASE("policies.def: every row constructs a policy of its name with a summary, and an unknown name lists them") {
  const auto names = policy_names();
  REQUIRE(names.size() >= 2);
  for (const auto& name : names) {
    spec::PolicySpec ps;
    ps.set_name(name);
    CHECK(make_policy(ps)->name() == name);
    CHECK(policy_summary(name).size() > 20);
    CHECK(std::count(names.begin(), names.end(), name) == 1);
  }
  spec::PolicySpec unknown;
  unknown.set_name("no-such-policy");
  CHECK_THROWS_WITH(make_policy(unknown), Catch::Contains("policy.name") && Catch::Contains(names.back()));
}
