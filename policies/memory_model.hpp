// The memory a GPU needs for one training iteration, by what holds it. One model for every policy:
// the iteration builder counts what each GPU owns and what it materializes, this file prices it.
//
//   state per parameter (docs/spec/hecate.md §2, §14): the compute dtype's parameters and gradients, and
//     Adam's states: with fp16/bf16 an fp32 master copy, m and v (12 B: "optimizer states ≥ 6× the
//     parameter size"); with fp32, m and v (8 B).
//   activations kept for the backward, per layer and token (Korthikanti et al. 2022, "Reducing
//     Activation Recomputation in Large Transformer Models", Eq. 1, no recomputation, 2-byte
//     activations, scaled by the dtype): attention 11·h + 5·a·s (the a heads' s × s scores and
//     their softmax and dropout; with FlashAttention 2·a, its fp32 log-sum-exp), two layer norms 4·h, the FFN 3·h + 4·f per token-slot (input,
//     f-wide GEMM output and activation, dropout mask; 19·h for f = 4h), and the MoE layer's
//     dispatch and combine buffers 2·k·h per token; h = d_model, f = d_ffn, a = heads, s = seq_len;
//     with a vocabulary of v, the output layer's 4·h and the loss's fp32 logits, 4·v bytes a token
//     (their §4.3: 4sbh(1 + v/h)).
#pragma once
#include <cstdint>
#include <vector>

#include "model.hpp"

namespace moesim {

struct IterationInput;  // policy.hpp
struct IterationPlan;   // moe_iteration.hpp

struct MemoryUse {
  double params = 0;       // parameters the GPU keeps (dense, its own experts or shards)
  double grads = 0;
  double optimizer = 0;    // Adam's states (and the fp32 master copy)
  double activations = 0;  // of its micro-batch, all layers, for the backward
  double materialized = 0; // what a policy gathers or copies for the iteration: replicas' and
                           // gathered experts' parameters and gradients (FlexMoE's persistent
                           // copies: and their optimizer states)
  double materialized_params = 0;  // of `materialized`, the parameters (Hecate Fig. 13's "Param")
  double total() const { return params + grads + optimizer + activations + materialized; }
  /// The model states: all but the activations.
  double states() const { return total() - activations; }
  /// Field by field (a GPU's pipeline chunks together).
  MemoryUse& operator+=(const MemoryUse& o) {
    params += o.params, grads += o.grads, optimizer += o.optimizer, activations += o.activations;
    materialized += o.materialized, materialized_params += o.materialized_params;
    return *this;
  }
};

/// Bytes per parameter of each kind of state.
struct StateBytes {
  double param = 0, grad = 0, optimizer = 0;
  double total() const { return param + grad + optimizer; }
};
StateBytes state_bytes(spec::DType dtype);

/// Activations one layer keeps for its backward, for `tokens` tokens of which the MoE part computes
/// `token_slots` (k per token on average; a GPU computes the slots routed to the experts it runs).
double layer_activation_bytes(const MoeModel& model, double tokens, double token_slots);
/// Activations kept outside the MoE layers: the dense blocks' (ModelSpec.dense_layers; attention
/// and an FFN of d_ffn per token) and, with a vocabulary, the output layer's and the loss's.
double outside_layers_activation_bytes(const MoeModel& model);

/// Every layer's dense parameters with their full state (data parallelism replicates them).
MemoryUse dense_memory(const MoeModel& model);

/// The full state (parameters, gradients, optimizer) of `experts` experts' worth of parameters,
/// all layers together (e.g. L · E/G for expert parallelism, L / s for a 1/s shard per layer).
MemoryUse expert_state(const MoeModel& model, double experts);

/// One expert a GPU computes in a layer, with the token-slots of all sources it computes for it.
struct ExpertLoad {
  int expert;
  std::int64_t tokens;
  bool local = false;  // all of them the GPU's own tokens (its copy of a shadowed or replicated expert)
};
/// Per layer, per GPU: the experts it computes (its own and the copies sources send it), in order;
/// empty under ZeRO, where every GPU computes every expert on its own tokens (its routing row).
using ExpertLoads = std::vector<std::vector<std::vector<ExpertLoad>>>;

/// The iteration's accounting, from the plan and what each GPU computes: per layer the spread of
/// the GPUs' loads (in.report.load_stddev, load_max_mean), per GPU its load over the layers
/// (gpu_load), the memory of the GPU that needs the most (memory), and the experts the plan moves
/// with their optimizer states before the iteration (moved_experts).
void account_iteration(const IterationInput& in, const IterationPlan& plan, const ExpertLoads& computes);

}  // namespace moesim
