// A communication-like kernel beside a GEMM on one GPU: what each costs the other. moesim's model
// says a kernel that holds k of a GPU's S SMs (DeepEP's dispatch and combine, Collective::sm_share)
// slows compute overlapping it to (S - k) / S of its speed, and moves its own bytes as if alone;
// NCCL's kernels take nothing from compute in the model, and the all-to-all's slowdown beside
// compute that ScheMoE's Table 1 and Tutel §2.1 point at is not modelled (report/ledger.textproto,
// schemoe-all-to-all-share). This measures both sides, for k blocks of a copy kernel:
//   - "exclusive": each block asks for more shared memory than leaves room for a GEMM block beside
//     it, so it holds its SM as DeepEP's kernels are meant to;
//   - "shared": a small block, as NCCL's are, that the SM's scheduler may place beside GEMM blocks;
// the copy going device to device (NVLink-like stores) or device to pinned host memory (the
// network path without GPUDirect RDMA). The GEMM chain (cuBLAS FP16 8192^3, about 1.5 ms each on
// an H100) and the copy are timed alone, then together on two streams, the copy launched first.
// Printed per case: the copy's rate alone (bytes read + written), its time alone and together, and
// the GEMM chain's time together, its slowdown beside S / (S - k).
// Not part of moesim's build; on a machine with the CUDA toolkit:
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/overlap/overlap_bench.cu -lcublas -o overlap_bench && ./overlap_bench
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    if (auto e = (x); e != 0) {                                                           \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, int(e));    \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// Each block copies its share of `n` 16-byte words `passes` times, grid-strided inside the block.
__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n, int passes) {
  extern __shared__ char hold[];  // only reserved: its size decides how many blocks an SM takes
  if (threadIdx.x == 0 && n == 0) hold[0] = 0;
  const size_t per_block = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = blockIdx.x * per_block, end = begin + per_block < n ? begin + per_block : n;
  for (int p = 0; p < passes; ++p)
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
  }
  void start(cudaStream_t s) { CHECK(cudaEventRecord(a, s)); }
  float stop_ms(cudaStream_t s) {
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int S = prop.multiProcessorCount;
  std::printf("device %s, %d SMs, %zu KiB shared memory an SM\n", prop.name, S, prop.sharedMemPerMultiprocessor / 1024);

  const int n = 8192, gemms = 8;
  __half *A, *B, *C;
  for (__half** m : {&A, &B, &C}) {
    CHECK(cudaMalloc(m, size_t(n) * n * 2));
    CHECK(cudaMemset(*m, 0, size_t(n) * n * 2));
  }
  cublasHandle_t blas;
  CHECK(cublasCreate(&blas));
  cudaStream_t sg, sc;
  CHECK(cudaStreamCreateWithFlags(&sg, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&sc, cudaStreamNonBlocking));
  CHECK(cublasSetStream(blas, sg));
  const __half one = __float2half(1.f), zero = __float2half(0.f);
  auto gemm_chain = [&] {
    for (int i = 0; i < gemms; ++i)
      CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16F, n, B, CUDA_R_16F, n, &zero, C,
                         CUDA_R_16F, n, CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT));
  };

  const size_t bytes = 256ull << 20, words = bytes / 16;
  int4 *src, *dev_dst, *host_dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dev_dst, bytes));
  CHECK(cudaMallocHost(&host_dst, bytes));
  CHECK(cudaMemset(src, 1, bytes));

  Timer tg, tc;
  gemm_chain();  // warm-up: clocks up, cuBLAS's kernel chosen
  CHECK(cudaStreamSynchronize(sg));
  tg.start(sg);
  gemm_chain();
  const float gemm_alone = tg.stop_ms(sg);
  std::printf("GEMM chain alone: %.3f ms (%d x %d^3 FP16, %.0f TFLOP/s)\n", gemm_alone, gemms, n,
              2.0 * gemms * double(n) * n * n / (gemm_alone * 1e-3) / 1e12);
  std::printf("%-10s %-6s %4s  %9s %9s %9s %9s  %9s %9s %9s\n", "copy", "blocks", "k", "GB/s", "copy ms", "together",
              "slowdown", "GEMM ms", "slowdown", "S/(S-k)");
  const size_t exclusive_smem = prop.sharedMemPerMultiprocessor * 3 / 4, shared_smem = 0;
  CHECK(cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(exclusive_smem)));
  for (const bool to_host : {false, true})
    for (const bool exclusive : {true, false})
      for (const int k : {8, 16, 24, 32}) {
        int4* dst = to_host ? host_dst : dev_dst;
        const size_t smem = exclusive ? exclusive_smem : shared_smem;
        // Passes so that the copy alone lasts about as long as the GEMM chain.
        Timer t1;
        t1.start(sc);
        copy_kernel<<<k, 512, smem, sc>>>(src, dst, words, 1);
        const float once = t1.stop_ms(sc);
        const int passes = std::max(1, int(gemm_alone / once));
        tc.start(sc);
        copy_kernel<<<k, 512, smem, sc>>>(src, dst, words, passes);
        const float copy_alone = tc.stop_ms(sc);
        CHECK(cudaDeviceSynchronize());
        tc.start(sc);  // the copy first, then the GEMMs beside it
        copy_kernel<<<k, 512, smem, sc>>>(src, dst, words, passes);
        tg.start(sg);
        gemm_chain();
        const float gemm_together = tg.stop_ms(sg), copy_together = tc.stop_ms(sc);
        CHECK(cudaGetLastError());
        std::printf("%-10s %-6s %4d  %9.1f %9.3f %9.3f %9.3f  %9.3f %9.3f %9.3f\n", to_host ? "to host" : "on device",
                    exclusive ? "excl" : "shared", k, 2.0 * double(bytes) * passes / (copy_alone * 1e-3) / 1e9, copy_alone,
                    copy_together, copy_together / copy_alone, gemm_together, gemm_together / gemm_alone, double(S) / (S - k));
      }
  return 0;
}
