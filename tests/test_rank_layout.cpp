// Rank layouts against Megatron-Core's own examples (megatron/core/parallel_state.py, the
// docstring of generate_masked_orthogonal_rank_groups) and hand layouts.
#include <catch2/catch.hpp>

#include "rank_layout.hpp"

using namespace moesim;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("rank layouts give Megatron-Core's groups on its documented examples") {
  // 8 GPUs, order tp-pp-dp, sizes 2-2-2: "the dp_group here is [[0, 4], [1, 5], [2, 6], [3, 7]]".
  const RankLayout a("tp-pp-dp", {2, 2, 2});
  CHECK(a.groups("dp") == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // Order tp-dp-pp, sizes [2, 3, 4], the dp mask: dp_group[0] = [0, 2, 4], dp_group[1] = [1, 3, 5],
  // dp_group[7] = [19, 21, 23].
  const RankLayout b("tp-dp-pp", {2, 3, 4});
  const auto dp = b.groups("dp");
  REQUIRE(dp.size() == 8);
  CHECK(dp[0] == std::vector<int>{0, 2, 4});
  CHECK(dp[1] == std::vector<int>{1, 3, 5});
  CHECK(dp[7] == std::vector<int>{19, 21, 23});
}

TEST_CASE("rank layouts: coordinates, group membership and combined dimensions on a hand layout") {
  // Megatron's default order for the expert layers: tp 2, ep 4, dp 2, pp 2 on 32 GPUs.
  const RankLayout l("tp-ep-dp-pp", {2, 4, 2, 2});
  REQUIRE(l.world_size() == 32);
  // rank = tp + 2·ep + 8·dp + 16·pp: rank 27 = 1 + 2·1 + 8·1 + 16·1.
  CHECK(l.coordinate(27, "tp") == 1);
  CHECK(l.coordinate(27, "ep") == 1);
  CHECK(l.coordinate(27, "dp") == 1);
  CHECK(l.coordinate(27, "pp") == 1);
  CHECK(l.group_of(27, "ep") == std::vector<int>{25, 27, 29, 31});
  CHECK(l.group_of(27, "tp") == std::vector<int>{26, 27});
  CHECK(l.group_of(27, "pp") == std::vector<int>{11, 27});
  CHECK(l.group_of(3, "tp-ep") == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // Every dimension's groups partition the ranks.
  for (const char* d : {"tp", "ep", "dp", "pp", "ep-dp", "tp-ep-dp-pp"}) {
    std::vector<int> seen(32, 0);
    for (const auto& g : l.groups(d))
      for (int r : g) ++seen[std::size_t(r)];
    CHECK(std::count(seen.begin(), seen.end(), 1) == 32);
  }
  CHECK_THROWS_WITH(RankLayout("tp-xp", {1, 2}), Catch::Contains("'xp' is not a dimension"));
  CHECK_THROWS_WITH(RankLayout("tp-tp", {1, 2}), Catch::Contains("twice"));
  CHECK_THROWS(l.groups("cp"));
}
