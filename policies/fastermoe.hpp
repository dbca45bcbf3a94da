// FasterMoE's techniques as functions, for the policy and for tests (see fastermoe.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "cost_model.hpp"

namespace moesim {

/// Algorithm 1 (paper variant, Eq. 8 keeping the remaining all-to-all): the experts to shadow.
std::vector<int> dynamic_shadowing(const CostModel& cost, const MoeModel& model, const RoutingMatrix& routing);
/// The released code's rule (shadow_policy.py) with its own constants; see fastermoe.cpp.
std::vector<int> released_shadowing(const MoeModel& model, const RoutingMatrix& routing);
/// The topology-aware gate on counts: at most `limit` slots per source leave its node; returns the
/// slots re-routed to experts of the source's own node.
std::int64_t topology_aware_gate(RoutingMatrix& routing, const Cluster& cluster, std::int64_t tokens, double limit);

}  // namespace moesim
