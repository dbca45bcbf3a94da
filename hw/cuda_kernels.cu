#include "cuda_kernels.hpp"

#include <cfloat>

namespace moesim::hw::cuda {

namespace {

constexpr int kThreads = 256;
unsigned blocks(std::size_t n) { return unsigned((n + kThreads - 1) / kThreads < 65535 * 8 ? (n + kThreads - 1) / kThreads : 65535 * 8); }

__global__ void permute_rows_kernel(const float* in, float* out, std::size_t rows, std::size_t width) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < rows * width; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t row = i / width, col = i % width;
    out[i] = in[((row * 7919) % rows) * width + col];
  }
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, std::size_t n) {
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * (m[i] / (1 - b1)) / (sqrtf(v[i] / (1 - b2)) + eps);
  }
}

__global__ void axpy_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    y[i] += 0.5f * x[i];
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
  permute_rows_kernel<<<blocks(rows * width), kThreads, 0, stream>>>(static_cast<const float*>(in), static_cast<float*>(out), rows, width);
}

void adam(float* state, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<<<blocks(n), kThreads, 0, stream>>>(state, state + n, state + 2 * n, state + 3 * n, n);
}

void axpy(const float* x, float* y, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  axpy_kernel<<<blocks(n), kThreads, 0, stream>>>(x, y, n);
}

void gate_top_k(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight, cudaStream_t stream) {
  if (rows == 0) return;
  gate_kernel<<<unsigned((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(scores, rows, cols, k, index, weight);
}

}  // namespace moesim::hw::cuda
