#include "gate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moesim {

double needed_capacity_factor(const RoutingMatrix& R, int tokens_per_gpu, int top_k) {
  return double(R.largest_count()) * R.experts / (double(top_k) * tokens_per_gpu);
}

GateOutcome apply_gate(const spec::GateSpec& gate, const RoutingMatrix& R, int tokens_per_gpu, int top_k) {
  const double kT_over_E = double(top_k) * tokens_per_gpu / R.experts;  // C per unit of f
  const std::int64_t need = R.largest_count();
  const double f_need = needed_capacity_factor(R, tokens_per_gpu, top_k);
  GateOutcome out;
  const double f = gate.has_capacity_factor() ? gate.capacity_factor() : 0.0;
  out.factor = f > 0 ? f : f < 0 ? std::min(f_need, -f) : f_need;
  // A dynamic factor (f <= 0) is chosen so its capacity is exactly the need (or the cap's).
  out.capacity = f == 0 || (f < 0 && f_need <= -f) ? need : std::int64_t(std::ceil(out.factor * kT_over_E - 1e-9));
  out.kept = R;
  if (need > out.capacity)  // only then do counts change (a change would drop the routing's token spreads)
    for (auto& c : out.kept.mutable_counts()) {
      out.dropped += std::max<std::int64_t>(0, c - out.capacity);
      c = std::int32_t(std::min<std::int64_t>(c, out.capacity));
    }
  out.routed = out.kept;
  if (gate.pad_to_capacity()) {  // a cell holds up to 2^31 - 1 token-slots (RoutingMatrix)
    auto& padded = out.routed.mutable_counts();
    const auto cell = std::int32_t(std::min<std::int64_t>(out.capacity, std::numeric_limits<std::int32_t>::max()));
    std::fill(padded.begin(), padded.end(), cell);
  }
  return out;
}

DispatchSizing dispatch_sizing(const spec::GateSpec& gate) {
  if (!gate.pad_to_capacity()) return DispatchSizing::counts;
  return gate.has_capacity_factor() && gate.capacity_factor() > 0 ? DispatchSizing::fixed : DispatchSizing::group_max;
}

}  // namespace moesim
