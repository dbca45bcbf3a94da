#include "model.hpp"

#include <cmath>

#include <fmt/format.h>

#include "errors.hpp"

namespace moesim {

MoeModel::MoeModel(spec::ModelSpec spec) : spec_(std::move(spec)) {
  auto require = [](bool ok, const char* field, const std::string& message) {
    if (!ok) throw FieldError(field, message);
  };
  // Ranges: beyond any model trained, short of overflowing a token count (int32) or a GEMM's FLOPs.
  auto in = [&](std::uint32_t v, std::uint32_t lo, std::uint32_t hi, const char* field) {
    require(v >= lo && v <= hi, field, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  };
  in(spec_.layers(), 1, 10'000, "layers");
  in(spec_.d_model(), 1, 1u << 20, "d_model");
  in(spec_.d_ffn(), 1, 1u << 22, "d_ffn");
  in(spec_.experts(), 1, 1u << 16, "experts");
  require(spec_.top_k() >= 1 && spec_.top_k() <= spec_.experts() && spec_.top_k() <= 1024, "top_k",
          fmt::format("must be between 1 and the number of experts ({}), at most 1024", spec_.experts()));
  in(spec_.tokens_per_gpu(), 1, 1u << 24, "tokens_per_gpu");
  in(spec_.seq_len(), 1, 1u << 24, "seq_len");
  require(std::uint64_t(spec_.tokens_per_gpu()) * spec_.top_k() < (1ull << 31), "top_k",
          "times tokens_per_gpu must be below 2^31 (token-slots per GPU are counted in 32 bits)");
  require(spec_.tokens_per_gpu() % spec_.seq_len() == 0, "tokens_per_gpu",
          fmt::format("{} is not a multiple of seq_len {} (tokens per GPU = micro-batch × seq_len)",
                      spec_.tokens_per_gpu(), spec_.seq_len()));
  require(spec_.heads() >= 1 && (spec_.head_dim() > 0 || spec_.d_model() % spec_.heads() == 0), "heads",
          fmt::format("must be >= 1 and divide d_model ({}), unless head_dim is set", spec_.d_model()));
  require(spec_.kv_heads() == 0 || (spec_.kv_heads() <= spec_.heads() && spec_.heads() % spec_.kv_heads() == 0), "kv_heads",
          fmt::format("must divide heads ({}): each K/V head serves a group of query heads", spec_.heads()));
  in(spec_.head_dim(), 0, 1u << 16, "head_dim");
  in(spec_.expert_d_ffn(), 0, 1u << 22, "expert_d_ffn");
  in(spec_.shared_experts(), 0, 1024, "shared_experts");
  in(spec_.dense_layers(), 0, 10'000, "dense_layers");
  if (spec_.expert_groups() || spec_.group_limit()) {
    const std::uint32_t g = spec_.expert_groups(), m = spec_.group_limit();
    require(g >= 1 && spec_.experts() % g == 0, "expert_groups",
            fmt::format("must divide experts ({}) into equal groups", spec_.experts()));
    require(m >= 1 && m <= g, "group_limit", fmt::format("must be between 1 and expert_groups ({})", g));
    require(std::uint64_t(m) * (spec_.experts() / g) >= spec_.top_k(), "group_limit",
            fmt::format("{} groups of {} experts cannot hold a token's top-{}", m, spec_.experts() / g, spec_.top_k()));
  }
  require(spec_.dtype() != spec::DTYPE_UNSPECIFIED, "dtype", "is not set; use FP32, TF32, FP16 or BF16");
  in(spec_.vocab(), 0, 1u << 24, "vocab");
  if (spec_.moe_layer_only())
    require(spec_.vocab() == 0 && spec_.dense_layers() == 0 && spec_.shared_experts() == 0 && spec_.extra_dense_gemms_size() == 0,
            "moe_layer_only", "the MoE FFN alone has no vocab, dense_layers, shared_experts or extra_dense_gemms: leave them unset");
  for (int i = 0; i < spec_.extra_dense_gemms_size(); ++i) {
    const auto& g = spec_.extra_dense_gemms(i);
    constexpr std::uint64_t kMaxDim = 1ull << 24, kMaxBatch = 1ull << 20;
    if (g.m() == 0 || g.n() == 0 || g.k() == 0 || g.m() > kMaxDim || g.n() > kMaxDim || g.k() > kMaxDim || g.batch() > kMaxBatch)
      throw FieldError(fmt::format("extra_dense_gemms[{}]", i),
                       fmt::format("m, n and k must be in [1, {}] and batch at most {}", kMaxDim, kMaxBatch));
  }
}

MoeModel MoeModel::blocks(int layers, int dense_layers, bool output) const {
  MoeModel out = *this;
  out.spec_.set_layers(std::uint32_t(layers));
  out.spec_.set_dense_layers(std::uint32_t(dense_layers));
  if (!output) out.spec_.set_vocab(0);
  return out;
}

namespace {

// FieldError `field` unless a group of `gpus` GPUs (a "tensor-parallel" or "context-parallel" one)
// divides the model's `what`, of n.
void require_divides(const char* field, const char* group, int gpus, std::uint32_t n, const char* what) {
  if (n % std::uint32_t(gpus) != 0)
    throw FieldError(field, fmt::format("{} GPUs per {} group do not divide the model's {} ({})", gpus, group, what, n));
}

}  // namespace

MoeModel MoeModel::tensor_parallel(int tp) const {
  if (tp == tp_) return *this;
  auto divides = [&](std::uint32_t n, const char* what) { require_divides("parallel.tp", "tensor-parallel", tp, n, what); };
  if (tp_ != 1 || tp < 1) throw FieldError("parallel.tp", "must be at least 1");
  if (spec_.moe_layer_only()) throw FieldError("parallel.tp", "must be 1 for a model.moe_layer_only benchmark (no attention to split)");
  divides(spec_.tokens_per_gpu(), "tokens_per_gpu");
  divides(spec_.heads(), "heads");
  if (spec_.kv_heads()) divides(spec_.kv_heads(), "kv_heads");
  if (spec_.dense_layers()) divides(spec_.d_ffn(), "d_ffn");
  MoeModel out = *this;
  out.spec_.set_tokens_per_gpu(spec_.tokens_per_gpu() / std::uint32_t(tp));
  out.tp_ = tp;
  return out;
}

MoeModel MoeModel::context_parallel(int cp) const {
  if (cp == cp_) return *this;
  if (cp_ != 1 || cp < 1) throw FieldError("parallel.cp", "must be at least 1");
  if (spec_.moe_layer_only()) throw FieldError("parallel.cp", "must be 1 for a model.moe_layer_only benchmark (no attention to split)");
  require_divides("parallel.cp", "context-parallel", cp, spec_.seq_len(), "seq_len");
  require_divides("parallel.cp", "context-parallel", cp, spec_.tokens_per_gpu(), "tokens_per_gpu");
  MoeModel out = *this;
  out.spec_.set_tokens_per_gpu(spec_.tokens_per_gpu() / std::uint32_t(cp));
  out.cp_ = cp;
  return out;
}

double MoeModel::kv_gathered_bytes() const {
  if (cp_ == 1) return 0;
  const double d = spec_.d_model(), dh = spec_.head_dim() ? spec_.head_dim() : d / spec_.heads();
  const double kv = double(spec_.kv_heads() ? spec_.kv_heads() : spec_.heads()) / tp_;
  return double(group_tokens()) * cp_ * 2 * kv * dh * dtype_bytes();
}

std::vector<Gemm> MoeModel::dense_forward_gemms() const {
  if (spec_.moe_layer_only()) return {};  // no attention
  // Under tensor parallelism: the group's tokens, 1/tp of the heads (Megatron's column- and
  // row-parallel attention). Under context parallelism the tokens are 1/cp of each of their
  // sequences: seq_len/cp queries a sequence, each against all seq_len keys.
  const std::uint64_t t = group_tokens(), d = spec_.d_model(), s = spec_.seq_len(), tp = std::uint64_t(tp_), cp = std::uint64_t(cp_);
  const std::uint64_t dh = spec_.head_dim() ? spec_.head_dim() : d / spec_.heads(), h = spec_.heads() / tp;
  const std::uint64_t sequences = t * cp / s, queries = s / cp;
  const std::uint64_t kv = (spec_.kv_heads() ? spec_.kv_heads() : spec_.heads()) / tp;
  std::vector<Gemm> gemms = {
      {t, (h + 2 * kv) * dh, d, 1},         // QKV projection (3d for multi-head attention)
      {queries, s, dh, sequences * h},      // scores Q·Kᵀ per sequence (slice) and head
      {queries, dh, s, sequences * h},      // context scores·V
      {t, d, h * dh, 1},                    // output projection
  };
  for (const auto& g : spec_.extra_dense_gemms()) gemms.push_back({g.m(), g.n(), g.k(), g.batch() ? g.batch() : 1});
  return gemms;
}

double MoeModel::dense_forward_memory_bytes() const {
  if (spec_.moe_layer_only()) return 0;
  // Scores of 1/tp of the heads over the group's sequences; norms and residuals on the GPU's own
  // 1/tp of the tokens (sequence parallelism).
  const double t = spec_.tokens_per_gpu(), d = spec_.d_model(), s = spec_.seq_len(), h = double(spec_.heads()) / tp_;
  const double b = dtype_bytes(), sequences = std::floor(double(group_tokens()) * cp_ / s);
  const double scores = spec_.flash_attention() ? 0 : h * sequences * (s / cp_) * s * (4 * b + 1);
  return scores + t * d * (10 * b + 2);
}

std::vector<Gemm> MoeModel::attention_recompute_gemms() const {
  if (!spec_.flash_attention() || spec_.moe_layer_only()) return {};
  return {dense_forward_gemms()[1]};  // the scores Q·Kᵀ
}

Gemm MoeModel::gate_gemm() const { return {spec_.tokens_per_gpu(), spec_.experts(), spec_.d_model(), 1}; }

std::vector<Gemm> MoeModel::ffn_gemms(std::uint64_t t, std::uint64_t f) const {
  return {{t, spec_.gated_ffn() ? 2 * f : f, spec_.d_model(), 1}, {t, spec_.d_model(), f, 1}};
}

std::vector<Gemm> MoeModel::expert_gemms(long tokens) const {
  if (tokens <= 0) return {};
  return ffn_gemms(std::uint64_t(tokens), std::uint64_t(expert_ffn()));
}

std::vector<Gemm> MoeModel::shared_expert_gemms() const {
  if (spec_.shared_experts() == 0) return {};
  auto gemms = expert_gemms(tokens_per_gpu());
  for (auto& g : gemms) g.repeat = spec_.shared_experts();
  return gemms;
}

std::vector<Gemm> MoeModel::dense_block_gemms() const {
  if (spec_.dense_layers() == 0) return {};
  auto gemms = dense_forward_gemms();
  for (const auto& g : ffn_gemms(group_tokens(), spec_.d_ffn() / std::uint32_t(tp_))) gemms.push_back(g);
  return gemms;
}

std::vector<Gemm> MoeModel::output_forward_gemms() const {
  if (spec_.vocab() == 0) return {};
  return {{group_tokens(), (spec_.vocab() + std::uint32_t(tp_) - 1) / std::uint32_t(tp_), spec_.d_model(), 1}};  // vocabulary-parallel
}

double MoeModel::output_memory_bytes() const {
  if (spec_.vocab() == 0) return 0;
  const double t = spec_.tokens_per_gpu(), d = spec_.d_model(), v = spec_.vocab();
  return 4 * t * d * dtype_bytes() + 8 * t * v;
}

double MoeModel::embedding_params() const {
  return double(spec_.vocab()) * spec_.d_model() * (spec_.untied_output() ? 2 : 1);
}

double MoeModel::expert_params() const { return (spec_.gated_ffn() ? 3.0 : 2.0) * spec_.d_model() * expert_ffn(); }

double MoeModel::attention_params() const {
  if (spec_.moe_layer_only()) return 0;
  const double d = spec_.d_model(), h = spec_.heads();
  if (!spec_.kv_heads() && !spec_.head_dim()) return 4 * d * d;
  const double dh = spec_.head_dim() ? spec_.head_dim() : d / h, kv = spec_.kv_heads() ? spec_.kv_heads() : h;
  return d * dh * (2 * h + 2 * kv);  // Q and O: d·h·dh each; K and V: d·h_kv·dh each
}

double MoeModel::dense_params_per_layer() const {
  const double d = spec_.d_model();
  double params = attention_params() + d * spec_.experts() + spec_.shared_experts() * expert_params();
  for (const auto& g : spec_.extra_dense_gemms()) params += double(g.n()) * double(g.k());
  return params;
}

double MoeModel::dense_block_params() const {
  const double ffn = (spec_.gated_ffn() ? 3.0 : 2.0) * spec_.d_model() * spec_.d_ffn();
  return spec_.dense_layers() * (attention_params() + ffn);
}

double MoeModel::dense_params_per_gpu() const {
  return (dense_params_per_layer() * layers() + embedding_params() + dense_block_params()) / tp_;
}

double MoeModel::total_params() const {
  return layers() * (dense_params_per_layer() + experts() * expert_params()) + dense_block_params() + embedding_params();
}

double MoeModel::iteration_flops_per_gpu() const {
  auto sum = [](const std::vector<Gemm>& gemms) {
    double f = 0;
    for (const auto& g : gemms) f += g.flops();
    return f;
  };
  const double slots = double(tokens_per_gpu()) * top_k();
  const double layer = sum(dense_forward_gemms()) + gate_gemm().flops() + sum(expert_gemms(1)) * slots + sum(shared_expert_gemms());
  return 3 * (layers() * layer + dense_layers() * sum(dense_block_gemms()) + sum(output_forward_gemms()));
}

double MoeModel::activated_params() const {
  return layers() * (dense_params_per_layer() + top_k() * expert_params()) + dense_block_params() + embedding_params();
}

}  // namespace moesim
