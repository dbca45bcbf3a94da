// Pro-Prophet (Wang et al.; docs/spec/pro-prophet.md) as a policy: the lightweight expert
// placement (Trans / Agg, §1.2), its performance model (Eqs. 1-8, §1.3), the locality-based greedy
// search (Algorithm 1, §2) and the block-wise scheduler (Algorithm 2, §3, built by
// moe_iteration.cpp as ReplicaSchedule::block_wise). Symbols follow the paper: D devices, E experts,
// H_i inputs computed on device i, R_i inputs it receives from others, B̄ the average bandwidth,
// t the computation throughput, s selected experts, n devices a selected expert is not sent to,
// I inputs of the iteration, α the balance coefficient.
//
// Choices where the paper is unclear:
//  - The model's scalars come from the shared cost model, once per policy (the paper profiles
//    them before training): B̄ of Eq. 1 is what one device receives per second when every other
//    device sends to it. Eq. 1 is receiver-bound (max_i R_i), and under skew the heaviest
//    receiver is a hot expert's device fed by everyone: profiled so, Eq. 1 is within ~6% of the
//    simulated all-to-alls of skewed routings (the paper's Fig. 13 claims < 5%), where a B̄ from a
//    uniform all-to-all (a per-GPU share of the NIC) overestimates them 2.7× and over-replicates
//    (tests/test_pro_prophet.cpp, "Eq. 1 estimates ..."). B̄ of Eqs. 4-5 is size(params) over a ring broadcast to all GPUs (so Trans with
//    n = 0 costs one broadcast), t is a device's expert GEMM throughput at the mean load, T_FNEC the
//    GEMMs of a layer's attention and gate, T_BNEC = 2·T_FNEC. The paper has one B̄; the cost model
//    gives both primitives theirs.
//  - Inputs are token-slots (tokens × k), for H, R and I alike.
//  - E/G experts per GPU (the paper has E = D): H and R are per device; the search takes the
//    heaviest device's heaviest expert not yet selected, and stops ("already relieved") when the
//    heaviest device has none left. With E = D this is Algorithm 1 exactly.
//  - n counts devices besides the home (BottomK over the D − 1 others); a device with no input for
//    the expert never gets a copy (Fig. 6: "Dev. 2 has no inputs routed to E0"). Eqs. 4-5 are
//    charged per selected expert with its own n_e = D − 1 − (receivers), so D − n_e counts the home
//    with the receivers: s·(D − n)/D · size / B̄ when every expert has n_e = n.
//  - Replace_Inputs follows the iteration builder (expert_target()): a source without a copy sends
//    its tokens to a copy on its node if there is one, else to a copy spread by source, so the
//    plan's H and R are those the simulated iteration has.
//  - Eq. 7 compares the spread of H with α·I/D, the mean device load (the paper's I/E, E = D).
#include "pro_prophet.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <optional>

#include "errors.hpp"
#include "policy_factories.hpp"

namespace moesim {

ProphetModel prophet_model(const CostModel& cost, const MoeModel& model, const GpuModel& gpu) {
  ProphetModel m;
  const int G = cost.cluster().num_gpus();
  m.devices = G;
  m.input_bytes = model.token_bytes();
  m.params_bytes = m.grads_bytes = model.expert_params() * model.dtype_bytes();
  const double inf = std::numeric_limits<double>::infinity();
  m.a2a_bandwidth = m.xfer_bandwidth = inf;
  if (G > 1) {
    const double b = 1e6;
    std::vector<double> hot(std::size_t(G) * G, 0.0);  // every device sends b to device 0
    for (int i = 1; i < G; ++i) hot[std::size_t(i) * G] = b;
    m.a2a_bandwidth = (G - 1) * b / cost.alltoall_time(hot);
    std::vector<int> all(std::size_t(G), 0);
    std::iota(all.begin(), all.end(), 0);
    m.xfer_bandwidth = m.params_bytes / cost.broadcast_time(all, m.params_bytes);
  }
  const int per_gpu = model.experts() / G;
  const double slots = double(model.tokens_per_gpu()) * model.top_k();  // a device's mean load
  m.throughput = slots / (per_gpu * cost.expert_time(model, slots / per_gpu));
  m.fnec += Compute{ComputeKind::gemm, model.dense_forward_gemms(), model.dense_forward_memory_bytes()}.seconds(gpu);
  m.fnec += gpu.gemm_time(model.gate_gemm());
  m.bnec = 2 * m.fnec;
  return m;
}

namespace {
// Eqs. 1 and 2 from the maxima they depend on (greedy_search keeps those).
double a2a_of_max(const ProphetModel& m, double r_max) { return r_max > 0 ? r_max * m.input_bytes / m.a2a_bandwidth : 0; }
double fec_of_max(const ProphetModel& m, double h_max) { return h_max / m.throughput; }
// Eq. 7 from the extremes of H and the layer's inputs I over D devices.
bool balanced_spread(double h_max, double h_min, double I, std::size_t D, double alpha) { return h_max - h_min < alpha * I / double(D); }
}  // namespace

/// Eq. 1, Tutel's P2P all-to-all: T_A2A(R) = max_i R_i · size(input) / B̄.
double a2a_time(const ProphetModel& m, const std::vector<double>& R) {
  return a2a_of_max(m, R.empty() ? 0 : *std::max_element(R.begin(), R.end()));
}

/// Eq. 2: T_FEC(H) = max_i H_i / t (a device's experts run one after another).
double fec_time(const ProphetModel& m, const std::vector<double>& H) {
  return fec_of_max(m, H.empty() ? 0 : *std::max_element(H.begin(), H.end()));
}

/// Eq. 3: T_BEC(H) = 2 · max_i H_i / t.
double bec_time(const ProphetModel& m, const std::vector<double>& H) { return 2 * fec_time(m, H); }

/// Eq. 4: T_Trans(s, n) = s · (D − n) · size(e.params) / (D · B̄).
double trans_time(const ProphetModel& m, double s, double n) {
  return s * (m.devices - n) * m.params_bytes / (m.devices * m.xfer_bandwidth);
}

/// Eq. 5: T_Agg(s, n) = s · (D − n) · size(e.grads) / (D · B̄).
double agg_time(const ProphetModel& m, double s, double n) {
  return s * (m.devices - n) * m.grads_bytes / (m.devices * m.xfer_bandwidth);
}

/// Eq. 6: T' = 4·T_A2A + 3·T_FEC + T_Trans + T_Agg (FEC + BEC = 3·FEC; 2 + 2 all-to-alls).
double layer_time(double a2a, double fec, double trans, double agg) { return 4 * a2a + 3 * fec + trans + agg; }

/// Eq. 8: T' = 4·T_A2A + 3·T_FEC + T_PTrans + T_PAgg, T_PTrans = max(0, T_Trans − T_FEC − T_FNEC),
/// T_PAgg = max(0, T_Agg − T_BEC − T_BNEC): only what the block's compute cannot hide. The real
/// schedule hides Trans_{i+1} under block i; Eq. 8 subtracts the layer's own T_FEC (the paper's
/// approximation, kept).
double layer_time_overlapped(const ProphetModel& m, double a2a, double fec, double trans, double agg) {
  return 4 * a2a + 3 * fec + std::max(0.0, trans - fec - m.fnec) + std::max(0.0, agg - 2 * fec - m.bnec);
}

/// Eq. 7: max(H) − min(H) < α · I / D.
bool balanced(const std::vector<double>& H, double alpha) {
  if (H.empty()) return true;
  const auto [lo, hi] = std::minmax_element(H.begin(), H.end());
  return balanced_spread(*hi, *lo, std::accumulate(H.begin(), H.end(), 0.0), H.size(), alpha);
}

/// Algorithm 1 (reconstructed, docs/spec/pro-prophet.md §2.2): from the no-replica baseline, repeatedly take
/// the heaviest device's heaviest unselected expert (greedy rule 1), send it to every device but
/// the n with the fewest inputs for it (rule 2, BottomK), re-assign the inputs, score the prefix with
/// Eq. 6 or 8, and keep the best prefix. Stops when Eq. 7 holds (balanced) or when the heaviest
/// device has no expert left to select (relieved: the paper's "i in Used"; it also ends the search
/// once every expert is selected). The listing's fixes (a)-(c) are as in the extract.
///
/// Cost: the loop selects each expert at most once, and a pass is two sweeps over the D devices
/// (Replace_Inputs with the new copy's holders; then max/min/argmax of H and max of R for Eqs. 6-8,
/// Eq. 7 and the next pick) plus O(E/D) to pick the expert, and BottomK (nth_element) when n > 0:
/// O(E·D) per layer with the initial column sums, against the extract's O(D³) for a from-scratch
/// Replace_Inputs. Inputs are whole token-slots held in doubles, so the incremental H and R are exact.
ProphetPlan greedy_search(const ProphetModel& m, const Cluster& cluster, const RoutingMatrix& gating,
                          const SearchOptions& o) {
  const int D = cluster.num_gpus(), E = gating.experts, per = E / D;
  std::vector<double> load(std::size_t(E), 0.0), H(std::size_t(D), 0.0), R(std::size_t(D), 0.0);
  // gating[:, e] is read whole for each expert tried: a copy by expert makes it contiguous (read in
  // place, a column of a 1,024 × 1,024 matrix is a cache and TLB miss per source). Copied in
  // blocks of 16 sources, so that each expert's write is one cache line.
  std::vector<std::int32_t> by_expert(std::size_t(E) * std::size_t(D));
  constexpr int block = 16;
  for (int s0 = 0; s0 < D; s0 += block)
    for (int e = 0; e < E; ++e)
      for (int s = s0; s < std::min(s0 + block, D); ++s)
        by_expert[std::size_t(e) * std::size_t(D) + std::size_t(s)] = std::int32_t(gating.at(s, e));
  for (int e = 0; e < E; ++e) {  // no replica: the home computes all of e's inputs, receives the others'
    const std::int32_t* column = &by_expert[std::size_t(e) * std::size_t(D)];
    const int home = e / per;
    load[std::size_t(e)] = std::accumulate(column, column + D, 0.0);
    H[std::size_t(home)] += load[std::size_t(e)];
    R[std::size_t(home)] += load[std::size_t(e)] - column[home];
  }
  const double I = std::accumulate(H.begin(), H.end(), 0.0);  // Eq. 7's I: Replace_Inputs keeps it
  double trans = 0, agg = 0;
  // max/min/argmax of H and max of R: what Eqs. 6-8 score, Eq. 7 tests and rule 1 picks from.
  struct Extremes {
    double h_max = 0, h_min = 0, r_max = 0;
    int heaviest = 0;
  };
  auto extremes = [&] {
    Extremes x{H[0], H[0], R[0], 0};
    for (int d = 1; d < D; ++d) {
      const double h = H[std::size_t(d)];
      if (h > x.h_max) x.h_max = h, x.heaviest = d;
      x.h_min = std::min(x.h_min, h);
      x.r_max = std::max(x.r_max, R[std::size_t(d)]);
    }
    return x;
  };
  auto score = [&](const Extremes& x) {
    const double a2a = a2a_of_max(m, x.r_max), fec = fec_of_max(m, x.h_max);  // Eqs. 1, 2
    return o.overlap ? layer_time_overlapped(m, a2a, fec, trans, agg) : layer_time(a2a, fec, trans, agg);
  };
  ProphetPlan plan;
  Extremes now = extremes();
  plan.time_before = plan.time_after = score(now);  // T_output, fix (a)
  plan.H = H, plan.R = R;
  std::vector<Replica> L;
  std::vector<char> used(std::size_t(E), 0);  // fix (b)
  std::vector<int> others;
  std::vector<char> out(std::size_t(D), 0);  // by device: among the BottomK excluded
  std::size_t cnt = 0;
  for (;;) {
    if (balanced_spread(now.h_max, now.h_min, I, std::size_t(D), o.alpha)) {  // Eq. 7
      plan.stop = ProphetPlan::Stop::balanced;
      break;
    }
    const int i = now.heaviest;  // heaviest device (the first of equals), fix (c)
    int e = -1;
    for (int c = i * per; c < (i + 1) * per; ++c)
      if (!used[std::size_t(c)] && (e < 0 || load[std::size_t(c)] > load[std::size_t(e)])) e = c;
    if (e < 0) {
      plan.stop = ProphetPlan::Stop::relieved;
      break;
    }
    used[std::size_t(e)] = 1;
    const std::int32_t* column = &by_expert[std::size_t(e) * std::size_t(D)];  // gating[:, e]
    // BottomK(gating[:, e], n) over the devices other than the home; ties: the higher index excluded.
    const auto excluded = std::min<std::size_t>(std::size_t(o.n), std::size_t(D - 1));
    std::fill(out.begin(), out.end(), 0);
    bool out_with_inputs = false;  // an excluded device has inputs for e: they go to another copy
    if (excluded > 0) {
      others.clear();
      for (int d = 0; d < D; ++d)
        if (d != i) others.push_back(d);
      std::nth_element(others.begin(), others.begin() + std::ptrdiff_t(excluded), others.end(), [&](int a, int b) {
        const auto x = column[a], y = column[b];
        return x != y ? x < y : a > b;
      });
      for (std::size_t k = 0; k < excluded; ++k) {
        out[std::size_t(others[k])] = 1;
        out_with_inputs = out_with_inputs || column[others[k]] > 0;
      }
    }
    // The copy goes to the rest that have inputs for e, in order: each computes its own. Replace_Inputs
    // moves those inputs off the home (and off its received R_i).
    Replica rep{e, {}};
    double moved = 0;
    for (int d = 0; d < D; ++d) {
      const double x = double(column[d]);
      if (d == i || out[std::size_t(d)] || x <= 0) continue;
      rep.holders.push_back(d);
      H[std::size_t(d)] += x;
      moved += x;
    }
    if (rep.holders.empty()) continue;  // nobody else computes it: nothing to send
    H[std::size_t(i)] -= moved;
    R[std::size_t(i)] -= moved;
    if (out_with_inputs) {  // an excluded source sends to a copy on its node, else one spread by source
      const auto target = replica_targets(rep, cluster, expert_owner(rep.expert, E, D));
      for (int s = 0; s < D; ++s) {
        const double x = double(column[s]);
        if (!out[std::size_t(s)] || x == 0 || target[std::size_t(s)] == i) continue;
        const int t = target[std::size_t(s)];
        H[std::size_t(i)] -= x, R[std::size_t(i)] -= x;
        H[std::size_t(t)] += x, R[std::size_t(t)] += x;
      }
    }
    const double n_e = double(D - 1) - double(rep.holders.size());
    trans += trans_time(m, 1, n_e);
    agg += agg_time(m, 1, n_e);
    L.push_back(std::move(rep));
    now = extremes();
    const double t = score(now);
    if (t < plan.time_after) {
      plan.time_after = t;
      cnt = L.size();
      plan.H = H, plan.R = R;
    }
  }
  plan.searched = int(L.size());
  L.resize(cnt);
  plan.replicas = std::move(L);
  return plan;
}

std::vector<int> top_experts(const RoutingMatrix& routing, int k) {
  const std::vector<std::int64_t> load = routing.expert_loads();
  std::vector<int> order(std::size_t(routing.experts));
  std::iota(order.begin(), order.end(), 0);
  const auto top = std::min<std::size_t>(std::size_t(std::max(k, 0)), order.size());
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(top), order.end(),
                    [&](int a, int b) { return load[std::size_t(a)] != load[std::size_t(b)] ? load[std::size_t(a)] > load[std::size_t(b)] : a < b; });
  order.resize(top);
  return order;
}

namespace {

// The policy. Locality (§2.2): the plan for iteration j + 1 is searched at the end of iteration j
// from the loads observed so far (the last `history` iterations, averaged), as the paper runs
// Plan^{j+1} under iteration j's all-to-all. In the simulator that is a modelling statement: the
// search's wall time goes to PolicyReport.decision_seconds and no Plan op is on the simulated
// critical path (the paper's claim that A2A hides it). The first iteration has no observed loads
// and runs as plain EP (no replica). `plan_every` > 1 keeps a plan for that many iterations.
class ProProphet final : public Policy {
 public:
  explicit ProProphet(bool scheduler) : scheduler_(scheduler) {}

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    const auto& p = spec.pro_prophet();
    if (p.has_alpha() && !(p.alpha() > 0))
      throw FieldError("policy.pro_prophet.alpha", "the balance coefficient α must be > 0");
    if (std::int64_t(p.n()) > cluster.num_gpus() - 1)
      throw FieldError("policy.pro_prophet.n", fmt::format("at most D − 1 = {} devices can be left out", cluster.num_gpus() - 1));
  }

  IterationPlan plan(const IterationInput& in) override {
    const auto& p = in.spec.pro_prophet();
    if (!cost_) {  // profiled once, "before training"
      cost_.emplace(in.cluster, in.gpu);
      model_ = prophet_model(*cost_, in.model, in.gpu);
    }
    std::vector<LayerPlan> plans;
    for (std::size_t l = 0; l < in.routing.size(); ++l) {
      plans.push_back({in.routing[l], l < next_.size() ? next_[l] : std::vector<Replica>{}});
      in.report.shadowed_experts += int(plans.back().replicas.size());
    }
    plan_next(in, p);
    IterationPlan plan(std::move(plans));
    plan.replicas.timing = scheduler_ ? ReplicaSchedule::block_wise : ReplicaSchedule::exposed;
    // Partition(): as many experts' transfers under the non-MoE compute as fit (static, from the
    // profiled T_FNEC / T_BNEC and one expert's transfer); the rest under the expert compute.
    plan.replicas.trans_under_dense = fit(model_.fnec, trans_time(model_, 1, 0));
    plan.replicas.agg_under_dense = fit(model_.bnec, agg_time(model_, 1, 0));
    return plan;
  }

 private:
  static int fit(double window, double one) {
    return one > 0 ? int(std::min(std::floor(window / one), 1e9)) : std::numeric_limits<int>::max();
  }

  // Plan^{j+1}, from this iteration's loads and the window before it.
  void plan_next(const IterationInput& in, const spec::ProProphetSpec& p) {
    const std::size_t history = p.history() ? p.history() : 1;
    const int every = iterations_as_int(p.plan_every() ? p.plan_every() : 1);
    if (history > 1) {
      window_.push_back(in.routing);
      if (window_.size() > history) window_.pop_front();
    }
    if (iteration_++ % every != 0) return;
    SearchOptions o;
    o.alpha = p.has_alpha() ? p.alpha() : 0.1;
    o.n = int(p.n());
    o.overlap = p.has_overlap_model() ? p.overlap_model() : scheduler_;  // "Full": Eq. 8
    next_.assign(in.routing.size(), {});
    for (std::size_t l = 0; l < in.routing.size(); ++l)
      next_[l] = greedy_search(model_, in.cluster, history > 1 ? mean_load(l) : in.routing[l], o).replicas;
  }

  // The window's mean routing of layer l, rounded to whole token-slots.
  RoutingMatrix mean_load(std::size_t l) const {
    RoutingMatrix m = window_.front()[l];
    auto& sum = m.mutable_counts();
    for (std::size_t j = 1; j < window_.size(); ++j) {
      const auto& add = window_[j][l].counts();
      for (std::size_t c = 0; c < sum.size(); ++c) sum[c] += add[c];
    }
    const auto h = std::int64_t(window_.size());
    for (auto& x : sum) x = (x + h / 2) / h;
    return m;
  }

  bool scheduler_;
  std::optional<CostModel> cost_;
  ProphetModel model_;
  std::deque<std::vector<RoutingMatrix>> window_;  // the last `history` iterations' routing
  std::vector<std::vector<Replica>> next_;         // per layer: the plan for the next iteration
  long iteration_ = 0;
};

// Fig. 15's baseline: the k heaviest experts of the iteration (torch.topk on the gate's output,
// negligible cost) replicated on every GPU. Only the choice differs from the planner alone: the
// transfers are exposed as there (ReplicaSchedule::exposed).
class ReplicateTop final : public Policy {
 public:
  explicit ReplicateTop(int k) : k_(k) {}
  IterationPlan plan(const IterationInput& in) override {
    std::vector<LayerPlan> plans;
    for (const auto& R : in.routing) {
      LayerPlan plan{R, {}};
      if (in.cluster.num_gpus() > 1)
        for (int e : top_experts(R, k_)) plan.replicas.push_back(everywhere(e, in.model.experts(), in.cluster.num_gpus()));
      in.report.shadowed_experts += int(plan.replicas.size());
      plans.push_back(std::move(plan));
    }
    IterationPlan out(std::move(plans));
    out.replicas.timing = ReplicaSchedule::exposed;
    return out;
  }

 private:
  int k_;
};

}  // namespace

std::unique_ptr<Policy> make_pro_prophet(const ProProphetOptions& o) { return std::make_unique<ProProphet>(o.scheduler); }
std::unique_ptr<Policy> make_replicate_top(int k) { return std::make_unique<ReplicateTop>(k); }

}  // namespace moesim
