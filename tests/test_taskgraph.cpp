// The TaskGraph contract, the critical-path walk and the collective lowerings.
#include <catch2/catch.hpp>

#include "collectives/collectives.hpp"
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

TEST_CASE("the critical path adds up to the makespan on a hand case") {
  TaskGraph g(1);
  const OpId a = g.add_compute(0, "a", {});
  const OpId b = g.add_collective(Stream::comm, "b", {CollectiveType::all_to_all, {0}, {0}, "linear"}, {a});
  g.add_compute(0, "c", {}, {b});
  Timing t{{0, 1, 3.5}, {1, 3, 4}};  // a: 0-1, b: 1-3, gap 0.5, c: 3.5-4
  const auto br = critical_path(g, t);
  CHECK(br.seconds[int(Category::compute)] == Approx(1.5));
  CHECK(br.seconds[int(Category::all_to_all)] == Approx(2));
  CHECK(br.seconds[int(Category::other)] == Approx(0.5));
  CHECK(br.total() == Approx(t.makespan()));
}

TEST_CASE("linear all-to-all lowers to one step carrying every off-diagonal byte") {
  Collective c{CollectiveType::all_to_all, {4, 5, 6}, {1, 2, 0, 4, 5, 6, 7, 0, 9}, "linear"};
  const auto steps = lower(c);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].rounds == 1);
  double bytes = 0;
  for (const auto& t : steps[0].transfers) {
    CHECK(t.src != t.dst);
    CHECK(t.bytes > 0);
    bytes += t.bytes;
  }
  CHECK(steps[0].transfers.size() == 4);  // 2, 4, 6, 7 (zeros and the diagonal skipped)
  CHECK(bytes == 2 + 4 + 6 + 7);
  CHECK(find_collective_algorithm(CollectiveType::all_to_all, "linear")->bytes_sent_per_rank(c) == Approx(19.0 / 3));
}

TEST_CASE("ring all-reduce puts 2(n-1)/n of the buffer on every ring edge") {
  const double S = 1 << 20;
  Collective c{CollectiveType::all_reduce, {0, 1, 2, 3, 4}, {S}, "ring"};
  const auto steps = lower(c);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].rounds == 8);
  REQUIRE(steps[0].transfers.size() == 5);
  for (const auto& t : steps[0].transfers) {
    CHECK(t.dst == (t.src + 1) % 5);
    CHECK(t.bytes * steps[0].rounds == Approx(2.0 * 4 / 5 * S));
  }
  CHECK(lower(Collective{CollectiveType::all_reduce, {3}, {S}, "ring"}).empty());
}

TEST_CASE("ring all-gather and reduce-scatter put (n-1)/n of the buffer on every ring edge") {
  const double S = 8e6;
  for (auto type : {CollectiveType::all_gather, CollectiveType::reduce_scatter}) {
    const auto steps = lower(Collective{type, {2, 4, 6, 8}, {S}, "ring"});
    REQUIRE(steps.size() == 1);
    REQUIRE(steps[0].transfers.size() == 4);
    for (const auto& t : steps[0].transfers) CHECK(t.bytes * steps[0].rounds == Approx(3.0 / 4 * S));
  }
  const auto b = lower(Collective{CollectiveType::broadcast, {5, 1, 3}, {S}, "ring"});
  REQUIRE(b.size() == 1);
  CHECK(b[0].transfers.size() == 2);  // a chain from the root: 5 -> 1 -> 3, S on each edge
  CHECK(b[0].transfers[0].src == 5);
  CHECK(b[0].transfers[1].dst == 3);
  CHECK(b[0].transfers[1].bytes == S);
}
