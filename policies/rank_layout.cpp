#include "rank_layout.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace moesim {

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, '-');) out.push_back(part);
  return out;
}

}  // namespace

RankLayout::RankLayout(const std::string& order, std::vector<int> sizes) : names_(split(order)), sizes_(std::move(sizes)) {
  if (names_.size() != sizes_.size()) throw std::invalid_argument("rank layout: one size per dimension of '" + order + "'");
  for (std::size_t i = 0; i < names_.size(); ++i) {
    const auto& n = names_[i];
    if (n != "tp" && n != "cp" && n != "ep" && n != "dp" && n != "pp")
      throw std::invalid_argument("rank layout: '" + n + "' is not a dimension (tp, cp, ep, dp, pp)");
    if (std::count(names_.begin(), names_.end(), n) > 1) throw std::invalid_argument("rank layout: '" + n + "' twice in the order");
    if (sizes_[i] < 1) throw std::invalid_argument("rank layout: the size of '" + n + "' must be >= 1");
    strides_.push_back(world_);
    world_ *= sizes_[i];
  }
}

RankLayout RankLayout::named(const std::string& order, const std::map<std::string, int>& sizes) {
  std::vector<int> in_order;
  for (const auto& name : split(order)) in_order.push_back(sizes.count(name) ? sizes.at(name) : 1);
  return RankLayout(order, std::move(in_order));
}

int RankLayout::index(const std::string& dim) const {
  const auto it = std::find(names_.begin(), names_.end(), dim);
  if (it == names_.end()) throw std::invalid_argument("rank layout: no dimension '" + dim + "'");
  return int(it - names_.begin());
}

int RankLayout::coordinate(int rank, const std::string& dim) const {
  const int i = index(dim);
  return rank / strides_[std::size_t(i)] % sizes_[std::size_t(i)];
}

// generate_masked_orthogonal_rank_groups: the group index runs over the other dimensions' coordinates
// (fastest first), the rank in the group over the masked ones'.
std::vector<std::vector<int>> RankLayout::groups(const std::string& dims) const {
  std::vector<bool> in(names_.size(), false);
  for (const auto& d : split(dims)) in[std::size_t(index(d))] = true;
  int group_size = 1;
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (in[i]) group_size *= sizes_[i];
  std::vector<std::vector<int>> out(std::size_t(world_ / group_size));
  for (std::size_t g = 0; g < out.size(); ++g) {
    // The other dimensions' coordinates from the group index, fastest first.
    int base = 0, rest = int(g);
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (!in[i]) base += rest % sizes_[i] * strides_[i], rest /= sizes_[i];
    for (int k = 0; k < group_size; ++k) {
      int rank = base, left = k;
      for (std::size_t i = 0; i < names_.size(); ++i)
        if (in[i]) rank += left % sizes_[i] * strides_[i], left /= sizes_[i];
      out[g].push_back(rank);
    }
  }
  return out;
}

std::vector<int> RankLayout::group_of(int rank, const std::string& dims) const {
  for (auto& g : groups(dims))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  throw std::invalid_argument("rank layout: rank " + std::to_string(rank) + " is outside the layout");
}

}  // namespace moesim
