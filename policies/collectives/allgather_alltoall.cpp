// Megatron-Core's all-gather token dispatcher (NVIDIA/Megatron-LM
// megatron/core/transformer/moe/token_dispatcher.py, MoEAllGatherTokenDispatcher): the dispatch
// all-gathers every rank's tokens over the EP group, whatever the routing, and each rank keeps
// those of its own experts; the combine reduce-scatters the outputs back, each rank summing its
// own tokens' results. So the exchange is a ring all-gather (dispatch) or reduce-scatter (combine)
// of S = n · `Collective::gathered` bytes (ring_allgather.cpp): every rank sends (n − 1) times its
// tokens however few of them go elsewhere, against the all-to-all's routed token-slots. A
// collective with no `gathered` (a FasterMoE smart-schedule step, which sends a part of the pairs)
// goes as linear.
#include "collectives/collectives.hpp"

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;

namespace {

Lowering lower_allgather_dispatch(const Collective& c, const Cluster& cluster) {
  if (!(c.gathered > 0)) return linear_alltoall.lower(c, cluster);
  const Collective ring{c.combine ? CollectiveType::reduce_scatter : CollectiveType::all_gather, c.group,
                        {c.gathered * double(c.group.size())}, "ring"};
  return lower_rings(ring, cluster, 1);
}

}  // namespace

extern const CollectiveAlgorithm allgather_alltoall = {
    "allgather", CollectiveType::all_to_all,
    "Megatron's all-gather dispatcher: every rank's tokens gathered by all (ring), the combine a reduce-scatter",
    lower_allgather_dispatch};

}  // namespace moesim
