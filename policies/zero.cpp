// ZeRO data parallelism for the expert weights (DeepSpeed; FasterMoE's and Pro-Prophet's baseline,
// docs/spec/fastermoe.md §5.3: "ZeRO runs over a single-worker FastMoE with all 16 experts on each GPU"):
// every GPU computes every expert on its own tokens, so there is no all-to-all, and the experts'
// parameters, gradients and optimizer states are sharded ZeRO-style (stage 2 or 3, see
// moe_iteration.hpp ExpertSharding). Expert gradients are never all-reduced: ZeRO reduce-scatters
// them; the dense parameters are all-reduced as in every other policy.
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
