#include "policy.hpp"

#include <chrono>

#include "collectives/collectives.hpp"
#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<Policy> (*make)();
  const char* summary;
};
const Entry kPolicies[] = {
#define POLICY(NAME, MAKE, SUMMARY) {NAME, [] { return MAKE; }, SUMMARY},
#include "policies.def"
#undef POLICY
};
}  // namespace

TaskGraph Policy::build_iteration(const IterationInput& in) {
  const auto t0 = std::chrono::steady_clock::now();
  const IterationPlan decided = plan(in);  // the policy's decisions, timed; the graph is not
  in.report.decision_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return build_moe_iteration(in, decided);
}

void Policy::validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const {
  validate_expert_placement(cluster, model, spec);
}

std::string policy_summary(const std::string& name) {
  for (const auto& e : kPolicies)
    if (name == e.name) return e.summary;
  return {};
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.push_back(e.name);
  return names;
}

std::unique_ptr<Policy> make_policy(const spec::PolicySpec& spec) {
  const std::string name = spec.name().empty() ? "ep" : spec.name();
  for (const auto& e : kPolicies)
    if (name == e.name) {
      auto policy = e.make();
      policy->name_ = e.name;
      return policy;
    }
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw FieldError("policy.name", "unknown policy '" + name + "'; known: " + known);
}

std::string collective_algorithm(const spec::PolicySpec& spec, CollectiveType type) {
  const bool a2a = type == CollectiveType::all_to_all;
  std::string name = a2a ? spec.all_to_all() : spec.all_reduce();
  if (name.empty()) name = a2a ? "linear" : "nccl";
  if (!find_collective_algorithm(type, name) && !(!a2a && name == "nccl"))
    throw FieldError(a2a ? "policy.all_to_all" : "policy.all_reduce",
                     "unknown algorithm '" + name + "'; known: " + collective_algorithm_names(type) +
                         (a2a ? "" : ", nccl (Ring or Tree per call, as NCCL's tuner picks)"));
  return name;
}

double deepep_sm_share(std::optional<std::uint32_t> sms, const spec::GpuSpec& gpu, const std::string& field) {
  if (sms && (*sms == 0 || (gpu.sms() > 0 && *sms > gpu.sms())))
    throw FieldError(field, fmt::format("{} SMs: give 1 to the GPU's {}", *sms, gpu.sms()));
  return gpu.sms() == 0 ? 0 : double(sms.value_or(20)) / double(gpu.sms());  // DeepEP's Buffer.num_sms
}

double deepep_sm_share(const spec::PolicySpec& spec, const spec::GpuSpec& gpu) {
  return deepep_sm_share(spec.deepep().has_sms() ? std::optional(spec.deepep().sms()) : std::nullopt, gpu, "policy.deepep.sms");
}

std::vector<int> spread_blocks(const std::string& algorithm, int experts, int gpus, int gpus_per_node) {
  if (algorithm != "deepep" || gpus < 1 || experts < gpus || experts % gpus != 0) return {};
  return {experts / gpus, experts / gpus * gpus_per_node};
}

}  // namespace moesim
