// The MoE transformer model: its GEMM shapes and parameter counts, from a ModelSpec.
#pragma once
#include <vector>

#include "gpu.hpp"
#include "routing.hpp"
#include "moesim.pb.h"

namespace moesim {

class MoeModel {
 public:
  /// Validates the spec (FieldError with the field path relative to ModelSpec).
  explicit MoeModel(spec::ModelSpec spec);

  const spec::ModelSpec& spec() const { return spec_; }
  /// The same model over fewer blocks, its first `dense_layers` dense and `layers` MoE layers (a
  /// pipeline stage's; parallel_layout.cpp); `output`: with the vocabulary's ends.
  MoeModel blocks(int layers, int dense_layers, bool output) const;
  /// The model as one GPU of a tensor-parallel group of `tp` GPUs sees it, with sequence
  /// parallelism (Megatron-Core's, ParallelSpec.tp): tokens_per_gpu() becomes its 1/tp of the
  /// group's tokens (what it routes to the experts and keeps activations of); the attention, the
  /// dense blocks' FFNs and the output layer run on all the group's tokens with 1/tp of the heads,
  /// of d_ffn and of the vocabulary, and dense_params_per_gpu() is 1/tp. The experts are not split
  /// (expert tensor parallelism 1). FieldError "parallel.tp" where tp does not divide the tokens,
  /// the heads, the K/V heads or d_ffn.
  MoeModel tensor_parallel(int tp) const;
  int tp() const { return tp_; }
  /// The model as one GPU of a context-parallel group of `cp` GPUs sees it (Megatron-Core's CP,
  /// ParallelSpec.cp): each sequence in cp slices, the GPU holding one, so tokens_per_gpu() becomes
  /// 1/cp of it (what it routes and keeps activations of); its attention runs its slices' queries,
  /// seq_len/cp of each sequence, against all seq_len keys and values (kv_gathered_bytes()).
  /// Composes with tensor_parallel() in either order. FieldError "parallel.cp" where cp does not
  /// divide seq_len or the tokens.
  MoeModel context_parallel(int cp) const;
  int cp() const { return cp_; }
  /// The tokens a tensor-parallel group's attention runs on: every GPU's of the group (of its
  /// sequences' slices, under context parallelism).
  std::uint64_t group_tokens() const { return std::uint64_t(spec_.tokens_per_gpu()) * std::uint64_t(tp_); }
  /// Under context parallelism, the keys and values one GPU's attention reads, of whole sequences
  /// and of its 1/tp of the K/V heads: what the CP group's all-gather brings it (cp · group_tokens()
  /// tokens × 2 · kv_heads/tp · head_dim × dtype), and in the backward what the reduce-scatter of
  /// their gradients sends. 0 without context parallelism.
  double kv_gathered_bytes() const;
  int layers() const { return int(spec_.layers()); }
  int experts() const { return int(spec_.experts()); }
  int top_k() const { return int(spec_.top_k()); }
  int tokens_per_gpu() const { return int(spec_.tokens_per_gpu()); }
  spec::DType dtype() const { return spec_.dtype(); }
  int dtype_bytes() const { return moesim::dtype_bytes(spec_.dtype()); }

  /// Bytes of one token's hidden vector (d_model × dtype size): the unit of all-to-all traffic.
  double token_bytes() const { return double(spec_.d_model()) * dtype_bytes(); }

  /// Forward GEMMs of one layer's non-MoE part on one GPU: attention (QKV projection, scores,
  /// context, output projection) and the spec's extra dense GEMMs.
  std::vector<Gemm> dense_forward_gemms() const;
  /// Bytes the same forward moves through device memory besides its GEMMs (Megatron-style
  /// attention without a fused flash kernel; backward: twice as much): the fused scale-mask-softmax
  /// and the dropout over the h·(t/s)·s² attention scores (read and write each, plus the dropout's
  /// one-byte mask), the two layer norms (read and write t·d) and the two dropout + residual adds
  /// (read two, write one, a mask): h·(t/s)·s²·(4b + 1) + t·d·(10b + 2), b the dtype's bytes.
  double dense_forward_memory_bytes() const;
  /// GEMMs the backward of one layer's attention adds to the forward's twice: FlashAttention's
  /// recomputed scores Q·Kᵀ (none without flash_attention).
  std::vector<Gemm> attention_recompute_gemms() const;
  /// Forward gate scoring on one GPU: tokens × experts × d_model.
  Gemm gate_gemm() const;
  /// One expert's forward GEMMs for `tokens` routed tokens: d_model -> f -> d_model, f its FFN size
  /// (expert_d_ffn); with a gated FFN the first GEMM has 2f outputs (gate and up).
  std::vector<Gemm> expert_gemms(long tokens) const;
  /// The expert FFN size f (expert_d_ffn, else d_ffn).
  int expert_ffn() const { return int(spec_.expert_d_ffn() ? spec_.expert_d_ffn() : spec_.d_ffn()); }
  /// Shared experts: each layer's forward GEMMs on all of a GPU's tokens (none without them).
  std::vector<Gemm> shared_expert_gemms() const;
  int dense_layers() const { return int(spec_.dense_layers()); }
  /// Group-limited routing (expert_groups, group_limit); off when not set.
  GroupLimit group_limit() const { return {int(spec_.expert_groups()), int(spec_.group_limit())}; }
  /// One dense block's forward GEMMs on one GPU (attention and the FFN of d_ffn), and its memory
  /// traffic besides them; none without dense blocks.
  std::vector<Gemm> dense_block_gemms() const;
  /// Parameters of the whole model, and those one token goes through (the routed experts it is
  /// sent to, top-k of them, and everything dense): the figures models publish.
  double total_params() const;
  double activated_params() const;
  /// Model FLOPs of one training iteration on one GPU: three times the forward's GEMMs (the
  /// backward is two of them) over its tokens_per_gpu tokens, each through the attention, the gate,
  /// top-k routed experts, the shared experts, the dense blocks and the output layer; what MFU
  /// divides by the time and the GPU's peak (dropped or padded token-slots, recomputation and
  /// copies a policy adds are not the model's).
  double iteration_flops_per_gpu() const;

  /// The output projection's forward GEMM (tokens × vocab × d_model); none without a vocabulary.
  std::vector<Gemm> output_forward_gemms() const;
  /// Bytes the language-model ends move through device memory besides that GEMM, forward and
  /// backward together: the embedding lookup and its gradient's scatter (read and write t·d each),
  /// and the softmax cross-entropy reading the logits and writing their gradient (t·vocab each, in
  /// fp32 as Megatron-LM and fairseq compute it): 4·t·d·b + 8·t·vocab.
  double output_memory_bytes() const;
  /// Parameters of the embedding table and, untied, of the output projection (vocab · d_model each).
  double embedding_params() const;

  /// Parameters of one expert (2 · d_model · f, or 3 · d_model · f gated) and the dense parameters
  /// of one MoE layer that data parallelism all-reduces (attention: 4·d² for multi-head, d·dh·(2h +
  /// 2h_kv) in general; the gate d·E; shared experts; extra GEMMs n·k).
  double expert_params() const;
  double dense_params_per_layer() const;
  /// The parameters of the dense blocks (attention and the FFN of d_ffn each), all of them.
  double dense_block_params() const;
  /// The dense parameters one GPU keeps, trains and all-reduces: every MoE layer's, the dense
  /// blocks' and the embeddings', 1/tp of them under tensor parallelism.
  double dense_params_per_gpu() const;
  /// One MoE layer's share of it: the layer's dense parameters, 1/tp of them.
  double layer_dense_params_per_gpu() const { return dense_params_per_layer() / tp_; }

 private:
  double attention_params() const;
  std::vector<Gemm> ffn_gemms(std::uint64_t tokens, std::uint64_t f) const;
  spec::ModelSpec spec_;
  int tp_ = 1, cp_ = 1;
};

}  // namespace moesim
