// The GPU compute model: how long a GEMM or a memory-bound kernel takes on one GPU.
// One place for it: the SimGrid backend, the cost model and the reports all call these.
#pragma once
#include <algorithm>
#include <compare>
#include <cstdint>
#include <optional>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

/// Bytes per element of a dtype (fp32/tf32 4, fp16/bf16 2).
int dtype_bytes(spec::DType dtype);
const char* dtype_name(spec::DType dtype);
/// Whose gemm_efficiency points make `dtype`'s curve on `gpu` (EfficiencyPoint.dtype): its own, else
/// the points without a dtype (DTYPE_UNSPECIFIED); nullopt where neither exists.
std::optional<spec::DType> gemm_curve_dtype(const spec::GpuSpec& gpu, spec::DType dtype);

/// C[m×n] = op(A)·op(B) with op(A) m×k and op(B) k×n, `batch` times. `ta`/`tb`: A is stored k×m
/// (B n×k) and read transposed, as a backward pass reads the forward's operands (the weight
/// gradient Aᵀ·dC, the input gradient dC·Bᵀ): the leading dimensions stay the model's, not the
/// token counts. The cost model reads the FLOPs only; the GPU backend passes them to cuBLAS.
struct Gemm {
  std::uint64_t m = 0, n = 0, k = 0, batch = 1;
  std::uint64_t repeat = 1;  // the same GEMM run this many times, one after another (each timed alone)
  bool ta = false, tb = false;
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch ? batch : 1) * double(repeat ? repeat : 1); }
  friend auto operator<=>(const Gemm&, const Gemm&) = default;
};

class GpuModel {
 public:
  GpuModel(const spec::GpuSpec& gpu, spec::DType dtype);

  /// Peak FLOP/s for the model's dtype (the catalog's dense peak).
  double peak_flops() const { return peak_; }
  /// Fraction of peak a GEMM of `flops` reaches: the catalog's curve, interpolated in log(flops).
  double gemm_efficiency(double flops) const;
  /// Seconds for one GEMM: flops / (peak × efficiency(flops)), or, where longer, the time to read
  /// its operands and write its result once (memory_time: a roofline).
  double gemm_time(const Gemm& g) const;
  /// Seconds for a memory-bound kernel moving `bytes` (read + write) through device memory.
  double memory_time(double bytes) const;
  double memory_bytes() const { return memory_bytes_; }
  /// Seconds of a host-device round trip on the critical path (GpuSpec.host_sync_us).
  double host_sync_seconds() const { return host_sync_; }
  /// Seconds the host takes to issue one kernel from the framework (GpuSpec.launch_us).
  double launch_seconds() const { return launch_; }
  /// The least seconds one kernel takes on the GPU (GpuSpec.kernel_us): a kernel's time is at least this.
  double kernel_seconds() const { return kernel_; }
  /// Seconds of one kernel whose modelled time is `seconds`: at least kernel_seconds().
  double kernel_time(double seconds) const { return std::max(seconds, kernel_); }

 private:
  double peak_ = 0, mem_bw_ = 0, memory_bytes_ = 0, host_sync_ = 15e-6, launch_ = 7e-6, kernel_ = 0, element_bytes_ = 2;
  std::vector<std::pair<double, double>> curve_;  // (log gflops, efficiency), sorted
};

}  // namespace moesim
