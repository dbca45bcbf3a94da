// Expert parallelism's layer: the dispatch all-to-all sends each token-slot to the GPU computing
// its expert (the owner, or a replica the plan chose), every GPU computes its experts on what it
// received, and the combine all-to-all brings the outputs back. Backward has the same shape, with
// dgrad and wgrad GEMMs. Golden: tests/golden/ep_2node_a100.
#include "layer_ops.hpp"

namespace moesim {
namespace {

class Sequential final : public LayerSchedule {
 public:
  std::string name() const override { return "sequential"; }
  OpId emit(LayerOps& ops, int l, Pass pass) const override {
    const OpId dispatch = ops.collective(Stream::comm, LayerOps::label(l, pass, "a2a_dispatch"), ops.exchange(l, false), ops.ready());
    std::vector<OpId> experts(std::size_t(ops.gpus()));
    for (int r = 0; r < ops.gpus(); ++r)
      experts[std::size_t(r)] = ops.expert_op(l, r, LayerOps::label(l, pass, "experts"), 0, ops.gpus(), pass, {dispatch});
    ops.under_experts(l, pass);  // Pro-Prophet's block-wise transfers, when the plan has them
    return ops.collective(Stream::comm, LayerOps::label(l, pass, "a2a_combine"), ops.exchange(l, true), experts);
  }
};

}  // namespace

std::shared_ptr<const LayerSchedule> sequential_schedule() { return std::make_shared<Sequential>(); }

}  // namespace moesim
