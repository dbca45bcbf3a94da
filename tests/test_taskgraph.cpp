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
    CHECK(s.total() == back.total());
    sum_of_steps += s.total();
    CHECK(!s.same_view(whole));
    CHECK(s.same_view(whole.group_step(gs, step)));
    CHECK(!s.same_view(whole.group_step(gs, (step + 1) % 3)));
  }
  CHECK(sum_of_steps == whole.total());  // the steps part the matrix
  CHECK_THROWS(whole.group_step(4, 0));            // 4 does not divide 6
  CHECK_THROWS(whole.group_step(2, 3));            // only 3 steps
  CHECK_THROWS(whole.transposed().group_step(2, 0));
  CHECK_THROWS(whole.group_step(2, 1).group_step(2, 1));
}
