#include "data_path.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "host_comm.hpp"
#include "host_kernels.hpp"
#include "moe_iteration.hpp"
#include "policy.hpp"

namespace moesim::hw {

namespace {

std::vector<float> random_values(Rng& rng, std::size_t n, double scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = float((2 * rng.uniform() - 1) * scale);
  return v;
}

/// A rank's gate decisions: per token, its k experts and their weights.
struct Gated {
  std::vector<std::uint32_t> expert;
  std::vector<float> weight;
};

Gated run_gate(const LayerProblem& p, int rank) {
  std::vector<float> scores(std::size_t(p.T) * p.E);
  host::gemm(false, false, p.T, p.E, p.d, p.x[std::size_t(rank)].data(), p.w_gate.data(), scores.data());
  for (int t = 0; t < p.T; ++t)
    for (int e = 0; e < p.E; ++e) scores[std::size_t(t) * p.E + e] += p.bias[std::size_t(e)];
  Gated g{std::vector<std::uint32_t>(std::size_t(p.T) * p.k), std::vector<float>(std::size_t(p.T) * p.k)};
  host::top_k_softmax(scores.data(), p.T, p.E, p.k, g.expert.data(), g.weight.data());
  return g;
}

/// A rank's token slots for one expert, in token order: (token, gate weight).
std::vector<std::pair<int, float>> slots_for(const LayerProblem& p, const Gated& g, int e) {
  std::vector<std::pair<int, float>> s;
  for (int t = 0; t < p.T; ++t)
    for (int j = 0; j < p.k; ++j)
      if (int(g.expert[std::size_t(t) * p.k + j]) == e) s.emplace_back(t, g.weight[std::size_t(t) * p.k + j]);
  return s;
}

/// Where a part of source `src`'s slots [from, to) for an expert is computed, with which slice of
/// the hidden dimension (slice −1: the whole expert).
struct Part {
  int gpu, slice;
  std::size_t from, to;
};
/// A copy of (a slice of) an expert on a GPU, and the parts it computes, in source order.
struct Unit {
  int gpu, slice;
  std::vector<std::pair<int, Part>> parts;  // (source, part)
};

/// The plan's answer to "who computes source src's tokens for e" (moe_iteration.hpp's rules).
std::vector<Part> parts_of(const LayerPlan& plan, const ExpertPlacement& where, const Cluster& cluster, int src, int e,
                           std::size_t count) {
  const int G = cluster.num_gpus(), E = plan.routing.experts;
  if (where.kind == ExpertPlacement::data_parallel) return {{src, -1, 0, count}};  // ZeRO: every GPU, own tokens
  if (where.kind == ExpertPlacement::sharded) {  // Tutel: 1/g of the tokens to a GPU of each of the r subgroups, slice p there
    const int sg = G / E, r = where.r, g = sg / r;
    std::vector<Part> parts;
    for (int c = 0; c < g; ++c)
      for (int p = 0; p < r; ++p) parts.push_back({e * sg + p * g + c, r > 1 ? p : -1, count * c / g, count * (c + 1) / g});
    return parts;
  }
  return {{expert_target(plan, cluster, src, e), -1, 0, count}};
}

constexpr long tag(int phase, int e, int slice) { return (long(phase) << 40) | (long(e) << 16) | long(slice + 1); }
enum Phase { kWeights = 1, kMigrate, kDispatch, kCombine, kGradDispatch, kGradCombine, kReduce };

}  // namespace

LayerProblem::LayerProblem(const MoeModel& model, int gpus, std::uint64_t seed, int iteration, double skew)
    : G(gpus), T(model.tokens_per_gpu()), d(int(model.spec().d_model())), h(int(model.spec().d_ffn())),
      E(model.experts()), k(model.top_k()) {
  Rng weights(derive_seed(seed, 0xfeed));  // the same weights every iteration
  w_gate = random_values(weights, std::size_t(d) * E, 1.0);
  for (int e = 0; e < E; ++e) bias.push_back(float(skew * std::max(0.0, 1.0 - e / 3.0)));  // experts 0-2 hot
  const double s1 = 1 / std::sqrt(double(d)), s2 = 1 / std::sqrt(double(h));
  for (int e = 0; e < E; ++e) {
    w1.push_back(random_values(weights, std::size_t(d) * h, s1));
    w2.push_back(random_values(weights, std::size_t(h) * d, s2));
  }
  Rng data(derive_seed(seed, 1 + std::uint64_t(iteration)));
  for (int r = 0; r < G; ++r) {
    x.push_back(random_values(data, std::size_t(T) * d, 1.0));
    dout.push_back(random_values(data, std::size_t(T) * d, 1.0));
  }
}

LayerNumbers reference_layer(const LayerProblem& p) {
  LayerNumbers n;
  n.routing = RoutingMatrix(p.G, p.E);
  n.dw1.assign(std::size_t(p.E), std::vector<float>(std::size_t(p.d) * p.h, 0.0f));
  n.dw2.assign(std::size_t(p.E), std::vector<float>(std::size_t(p.h) * p.d, 0.0f));
  std::vector<float> pre(std::size_t(p.h)), act(std::size_t(p.h)), y(std::size_t(p.d)), dy(std::size_t(p.d)),
      dh(std::size_t(p.h)), dx(std::size_t(p.d));
  for (int r = 0; r < p.G; ++r) {
    const Gated g = run_gate(p, r);
    auto& out = n.out.emplace_back(std::size_t(p.T) * p.d, 0.0f);
    auto& dxr = n.dx.emplace_back(std::size_t(p.T) * p.d, 0.0f);
    for (int t = 0; t < p.T; ++t)
      for (int j = 0; j < p.k; ++j) {
        const int e = int(g.expert[std::size_t(t) * p.k + j]);
        const float w = g.weight[std::size_t(t) * p.k + j];
        ++n.routing.mutable_at(r, e);
        const float* xt = p.x[std::size_t(r)].data() + std::size_t(t) * p.d;
        const auto& W1 = p.w1[std::size_t(e)];
        const auto& W2 = p.w2[std::size_t(e)];
        host::gemm(false, false, 1, p.h, p.d, xt, W1.data(), pre.data());
        for (int i = 0; i < p.h; ++i) act[std::size_t(i)] = std::max(0.0f, pre[std::size_t(i)]);
        host::gemm(false, false, 1, p.d, p.h, act.data(), W2.data(), y.data());
        for (int i = 0; i < p.d; ++i) out[std::size_t(t) * p.d + i] += w * y[std::size_t(i)];
        for (int i = 0; i < p.d; ++i) dy[std::size_t(i)] = w * p.dout[std::size_t(r)][std::size_t(t) * p.d + i];
        host::gemm(false, true, 1, p.h, p.d, dy.data(), W2.data(), dh.data());
        for (int i = 0; i < p.h; ++i)
          if (pre[std::size_t(i)] <= 0) dh[std::size_t(i)] = 0;
        host::gemm(true, false, p.h, p.d, 1, act.data(), dy.data(), n.dw2[std::size_t(e)].data(), 1);
        host::gemm(true, false, p.d, p.h, 1, xt, dh.data(), n.dw1[std::size_t(e)].data(), 1);
        host::gemm(false, true, 1, p.d, p.h, dh.data(), W1.data(), dx.data());
        for (int i = 0; i < p.d; ++i) dxr[std::size_t(t) * p.d + i] += dx[std::size_t(i)];
      }
  }
  for (int e = 0; e < p.E; ++e) n.owner.push_back(p.E >= p.G ? expert_owner(e, p.E, p.G) : e * (p.G / p.E));
  return n;
}

namespace {

/// The layer on host ranks, following `plan` and the schedule's placement `where`.
LayerNumbers distributed_layer(const LayerProblem& p, const std::vector<Gated>& gated, const LayerPlan& plan,
                               const ExpertPlacement& where, const Cluster& cluster, GemmFn gemm) {
  const int G = p.G, E = p.E, d = p.d;
  const bool sharded = where.kind == ExpertPlacement::sharded;
  const int r = sharded ? where.r : 1;
  auto slice_cols = [&](int slice) { return slice < 0 ? std::pair{0, p.h} : std::pair{slice * p.h / r, (slice + 1) * p.h / r}; };
  // Who owns, who holds the weights at the start (a migration's old owner), who computes.
  std::vector<int> owner(static_cast<std::size_t>(E)), home(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    owner[std::size_t(e)] = sharded ? e * (G / E) : plan_owner(plan, e, G);
    home[std::size_t(e)] = owner[std::size_t(e)];
  }
  // A migration to the owner moves the expert (SmartMoE); one to another GPU makes a persistent
  // copy there (FlexMoE), which the copies below send like any other.
  for (const Migration& m : plan.migrations)
    if (m.to == owner[std::size_t(m.expert)]) home[std::size_t(m.expert)] = m.from;
  std::vector<std::vector<std::vector<std::pair<int, float>>>> slots(static_cast<std::size_t>(G));  // [src][e]
  std::vector<std::vector<std::vector<Part>>> parts(static_cast<std::size_t>(G));                  // [src][e]
  std::vector<std::vector<Unit>> units(static_cast<std::size_t>(E));
  for (int src = 0; src < G; ++src)
    for (int e = 0; e < E; ++e) {
      slots[std::size_t(src)].push_back(slots_for(p, gated[std::size_t(src)], e));
      const std::size_t count = slots[std::size_t(src)].back().size();
      parts[std::size_t(src)].push_back(count ? parts_of(plan, where, cluster, src, e, count) : std::vector<Part>{});
      for (const Part& part : parts[std::size_t(src)].back()) {
        if (part.from == part.to) continue;
        auto& us = units[std::size_t(e)];
        auto it = std::find_if(us.begin(), us.end(), [&](const Unit& u) { return u.gpu == part.gpu && u.slice == part.slice; });
        if (it == us.end()) it = us.insert(us.end(), Unit{part.gpu, part.slice, {}});
        it->parts.emplace_back(src, part);
      }
    }
  LayerNumbers n;
  n.owner = owner;
  for (int e = 0; e < E; ++e) n.migrations += home[std::size_t(e)] != owner[std::size_t(e)];
  for (int e = 0; e < E; ++e) {
    std::vector<int> gpus;
    for (const Unit& u : units[std::size_t(e)])
      if (u.gpu != owner[std::size_t(e)]) gpus.push_back(u.gpu);
    std::sort(gpus.begin(), gpus.end());
    n.copies += int(std::unique(gpus.begin(), gpus.end()) - gpus.begin());
  }
  n.routing = plan.routing;
  n.out.assign(std::size_t(G), std::vector<float>(std::size_t(p.T) * d, 0.0f));
  n.dx.assign(std::size_t(G), std::vector<float>(std::size_t(p.T) * d, 0.0f));
  n.dw1.assign(std::size_t(E), {});
  n.dw2.assign(std::size_t(E), {});

  HostComm comm;
  auto weights_of = [&](int e, int slice) {  // (W1[:, cols], W2[cols, :]) of the home's copy
    const auto [c0, c1] = slice_cols(slice);
    const int w = c1 - c0;
    std::vector<float> both(std::size_t(2) * d * w);
    for (int i = 0; i < d; ++i)
      for (int c = 0; c < w; ++c) both[std::size_t(i) * w + c] = p.w1[std::size_t(e)][std::size_t(i) * p.h + c0 + c];
    std::copy_n(p.w2[std::size_t(e)].begin() + std::ptrdiff_t(c0) * d, std::size_t(w) * d, both.begin() + std::ptrdiff_t(d) * w);
    return both;
  };
  auto rank_main = [&](int rank) {
    // Copies: the home sends each computing GPU its (slice of the) expert; a migrated expert first
    // travels whole to its new owner.
    for (int e = 0; e < E; ++e) {
      if (home[std::size_t(e)] != rank) continue;
      if (owner[std::size_t(e)] != rank) comm.send(rank, owner[std::size_t(e)], tag(kMigrate, e, -1), weights_of(e, -1));
      for (const Unit& u : units[std::size_t(e)])
        if (u.gpu != rank) comm.send(rank, u.gpu, tag(kWeights, e, u.slice), weights_of(e, u.slice));
    }
    for (int e = 0; e < E; ++e)
      if (owner[std::size_t(e)] == rank && home[std::size_t(e)] != rank)
        (void)comm.recv(rank, home[std::size_t(e)], tag(kMigrate, e, -1), fmt::format("expert {}'s migration", e));
    // Dispatch: rows of x for each part.
    const auto& x = p.x[std::size_t(rank)];
    auto send_rows = [&](int phase, const std::vector<float>& src, bool weighted) {
      for (int e = 0; e < E; ++e)
        for (const Part& part : parts[std::size_t(rank)][std::size_t(e)]) {
          std::vector<float> rows;
          for (std::size_t s = part.from; s < part.to; ++s) {
            const auto [t, w] = slots[std::size_t(rank)][std::size_t(e)][s];
            for (int i = 0; i < d; ++i) rows.push_back((weighted ? w : 1.0f) * src[std::size_t(t) * d + i]);
          }
          comm.send(rank, part.gpu, tag(phase, e, part.slice), std::move(rows));
        }
    };
    send_rows(kDispatch, x, false);
    // Experts: each unit on this rank, forward.
    struct Work {
      const Unit* unit;
      int e, w;
      std::vector<float> W, xs, pre, act;
    };
    std::vector<Work> work;
    for (int e = 0; e < E; ++e)
      for (const Unit& u : units[std::size_t(e)]) {
        if (u.gpu != rank) continue;
        const auto [c0, c1] = slice_cols(u.slice);
        Work wk{&u, e, c1 - c0, {}, {}, {}, {}};
        wk.W = home[std::size_t(e)] == rank ? weights_of(e, u.slice)
                                            : comm.recv(rank, home[std::size_t(e)], tag(kWeights, e, u.slice),
                                                        fmt::format("expert {}'s parameters", e));
        for (const auto& [src, part] : u.parts) {
          auto rows = comm.recv(rank, src, tag(kDispatch, e, u.slice), fmt::format("tokens for expert {}", e));
          wk.xs.insert(wk.xs.end(), rows.begin(), rows.end());
        }
        const std::size_t m = wk.xs.size() / std::size_t(d);
        wk.pre.resize(m * std::size_t(wk.w));
        gemm(false, false, m, std::size_t(wk.w), std::size_t(d), wk.xs.data(), wk.W.data(), wk.pre.data(), 0.0f);
        wk.act = wk.pre;
        for (auto& v : wk.act) v = std::max(0.0f, v);
        std::vector<float> y(m * std::size_t(d));
        gemm(false, false, m, std::size_t(d), std::size_t(wk.w), wk.act.data(), wk.W.data() + std::size_t(d) * wk.w, y.data(), 0.0f);
        std::size_t row = 0;
        for (const auto& [src, part] : u.parts) {
          const std::size_t rows = part.to - part.from;
          comm.send(rank, src, tag(kCombine, e, u.slice),
                    std::vector<float>(y.begin() + std::ptrdiff_t(row * d), y.begin() + std::ptrdiff_t((row + rows) * d)));
          row += rows;
        }
        work.push_back(std::move(wk));
      }
    // Combine: out[t] += g_t · y (a slice's partial outputs add up to the expert's).
    auto receive_rows = [&](int phase, std::vector<float>& dst, bool weighted, const char* what) {
      for (int e = 0; e < E; ++e)
        for (const Part& part : parts[std::size_t(rank)][std::size_t(e)]) {
          const auto rows = comm.recv(rank, part.gpu, tag(phase, e, part.slice), fmt::format("{} of expert {}", what, e));
          for (std::size_t s = part.from; s < part.to; ++s) {
            const auto [t, w] = slots[std::size_t(rank)][std::size_t(e)][s];
            for (int i = 0; i < d; ++i) dst[std::size_t(t) * d + i] += (weighted ? w : 1.0f) * rows[(s - part.from) * d + i];
          }
        }
    };
    receive_rows(kCombine, n.out[std::size_t(rank)], true, "outputs");
    // Backward: dy = g_t · dout[t] to the same parts; dW and dx there; dx back.
    send_rows(kGradDispatch, p.dout[std::size_t(rank)], true);
    std::vector<std::vector<float>> grads;  // of the experts this rank owns and computes, in order
    for (Work& wk : work) {
      const Unit& u = *wk.unit;
      std::vector<float> dy;
      for (const auto& [src, part] : u.parts) {
        auto rows = comm.recv(rank, src, tag(kGradDispatch, wk.e, u.slice), fmt::format("gradients for expert {}", wk.e));
        dy.insert(dy.end(), rows.begin(), rows.end());
      }
      const std::size_t m = dy.size() / std::size_t(d), w = std::size_t(wk.w);
      const float* W1 = wk.W.data();
      const float* W2 = wk.W.data() + std::size_t(d) * w;
      std::vector<float> dh(m * w), dW1(std::size_t(d) * w), dW2(w * std::size_t(d)), dxs(m * std::size_t(d));
      gemm(false, true, m, w, std::size_t(d), dy.data(), W2, dh.data(), 0.0f);
      for (std::size_t i = 0; i < dh.size(); ++i)
        if (wk.pre[i] <= 0) dh[i] = 0;
      gemm(true, false, w, std::size_t(d), m, wk.act.data(), dy.data(), dW2.data(), 0.0f);
      gemm(true, false, std::size_t(d), w, m, wk.xs.data(), dh.data(), dW1.data(), 0.0f);
      gemm(false, true, m, std::size_t(d), w, dh.data(), W1, dxs.data(), 0.0f);
      std::size_t row = 0;
      for (const auto& [src, part] : u.parts) {
        const std::size_t rows = part.to - part.from;
        comm.send(rank, src, tag(kGradCombine, wk.e, u.slice),
                  std::vector<float>(dxs.begin() + std::ptrdiff_t(row * d), dxs.begin() + std::ptrdiff_t((row + rows) * d)));
        row += rows;
      }
      std::vector<float> g(dW1);
      g.insert(g.end(), dW2.begin(), dW2.end());
      if (owner[std::size_t(wk.e)] != rank) comm.send(rank, owner[std::size_t(wk.e)], tag(kReduce, wk.e, u.slice), std::move(g));
      else grads.push_back(std::move(g));
    }
    receive_rows(kGradCombine, n.dx[std::size_t(rank)], false, "input gradients");
    // Reduce: the owner sums every copy's gradients, unit by unit (a slice into its columns/rows).
    std::size_t own = 0;
    for (int e = 0; e < E; ++e) {
      if (owner[std::size_t(e)] != rank) continue;
      auto& dw1 = n.dw1[std::size_t(e)];
      auto& dw2 = n.dw2[std::size_t(e)];
      dw1.assign(std::size_t(d) * p.h, 0.0f);
      dw2.assign(std::size_t(p.h) * d, 0.0f);
      for (const Unit& u : units[std::size_t(e)]) {
        const std::vector<float> g = u.gpu == rank ? std::move(grads[own++])
                                                   : comm.recv(rank, u.gpu, tag(kReduce, e, u.slice), fmt::format("expert {}'s gradients", e));
        const auto [c0, c1] = slice_cols(u.slice);
        const int w = c1 - c0;
        for (int i = 0; i < d; ++i)
          for (int c = 0; c < w; ++c) dw1[std::size_t(i) * p.h + c0 + c] += g[std::size_t(i) * w + c];
        for (std::size_t i = 0; i < std::size_t(w) * d; ++i) dw2[std::size_t(c0) * d + i] += g[std::size_t(d) * w + i];
      }
    }
  };
  std::vector<std::string> errors(static_cast<std::size_t>(G));
  {
    std::vector<std::jthread> threads;
    for (int rank = 0; rank < G; ++rank)
      threads.emplace_back([&, rank] {
        try {
          rank_main(rank);
        } catch (const std::exception& e) {
          errors[std::size_t(rank)] = e.what();
        }
      });
  }
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  n.bytes_moved = comm.bytes_sent();
  return n;
}

}  // namespace

DataPathRun run_data_path(const Cluster& cluster, const MoeModel& model, const GpuModel& gpu,
                          const spec::PolicySpec& policy_spec, int iterations, std::uint64_t seed, double skew,
                          GemmFn expert_gemm) {
  auto policy = make_policy(policy_spec);
  policy->validate(cluster, model, policy_spec);
  DataPathRun run;
  for (int it = 0; it < iterations; ++it) {
    const LayerProblem& p = run.problems.emplace_back(model, cluster.num_gpus(), seed, it, skew);
    std::vector<Gated> gated;
    RoutingMatrix R(p.G, p.E);
    for (int rank = 0; rank < p.G; ++rank) {
      gated.push_back(run_gate(p, rank));
      for (std::uint32_t e : gated.back().expert) ++R.mutable_at(rank, int(e));
    }
    const std::vector<RoutingMatrix> routing(std::size_t(model.layers()), R);
    PolicyReport report;
    const IterationInput input{cluster, model, gpu, policy_spec, routing, report};
    const IterationPlan plan = policy->plan(input);
    if (plan.layers.empty()) throw std::logic_error("data path: policy " + policy->name() + " built no plan");
    if (plan.layers.front().routing.counts() != R.counts())
      throw std::invalid_argument("data path: policy " + policy->name() +
                                  " changed the gate's routing (a gate policy changes the model by design)");
    run.numbers.push_back(distributed_layer(p, gated, plan.layers.front(), plan.placement(), cluster, expert_gemm));
  }
  return run;
}

double max_relative_difference(const LayerNumbers& a, const LayerNumbers& b) {
  double worst = 0;
  auto compare = [&](const std::vector<std::vector<float>>& x, const std::vector<std::vector<float>>& y) {
    if (x.size() != y.size()) {
      worst = std::numeric_limits<double>::infinity();
      return;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (x[i].size() != y[i].size()) {
        worst = std::numeric_limits<double>::infinity();
        return;
      }
      double scale = 1e-12, diff = 0;
      for (std::size_t j = 0; j < x[i].size(); ++j) {
        scale = std::max(scale, double(std::abs(y[i][j])));
        diff = std::max(diff, double(std::abs(x[i][j] - y[i][j])));
      }
      worst = std::max(worst, diff / scale);
    }
  };
  compare(a.out, b.out);
  compare(a.dx, b.dx);
  compare(a.dw1, b.dw1);
  compare(a.dw2, b.dw2);
  return worst;
}

}  // namespace moesim::hw
