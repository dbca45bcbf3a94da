// Tutel's adaptive pipelining as a policy: plain expert placement; each MoE layer's all-to-all /
// experts / all-to-all split along the capacity dimension into d parts (all-to-alls on the comm
// stream, experts on the compute stream, docs/spec/tutel.md §2.2), with the all-to-all algorithm of the
// strategy. Static (`policy.tutel.degree`, `.all_to_all`) or adaptive: Algorithm 2 times one
// strategy per real iteration from the backend's measured step time (observe()) and keeps, per
// capacity-factor bucket, the best.
//
// Choices where the paper is unclear: one strategy per iteration for all layers, keyed by the
// iteration's capacity factor f = the smallest that drops nothing (Tutel's x = 0), the mean over
// layers; the measured time is the iteration's; bucket length L = 1 by default (not given).
#include "tutel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "errors.hpp"
#include "gate.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {

StrategySearch::StrategySearch(std::vector<Strategy> space, double bucket_length)
    : space_(std::move(space)), length_(bucket_length) {}

void StrategySearch::recompute_buckets() {
  // Greedy packing of the sorted fs: a bucket closes when the next f is L or more above its first.
  int bucket = -1;
  double first = 0;
  for (auto& [f, b] : bucket_of_) {
    if (bucket < 0 || f - first >= length_) ++bucket, first = f;
    b = bucket;
  }
}

std::map<Strategy, double> StrategySearch::bucket_times(int bucket) const {
  std::map<Strategy, double> out;
  double low = -1;
  for (const auto& [f, b] : bucket_of_) {
    if (b != bucket) continue;
    if (low < 0) low = f;
    for (const auto& [s, t] : tried_.at(f)) {
      const double normalised = f > 0 ? t * low / f : t;
      auto [it, fresh] = out.emplace(s, normalised);
      if (!fresh) it->second = std::min(it->second, normalised);
    }
  }
  return out;
}

Strategy StrategySearch::get(double f) {
  if (!bucket_of_.count(f)) {
    bucket_of_[f] = 0;
    tried_[f];
    recompute_buckets();
  }
  auto best = [](const std::map<Strategy, double>& times) {
    return std::min_element(times.begin(), times.end(), [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  };
  const auto& mine = tried_.at(f);
  if (mine.size() >= space_.size()) return best(mine);
  const auto bucket = bucket_times(bucket_of_.at(f));
  if (bucket.size() >= space_.size()) return best(bucket);
  for (const auto& s : space_)
    if (!bucket.count(s)) return s;
  return space_.front();
}

void StrategySearch::record(double f, const Strategy& s, double seconds) {
  if (!bucket_of_.count(f)) get(f);
  tried_[f][s] = seconds;
}

std::vector<ParallelismOption> parallelism_options(int W, int E, double P, double D, double budget) {
  const int s = E < W ? W / E : 1;    // GPUs sharing one expert (sharded_count)
  const double local = double(std::max(1, E / W));  // ΔE: experts whose slices a GPU holds
  const double slices = local * P / s;  // persistent parameter bytes per GPU, whatever r
  std::vector<ParallelismOption> out;
  // r = 0: every GPU gathers every expert over all W GPUs (ring: (W−1)/W of it), computes its own
  // tokens locally, no all-to-all.
  ParallelismOption dp{0, 0, double(E) * P * double(W - 1) / W, 0, true};
  dp.memory_bytes = slices + double(E) * P + D;
  out.push_back(dp);
  for (int r = 1; r <= s; ++r) {
    if (s % r != 0) continue;
    ParallelismOption o{r, 2 * r * D, local * P * (1.0 / r - 1.0 / s), 0, true};
    o.memory_bytes = slices + local * P / r + 2 * r * D;  // gathered 1/r of the expert; sent + received tokens
    out.push_back(o);
  }
  for (auto& o : out) o.fits = o.memory_bytes <= budget;
  return out;
}

int choose_parallelism(const std::vector<ParallelismOption>& options) {
  int best = -1;
  double least = 0;
  for (const auto& o : options)
    if (o.r >= 1 && o.fits && (best < 0 || o.comm_bytes() < least)) best = o.r, least = o.comm_bytes();
  return best;
}

namespace {

// `tutel`: the paper's adaptive pipelining (Algorithm 2) and parallelism router. `tutel-released`:
// microsoft/tutel as shipped (82af7aa), which has no strategy search and no router: the degree, 2DH
// and r are the MOELayer's arguments, with its defaults (tutel/impls/moe_layer.py:93-99:
// a2a_ffn_overlap_degree=1, use_2dh=False, parallel_type='adaptive:1'), here policy.tutel.degree,
// .all_to_all ("linear" or "2dh") and .parallel_r.
class Tutel final : public Policy {
 public:
  explicit Tutel(bool released) : released_(released) {}

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    const auto& t = spec.tutel();
    if (released_ && (t.degrees_size() || t.algorithms_size()))
      throw FieldError(t.degrees_size() ? "policy.tutel.degrees" : "policy.tutel.algorithms",
                       "tutel-released has no strategy search (the library takes the degree and use_2dh per "
                       "call): set policy.tutel.degree and policy.tutel.all_to_all, or use policy tutel");
    const int W = cluster.num_gpus(), E = model.experts();
    if (E < W) {
      if (W % E != 0)
        throw FieldError("model.experts", fmt::format("with fewer experts than GPUs each expert is sharded over W/E GPUs: "
                                                      "{} GPUs over {} experts is not a whole number; use a divisor of {}", W, E, W));
      collective_algorithm(spec, CollectiveType::all_reduce);
    } else {
      validate_expert_placement(cluster, model, spec);
    }
    if (t.has_parallel_r()) {
      const int s = E < W ? W / E : 1, r = t.parallel_r();
      if (r < 0 || (r > 0 && s % r != 0))
        throw FieldError("policy.tutel.parallel_r", fmt::format("r is 0 (data parallel) or a divisor of W/E = {}", s));
    }
    // A plan names one layer schedule: a degree that the chosen schedule would ignore is refused.
    if (t.degree() > 1 && t.has_parallel_r() && t.parallel_r() == 0)
      throw FieldError("policy.tutel.degree", "parallel_r: 0 is data parallelism (every GPU gathers every expert, no "
                                              "all-to-all to pipeline); leave degree out or choose r >= 1");
    if (t.degree() > 1 && E < W && !released_)
      throw FieldError("policy.tutel.degree", fmt::format("with fewer experts than GPUs ({} < {}) tutel shards each expert "
                                                          "(Tutel §3.2), a layer it does not pipeline; leave degree out, or use "
                                                          "policy tutel-released, which pipelines sharded experts", E, W));
    for (const auto& s : space(t)) {
      if (s.degree < 1 || s.degree > 64)
        throw FieldError(t.degree() ? "policy.tutel.degree" : "policy.tutel.degrees", "pipelining degrees are 1 to 64");
      spec::PolicySpec probe;
      probe.set_all_to_all(s.all_to_all);
      try {
        collective_algorithm(probe, CollectiveType::all_to_all);
      } catch (const FieldError& e) {
        throw FieldError(t.degree() ? "policy.tutel.all_to_all" : "policy.tutel.algorithms", e.message());
      }
    }
    if (t.has_bucket_length() && !(t.bucket_length() > 0)) throw FieldError("policy.tutel.bucket_length", "must be > 0");
  }

  IterationPlan plan(const IterationInput& in) override {
    const auto& t = in.spec.tutel();
    if (!search_) search_.emplace(space(t), t.has_bucket_length() ? t.bucket_length() : 1.0);
    f_ = capacity_factor(in);
    current_ = t.degree() || released_ ? space(t).front() : search_->get(f_);
    IterationPlan plan;
    for (const auto& R : in.routing) plan.layers.push_back({R, {}});
    plan.all_to_all = current_.all_to_all;
    plan.kernels.dense_encode = t.dense_encode();
    plan.kernels.layout_copies = t.has_flexible_alltoall() && !t.flexible_alltoall();
    const int W = in.cluster.num_gpus(), E = in.model.experts();
    const int r = t.has_parallel_r() ? t.parallel_r() : released_ ? 1 : switching_rule(in);
    in.report.parallel_r = r;
    if (r == 0) {  // data parallel: every GPU gathers every expert (ZeRO-3)
      plan.schedule = zero_schedule(3);
    } else if (E < W) {  // sharded experts; the release pipelines them too
      plan.schedule = sharded_schedule(r, released_ ? current_.degree : 1);
    } else if (current_.degree > 1) {
      // Pipelined, the released linear all-to-all sends each part as E slices, one ncclSend per
      // expert: ΔE = E/W messages to each peer (microsoft/tutel 82af7aa, tutel/custom/custom_kernel.cpp
      // nccl_all_to_all_scatter_async / _gather_async, num_slices_per_split = E; tutel/impls/
      // communicate.py AllToAllScatterAsync). Unpipelined it is one all_to_all_single: one message.
      Pipelining p;
      p.partitions = current_.degree;
      if (E > W && current_.all_to_all == "linear") p.messages_per_peer = E / W;
      plan.schedule = pipelined_schedule(p);
    }
    return plan;
  }

  void observe(const TaskGraph&, const Timing& timing) override {
    if (!released_) search_->record(f_, current_, timing.makespan());
  }

 private:
  // The inline parallelism router: the fitting r with the least communication for this iteration's
  // dispatch tensor (E × C × M per GPU, C the largest (source, expert) count: Tutel pads to it).
  static int switching_rule(const IterationInput& in) {
    const int W = in.cluster.num_gpus(), E = in.model.experts();
    double dispatch = 0;
    for (const auto& R : in.routing)
      dispatch += double(E) * double(R.largest_count()) * in.model.token_bytes() / double(in.routing.size());
    const double expert = in.model.expert_params() * in.model.dtype_bytes();
    const int r = choose_parallelism(parallelism_options(W, E, expert, dispatch, in.gpu.memory_bytes()));
    return r < 0 ? (E < W ? W / E : 1) : r;
  }

  std::vector<Strategy> space(const spec::TutelSpec& t) const {
    if (t.degree() || released_) return {{int(std::max(1u, t.degree())), t.all_to_all().empty() ? "linear" : t.all_to_all()}};
    const std::vector<int> degrees =
        t.degrees().empty() ? std::vector<int>{1, 2, 4, 8} : std::vector<int>(t.degrees().begin(), t.degrees().end());
    std::vector<std::string> algos(t.algorithms().begin(), t.algorithms().end());
    if (algos.empty()) algos = {"linear", "2dh"};
    std::vector<Strategy> out;
    for (int d : degrees)
      for (const auto& a : algos) out.push_back({d, a});
    return out;
  }

  // Tutel's x = 0 (the gate's needed_capacity_factor), mean over layers, rounded to 1e-3 so that
  // equal workloads share a table entry.
  static double capacity_factor(const IterationInput& in) {
    double sum = 0;
    for (const auto& R : in.routing) sum += needed_capacity_factor(R, in.model.tokens_per_gpu(), in.model.top_k());
    return in.routing.empty() ? 1 : std::round(sum / double(in.routing.size()) * 1e3) / 1e3;
  }

  bool released_;
  std::optional<StrategySearch> search_;
  Strategy current_;
  double f_ = 1;
};

}  // namespace

std::unique_ptr<Policy> make_tutel(Code code) { return std::make_unique<Tutel>(code == Code::released); }

}  // namespace moesim
