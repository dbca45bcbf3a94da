// Plain expert parallelism (DeepSpeed-MoE / FastMoE / GShard style), the baseline every seed
// system compares against: expert e lives on GPU e / (E/G), every token-slot goes to its expert's
// GPU through the all-to-all, and the schedule is sequential (nothing overlaps). The ops are
// those of moe_iteration.hpp with no expert shadowed.
#include <fmt/format.h>

#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {
namespace {

class ExpertParallel final : public Policy {
 public:

  IterationPlan plan(const IterationInput& in) override {
    IterationPlan plan;
    for (const auto& R : in.routing) plan.layers.push_back({R, {}});
    return plan;
  }
};

}  // namespace

void validate_expert_placement(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) {
  if (model.experts() % cluster.num_gpus() != 0)
    throw FieldError("model.experts",
                     fmt::format("expert parallelism places E/G experts on each GPU: {} experts on {} GPUs is not "
                                 "a whole number; use a multiple of {}",
                                 model.experts(), cluster.num_gpus(), cluster.num_gpus()));
  collective_algorithm(spec, CollectiveType::all_to_all);
  collective_algorithm(spec, CollectiveType::all_reduce);
}

std::unique_ptr<Policy> make_expert_parallel() { return std::make_unique<ExpertParallel>(); }

}  // namespace moesim
