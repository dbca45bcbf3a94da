#include "memory_model.hpp"

namespace moesim {

StateBytes state_bytes(spec::DType dtype) {
  const double b = dtype_bytes(dtype);
  return {b, b, b >= 4 ? 8.0 : 12.0};  // fp32: Adam's m and v; mixed precision: + fp32 master copy
}

double layer_activation_bytes(const MoeModel& model, double tokens, double token_slots) {
  const auto& s = model.spec();
  const double h = s.d_model(), f = s.d_ffn(), a = s.heads(), seq = s.seq_len(), k = s.top_k();
  const double scale = model.dtype_bytes() / 2.0;  // the coefficients count 2-byte activations
  const double attention = tokens * (11 * h + 5 * a * seq) + tokens * 4 * h;
  const double ffn = token_slots * (3 * h + 4 * f) + tokens * 2 * k * h;
  return scale * (attention + ffn);
}

MemoryUse expert_state(const MoeModel& model, double experts) {
  const auto b = state_bytes(model.dtype());
  const double params = experts * model.expert_params();
  return {params * b.param, params * b.grad, params * b.optimizer, 0, 0};
}

MemoryUse dense_memory(const MoeModel& model) {
  const auto b = state_bytes(model.dtype());
  const double params = model.dense_params_per_layer() * model.layers() + model.embedding_params();
  return {params * b.param, params * b.grad, params * b.optimizer, 0, 0};
}

}  // namespace moesim
