// Plain expert parallelism (DeepSpeed-MoE / FastMoE / GShard style), the baseline every seed
// system compares against. Expert e lives on GPU e / (E/G); each iteration, per MoE layer:
//
//   forward : attention -> gate -> encode -> all-to-all dispatch -> experts -> all-to-all combine -> decode
//   backward: decode' -> all-to-all -> experts' (dgrad + wgrad) -> all-to-all -> encode' -> gate' -> attention'
//   then    : ring all-reduce of the dense (non-expert) gradients -> optimizer step
//
// Compute ops run on the compute stream, all-to-alls and the all-reduce on the comm stream; in
// this sequential schedule nothing overlaps. Bytes on the wire are tokens × d_model × dtype size.
#include <fmt/format.h>

#include "errors.hpp"
#include "policy.hpp"

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

class ExpertParallel final : public Policy {
 public:
  std::string name() const override { return "ep"; }

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    if (model.experts() % cluster.num_gpus() != 0)
      throw FieldError("model.experts",
                       fmt::format("expert parallelism places E/G experts on each GPU: {} experts on {} GPUs is not "
                                   "a whole number; use a multiple of {}",
                                   model.experts(), cluster.num_gpus(), cluster.num_gpus()));
    collective_algorithm(spec, CollectiveType::all_to_all);
    collective_algorithm(spec, CollectiveType::all_reduce);
  }

  TaskGraph build_iteration(const IterationInput& in) override {
    const int G = in.cluster.num_gpus(), E = in.model.experts(), L = in.model.layers();
    const int local = E / G;
    const double token_bytes = in.model.token_bytes();
    const double T = in.model.tokens_per_gpu(), k = in.model.top_k();
    const std::string a2a_algo = collective_algorithm(in.spec, CollectiveType::all_to_all);
    const std::string ar_algo = collective_algorithm(in.spec, CollectiveType::all_reduce);
    std::vector<int> everyone(G);
    for (int r = 0; r < G; ++r) everyone[r] = r;

    // bytes[i][j] of the dispatch: tokens GPU i routes to experts on GPU j; the combine is its transpose.
    auto exchange = [&](const RoutingMatrix& R, bool transpose) {
      Collective c{CollectiveType::all_to_all, everyone, std::vector<double>(std::size_t(G) * G, 0.0), a2a_algo};
      for (int i = 0; i < G; ++i)
        for (int e = 0; e < E; ++e) {
          const int j = e / local;
          c.bytes[transpose ? std::size_t(j) * G + i : std::size_t(i) * G + j] += double(R.at(i, e)) * token_bytes;
        }
      return c;
    };
    auto expert_work = [&](const RoutingMatrix& R, int rank, bool bwd) {
      Compute c{ComputeKind::grouped_gemm, {}, 0};
      for (int e = rank * local; e < (rank + 1) * local; ++e) {
        const auto fwd = in.model.expert_gemms(R.expert_load(e));
        const auto gemms = bwd ? backward(fwd) : fwd;
        c.gemms.insert(c.gemms.end(), gemms.begin(), gemms.end());
      }
      return c;
    };
    const auto dense = in.model.dense_forward_gemms();
    const Gemm gate = in.model.gate_gemm();
    const double scores_bytes = 2 * T * E * 4;                 // softmax + top-k over fp32 scores
    const double permute_bytes = 2 * T * k * token_bytes;      // read + write each routed token

    TaskGraph g(G);
    std::vector<OpId> ready(G);  // each rank's last op before the next collective
    for (int l = 0; l < L; ++l) {
      const auto& R = in.routing[l];
      for (int r = 0; r < G; ++r) {
        g.add_compute(r, fmt::format("L{}.fwd.attention", l), {ComputeKind::gemm, dense, 0});
        g.add_compute(r, fmt::format("L{}.fwd.gate", l), {ComputeKind::gate, {gate}, scores_bytes});
        ready[r] = g.add_compute(r, fmt::format("L{}.fwd.encode", l), {ComputeKind::encode, {}, permute_bytes});
      }
      const OpId dispatch = g.add_collective(Stream::comm, fmt::format("L{}.fwd.a2a_dispatch", l), exchange(R, false), ready);
      for (int r = 0; r < G; ++r) ready[r] = g.add_compute(r, fmt::format("L{}.fwd.experts", l), expert_work(R, r, false), {dispatch});
      const OpId combine = g.add_collective(Stream::comm, fmt::format("L{}.fwd.a2a_combine", l), exchange(R, true), ready);
      for (int r = 0; r < G; ++r)
        g.add_compute(r, fmt::format("L{}.fwd.decode", l), {ComputeKind::decode, {}, permute_bytes}, {combine});
    }
    for (int l = L - 1; l >= 0; --l) {
      const auto& R = in.routing[l];
      for (int r = 0; r < G; ++r)
        ready[r] = g.add_compute(r, fmt::format("L{}.bwd.decode", l), {ComputeKind::decode, {}, permute_bytes});
      const OpId to_experts = g.add_collective(Stream::comm, fmt::format("L{}.bwd.a2a_dispatch", l), exchange(R, false), ready);
      for (int r = 0; r < G; ++r) ready[r] = g.add_compute(r, fmt::format("L{}.bwd.experts", l), expert_work(R, r, true), {to_experts});
      const OpId back = g.add_collective(Stream::comm, fmt::format("L{}.bwd.a2a_combine", l), exchange(R, true), ready);
      for (int r = 0; r < G; ++r) {
        g.add_compute(r, fmt::format("L{}.bwd.encode", l), {ComputeKind::encode, {}, permute_bytes}, {back});
        g.add_compute(r, fmt::format("L{}.bwd.gate", l), {ComputeKind::gate, backward({gate}), scores_bytes});
        ready[r] = g.add_compute(r, fmt::format("L{}.bwd.attention", l), {ComputeKind::gemm, backward(dense), 0});
      }
    }
    // Data parallelism over all GPUs for the dense parameters; experts are not replicated in EP.
    const double dense_params = in.model.dense_params_per_layer() * L;
    const double dense_bytes = dense_params * in.model.dtype_bytes();
    const OpId allreduce = g.add_collective(Stream::comm, "allreduce.dense",
                                            {CollectiveType::all_reduce, everyone, {dense_bytes}, ar_algo}, ready);
    // Adam with fp32 master weights and moments: read p, m, v (fp32) and g; write p, m, v and the
    // low-precision copy.
    const double params = dense_params + local * L * in.model.expert_params();
    const double adam_bytes = params * (6 * 4 + 2 * in.model.dtype_bytes());
    for (int r = 0; r < G; ++r) g.add_compute(r, "optimizer", {ComputeKind::optimizer, {}, adam_bytes}, {allreduce});
    return g;
  }
};

}  // namespace

std::unique_ptr<Policy> make_expert_parallel() { return std::make_unique<ExpertParallel>(); }

}  // namespace moesim
