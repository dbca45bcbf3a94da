// Hecate's FSSDP (hecate.md): every expert sharded to exactly one owner, and each iteration a
// sparse materialization of the layer (Algorithm 1) predicted from past loads, its parameters
// broadcast (SparseAllGather) under the layer's attention forward and its copies' gradients
// reduced to the owners (SparseReduceScatter) under the attention backward.
#pragma once
#include <vector>

#include "cluster.hpp"

namespace moesim {

/// Algorithm 1 (hecate.md §4.3, reconstructed): the copies to materialize, per expert the GPUs
/// (other than its owner) that get one. `load` the predicted load per expert, `owner` each
/// expert's GPU, `t` the overlap degree (experts whose parameters fit under the attention),
/// `m` the memory capacity per GPU in experts. With m ≥ t the top-t experts go to every GPU;
/// otherwise G·min(m, t) slots are shared among the top-t experts in proportion to their load
/// (at least one each while slots last, at most G − 1), each expert's copies spread over the
/// nodes that do not hold it yet first, then the nodes with more free slots, and inside a node
/// over GPUs with a free slot.
std::vector<std::vector<int>> sparse_materialize(const std::vector<double>& load, const std::vector<int>& owner, int t,
                                                 int m, const Cluster& cluster);

}  // namespace moesim
