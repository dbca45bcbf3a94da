#include "memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moe_iteration.hpp"

namespace moesim {

StateBytes state_bytes(spec::DType dtype) {
  const double b = dtype_bytes(dtype);
  return {b, b, b >= 4 ? 8.0 : 12.0};  // fp32: Adam's m and v; mixed precision: + fp32 master copy
}

namespace {

// In units of 2-byte activations (Korthikanti et al.'s coefficients): the attention block and its
// two layer norms for `tokens` tokens, and one token-slot of an FFN of width f. A gated FFN keeps
// two f-wide outputs (gate, up) and their product instead of one output and its activation: 2f
// more per token-slot (our count; Korthikanti et al. give the ungated one).
double attention_units(const spec::ModelSpec& s, double tokens) {
  if (s.moe_layer_only()) return 0;  // a layer benchmark: the MoE FFN alone
  const double h = s.d_model(), a = s.heads(), seq = s.seq_len();
  // FlashAttention keeps a 4-byte log-sum-exp per head instead of the scores, softmax and dropout.
  const double scores = s.flash_attention() ? 2 * a : 5 * a * seq;
  return tokens * (11 * h + scores) + tokens * 4 * h;
}
double ffn_slot_units(const spec::ModelSpec& s, double f) { return 3 * s.d_model() + (s.gated_ffn() ? 6 : 4) * f; }

}  // namespace

double layer_activation_bytes(const MoeModel& model, double tokens, double token_slots) {
  const auto& s = model.spec();
  const double h = s.d_model(), k = s.top_k();
  const double scale = model.dtype_bytes() / 2.0;  // the coefficients count 2-byte activations
  // Shared experts: every token is one more slot of each.
  const double ffn = (token_slots + tokens * s.shared_experts()) * ffn_slot_units(s, model.expert_ffn()) + tokens * 2 * k * h;
  return scale * (attention_units(s, tokens) + ffn);
}

double outside_layers_activation_bytes(const MoeModel& model) {
  const auto& s = model.spec();
  const double t = model.tokens_per_gpu();
  const double block = attention_units(s, t) + t * ffn_slot_units(s, s.d_ffn());
  const double dense_blocks = model.dtype_bytes() / 2.0 * s.dense_layers() * block;
  if (s.vocab() == 0) return dense_blocks;
  // The output layer (Korthikanti et al. §4.3, 4sbh(1 + v/h)): the final layer norm's and the
  // output projection's inputs, 2 units each, and the cross-entropy's logits in fp32 whatever the
  // dtype, 4 bytes each (vocabulary-parallel: v/tp of them).
  const double vocab = std::ceil(double(s.vocab()) / model.tp());
  return dense_blocks + model.dtype_bytes() / 2.0 * t * 4 * s.d_model() + 4 * t * vocab;
}

MemoryUse expert_state(const MoeModel& model, double experts) {
  const auto b = state_bytes(model.dtype());
  const double params = experts * model.expert_params();
  return {params * b.param, params * b.grad, params * b.optimizer, 0, 0};
}

MemoryUse dense_memory(const MoeModel& model) {
  const auto b = state_bytes(model.dtype());
  const double params = model.dense_params_per_gpu();
  return {params * b.param, params * b.grad, params * b.optimizer, 0, 0};
}

namespace {

// Population standard deviation.
double stddev(const std::vector<double>& x) {
  if (x.empty()) return 0;
  double mean = 0, var = 0;
  for (double v : x) mean += v / double(x.size());
  for (double v : x) var += (v - mean) * (v - mean) / double(x.size());
  return std::sqrt(var);
}

// The memory of the GPU that needs the most: dense state, its experts' state as the placement
// keeps it, what it gathers or copies, and its activations.
// Also, in `states`, the GPU whose model states (all but activations) need the most.
MemoryUse peak_memory(const IterationInput& in, const IterationPlan& plan, const std::vector<double>& activations,
                      const std::vector<double>& copies, const std::vector<double>& owned, std::vector<double>& each,
                      MemoryUse& states) {
  const MoeModel& model = in.model;
  const auto b = state_bytes(model.dtype());
  const ExpertPlacement where = plan.placement();
  const double P = model.expert_params(), L = double(plan.layers.size()), E = model.experts(), G = in.cluster.num_gpus();
  MemoryUse experts;  // ZeRO's and Tutel's sharding: the same on every GPU
  if (where.kind == ExpertPlacement::data_parallel && where.zero_stage == 3) {  // everything sharded; one layer gathered at a time
    experts = expert_state(model, L * E / G);
    experts.materialized = E * P * (b.param + b.grad);
    experts.materialized_params = E * P * b.param;
  } else if (where.kind == ExpertPlacement::data_parallel) {  // ZeRO-2: parameters kept; gradients and states sharded
    experts = expert_state(model, L * E);
    experts.grads /= G;
    experts.optimizer /= G;
    experts.materialized = E * P * b.grad;
  } else if (where.kind == ExpertPlacement::sharded) {  // 1/s of an expert per GPU; 1/r slices gathered
    // Every layer's gathered slice stays until its backward (autograd keeps it, sharded.cpp); a
    // layer's slice of gradients lives until its reduce-scatter. r = s gathers nothing.
    experts = expert_state(model, L / (G / E));
    if (G / E > where.r) {
      experts.materialized_params = L * P / where.r * b.param;
      experts.materialized = experts.materialized_params + P / where.r * b.grad;
    }
  }
  MemoryUse dense = dense_memory(model);
  if (where.kind == ExpertPlacement::data_parallel) {  // ZeRO shards the layers' dense tensors as their experts (zero.cpp)
    const double layered = L * model.layer_dense_params_per_gpu(), shard = layered * (1 - 1.0 / G);
    dense.grads -= shard * b.grad;
    dense.optimizer -= shard * b.optimizer;
    if (where.zero_stage == 3) {
      dense.params -= shard * b.param;
      experts.materialized += layered / L * (b.param + b.grad);  // one layer's, gathered with its experts
      experts.materialized_params += layered / L * b.param;
    }
  }
  MemoryUse peak;
  for (std::size_t t = 0; t < activations.size(); ++t) {
    // Owners: the experts GPU t owns over all layers (E/G per layer, or as the plans shard them).
    const MemoryUse own = where.kind != ExpertPlacement::owner ? experts : expert_state(model, owned[t]);
    const double copy = copies[t] * P;
    MemoryUse m;
    m.params = dense.params + own.params;
    m.grads = dense.grads + own.grads;
    m.optimizer = dense.optimizer / in.dense_optimizer_shards + own.optimizer / in.expert_optimizer_shards;
    m.activations = activations[t] * in.activation_copies;
    m.materialized = experts.materialized + copy * (b.param + b.grad + (plan.replicas.persistent ? b.optimizer : 0));
    m.materialized_params = experts.materialized_params + copy * b.param;
    each.push_back(m.total());
    if (m.total() > peak.total()) peak = m;
    if (m.states() > states.states()) states = m;
  }
  return peak;
}

}  // namespace

void account_iteration(const IterationInput& in, const IterationPlan& plan, const ExpertLoads& computes) {
  const int G = in.cluster.num_gpus(), E = in.model.experts();
  const bool owners = plan.placement().kind == ExpertPlacement::owner;
  const ReplicaOptions& replicas = plan.replicas;
  std::vector<double> activations(std::size_t(G), outside_layers_activation_bytes(in.model)), copies(std::size_t(G), 0.0),
      owned(std::size_t(G), 0.0);
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    std::vector<double> H(std::size_t(G), 0.0);  // token-slots each GPU computes
    if (plan.placement().kind == ExpertPlacement::data_parallel)  // ZeRO: its own, every expert (no list)
      for (int t = 0; t < G; ++t) H[std::size_t(t)] += double(plan.layers[l].routing.row_sum(t));
    for (int t = 0; t < G; ++t)
      for (const auto& served : computes[l][std::size_t(t)]) H[std::size_t(t)] += double(served.tokens);
    for (int t = 0; t < G; ++t) {  // what GPU t materializes and keeps for this layer
      activations[std::size_t(t)] += layer_activation_bytes(in.model, in.model.tokens_per_gpu(), H[std::size_t(t)]);
      if (!owners) continue;
      double layer_copies = 0;
      for (const auto& served : computes[l][std::size_t(t)])
        if (plan_owner(plan.layers[l], served.expert, G) != t) layer_copies += 1;  // a replica, held until its reduce
      layer_copies = std::max(layer_copies, double(replicas.reserved_copies));
      // Every layer's copies at once, or with re-materialization one layer's at a time.
      copies[std::size_t(t)] = replicas.rematerialize ? std::max(copies[std::size_t(t)], layer_copies) : copies[std::size_t(t)] + layer_copies;
    }
    if (owners)
      for (int e = 0; e < E; ++e) owned[std::size_t(plan_owner(plan.layers[l], e, G))] += 1;
    in.report.moved_experts += int(plan.layers[l].migrations.size());
    in.report.load_stddev.push_back(stddev(H));
    const double mean_load = std::accumulate(H.begin(), H.end(), 0.0) / double(H.size());
    in.report.load_max_mean.push_back(mean_load > 0 ? *std::max_element(H.begin(), H.end()) / mean_load : 1.0);
    in.report.gpu_load.resize(H.size(), 0.0);
    for (std::size_t g = 0; g < H.size(); ++g) in.report.gpu_load[g] += H[g];
  }
  in.report.gpu_memory.clear();
  in.report.memory = peak_memory(in, plan, activations, copies, owned, in.report.gpu_memory, in.report.state_memory);
}

}  // namespace moesim
