// The CUDA backend's own kernels (cuda_kernels.cu): what the graph's memory-bound ops run on a GPU.
// GEMMs are cuBLAS's; these are the rest. Each launches on `stream` and returns at once.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace moesim::hw::cuda {

/// Token encode/decode: out row i = in row (i · 7919 mod rows), `row_bytes` a row (a multiple of 4).
void permute_rows(const void* in, void* out, std::size_t rows, std::size_t row_bytes, cudaStream_t stream);
/// One Adam step over n fp32 parameters: param, grad, m and v in `state`, each n rounded up to a
/// multiple of 4 floats after the one before (16-byte aligned for float4 loads).
void adam(float* state, std::size_t n, cudaStream_t stream);
/// y += 0.5 · x over n floats (elementwise ops, compression's modelled passes): x at `state`, y n
/// rounded up to a multiple of 4 floats after it.
void axpy(float* state, std::size_t n, cudaStream_t stream);
/// The gate: per row of `scores` (rows × cols, fp32) the k largest, softmax-weighted.
void gate_top_k(const float* scores, std::size_t rows, int cols, int k, std::int32_t* index, float* weight,
                cudaStream_t stream);

}  // namespace moesim::hw::cuda
