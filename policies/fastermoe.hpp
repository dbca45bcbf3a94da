// FasterMoE's techniques as functions, for the policy and for tests (see fastermoe.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "cost_model.hpp"

namespace moesim {

/// Algorithm 1 (paper variant, Eq. 8 keeping the remaining all-to-all): the experts to shadow.
std::vector<int> dynamic_shadowing(const CostModel& cost, const MoeModel& model, const RoutingMatrix& routing);
/// The released policy's constants: its environment variables' defaults (shadow_policy.py).
struct ReleasedConstants {
  double bw_net = 50e9 / 8;  // FMOE_FASTER_GLBPLC_NETBW, bytes/s
  double bw_mm = 11.5e12;    // FMOE_FASTER_GLBPLC_GPUTP, FLOP/s
  double alpha = 2;          // FMOE_FASTER_GLBPLC_ALPHA
};
/// How the released policy sums the all-gathered counts: per rank (.sum(1), as shipped) or per expert.
enum class ReleasedCounting { per_rank, per_expert };
/// The released code's rule (shadow_policy.py global_policy): the experts it shadows; see fastermoe.cpp.
std::vector<int> released_shadowing(double d_model, const RoutingMatrix& routing, ReleasedCounting counting,
                                    const ReleasedConstants& constants = {});
/// The rule FasterMoE's artifact ran (thu-pacman/FasterMoE fmoe/transformer.py), one expert per
/// worker as there: the experts it shadows; see fastermoe.cpp.
std::vector<int> prototype_shadowing(double d_model, double d_hidden, const RoutingMatrix& routing);
/// The topology-aware gate on counts: at most `limit` slots per source leave its node; returns the
/// slots re-routed to experts of the source's own node.
std::int64_t topology_aware_gate(RoutingMatrix& routing, const Cluster& cluster, std::int64_t tokens, double limit);

}  // namespace moesim
