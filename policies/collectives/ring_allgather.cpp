// Ring all-gather and ring reduce-scatter of a buffer of S bytes (each rank holds or ends with
// S/n of it) over n ranks: n−1 rounds in which each rank sends a chunk of S/n to its ring
// successor, pipelined into one step (rounds = n−1), so every rank sends (n−1)/n·S; split over the
// C rings of the channels (rings()) as the all-reduce is.
#include "collectives/collectives.hpp"

namespace moesim {

namespace {

Lowering lower_ring_gather(const Collective& c, const Cluster& cluster) { return lower_rings(c, cluster, 1); }


}  // namespace

extern const CollectiveAlgorithm ring_allgather = {
    "ring", CollectiveType::all_gather, "n-1 rounds of S/n around C rings (channels): (n-1)/n*S per rank", lower_ring_gather};

extern const CollectiveAlgorithm ring_reduce_scatter = {
    "ring", CollectiveType::reduce_scatter, "n-1 rounds of S/n around C rings (channels): (n-1)/n*S per rank", lower_ring_gather};

}  // namespace moesim
