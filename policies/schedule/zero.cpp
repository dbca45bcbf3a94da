// ZeRO (Rajbhandari et al. 2020, stages 2 and 3) over every tensor of the layers, as DeepSpeed
// partitions them ("every tensor partitioned", docs/spec/fastermoe.md §5.3; DeepSpeed v0.4.4 keeps
// whole only parameters below stage3_param_persistence_threshold, 1e5 elements: biases and norms):
// every GPU computes every expert on its own tokens, so no all-to-all moves tokens. Stage 3 shards
// the parameters: a layer's experts and dense parameters are all-gathered before its forward
// experts and again before its backward, and their gradients reduce-scattered after (DeepSpeed
// gathers each module before it runs, the attention's before the attention: the same bytes, here
// in one collective with the experts'). Stage 2 keeps the parameters, reduce-scatters the
// gradients and all-gathers the updated parameters after the optimizer step. The parameters
// outside the layers (embeddings, dense blocks) are all-reduced as in every policy. Golden:
// tests/golden/zero3_2node_a100.
#include "layer_ops.hpp"

#include <fmt/format.h>

namespace moesim {
namespace {

class Zero final : public LayerSchedule {
 public:
  explicit Zero(int stage) : stage_(stage) {}
  std::string name() const override { return fmt::format("zero{}", stage_); }
  ExpertPlacement placement() const override { return {ExpertPlacement::data_parallel, stage_, 0}; }

  OpId emit(LayerOps& ops, int l, Pass pass) const override {
    std::vector<OpId> deps;
    if (stage_ == 3)
      deps.push_back(gather_or_scatter(ops, CollectiveType::all_gather, LayerOps::label(l, pass, "experts_allgather"), {}));
    std::vector<OpId> experts(std::size_t(ops.gpus()));
    for (int r = 0; r < ops.gpus(); ++r)  // after the GPU's encode by its stream's order
      experts[std::size_t(r)] = ops.expert_op(l, r, LayerOps::label(l, pass, "experts"), r, r + 1, pass, deps);
    if (pass == Pass::forward) return ops.join(LayerOps::label(l, pass, "experts_done"), experts);
    return gather_or_scatter(ops, CollectiveType::reduce_scatter, LayerOps::label(l, pass, "grads_reduce_scatter"), experts);
  }

  void after_optimizer(LayerOps& ops, const std::vector<OpId>& steps) const override {
    if (stage_ == 2)  // every GPU gathers the shards the others updated
      for (int l = 0; l < ops.model().layers(); ++l)
        gather_or_scatter(ops, CollectiveType::all_gather, fmt::format("L{}.experts_allgather_updated", l), steps);
  }

 private:
  // A layer's experts and dense parameters gathered (all-gather) or their gradients scattered
  // (reduce-scatter).
  static OpId gather_or_scatter(LayerOps& ops, CollectiveType type, std::string label, std::vector<OpId> deps) {
    return ops.collective(Stream::comm, std::move(label),
                          {type, ops.everyone(), {ops.expert_bytes() * ops.experts() + ops.layer_dense_bytes()}, "ring"},
                          std::move(deps));
  }
  int stage_;
};

}  // namespace

std::shared_ptr<const LayerSchedule> zero_schedule(int stage) { return std::make_shared<Zero>(stage); }

}  // namespace moesim
