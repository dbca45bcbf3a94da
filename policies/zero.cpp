// ZeRO data parallelism (DeepSpeed; FasterMoE's and Pro-Prophet's baseline, docs/spec/fastermoe.md
// §5.3: "ZeRO runs over a single-worker FastMoE with all 16 experts on each GPU", stage 3 "every
// tensor partitioned"): every GPU computes every expert on its own tokens, so there is no
// all-to-all, and every tensor of the layers, the experts' and the attention's, has its parameters,
// gradients and optimizer states sharded ZeRO-style (stage 2 or 3, schedule/zero.cpp; the memory
// model prices the same). Gradients are reduce-scattered with the layer, never all-reduced; the
// parameters outside the layers (embeddings, dense blocks) are all-reduced as in every policy.
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {
namespace {

class Zero final : public Policy {
 public:
  explicit Zero(int stage) : stage_(stage) {}

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);  // the optimizer shards E/G experts' states per GPU
  }

  IterationPlan plan(const IterationInput& in) override {
    IterationPlan plan;
    for (const auto& R : in.routing) plan.layers.push_back({R, {}});
    plan.schedule = zero_schedule(stage_);
    return plan;
  }

 private:
  int stage_;
};

}  // namespace

std::unique_ptr<Policy> make_zero(int stage) { return std::make_unique<Zero>(stage); }

}  // namespace moesim
