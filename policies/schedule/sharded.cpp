// Tutel's adaptive parallelism with fewer experts than GPUs (Tutel §3.2, Fig. 14), r ≥ 1 of
// s = G/E: expert e lives on the s GPUs e·s .. e·s + s − 1, each holding 1/s of it. Each source's
// tokens for e go r times, 1/(s/r) of them to each GPU of e's group; each subgroup of g = s/r GPUs
// all-gathers its 1/r slice of e (after the first dispatch), runs the slice on the tokens it
// received (the GEMMs' hidden dimension d_ffn/r), and the combine brings the r partial outputs to
// the source, which sums them. Backward as released (microsoft/tutel 82af7aa,
// tutel/impls/communicate.py PrimAllgather.zero_gather: an autograd function whose backward is a
// reduce-scatter; the GEMMs keep the gathered weights for their backward): no gather again, only
// the gradients reduce-scattered back to the 1/s shards. With `partitions` > 1 (tutel-released
// pipelines sharded experts) each part is dispatch → experts → combine, the slices gathered once.
// Golden: tests/golden/tutel_sharded_r2.
#include "layer_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moesim {
namespace {

class Sharded final : public LayerSchedule {
 public:
  Sharded(int r, int partitions) : r_(r), partitions_(std::max(1, partitions)) {}
  std::string name() const override { return "sharded"; }
  ExpertPlacement placement() const override { return {ExpertPlacement::sharded, 0, r_}; }

  OpId emit(LayerOps& ops, int l, Pass pass) const override {
    const int G = ops.gpus(), E = ops.experts(), s = G / E, r = r_, g = s / r, parts = partitions_;
    const bool bwd = pass == Pass::backward;
    auto part_name = [&](const char* what, int p) {
      return LayerOps::label(l, pass, parts > 1 ? fmt::format("{}.p{}", what, p) : std::string(what));
    };
    auto part_bytes = [&](bool transpose) {
      Collective c = ops.exchange(l, transpose);
      if (parts > 1) c.scale_bytes(1.0 / parts);
      return c;
    };
    auto subgroup = [&](int first) {
      std::vector<int> sub(static_cast<std::size_t>(g));
      std::iota(sub.begin(), sub.end(), first);
      return sub;
    };
    std::vector<OpId> dispatch(static_cast<std::size_t>(parts));
    for (int p = 0; p < parts; ++p)
      dispatch[std::size_t(p)] = ops.collective(Stream::comm, part_name("a2a_dispatch", p), part_bytes(false), ops.ready());
    std::vector<OpId> gathered(static_cast<std::size_t>(G));
    const double slice = ops.expert_bytes() / r;  // what a subgroup gathers
    for (int first = 0; first < G; first += g) {
      OpId id = dispatch.front();
      if (g > 1 && !bwd)
        id = ops.collective(Stream::comm, LayerOps::label(l, pass, fmt::format("expert_allgather.g{}", first / g)),
                            {CollectiveType::all_gather, subgroup(first), {slice}, "ring"}, {dispatch.front()});
      for (int t = first; t < first + g; ++t) gathered[std::size_t(t)] = id;
    }
    const auto& R = ops.routing(l);
    const auto d = std::uint64_t(ops.model().spec().d_model()), h = std::uint64_t(ops.model().expert_ffn() / r);
    const auto h_in = ops.model().spec().gated_ffn() ? 2 * h : h;  // gate and up projections, gated
    std::vector<double> received(static_cast<std::size_t>(E), 0.0);  // by each GPU of expert e's subgroup
    for (int e = 0; e < E; ++e)
      for (int src = 0; src < G; ++src) received[std::size_t(e)] += double(R.at(src, e)) / g;
    std::vector<std::vector<OpId>> experts(static_cast<std::size_t>(parts), std::vector<OpId>(static_cast<std::size_t>(G)));
    for (int p = 0; p < parts; ++p)
      for (int t = 0; t < G; ++t) {
        const auto m = std::uint64_t(std::llround(received[std::size_t(t / s)] / parts));
        Compute c{ComputeKind::grouped_gemm, {}, 0};
        if (m > 0) {
          const std::vector<Gemm> fwd = {{m, h_in, d, 1}, {m, d, h, 1}};
          c.gemms = bwd ? backward_gemms(fwd) : fwd;
          c.tokens = long(m);
        }
        experts[std::size_t(p)][std::size_t(t)] =
            ops.compute(t, part_name("experts", p), std::move(c), {dispatch[std::size_t(p)], gathered[std::size_t(t)]});
      }
    std::vector<OpId> combines;
    for (int p = 0; p < parts; ++p)
      combines.push_back(ops.collective(Stream::comm, part_name("a2a_combine", p), part_bytes(true), experts[std::size_t(p)]));
    if (bwd && g > 1)
      for (int first = 0; first < G; first += g) {
        std::vector<OpId> deps;
        for (const auto& part : experts) deps.insert(deps.end(), part.begin() + first, part.begin() + first + g);
        ops.add_gradient_reduce(ops.collective(Stream::comm, LayerOps::label(l, pass, fmt::format("expert_reduce_scatter.g{}", first / g)),
                                               {CollectiveType::reduce_scatter, subgroup(first), {slice}, "ring"}, deps));
      }
    // The r partial outputs of each token summed at its source: read r copies, write one.
    std::vector<OpId> sums(static_cast<std::size_t>(G));
    for (int src = 0; src < G; ++src) {
      double slots = 0;
      for (int e = 0; e < E; ++e) slots += double(R.at(src, e));
      sums[std::size_t(src)] = ops.compute(src, LayerOps::label(l, pass, "partial_sum"),
                                           {ComputeKind::elementwise, {}, slots * ops.token_bytes() * (r + 1)}, combines);
    }
    return ops.join(LayerOps::label(l, pass, "sharded_done"), sums);
  }

 private:
  int r_, partitions_;
};

}  // namespace

std::shared_ptr<const LayerSchedule> sharded_schedule(int r, int partitions) { return std::make_shared<Sharded>(r, partitions); }

}  // namespace moesim
