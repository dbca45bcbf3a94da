// The TaskGraph contract and the critical-path walk.
#include <catch2/catch.hpp>

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
  Timing t{{0, 1, 3.5}, {1, 3, 4}, {}};  // a: 0-1, b: 1-3, gap 0.5, c: 3.5-4
  const auto br = critical_path(g, t);
  CHECK(br.seconds[int(Category::compute)] == Approx(1.5));
  CHECK(br.seconds[int(Category::all_to_all)] == Approx(2));
  CHECK(br.seconds[int(Category::other)] == Approx(0.5));
  CHECK(br.total() == Approx(t.makespan()));
}
