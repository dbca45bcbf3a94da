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

// One warp per token (grid-strided): the row's scores read by 32 lanes side by side (a thread per
// row read them 4·E bytes apart, and the H200 ran the gate 5-7x slower than the bytes it moves,
// docs/hardware.md), the max and the softmax's sum reduced across the warp, then k rounds of a
// warp arg-max (ties to the lower expert), each after the previous round's pick.
__device__ void warp_best(float& score, int& index) {
  for (int o = 16; o > 0; o /= 2) {
    const float s = __shfl_xor_sync(0xffffffffu, score, o);
    const int i = __shfl_xor_sync(0xffffffffu, index, o);
    if (i >= 0 && (index < 0 || s > score || (s == score && i < index))) score = s, index = i;
  }
}
__global__ void gate_kernel(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight) {
  const int lane = int(threadIdx.x % 32);
  const std::size_t warps = std::size_t(gridDim.x) * blockDim.x / 32;
  for (std::size_t r = (blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) / 32; r < rows; r += warps) {
    const float* s = scores + r * cols;
    float top = -FLT_MAX;
    for (int c = lane; c < cols; c += 32) top = fmaxf(top, s[c]);
    for (int o = 16; o > 0; o /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
    float sum = 0;
    for (int c = lane; c < cols; c += 32) sum += expf(s[c] - top);
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int last = -1;
    float last_score = FLT_MAX;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float bs = -FLT_MAX;
      for (int c = lane; c < cols; c += 32) {
        const bool after = s[c] < last_score || (s[c] == last_score && c > last);
        if (after && (best < 0 || s[c] > bs)) best = c, bs = s[c];
      }
      warp_best(bs, best);
      if (lane == 0) {
        index[r * k + j] = best;
        weight[r * k + j] = best < 0 ? 0.f : expf(bs - top) / sum;
      }
      last = best, last_score = bs;
    }
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

// Arrays `stride` floats apart, stride = n rounded up to 4: each starts 16-byte aligned, the first
// n/4 float4s run vectorized and the last n % 4 floats one by one.
std::size_t stride(std::size_t n) { return (n + 3) / 4 * 4; }

void adam(float* state, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const std::size_t q = n / 4, st = stride(n), tail = n - 4 * q;
  if (q > 0) {
    auto* s4 = reinterpret_cast<float4*>(state);
    adam_kernel<<<blocks(q), kThreads, 0, stream>>>(s4, s4 + st / 4, s4 + 2 * st / 4, s4 + 3 * st / 4, q);
  }
  if (tail > 0) {
    float* t = state + 4 * q;
    adam_kernel<<<1, kThreads, 0, stream>>>(t, t + st, t + 2 * st, t + 3 * st, tail);
  }
}

void axpy(float* state, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const std::size_t q = n / 4, st = stride(n), tail = n - 4 * q;
  if (q > 0)
    axpy_kernel<<<blocks(q), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(state), reinterpret_cast<float4*>(state + st), q);
  if (tail > 0) axpy_kernel<<<1, kThreads, 0, stream>>>(state + 4 * q, state + st + 4 * q, tail);
}

void gate_top_k(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight, cudaStream_t stream) {
  if (rows == 0) return;
  gate_kernel<<<blocks(rows * 32), kThreads, 0, stream>>>(scores, rows, cols, k, index, weight);
}

}  // namespace moesim::hw::cuda
