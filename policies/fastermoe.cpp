// FasterMoE (He et al., PPoPP'22; docs/spec/fastermoe.md) as a policy: dynamic shadowing
// (§4.1, Algorithm 1), the smart schedule (§4.2, schedule/smart.cpp) and the
// congestion-avoiding topology-aware gate (§4.3). Symbols follow the paper: B_w tokens processed on
// worker w, T_iw tokens from worker i to w, H = d_model, α·H = d_ffn, P GEMM throughput, W_net the
// network bandwidth.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "fastermoe.hpp"

#include <limits>
#include <optional>
#include <tuple>
#include "errors.hpp"
#include "gating.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {

namespace {

// W_net of Eqs. 7-8: a worker's share of its node's network bandwidth (one node: its narrowest
// route to another GPU). The paper's "fixed network bandwidth"; the released code uses 50 Gb/s.
double network_bandwidth(const Cluster& c) {
  if (c.nodes() > 1) return c.node_uplink_bandwidth() / c.gpus_per_node();
  double w = std::numeric_limits<double>::infinity();
  for (int j = 1; j < c.gpus_per_node(); ++j) w = std::min(w, c.route_bandwidth(c.intra_route(0, j)));
  return std::isfinite(w) ? w : 1e18;
}

}  // namespace

/// Dynamic shadowing, Algorithm 1 (paper variant). Candidates in descending order of load;
/// shadowing expert e moves its tokens from its owner to their sources (B_owner −= Σ_{j≠owner} T_je,
/// B_j += T_je, every worker computing its own tokens of e). With r experts shadowed:
///   Lat_imbl   = max_w { 3·comp(B_w)  + 4·A_w·H/W_net }                         (Eq. 7, r = 0)
///   Lat_shadow = max_w { 3·comp(B'_w) + 4·A'_w·H/W_net } + 2r·2αH²/W_net        (Eq. 8)
/// comp(·) is the cost model's forward expert time, A_w the tokens worker w still receives through
/// the all-to-all. Two choices where the paper is unclear (docs/spec/fastermoe.md §2.2-2.4):
///  - Eq. 8 as printed drops the all-to-all term of the tokens left unshadowed; without it
///    shadowing always wins once B > αH, even under a uniform load, which the paper says it does
///    not do. The term stays, as in Eq. 7.
///  - Algorithm 1 as printed stops at the first candidate that does not lower the cost. With two
///    equally hot experts, shadowing the first cannot lower the maximum (the other still sets it),
///    so nothing would ever be shadowed. We scan every prefix of the order and keep the cheapest,
///    as the FasterMoE prototype of the artifact does (transformer.py keeps the running minimum);
///    Eqs. 9-10 are closed forms of this comparison and need no separate test. The scan stops once
///    r model transfers alone cost more than the best prefix. Cost: O(G·E).
std::vector<int> dynamic_shadowing(const CostModel& cost, const MoeModel& model, const RoutingMatrix& R) {
  const int G = cost.cluster().num_gpus(), E = R.experts;
  const double w_net = network_bandwidth(cost.cluster());
  const double feature = model.token_bytes() / w_net;                              // one token over the network
  const double params = 2 * model.expert_params() * model.dtype_bytes() / w_net;  // broadcast + reduce
  std::vector<double> load(E), comp(G, 0.0), received(G, 0.0);  // comp(B_w) and A_w per worker
  const auto loads = R.expert_loads();
  for (int e = 0; e < E; ++e) {
    load[e] = double(loads[std::size_t(e)]);
    const int o = expert_owner(e, E, G);
    comp[o] += cost.expert_time(model, load[e]);
    received[o] += load[e];
  }
  auto latency = [&](double r) {
    double worst = 0;
    for (int w = 0; w < G; ++w) worst = std::max(worst, 3 * comp[w] + 4 * received[w] * feature);
    return worst + r * params;
  };
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return load[a] > load[b]; });
  // comp() of a worker's own tokens of a shadowed expert, kept by their count (up to 65,535): G of
  // them a candidate, most of them small counts seen before.
  std::vector<double> own_time;
  auto own = [&](std::int64_t tokens) {
    if (tokens < 0 || tokens > 65535) return cost.expert_time(model, double(tokens));
    if (std::size_t(tokens) >= own_time.size()) own_time.resize(std::size_t(tokens) + 1, -1.0);
    double& t = own_time[std::size_t(tokens)];
    if (t < 0) t = cost.expert_time(model, double(tokens));
    return t;
  };
  double best = latency(0);  // c_min = Lat_imbl
  std::size_t best_r = 0;
  for (std::size_t i = 0; i < order.size() && load[order[i]] > 0 && double(i + 1) * params < best; ++i) {
    const int e = order[i], o = expert_owner(e, E, G);
    comp[o] -= cost.expert_time(model, load[e]);
    received[o] -= load[e];
    for (int w = 0; w < G; ++w) comp[w] += own(R.at(w, e));
    const double c = latency(double(i + 1));
    if (c < best) best = c, best_r = i + 1;
  }
  return {order.begin(), order.begin() + std::ptrdiff_t(best_r)};
}

/// The released rule: laekov/fastmoe `fmoe/fastermoe/shadow_policy.py`, global_policy() (ee3c561,
/// unchanged in substance since 91a5e79). Loads sorted, B_0 ≥ B_1 ≥ ...:
///   lat_base = 3·comp·B_0 + 4·send_feature·B_0
///   for i = 0, 1, ...:  shadow_time += send_model
///                       lat_new = 3·comp·B_{i+1} + 4·send_feature·B_{i+1} + shadow_time
///                       if lat_new < lat_base: lat_base = lat_new, shadow expert i; else stop
/// with the code's constants, not the platform's (ReleasedConstants: its environment variables'
/// defaults) and data_size = 4 B: comp = 4·alpha·d²/bw_mm, send_feature = d·4/bw_net,
/// send_model = 2·alpha·d²·4/bw_net. Each step must beat the last one accepted, so two equally hot
/// experts stop it at once (Hecate §2.5's "strict trigger conditions").
/// The loads B: the gathered [rank, expert] counts summed per expert (per_expert, what the loop is
/// written for), or, as shipped, with .sum(1): per rank, so B has one entry per rank and the "expert"
/// shadowed at step i is the one numbered like the i-th rank in that order. Under top-k gating every
/// rank's sum is the same and nothing is shadowed (docs/spec/fidelity-diagnosis.md §3).
/// tests/data/fastermoe-released-policy.tsv holds the released function's own decisions
/// (tools/fastermoe_released_policy.py); tests/test_fastermoe.cpp checks this one against every row.
std::vector<int> released_shadowing(double d, const RoutingMatrix& R, ReleasedCounting counting,
                                    const ReleasedConstants& k) {
  constexpr double data_size = 4;
  const double alpha_h2 = k.alpha * d * d;
  const double send_feature = d * data_size / k.bw_net, send_model = 2 * alpha_h2 * data_size / k.bw_net;
  const double comp = 4 * alpha_h2 / k.bw_mm;
  std::vector<double> B;
  if (counting == ReleasedCounting::per_expert)
    for (const std::int64_t load : R.expert_loads()) B.push_back(double(load));
  else
    for (int s = 0; s < R.sources; ++s) B.push_back(double(R.row_sum(s)));
  std::vector<int> order(B.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return B[a] > B[b]; });
  auto lat = [&](double b) { return 3 * comp * b + 4 * send_feature * b; };
  double lat_base = lat(B[order[0]]), shadow_time = 0;
  std::vector<int> chosen;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    shadow_time += send_model;
    const double lat_new = lat(B[order[i + 1]]) + shadow_time;
    if (!(lat_new < lat_base)) break;
    lat_base = lat_new;
    chosen.push_back(order[i]);
  }
  return chosen;
}

/// The artifact's rule: thu-pacman/FasterMoE `fmoe/transformer.py` _global_policy (b2d13dd, "final
/// updates", the prototype's last change to it; the AE runs it with FMOE_ENABLE_DYNREP=1,
/// docs/spec/fastermoe.md §2.4), one expert per worker (the AE's num_expert = 1), its constants and
/// units as written: H = d_model, alpha = d_hidden / H, alphaHsquared = alpha·H²·4 (bytes:
/// data_size 4, which the compute terms carry too),
///   L_w = the tokens expert w receives, B = max L,
///   lat_comp = 12·B·alphaHsquared/bw_mm + 4·B·H·4/bw_net,
///   model_size = 2·alphaHsquared/bw_net · 2 (the model out and its gradient back; 583c50d had
///   (1 + 2(W − 1)/W) there),
///   for i = 0, 1, ... over the experts by load, descending: L_{e_i} = 0 and L_w += R(w, e_i) for
///   every w (each source computes its own tokens of e_i); c_i = max L · 12·alphaHsquared/bw_mm
///   + (i + 1)·model_size; keep the least c; stop at the first c_i above it,
/// then shadow e_0 .. e_{i−1} (i where it stopped; the last index if it never did) if lat_comp is
/// above the least c. bw_net = 50 Gb/s, bw_mm = 11.5 TFLOP/s.
std::vector<int> prototype_shadowing(double d_model, double d_hidden, const RoutingMatrix& R) {
  const int W = R.experts;
  if (W < 2) return {};
  constexpr double bw_net = 50e9 / 8, bw_mm = 11.5e12, data_size = 4;
  const double alpha_h2 = d_hidden / d_model * d_model * d_model * data_size;
  std::vector<double> L;
  for (const std::int64_t load : R.expert_loads()) L.push_back(double(load));
  std::vector<int> order(static_cast<std::size_t>(W));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return L[std::size_t(a)] > L[std::size_t(b)]; });
  const double B = *std::max_element(L.begin(), L.end());
  const double lat_comp = 12 * B * alpha_h2 / bw_mm + 4 * B * d_model * data_size / bw_net;
  const double model_size = 2 * alpha_h2 / bw_net * 2, comp_time = 12 * alpha_h2 / bw_mm;
  double best = std::numeric_limits<double>::infinity();
  int i = 0;
  for (; i < W; ++i) {
    const int e = order[std::size_t(i)];
    L[std::size_t(e)] = 0;
    for (int w = 0; w < W; ++w) L[std::size_t(w)] += double(R.at(w, e));
    const double c = *std::max_element(L.begin(), L.end()) * comp_time + (i + 1) * model_size;
    if (c < best) best = c;
    else if (c > best) break;
  }
  if (i == W) i = W - 1;  // Python's loop variable after a loop that never broke
  if (!(lat_comp > best)) return {};
  return {order.begin(), order.begin() + i};
}

/// The congestion-avoiding gate (§4.3) on counts: at most `limit` token-slots of each source leave
/// its node; the excess is re-routed to the experts of its own node in proportion to how it already
/// uses them. Which slots stay (the best-scoring, in the paper) cannot be seen in counts: the
/// off-node slots shrink in proportion. Returns the slots re-routed.
std::int64_t topology_aware_gate(RoutingMatrix& R, const Cluster& cluster, std::int64_t tokens, double limit) {
  const int G = cluster.num_gpus(), E = R.experts, M = cluster.gpus_per_node();
  std::int64_t moved = 0;
  for (int s = 0; s < R.sources; ++s) {
    std::vector<std::int64_t> off, on;
    std::vector<int> off_e, on_e;
    for (int e = 0; e < E; ++e) {
      const bool same_node = expert_owner(e, E, G) / M == s / M;
      (same_node ? on : off).push_back(R.at(s, e));
      (same_node ? on_e : off_e).push_back(e);
    }
    const std::int64_t out = std::accumulate(off.begin(), off.end(), std::int64_t(0));
    const auto keep = std::int64_t(std::floor(limit));
    if (out <= keep || on.empty()) continue;
    const std::int64_t total = R.row_sum(s);
    const auto new_off = rescale_row(off, keep, tokens);
    const auto new_on = rescale_row(on, total - keep, tokens);
    for (std::size_t i = 0; i < off_e.size(); ++i) R.mutable_at(s, off_e[i]) = new_off[i];
    for (std::size_t i = 0; i < on_e.size(); ++i) R.mutable_at(s, on_e[i]) = new_on[i];
    moved += out - keep;
  }
  return moved;
}

namespace {

// FasterMoE's configurations. Paper: the paper's techniques as named (`fastermoe`,
// `fastermoe-shadow`, `fastermoe-smart`). Released: `fastermoe-released`, the switches and constants
// of laekov/fastmoe as shipped, read from policy.fastermoe.released.

class FasterMoe final : public Policy {
 public:
  FasterMoe(bool shadow, bool smart, Code code) : shadow_(shadow), smart_(smart), code_(code) {}

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    const auto& f = spec.fastermoe();
    const std::int64_t gs = f.group_size() ? std::int64_t(f.group_size()) : 4;
    if (smart(f) && cluster.num_gpus() % std::min<std::int64_t>(gs, cluster.num_gpus()) != 0)
      throw FieldError("policy.fastermoe.group_size",
                       fmt::format("{} GPUs do not split into groups of {}; use a divisor of the GPU count", cluster.num_gpus(), gs));
    if (f.blocking() && smart(f))
      throw FieldError("policy.fastermoe.blocking", "the smart schedule overlaps the shadowed experts' transfers by design: "
                                                    "blocking is for shadowing without it (fastermoe-shadow)");
    if (!(f.outgoing_fraction() >= 0 && f.outgoing_fraction() <= 1))  // whatever the gate: never a silent NaN
      throw FieldError("policy.fastermoe.outgoing_fraction", "must be in [0, 1] (0 means the released default, 0.14)");
    if (f.shadow_variant() == spec::FasterMoeSpec::PROTOTYPE && model.experts() != cluster.num_gpus())
      throw FieldError("policy.fastermoe.shadow_variant",
                       fmt::format("PROTOTYPE is the artifact's rule for one expert per GPU (its num_expert = 1); "
                                   "the model has {} experts on {} GPUs",
                                   model.experts(), cluster.num_gpus()));
    if (code_ != Code::released) return;
    const auto& r = f.released();
    if (r.shadow() && !r.schedule())
      throw FieldError("policy.fastermoe.released.shadow",
                       "the release calls its shadowing policy only from the smart schedule's forward "
                       "(fmoe/fastermoe/schedule.py): set released.schedule: true as well, or use policy "
                       "fastermoe-shadow for shadowing with a blocking schedule");
    for (const auto& [field, set, value] : {std::tuple{"netbw_bytes_per_s", r.has_netbw_bytes_per_s(), r.netbw_bytes_per_s()},
                                           std::tuple{"gputp_flops", r.has_gputp_flops(), r.gputp_flops()},
                                           std::tuple{"alpha", r.has_alpha(), r.alpha()}})
      if (set && !(value > 0 && std::isfinite(value)))
        throw FieldError(std::string("policy.fastermoe.released.") + field, "must be a positive number (leave it out for the release's default)");
  }

  IterationPlan plan(const IterationInput& in) override {
    const auto& f = in.spec.fastermoe();
    if (!cost_)
      cost_.emplace(in.cluster, in.gpu, CostOptions{f.ninety_percent_peak()});
    std::vector<LayerPlan> plans;
    for (const auto& routing : in.routing) {
      LayerPlan plan{routing, {}};
      if (f.topology_gate() != spec::FasterMoeSpec::NONE && in.cluster.nodes() > 1)
        in.report.rerouted_tokens += topology_aware_gate(plan.routing, in.cluster, in.model.tokens_per_gpu(), gate_limit(in));
      if (shadow(f)) {
        // Broadcast (and reduced) in the release's loop order, each local expert index over the
        // workers in rank order (cuda/global_exchange.cuh, fmoe_cuda_model_exchange_impl): NCCL calls
        // in turn, whose fills overlap where one root follows the last down the ring.
        auto experts = shadowed(f, in, plan.routing);
        const int local = std::max<int>(1, int(in.model.experts() / in.cluster.num_gpus()));
        std::sort(experts.begin(), experts.end(), [local](int a, int b) { return std::pair(a % local, a / local) < std::pair(b % local, b / local); });
        for (int e : experts) plan.replicas.push_back(everywhere(e, in.model.experts(), in.cluster.num_gpus()));
      }
      in.report.shadowed_experts += int(plan.replicas.size());
      plans.push_back(std::move(plan));
    }
    IterationPlan plan(std::move(plans));
    if (f.blocking()) plan.replicas.timing = ReplicaSchedule::exposed;
    plan.shadow_search = shadow(f);
    plan.sizing = DispatchSizing::counts;  // FastMoE's count exchange, before every dispatch
    if (smart(f)) plan.schedule = smart_schedule(int(std::min<std::int64_t>(f.group_size() ? f.group_size() : 4, in.cluster.num_gpus())));
    return plan;
  }

 private:
  bool shadow(const spec::FasterMoeSpec& f) const { return code_ == Code::released ? f.released().shadow() : shadow_; }
  bool smart(const spec::FasterMoeSpec& f) const { return code_ == Code::released ? f.released().schedule() : smart_; }

  std::vector<int> shadowed(const spec::FasterMoeSpec& f, const IterationInput& in, const RoutingMatrix& routing) const {
    const double d = in.model.spec().d_model();
    if (code_ == Code::paper) switch (f.shadow_variant()) {
        case spec::FasterMoeSpec::RELEASED: return released_shadowing(d, routing, ReleasedCounting::per_expert);
        case spec::FasterMoeSpec::PROTOTYPE: return prototype_shadowing(d, in.model.expert_ffn(), routing);
        default: return dynamic_shadowing(*cost_, in.model, routing);
      }
    const auto& r = f.released();
    ReleasedConstants k;
    if (r.has_netbw_bytes_per_s()) k.bw_net = r.netbw_bytes_per_s();
    if (r.has_gputp_flops()) k.bw_mm = r.gputp_flops();
    if (r.has_alpha()) k.alpha = r.alpha();
    return released_shadowing(d, routing, r.counting() == spec::FasterMoeSpec::Released::PER_EXPERT ? ReleasedCounting::per_expert : ReleasedCounting::per_rank, k);
  }

  // L of §4.3: W_net / (M · W_local) · B token-slots per worker, B = T·k; or the released fraction
  // of the tokens (each picked token keeps one off-node slot).
  double gate_limit(const IterationInput& in) const {
    const auto& f = in.spec.fastermoe();
    const double T = in.model.tokens_per_gpu();
    if (f.topology_gate() == spec::FasterMoeSpec::FRACTION)
      return (f.outgoing_fraction() > 0 ? f.outgoing_fraction() : 0.14) * T;
    const auto& c = in.cluster;
    double w_local = std::numeric_limits<double>::infinity();
    for (int j = 1; j < c.gpus_per_node(); ++j) w_local = std::min(w_local, c.route_bandwidth(c.intra_route(0, j)));
    return c.node_uplink_bandwidth() / (c.gpus_per_node() * w_local) * T * in.model.top_k();
  }

  bool shadow_, smart_;
  Code code_;
  std::optional<CostModel> cost_;
};

}  // namespace

std::unique_ptr<Policy> make_fastermoe(const FasterMoeOptions& o) {
  return std::make_unique<FasterMoe>(o.shadow, o.smart, o.code);
}

}  // namespace moesim
