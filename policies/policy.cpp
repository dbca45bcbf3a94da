#include "policy.hpp"

#include <chrono>

#include "collectives/collectives.hpp"
#include "errors.hpp"
#include "moe_iteration.hpp"

namespace moesim {

std::unique_ptr<Policy> make_expert_parallel();
std::unique_ptr<Policy> make_fastermoe();
std::unique_ptr<Policy> make_fastermoe_shadow();
std::unique_ptr<Policy> make_fastermoe_smart();
std::unique_ptr<Policy> make_fastermoe_released();
std::unique_ptr<Policy> make_schemoe_released();
std::unique_ptr<Policy> make_tutel_released();
std::unique_ptr<Policy> make_zero2();
std::unique_ptr<Policy> make_zero3();
std::unique_ptr<Policy> make_pro_prophet();
std::unique_ptr<Policy> make_pro_prophet_planner();
std::unique_ptr<Policy> make_replicate_top2();
std::unique_ptr<Policy> make_replicate_top3();
std::unique_ptr<Policy> make_schemoe();
std::unique_ptr<Policy> make_tutel();
std::unique_ptr<Policy> make_smartmoe();
std::unique_ptr<Policy> make_flexmoe();
std::unique_ptr<Policy> make_hecate();

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<Policy> (*make)();
};
const Entry kPolicies[] = {
    {"ep", make_expert_parallel},
    {"fastermoe", make_fastermoe},
    {"fastermoe-shadow", make_fastermoe_shadow},
    {"fastermoe-smart", make_fastermoe_smart},
    {"fastermoe-released", make_fastermoe_released},
    {"zero2", make_zero2},
    {"zero3", make_zero3},
    {"pro-prophet", make_pro_prophet},
    {"pro-prophet-planner", make_pro_prophet_planner},
    {"replicate-top2", make_replicate_top2},
    {"replicate-top3", make_replicate_top3},
    {"schemoe", make_schemoe},
    {"schemoe-released", make_schemoe_released},
    {"tutel", make_tutel},
    {"tutel-released", make_tutel_released},
    {"smartmoe", make_smartmoe},
    {"flexmoe", make_flexmoe},
    {"hecate", make_hecate},
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

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.push_back(e.name);
  return names;
}

std::unique_ptr<Policy> make_policy(const spec::PolicySpec& spec) {
  const std::string name = spec.name().empty() ? "ep" : spec.name();
  for (const auto& e : kPolicies)
    if (name == e.name) return e.make();
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

}  // namespace moesim
