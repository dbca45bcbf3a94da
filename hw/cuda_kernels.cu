#include "cuda_kernels.hpp"

#include <cfloat>

namespace moesim::hw::cuda {

namespace {

constexpr int kThreads = 256;
unsigned blocks(std::size_t n) { return unsigned((n + kThreads - 1) / kThreads < 65535 * 8 ? (n + kThreads - 1) / kThreads : 65535 * 8); }

// Memory-bound kernels move 16 bytes a thread a load (float4) where the arrays allow it: with
// 4-byte loads the H200 reached 64% of the HBM bandwidth PyTorch's copy measures (2.68 vs 4.15 TB/s,
// docs/hardware.md), under issue 23's 70% floor. Every array here starts at a multiple of 16 bytes
// when its length is a multiple of 4 floats (cudaMalloc aligns to 256), which the callers check.
template <typename T>
__device__ T axpy_one(T x, T y) {
  if constexpr (sizeof(T) == sizeof(float)) return y + 0.5f * x;
  else return T{y.x + 0.5f * x.x, y.y + 0.5f * x.y, y.z + 0.5f * x.z, y.w + 0.5f * x.w};
}
template <typename T>
__global__ void axpy_kernel(const T* x, T* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    y[i] = axpy_one(x[i], y[i]);
}

// One block a row (grid-strided): the source row is found once, its floats copied by the block.
template <typename T>
__global__ void permute_rows_kernel(const T* in, T* out, std::size_t rows, std::size_t width) {
  for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* from = in + ((row * 7919) % rows) * width;
    T* to = out + row * width;
    for (std::size_t c = threadIdx.x; c < width; c += blockDim.x) to[c] = from[c];
  }
}

__device__ void adam_one(float& p, float g, float& m, float& v) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  p -= lr * (m / (1 - b1)) / (sqrtf(v / (1 - b2)) + eps);
}
template <typename T>
__global__ void adam_kernel(T* p, const T* g, T* m, T* v, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    T pi = p[i], mi = m[i], vi = v[i];
    const T gi = g[i];
    if constexpr (sizeof(T) == sizeof(float)) {
      adam_one(pi, gi, mi, vi);
    } else {
      adam_one(pi.x, gi.x, mi.x, vi.x), adam_one(pi.y, gi.y, mi.y, vi.y);
      adam_one(pi.z, gi.z, mi.z, vi.z), adam_one(pi.w, gi.w, mi.w, vi.w);
    }
    p[i] = pi, m[i] = mi, v[i] = vi;
  }
}

// One thread per token: k passes of an arg-max over the row (k is 1 or 2 in every model here),
// then the softmax weights of the chosen experts.
__global__ void gate_kernel(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight) {
  const std::size_t r = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* s = scores + r * cols;
  float top = -FLT_MAX;
  for (int c = 0; c < cols; ++c) top = fmaxf(top, s[c]);
  float sum = 0;
  for (int c = 0; c < cols; ++c) sum += expf(s[c] - top);
  int last = -1;
  float last_score = FLT_MAX;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bs = -FLT_MAX;
    for (int c = 0; c < cols; ++c) {
      const bool after = s[c] < last_score || (s[c] == last_score && c > last);
      if (after && (best < 0 || s[c] > bs)) best = c, bs = s[c];
    }
    index[r * k + j] = best;
    weight[r * k + j] = expf(bs - top) / sum;
    last = best, last_score = bs;
  }
}

}  // namespace

void permute_rows(const void* in, void* out, std::size_t rows, std::size_t row_bytes, cudaStream_t stream) {
  const std::size_t width = row_bytes / sizeof(float);
  if (rows * width == 0) return;
  const unsigned grid = unsigned(rows < 65535 * 8 ? rows : 65535 * 8);
  if (width % 4 == 0)
    permute_rows_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float4*>(in), static_cast<float4*>(out), rows, width / 4);
  else
    permute_rows_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(in), static_cast<float*>(out), rows, width);
}

void adam(float* state, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0) {
    auto* s4 = reinterpret_cast<float4*>(state);
    const std::size_t q = n / 4;
    adam_kernel<<<blocks(q), kThreads, 0, stream>>>(s4, s4 + q, s4 + 2 * q, s4 + 3 * q, q);
  } else {
    adam_kernel<<<blocks(n), kThreads, 0, stream>>>(state, state + n, state + 2 * n, state + 3 * n, n);
  }
}

void axpy(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0)
    axpy_kernel<<<blocks(n / 4), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), n / 4);
  else
    axpy_kernel<<<blocks(n), kThreads, 0, stream>>>(x, y, n);
}

void gate_top_k(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight, cudaStream_t stream) {
  if (rows == 0) return;
  gate_kernel<<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(scores, rows, cols, k, index, weight);
}

}  // namespace moesim::hw::cuda
