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
  require(spec_.heads() >= 1 && spec_.d_model() % spec_.heads() == 0, "heads",
          fmt::format("must be >= 1 and divide d_model ({})", spec_.d_model()));
  require(spec_.dtype() != spec::DTYPE_UNSPECIFIED, "dtype", "is not set; use FP32, TF32, FP16 or BF16");
  in(spec_.vocab(), 0, 1u << 24, "vocab");
  for (int i = 0; i < spec_.extra_dense_gemms_size(); ++i) {
    const auto& g = spec_.extra_dense_gemms(i);
    constexpr std::uint64_t kMaxDim = 1ull << 24, kMaxBatch = 1ull << 20;
    if (g.m() == 0 || g.n() == 0 || g.k() == 0 || g.m() > kMaxDim || g.n() > kMaxDim || g.k() > kMaxDim || g.batch() > kMaxBatch)
      throw FieldError(fmt::format("extra_dense_gemms[{}]", i),
                       fmt::format("m, n and k must be in [1, {}] and batch at most {}", kMaxDim, kMaxBatch));
  }
}

std::vector<Gemm> MoeModel::dense_forward_gemms() const {
  const std::uint64_t t = spec_.tokens_per_gpu(), d = spec_.d_model(), s = spec_.seq_len();
  const std::uint64_t h = spec_.heads(), dh = d / h, sequences = t / s;
  std::vector<Gemm> gemms = {
      {t, 3 * d, d, 1},              // QKV projection
      {s, s, dh, sequences * h},     // scores Q·Kᵀ per sequence and head
      {s, dh, s, sequences * h},     // context scores·V
      {t, d, d, 1},                  // output projection
  };
  for (const auto& g : spec_.extra_dense_gemms()) gemms.push_back({g.m(), g.n(), g.k(), g.batch() ? g.batch() : 1});
  return gemms;
}

double MoeModel::dense_forward_memory_bytes() const {
  const double t = spec_.tokens_per_gpu(), d = spec_.d_model(), s = spec_.seq_len(), h = spec_.heads();
  const double b = dtype_bytes(), sequences = std::floor(t / s);
  return h * sequences * s * s * (4 * b + 1) + t * d * (10 * b + 2);
}

Gemm MoeModel::gate_gemm() const { return {spec_.tokens_per_gpu(), spec_.experts(), spec_.d_model(), 1}; }

std::vector<Gemm> MoeModel::expert_gemms(long tokens) const {
  if (tokens <= 0) return {};
  const auto t = std::uint64_t(tokens);
  return {{t, spec_.d_ffn(), spec_.d_model(), 1}, {t, spec_.d_model(), spec_.d_ffn(), 1}};
}

std::vector<Gemm> MoeModel::output_forward_gemms() const {
  if (spec_.vocab() == 0) return {};
  return {{spec_.tokens_per_gpu(), spec_.vocab(), spec_.d_model(), 1}};
}

double MoeModel::output_memory_bytes() const {
  if (spec_.vocab() == 0) return 0;
  const double t = spec_.tokens_per_gpu(), d = spec_.d_model(), v = spec_.vocab();
  return 4 * t * d * dtype_bytes() + 8 * t * v;
}

double MoeModel::embedding_params() const {
  return double(spec_.vocab()) * spec_.d_model() * (spec_.untied_output() ? 2 : 1);
}

double MoeModel::expert_params() const { return 2.0 * spec_.d_model() * spec_.d_ffn(); }

double MoeModel::dense_params_per_layer() const {
  const double d = spec_.d_model();
  double params = 4 * d * d + d * spec_.experts();
  for (const auto& g : spec_.extra_dense_gemms()) params += double(g.n()) * double(g.k());
  return params;
}

}  // namespace moesim
