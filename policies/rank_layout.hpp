// Rank coordinates and process groups of a parallel layout, as Megatron-Core derives them
// (NVIDIA/Megatron-LM megatron/core/parallel_state.py: RankGenerator and
// generate_masked_orthogonal_rank_groups): each dimension (tp, cp, ep, dp, pp) has a size, and an
// order such as Megatron's default "tp-cp-ep-dp-pp" lists them from the fastest varying:
//   rank = Σ_i coordinate_i · Π_{j<i} size_j.
// A group of some dimensions holds the ranks that differ only in those, in the order of their
// coordinates. DeepSeek-V3's EP 64 over 8 whole nodes, beside PP 16 and ZeRO-1 DP, is the same
// order with tp = cp = 1: EP innermost, so that an EP group is consecutive ranks (whole nodes).
// parallel_layout() takes the EP groups, stages and DP coordinates from it.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace moesim {

class RankLayout {
 public:
  /// `order`: the dimensions' names, '-'-separated, fastest first (e.g. "tp-cp-ep-dp-pp");
  /// `sizes`: each one's size, in that order. std::invalid_argument for an unknown or repeated
  /// name, a size below 1, or a length mismatch.
  RankLayout(const std::string& order, std::vector<int> sizes);
  /// The same with each dimension's size by name; a dimension `sizes` does not name has size 1.
  static RankLayout named(const std::string& order, const std::map<std::string, int>& sizes);
  int world_size() const { return world_; }
  /// The rank's coordinate along a dimension.
  int coordinate(int rank, const std::string& dim) const;
  /// The groups of the given dimensions ("dp", "tp-dp", ...), each in the order of its ranks'
  /// coordinates; Megatron-Core's RankGenerator.get_ranks().
  std::vector<std::vector<int>> groups(const std::string& dims) const;
  /// The group of `dims` that holds `rank`.
  std::vector<int> group_of(int rank, const std::string& dims) const;

 private:
  int index(const std::string& dim) const;
  std::vector<std::string> names_;
  std::vector<int> sizes_, strides_;
  int world_ = 1;
};

}  // namespace moesim
