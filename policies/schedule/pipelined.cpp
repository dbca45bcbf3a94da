// A pipelined layer: ScheMoE's OptSche (ScheMoE §3, Theorem 1, Eqs. 12-14) and Tutel's adaptive
// pipelining at a fixed degree (Tutel §3.3). The layer's exchange and expert work are split into
// r parts along the capacity dimension, each the chain C1 → A1 → D1 → E → C2 → A2 → D2 (compress,
// dispatch, decompress, experts, compress, combine, decompress), added in OptSche's order: on the
// compute stream C1¹..C1ʳ, then (D1ⁱ Eⁱ C2ⁱ) for each part, then D2¹..D2ʳ; on the comm stream
// A1¹..A1ʳ then A2¹..A2ʳ, each starting as soon as its input is ready and the stream is free.
// Compression scales the all-to-all bytes by the wire ratio and costs its codec's time on each
// side; without a compressor the chain is A1 → E → A2 (Tutel's pipelining, in the same order).
// Backward has the same shape. Goldens: tests/golden/schemoe_2node_a100, tutel_pipelined_d2.
#include "layer_ops.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace moesim {
namespace {

class Pipelined final : public LayerSchedule {
 public:
  explicit Pipelined(const Pipelining& p) : p_(p) {}
  std::string name() const override { return "pipelined"; }

  OpId emit(LayerOps& ops, int l, Pass pass) const override {
    const int G = ops.gpus(), r = std::max(1, p_.partitions);
    const auto& codec_cost = p_.codec;
    const bool compress = codec_cost.on();
    const auto tokens = ops.exchanged(l);
    std::vector<double> sent(std::size_t(G), 0.0), received(std::size_t(G), 0.0);  // token-slots
    for (int i = 0; i < G; ++i)
      for (int j = 0; j < G; ++j) {
        sent[std::size_t(i)] += tokens[std::size_t(i) * G + j];
        received[std::size_t(j)] += tokens[std::size_t(i) * G + j];
      }
    auto name = [&](const std::string& what, int part) { return LayerOps::label(l, pass, fmt::format("{}.p{}", what, part)); };
    // C1 and C2 compress, D1 and D2 decompress a part's payload on the compute stream.
    auto codec = [&](int rank, const std::string& what, int part, double slots, std::vector<OpId> deps) {
      const double payload = slots / r * ops.token_bytes();
      Compute c{ComputeKind::compress, {}, 0};
      if (codec_cost.bytes_per_s > 0) c.fixed_seconds = payload / codec_cost.bytes_per_s;
      else c.memory_bytes = payload * (what[0] == 'C' ? codec_cost.compress_traffic : codec_cost.decompress_traffic);
      return ops.compute(rank, name(what, part), std::move(c), std::move(deps));
    };
    // A part's all-to-all. Pipe-A2A as released (Fragile-azalea/ScheMoE 402975e,
    // schemoe/custom/comm/pipe.cpp: each peer's send/recv on the communicator and stream of its lane,
    // is_intra) is two ops: the intra-node lane on the comm stream, the inter-node lane on comm2, each
    // in order across the parts, so a part's intra-node exchange starts once the previous part's
    // intra-node one is done, whatever the network still carries. Other algorithms: one op.
    // A compressor's side all-to-alls follow the payload's on its stream(s) (INT8's bias and scale:
    // int8.cpp all_to_all, one value of the dtype per token each).
    // Each exchange's lane k waits for lane k of the exchange before it (the same stream).
    auto send = [&](const char* what, bool transpose, int part, const std::vector<OpId>& deps) {
      std::vector<OpId> lanes;
      for (int side = 0; side <= codec_cost.side_all_to_alls; ++side) {
        Collective c = ops.exchange(l, transpose);
        c.scale_bytes(side == 0 ? p_.wire_ratio / r : ops.model().dtype_bytes() / ops.token_bytes() / r);
        c.messages = p_.messages_per_peer;
        const std::string base = name(what, part) + (side == 0 ? "" : side == 1 ? ".bias" : ".scale");
        const bool pipe = c.algorithm == "pipe";
        std::vector<OpId> next;
        for (int lane = 0; lane < (pipe ? 2 : 1); ++lane) {
          Collective one = c;
          if (pipe) one.lane = lane;
          next.push_back(ops.collective(lane == 0 ? Stream::comm : Stream::comm2,
                                        pipe ? base + (lane == 0 ? ".intra" : ".inter") : base, std::move(one),
                                        side == 0 ? deps : std::vector<OpId>{lanes[std::size_t(lane)]}));
        }
        lanes = std::move(next);
      }
      return lanes;
    };
    const auto parts = static_cast<std::size_t>(r);
    std::vector<std::vector<OpId>> ready(parts, ops.ready());  // what each part's dispatch waits for
    if (compress)  // each GPU's compression after its encode, by its stream's order
      for (int p = 0; p < r; ++p) {
        ready[std::size_t(p)].assign(std::size_t(G), 0);
        for (int k = 0; k < G; ++k) ready[std::size_t(p)][std::size_t(k)] = codec(k, "C1", p, sent[std::size_t(k)], {});
      }
    std::vector<std::vector<OpId>> A1(parts), A2(parts);
    for (int p = 0; p < r; ++p) A1[std::size_t(p)] = send("a2a_dispatch", false, p, ready[std::size_t(p)]);
    std::vector<std::vector<OpId>> done(parts, std::vector<OpId>(std::size_t(G)));
    for (int p = 0; p < r; ++p)
      for (int k = 0; k < G; ++k) {
        std::vector<OpId> in = A1[std::size_t(p)];
        if (compress) in = {codec(k, "D1", p, received[std::size_t(k)], in)};
        OpId out = ops.expert_op(l, k, name("experts", p), 0, G, pass, in, p, r);
        if (compress) out = codec(k, "C2", p, received[std::size_t(k)], {out});
        done[std::size_t(p)][std::size_t(k)] = out;
      }
    for (int p = 0; p < r; ++p) A2[std::size_t(p)] = send("a2a_combine", true, p, done[std::size_t(p)]);
    std::vector<OpId> last;
    for (int p = 0; p < r; ++p) {
      if (!compress) last.insert(last.end(), A2[std::size_t(p)].begin(), A2[std::size_t(p)].end());
      else
        for (int k = 0; k < G; ++k) last.push_back(codec(k, "D2", p, sent[std::size_t(k)], A2[std::size_t(p)]));
    }
    return ops.join(LayerOps::label(l, pass, "pipeline_done"), last);
  }

 private:
  Pipelining p_;
};

}  // namespace

std::shared_ptr<const LayerSchedule> pipelined_schedule(const Pipelining& p) { return std::make_shared<Pipelined>(p); }

}  // namespace moesim
