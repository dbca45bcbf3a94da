#include "moe_iteration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace moesim {
namespace {

// Backward GEMMs of a forward GEMM C[m×n] = A[m×k]·B[k×n]: dA = dC·Bᵀ (m×k, inner n) and
// dB = Aᵀ·dC (k×n, inner m).
std::vector<Gemm> backward(const std::vector<Gemm>& forward) {
  std::vector<Gemm> out;
  for (const auto& g : forward) {
    out.push_back({g.m, g.k, g.n, g.batch});
    out.push_back({g.k, g.n, g.m, g.batch});
  }
  return out;
}

class Builder {
 public:
  Builder(const IterationInput& in, const std::vector<LayerPlan>& plans, const ScheduleOptions& s)
      : in_(in), plans_(plans), schedule_(s), G_(in.cluster.num_gpus()), E_(in.model.experts()),
        g_(G_), everyone_(G_), ready_(G_) {
    for (int r = 0; r < G_; ++r) everyone_[r] = r;
    a2a_ = collective_algorithm(in.spec, CollectiveType::all_to_all);
    ar_ = collective_algorithm(in.spec, CollectiveType::all_reduce);
    token_bytes_ = in.model.token_bytes();
    const double T = in.model.tokens_per_gpu(), k = in.model.top_k();
    scores_bytes_ = 2 * T * E_ * 4;             // softmax + top-k over fp32 scores
    permute_bytes_ = 2 * T * k * token_bytes_;  // read + write each routed token
    expert_bytes_ = in.model.expert_params() * in.model.dtype_bytes();
  }

  TaskGraph build() {
    const int L = in_.model.layers();
    const auto dense = in_.model.dense_forward_gemms();
    const Gemm gate = in_.model.gate_gemm();
    std::vector<OpId> shadow_reduces;
    for (int l = 0; l < L; ++l) {
      for (int r = 0; r < G_; ++r) {
        g_.add_compute(r, fmt::format("L{}.fwd.attention", l), {ComputeKind::gemm, dense, 0});
        g_.add_compute(r, fmt::format("L{}.fwd.gate", l), {ComputeKind::gate, {gate}, scores_bytes_});
        ready_[r] = g_.add_compute(r, fmt::format("L{}.fwd.encode", l), {ComputeKind::encode, {}, permute_bytes_});
      }
      const OpId done = moe_layer(l, false);
      for (int r = 0; r < G_; ++r)
        g_.add_compute(r, fmt::format("L{}.fwd.decode", l), {ComputeKind::decode, {}, permute_bytes_}, {done});
    }
    for (int l = L - 1; l >= 0; --l) {
      for (int r = 0; r < G_; ++r)
        ready_[r] = g_.add_compute(r, fmt::format("L{}.bwd.decode", l), {ComputeKind::decode, {}, permute_bytes_});
      const OpId done = moe_layer(l, true);
      for (int r = 0; r < G_; ++r) {
        g_.add_compute(r, fmt::format("L{}.bwd.encode", l), {ComputeKind::encode, {}, permute_bytes_}, {done});
        g_.add_compute(r, fmt::format("L{}.bwd.gate", l), {ComputeKind::gate, backward({gate}), scores_bytes_});
        ready_[r] = g_.add_compute(r, fmt::format("L{}.bwd.attention", l), {ComputeKind::gemm, backward(dense), 0});
      }
      // Shadowed experts' gradients go back to their owners (a reduce each, FasterMoE §4.1).
      for (int e : plans_[l].shadowed)
        shadow_reduces.push_back(g_.add_collective(Stream::comm, fmt::format("L{}.bwd.shadow_reduce.e{}", l, e),
                                                   {CollectiveType::reduce, ring_from(e), {expert_bytes_}, "ring"},
                                                   shadow_grads_[l]));
    }
    // Data parallelism over all GPUs for the dense parameters; each expert has one owner.
    const double dense_params = in_.model.dense_params_per_layer() * L;
    std::vector<OpId> before_ar(ready_);
    before_ar.insert(before_ar.end(), shadow_reduces.begin(), shadow_reduces.end());
    const OpId allreduce = g_.add_collective(
        Stream::comm, "allreduce.dense",
        {CollectiveType::all_reduce, everyone_, {dense_params * in_.model.dtype_bytes()}, ar_}, before_ar);
    // Adam with fp32 master weights and moments: read p, m, v (fp32) and g; write p, m, v and the
    // low-precision copy.
    const double params = dense_params + double(E_ / G_) * L * in_.model.expert_params();
    const double adam_bytes = params * (6 * 4 + 2 * in_.model.dtype_bytes());
    for (int r = 0; r < G_; ++r) g_.add_compute(r, "optimizer", {ComputeKind::optimizer, {}, adam_bytes}, {allreduce});
    return std::move(g_);
  }

 private:
  // The ring of a shadowed expert's broadcast / reduce: its owner first, then everyone else.
  std::vector<int> ring_from(int expert) const {
    const int owner = expert_owner(expert, E_, G_);
    std::vector<int> ring{owner};
    for (int r = 0; r < G_; ++r)
      if (r != owner) ring.push_back(r);
    return ring;
  }

  bool shadowed(int layer, int e) const {
    const auto& s = plans_[layer].shadowed;
    return std::find(s.begin(), s.end(), e) != s.end();
  }

  // Token-slots GPU `src` sends to GPU `dst` through the all-to-all (shadowed experts stay local).
  std::vector<double> exchanged(int layer) const {
    const auto& R = plans_[layer].routing;
    std::vector<double> tokens(std::size_t(G_) * G_, 0.0);
    for (int i = 0; i < G_; ++i)
      for (int e = 0; e < E_; ++e)
        if (!shadowed(layer, e)) tokens[std::size_t(i) * G_ + expert_owner(e, E_, G_)] += double(R.at(i, e));
    return tokens;
  }

  // Expert work of GPU `rank` on the tokens from the sources in [from, to): its own experts'
  // share of those tokens; with `local`, also its own tokens for the shadowed experts.
  Compute expert_work(int layer, int rank, int from, int to, bool local, bool bwd) const {
    const auto& R = plans_[layer].routing;
    Compute c{ComputeKind::grouped_gemm, {}, 0};
    auto add = [&](long tokens) {
      const auto fwd = in_.model.expert_gemms(tokens);
      const auto gemms = bwd ? backward(fwd) : fwd;
      c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
      c.tokens += tokens;
    };
    for (int e = 0; e < E_; ++e) {
      if (shadowed(layer, e)) {
        if (local && R.at(rank, e) > 0) add(long(R.at(rank, e)));
      } else if (expert_owner(e, E_, G_) == rank) {
        long tokens = 0;
        for (int s = from; s < to; ++s) tokens += long(R.at(s, e));
        if (tokens > 0) add(tokens);
      }
    }
    return c;
  }

  Collective exchange(const std::vector<double>& tokens, bool transpose, int stride_group = -1) const {
    Collective c{CollectiveType::all_to_all, everyone_, std::vector<double>(std::size_t(G_) * G_, 0.0), a2a_};
    const int gs = schedule_.group_size, n = G_ / gs;
    for (int i = 0; i < G_; ++i)
      for (int j = 0; j < G_; ++j) {
        // Smart schedule step `stride_group`: group gi sends to group (gi − j) mod n.
        if (stride_group >= 0 && (i / gs - j / gs - stride_group + 2 * n) % n != 0) continue;
        const double b = tokens[std::size_t(i) * G_ + j] * token_bytes_;
        c.bytes[transpose ? std::size_t(j) * G_ + i : std::size_t(i) * G_ + j] = b;
      }
    return c;
  }

  // One MoE layer, forward or backward, after ready_[r] on every rank; returns the op the layer's
  // next ops wait for.
  OpId moe_layer(int l, bool bwd) {
    const char* dir = bwd ? "bwd" : "fwd";
    const auto tokens = exchanged(l);
    // Shadowed experts: broadcast their parameters in the forward pass (issued with the layer).
    std::vector<OpId> bcasts;
    if (!bwd)
      for (int e : plans_[l].shadowed)
        bcasts.push_back(g_.add_collective(Stream::comm, fmt::format("L{}.fwd.shadow_bcast.e{}", l, e),
                                           {CollectiveType::broadcast, ring_from(e), {expert_bytes_}, "ring"}));
    if (schedule_.smart) return smart_layer(l, bwd, tokens, bcasts);

    const OpId dispatch = g_.add_collective(Stream::comm, fmt::format("L{}.{}.a2a_dispatch", l, dir),
                                            exchange(tokens, false), ready_);
    std::vector<OpId> deps{dispatch};
    deps.insert(deps.end(), bcasts.begin(), bcasts.end());
    std::vector<OpId> experts(G_);
    for (int r = 0; r < G_; ++r)
      experts[r] = g_.add_compute(r, fmt::format("L{}.{}.experts", l, dir), expert_work(l, r, 0, G_, true, bwd), deps);
    if (bwd) shadow_grads_[l] = experts;
    return g_.add_collective(Stream::comm, fmt::format("L{}.{}.a2a_combine", l, dir), exchange(tokens, true), experts);
  }

  // FasterMoE's smart schedule (fastermoe.md §3): groups of `group_size` consecutive ranks,
  // n = G / group_size steps. In step j group i sends tokens to group t = (i − j) mod n (S_j),
  // computes the tokens received from group f = (i + j) mod n (C_j), and returns the outputs of
  // its tokens from group t (R_j). Comm stream: S_0..S_{n−1}, then R_0..R_{n−1}; compute stream:
  // C_0..C_{n−1}. Step 0 stays inside the group, step n−1 talks to the ring neighbour: the two
  // cheapest exchanges are the exposed ones.
  OpId smart_layer(int l, bool bwd, const std::vector<double>& tokens, const std::vector<OpId>& bcasts) {
    const char* dir = bwd ? "bwd" : "fwd";
    const int gs = schedule_.group_size, n = G_ / gs;
    std::vector<OpId> S(n), R(n);
    for (int j = 0; j < n; ++j)
      S[j] = g_.add_collective(Stream::comm, fmt::format("L{}.{}.S{}", l, dir, j), exchange(tokens, false, j),
                               j == 0 ? ready_ : std::vector<OpId>{});
    std::vector<std::vector<OpId>> C(n, std::vector<OpId>(G_));
    for (int j = 0; j < n; ++j)
      for (int r = 0; r < G_; ++r) {
        const int from_group = (r / gs + j) % n;
        C[j][r] = g_.add_compute(r, fmt::format("L{}.{}.C{}", l, dir, j),
                                 expert_work(l, r, from_group * gs, from_group * gs + gs, false, bwd), {S[j]});
      }
    // Shadowed experts on the local tokens, after the regular steps (as smart_schedule.h does).
    std::vector<OpId> shadow(G_);
    if (!plans_[l].shadowed.empty())
      for (int r = 0; r < G_; ++r) {
        Compute c = expert_work(l, r, 0, 0, true, bwd);
        shadow[r] = g_.add_compute(r, fmt::format("L{}.{}.shadowed", l, dir), std::move(c), bcasts);
      }
    if (bwd) shadow_grads_[l] = plans_[l].shadowed.empty() ? C[n - 1] : shadow;
    for (int j = 0; j < n; ++j) R[j] = g_.add_collective(Stream::comm, fmt::format("L{}.{}.R{}", l, dir, j),
                                                         exchange(tokens, true, j), C[j]);
    std::vector<OpId> done(R.begin(), R.end());
    if (!plans_[l].shadowed.empty()) done.insert(done.end(), shadow.begin(), shadow.end());
    // One marker op per layer keeps the next ops' dependencies short: an empty all-to-all.
    return g_.add_collective(Stream::comm, fmt::format("L{}.{}.smart_done", l, dir),
                             {CollectiveType::all_to_all, everyone_, std::vector<double>(std::size_t(G_) * G_, 0.0), a2a_},
                             done);
  }

  const IterationInput& in_;
  const std::vector<LayerPlan>& plans_;
  ScheduleOptions schedule_;
  int G_, E_;
  TaskGraph g_;
  std::vector<int> everyone_;
  std::vector<OpId> ready_;
  std::map<int, std::vector<OpId>> shadow_grads_;
  std::string a2a_, ar_;
  double token_bytes_ = 0, scores_bytes_ = 0, permute_bytes_ = 0, expert_bytes_ = 0;
};

}  // namespace

TaskGraph build_moe_iteration(const IterationInput& in, const std::vector<LayerPlan>& plans,
                              const ScheduleOptions& schedule) {
  return Builder(in, plans, schedule).build();
}

}  // namespace moesim
