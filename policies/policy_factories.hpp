// The factory of each policy class in policies.def, with the options its variants differ by.
#pragma once
#include <memory>

#include "policy.hpp"

namespace moesim {

/// The paper's algorithm, or the seed's released code (laekov/fastmoe, Fragile-azalea/ScheMoE,
/// microsoft/tutel).
enum class Code { paper, released };

struct FasterMoeOptions {
  bool shadow = false, smart = false;  // dynamic shadowing (§4.1), the smart schedule (§4.2)
  Code code = Code::paper;             // released: laekov/fastmoe as shipped (its switches in the spec)
};
struct ProProphetOptions {
  bool scheduler = true;  // the block-wise scheduler; without it, the planner alone
};

std::unique_ptr<Policy> make_expert_parallel();
std::unique_ptr<Policy> make_fastermoe(const FasterMoeOptions& options);
std::unique_ptr<Policy> make_zero(int stage);
std::unique_ptr<Policy> make_pro_prophet(const ProProphetOptions& options);
std::unique_ptr<Policy> make_replicate_top(int k);
std::unique_ptr<Policy> make_schemoe(Code code);
std::unique_ptr<Policy> make_tutel(Code code);
std::unique_ptr<Policy> make_smartmoe();
std::unique_ptr<Policy> make_flexmoe();
std::unique_ptr<Policy> make_hecate();
std::unique_ptr<Policy> make_eplb();

}  // namespace moesim
