// The host device's kernels: what a GPU runs with cuBLAS and small CUDA kernels, written plainly in
// C++ on fp32 (the host computes every dtype in fp32). Row-major throughout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace moesim::hw::host {

/// C[m×n] = op(A)·op(B) + beta·C, with op(A) m×k and op(B) k×n; `ta`/`tb` read A/B transposed
/// (A stored k×m, B stored n×k). The i-k-j loop order keeps the inner loop contiguous.
void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B, float* C,
          float beta = 0);

/// out[i] = in[index[i]] row by row (`width` floats a row): token encode/decode (permutation).
void gather_rows(const float* in, std::span<const std::uint32_t> index, std::size_t width, float* out);

/// One Adam step over n parameters (lr 1e-3, β 0.9/0.999, ε 1e-8, step 1).
void adam(float* param, const float* grad, float* m, float* v, std::size_t n);

/// The k largest of each row of `scores` (rows × cols), softmax-normalised over the row: the gate.
/// Writes rows·k expert indices and weights, best first.
void top_k_softmax(const float* scores, std::size_t rows, std::size_t cols, std::size_t k, std::uint32_t* index,
                   float* weight);

}  // namespace moesim::hw::host
