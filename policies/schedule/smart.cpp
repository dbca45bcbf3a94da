// FasterMoE's smart schedule (FasterMoE §4.2, Fig. 8): the G workers in n = G / group_size groups
// of consecutive ranks; each layer's exchange and expert work split into n steps. In step j group
// i sends its tokens to group t = (i − j) mod n (S_j), computes the tokens received from group
// f = (i + j) mod n (C_j), and returns the outputs of its tokens from group t (R_j). Comm stream:
// S_0..S_{n−1}, then R_0..R_{n−1}; compute stream: C_0..C_{n−1}. Step 0 stays inside the group,
// step n−1 talks to the ring neighbour: the two cheapest exchanges are the exposed ones. A GPU's
// own tokens for its replicas are in C_0. Golden: tests/golden/smart_2node_a100.
#include "layer_ops.hpp"

#include <fmt/format.h>

namespace moesim {
namespace {

class Smart final : public LayerSchedule {
 public:
  explicit Smart(int group_size) : group_size_(group_size) {}
  std::string name() const override { return "smart"; }
  OpId emit(LayerOps& ops, int l, Pass pass) const override {
    const int G = ops.gpus(), gs = group_size_, n = G / gs;
    auto step = [&](const char* what, int j) { return LayerOps::label(l, pass, fmt::format("{}{}", what, j)); };
    std::vector<OpId> S(static_cast<std::size_t>(n)), R(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j)
      S[std::size_t(j)] = ops.collective(Stream::comm, step("S", j), ops.exchange(l, false, j, gs),
                                         j == 0 ? ops.ready() : std::vector<OpId>{});
    std::vector<std::vector<OpId>> C(static_cast<std::size_t>(n));  // C_j: one op of a part per GPU
    std::vector<std::pair<int, int>> sources(static_cast<std::size_t>(G));
    for (int j = 0; j < n; ++j) {
      for (int r = 0; r < G; ++r) {
        const int f = (r / gs + j) % n;  // the group whose tokens C_j computes
        sources[std::size_t(r)] = {f * gs, f * gs + gs};
      }
      C[std::size_t(j)] = ops.expert_ops(l, step("C", j), sources, pass, {S[std::size_t(j)]});
    }
    for (int j = 0; j < n; ++j)
      R[std::size_t(j)] = ops.collective(Stream::comm, step("R", j), ops.exchange(l, true, j, gs), C[std::size_t(j)]);
    return ops.join(LayerOps::label(l, pass, "smart_done"), R);
  }

 private:
  int group_size_;
};

}  // namespace

std::shared_ptr<const LayerSchedule> smart_schedule(int group_size) { return std::make_shared<Smart>(group_size); }

}  // namespace moesim
