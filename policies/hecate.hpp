// Hecate's FSSDP (docs/spec/hecate.md): every expert sharded to exactly one owner, and each iteration a
// sparse materialization of the layer (Algorithm 1) predicted from past loads, its parameters
// broadcast (SparseAllGather) under the layer's attention forward and its copies' gradients
// reduced to the owners (SparseReduceScatter) under the attention backward. Every N iterations
// the shards themselves are planned anew (heterogeneous sharding, Algorithm 2).
#pragma once
#include <vector>

#include "cluster.hpp"
#include "cost_model.hpp"
#include "moe_iteration.hpp"

namespace moesim {

/// Algorithm 1 (docs/spec/hecate.md §4.3, reconstructed): the copies to materialize, per expert the GPUs
/// (other than its owner) that get one. `load` the predicted load per expert, `owner` each
/// expert's GPU, `t` the overlap degree (experts whose parameters fit under the attention),
/// `m` the memory capacity per GPU in experts. With m ≥ t the top-t experts go to every GPU;
/// otherwise G·min(m, t) slots are shared among the top-t experts in proportion to their load
/// (at least one each while slots last, at most G − 1), each expert's copies spread over the
/// nodes that do not hold it yet first, then the nodes with more free slots, and inside a node
/// over GPUs with a free slot.
std::vector<std::vector<int>> sparse_materialize(const std::vector<double>& load, const std::vector<int>& owner, int t,
                                                 int m, const Cluster& cluster);

/// Algorithm 2 (docs/spec/hecate.md §5.2, reconstructed): the sharding plan 𝒫^g, per layer and expert its
/// owner GPU. `Fg[l][e]` the predicted load of expert e of layer l, `t` the overlap degree. Every
/// GPU owns S = L·E/G experts over all layers (any number of one layer's). The top-t experts of
/// each layer (𝒥, materialized everywhere anyway) are placed last, in the slots left; the others
/// (𝒥′) first, layer by layer (layers whose hottest such expert is hottest first), each expert
/// (hottest first) to the least loaded node, then the least loaded GPU on it, ties to fewer free
/// slots, then the lower index. Loads are per layer (a layer's all-to-all is its own).
std::vector<std::vector<int>> heterogeneous_shard(const std::vector<std::vector<double>>& Fg, int t,
                                                  const Cluster& cluster);

/// The calibration stage (docs/spec/hecate.md §4.4), after the gate: Algorithm 1 again on the gate's real
/// loads (`plan.routing`) with the slots the fullest GPU has left (m minus its copies in `plan`).
/// Its new copies join `plan` as late holders (broadcast after the gate, on the critical path)
/// only if the cost model's estimate of the layer with them, plus their broadcasts one after
/// another, is below the estimate without them. Returns whether they were added.
bool calibrate(LayerPlan& plan, int t, int m, const MoeModel& model, const CostModel& cost);

}  // namespace moesim
