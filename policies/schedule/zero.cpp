// ZeRO (Rajbhandari et al. 2020, stages 2 and 3) over every tensor of the layers, as DeepSpeed
// partitions them ("every tensor partitioned", docs/spec/fastermoe.md §5.3; DeepSpeed v0.4.4 keeps
// whole only parameters below stage3_param_persistence_threshold, 1e5 elements: biases and norms):
// every GPU computes every expert on its own tokens, so no all-to-all moves tokens. Stage 3 shards
// the parameters: a layer's experts and dense parameters are all-gathered before its forward
// experts and, those not kept by DeepSpeed's reuse distance (regathered_bytes()), again before its
// backward, and their gradients reduce-scattered after (DeepSpeed
// gathers each module before it runs, the attention's before the attention: the same bytes, here
// in one collective with the experts'). Stage 2 keeps the parameters, reduces each owner's shard
// of the gradients to it, one reduce per GPU in turn, as DeepSpeed v0.4.4's stage 2 does
// (stage2.py: a dist.reduce to each partition's rank; S/G a reduce, S/BW in all against a
// reduce-scatter's (G - 1)/G · S/BW), and all-gathers the updated parameters after the optimizer
// step. The parameters
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
    if (const double bytes = pass == Pass::forward ? layer_bytes(ops) : regathered_bytes(ops, l); stage_ == 3 && bytes > 0)
      deps.push_back(gather_or_scatter(ops, CollectiveType::all_gather, LayerOps::label(l, pass, "experts_allgather"), {}, bytes));
    std::vector<OpId> experts(std::size_t(ops.gpus()));
    for (int r = 0; r < ops.gpus(); ++r)  // after the GPU's encode by its stream's order
      experts[std::size_t(r)] = ops.expert_op(l, r, LayerOps::label(l, pass, "experts"), r, r + 1, pass, deps);
    if (pass == Pass::forward) return ops.join(LayerOps::label(l, pass, "experts_done"), experts);
    if (stage_ == 3)
      return gather_or_scatter(ops, CollectiveType::reduce_scatter, LayerOps::label(l, pass, "grads_reduce_scatter"), experts,
                               layer_bytes(ops));
    return reduce_to_owners(ops, l, std::move(experts));
  }

  void after_optimizer(LayerOps& ops, const std::vector<OpId>& steps) const override {
    if (stage_ == 2)  // every GPU gathers the shards the others updated
      for (int l = 0; l < ops.model().layers(); ++l)
        gather_or_scatter(ops, CollectiveType::all_gather, fmt::format("L{}.experts_allgather_updated", l), steps, layer_bytes(ops));
  }

 private:
  // What ZeRO partitions of a layer, on a GPU: its experts' and its dense parameters' bytes.
  static double layer_bytes(const LayerOps& ops) { return ops.expert_bytes() * ops.experts() + ops.layer_dense_bytes(); }
  // DeepSpeed's stage3_max_reuse_distance (1e9 elements, its default and the FasterMoE artifact's,
  // benchmarks/deepspeed_config_stage3.json): after a module runs, its gathered parameters are kept
  // if the elements of the modules the step runs before its next use are fewer
  // (stage3.py, PrefetchCoordinator._distance_in_numel at v0.4.4), otherwise released and gathered
  // again before its backward. A layer's modules in forward order: the dense part (attention, gate),
  // the experts' first GEMM, their second; between a module's forward and its backward run the
  // modules after it in this layer and every module of the layers after it, each twice (none in a
  // layer benchmark, which runs one layer).
  static constexpr double kMaxReuseDistance = 1e9;
  static double regathered_bytes(const LayerOps& ops, int l) {
    const auto& model = ops.model();
    const double dtype = model.dtype_bytes(), experts = ops.experts() * ops.expert_bytes() / dtype;
    const double second = experts * double(model.spec().d_model()) * model.expert_ffn() / model.expert_params();
    const std::vector<double> modules = {ops.layer_dense_bytes() / dtype, experts - second, second};  // elements
    // Layer benchmarks (model.moe_layer_only) time each layer in a model of its own.
    const int layers_after = model.spec().moe_layer_only() ? 0 : model.layers() - 1 - l;
    const double after_layer = 2.0 * layers_after * (modules[0] + modules[1] + modules[2]);
    double regathered = 0, after_module = 0;  // elements of this layer's modules after the one at hand
    for (std::size_t m = modules.size(); m-- > 0;) {
      if (after_layer + 2 * after_module >= kMaxReuseDistance) regathered += modules[m];
      after_module += modules[m];
    }
    return regathered * dtype;
  }
  // `bytes` of a layer's experts and dense parameters gathered (all-gather) or of their gradients
  // scattered (reduce-scatter) over every GPU.
  static OpId gather_or_scatter(LayerOps& ops, CollectiveType type, std::string label, std::vector<OpId> deps, double bytes) {
    return ops.collective(Stream::comm, std::move(label), {type, ops.everyone(), {bytes}, "ring"}, std::move(deps));
  }
  // ZeRO-2's gradients: G reduces of a layer's S/G, each into the GPU that owns that shard
  // (group[0], the ring's root), one after another on the comm stream (stage2.py average_tensor's
  // loop of async dist.reduce, owners in rank order): one op of calls in turn.
  static OpId reduce_to_owners(LayerOps& ops, int l, std::vector<OpId> deps) {
    const int G = ops.gpus();
    std::vector<std::vector<int>> groups(static_cast<std::size_t>(G), std::vector<int>(static_cast<std::size_t>(G)));
    for (int owner = 0; owner < G; ++owner)
      for (int i = 0; i < G; ++i) groups[std::size_t(owner)][std::size_t(i)] = (owner + i) % G;
    return ops.collective(Stream::comm, LayerOps::label(l, Pass::backward, "grads_reduce"),
                          calls_in_turn(CollectiveType::reduce, std::move(groups), layer_bytes(ops) / G, "ring"), std::move(deps));
  }
  int stage_;
};

}  // namespace

std::shared_ptr<const LayerSchedule> zero_schedule(int stage) { return std::make_shared<Zero>(stage); }

}  // namespace moesim
