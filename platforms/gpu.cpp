#include "gpu.hpp"

#include <algorithm>
#include <cmath>

#include "errors.hpp"

namespace moesim {

int dtype_bytes(spec::DType dtype) {
  switch (dtype) {
    case spec::FP16:
    case spec::BF16: return 2;
    default: return 4;
  }
}

const char* dtype_name(spec::DType dtype) {
  switch (dtype) {
    case spec::FP32: return "fp32";
    case spec::TF32: return "tf32";
    case spec::FP16: return "fp16";
    case spec::BF16: return "bf16";
    default: return "unspecified";
  }
}

std::optional<spec::DType> gemm_curve_dtype(const spec::GpuSpec& gpu, spec::DType dtype) {
  for (const auto want : {dtype, spec::DTYPE_UNSPECIFIED})
    for (const auto& p : gpu.gemm_efficiency())
      if (p.dtype() == want) return want;
  return std::nullopt;
}

GpuModel::GpuModel(const spec::GpuSpec& gpu, spec::DType dtype) {
  for (const auto& p : gpu.peak())
    if (p.dtype() == dtype) peak_ = p.tflops() * 1e12;
  if (peak_ <= 0)
    throw FieldError("gpu.peak", std::string("no peak FLOP/s for dtype ") + dtype_name(dtype) + " on " +
                                     gpu.model() + "; add `peak { dtype: ... tflops: ... }` or change model.dtype");
  element_bytes_ = dtype_bytes(dtype);
  mem_bw_ = gpu.memory_gbytes_per_s() * 1e9 * (gpu.memory_efficiency() > 0 ? gpu.memory_efficiency() : 1.0);
  memory_bytes_ = gpu.memory_gib() * double(1ull << 30);
  if (gpu.has_host_sync_us()) host_sync_ = gpu.host_sync_us() * 1e-6;
  if (gpu.has_launch_us()) launch_ = gpu.launch_us() * 1e-6;
  if (gpu.has_kernel_us()) kernel_ = gpu.kernel_us() * 1e-6;
  if (const auto from = gemm_curve_dtype(gpu, dtype)) {
    for (const auto& p : gpu.gemm_efficiency())
      if (p.dtype() == *from) curve_.emplace_back(std::log(p.gflops()), p.efficiency());
  } else if (gpu.gemm_efficiency_size() > 0) {
    throw FieldError("gpu.gemm_efficiency", std::string("has no point for ") + dtype_name(dtype) + " on " + gpu.model() +
                                                " and none without a dtype; add `gemm_efficiency { gflops: ... efficiency: ... }`");
  }
  std::sort(curve_.begin(), curve_.end());
}

double GpuModel::gemm_efficiency(double flops) const {
  if (curve_.empty()) return 1.0;
  const double x = std::log(std::max(flops, 1.0) / 1e9);
  if (x <= curve_.front().first) return curve_.front().second;
  if (x >= curve_.back().first) return curve_.back().second;
  auto hi = std::upper_bound(curve_.begin(), curve_.end(), std::make_pair(x, -1.0));
  auto lo = std::prev(hi);
  const double t = (x - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

double GpuModel::gemm_time(const Gemm& g) const {
  const double times = double(g.repeat ? g.repeat : 1);
  const double f = g.flops() / times;  // one run: its size sets the efficiency
  if (f <= 0) return 0;
  // A roofline: a GEMM reads its operands and writes its result through device memory at least
  // once. At low arithmetic intensity HBM, not the tensor cores, bounds it: attention's per-head
  // GEMMs (inner d_head = 64, an s x s result per head), a gate's n = E. On an H200 the demo's
  // forward attention ran 1.23x the FLOP-only model (docs/hardware.md).
  const double bytes = double(g.batch ? g.batch : 1) * element_bytes_ *
                       (double(g.m) * double(g.k) + double(g.k) * double(g.n) + double(g.m) * double(g.n));
  return times * std::max(f / (peak_ * gemm_efficiency(f)), memory_time(bytes));
}

double GpuModel::memory_time(double bytes) const { return bytes <= 0 ? 0 : bytes / mem_bw_; }

}  // namespace moesim
