#include "host_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moesim::hw::host {

void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B, float* C,
          float beta) {
  for (std::size_t i = 0; i < m * n; ++i) C[i] = beta == 0 ? 0.0f : beta * C[i];
  for (std::size_t i = 0; i < m; ++i) {
    float* c = C + i * n;
    for (std::size_t p = 0; p < k; ++p) {
      const float a = ta ? A[p * m + i] : A[i * k + p];
      if (a == 0) continue;
      if (!tb) {
        const float* b = B + p * n;
        for (std::size_t j = 0; j < n; ++j) c[j] += a * b[j];
      } else {
        for (std::size_t j = 0; j < n; ++j) c[j] += a * B[j * k + p];
      }
    }
  }
}

void gather_rows(const float* in, std::span<const std::uint32_t> index, std::size_t width, float* out) {
  for (std::size_t i = 0; i < index.size(); ++i) std::copy_n(in + std::size_t(index[i]) * width, width, out + i * width);
}

void adam(float* param, const float* grad, float* m, float* v, std::size_t n) {
  constexpr float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * grad[i];
    v[i] = b2 * v[i] + (1 - b2) * grad[i] * grad[i];
    const float mh = m[i] / (1 - b1), vh = v[i] / (1 - b2);
    param[i] -= lr * mh / (std::sqrt(vh) + eps);
  }
}

void top_k_softmax(const float* scores, std::size_t rows, std::size_t cols, std::size_t k, std::uint32_t* index,
                   float* weight) {
  std::vector<std::uint32_t> order(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* s = scores + r * cols;
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(),
                      [&](std::uint32_t a, std::uint32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    const float top = s[order[0]];
    double sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += std::exp(double(s[c] - top));
    for (std::size_t j = 0; j < k; ++j) {
      index[r * k + j] = order[j];
      weight[r * k + j] = float(std::exp(double(s[order[j]] - top)) / sum);
    }
  }
}

}  // namespace moesim::hw::host
