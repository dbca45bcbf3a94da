// The released ZFP (Fragile-azalea/zfp, cuda_zfp) as ScheMoE calls it (schemoe/custom/compressor/
// zfpc.cpp): a 2D fp32 field d_model x tokens, fixed rate, CUDA execution, device pointers in and
// out. Times zfp_compress and zfp_decompress by wall clock after a warm-up (what a caller pays).
// Not part of moesim's build (it needs that fork of zfp); on a machine with the CUDA toolkit:
//   (a checkout of Fragile-azalea/zfp in zfp/) cd zfp && cmake -S . -B b -DZFP_WITH_CUDA=ON \
//     -DCUDA_NVCC_FLAGS=-gencode=arch=compute_90,code=sm_90 -DBUILD_SHARED_LIBS=OFF -DBUILD_TESTING=OFF \
//     -DBUILD_UTILITIES=OFF && cmake --build b
//   g++ -O2 -std=c++17 -Izfp/include -I/usr/local/cuda/include bench/zfp/zfp_bench.cpp zfp/b/lib/libzfp.a \
//     -L/usr/local/cuda/lib64 -lcudart -fopenmp -o zfp_bench && ./zfp_bench
// What one H100 measured: docs/hardware.md ("ZFP as ScheMoE releases it").
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include <cuda_runtime.h>
#include "zfp.h"
int main() {
  int dev = 0; cudaDeviceProp prop; cudaGetDeviceProperties(&prop, dev);
  std::printf("device %s\n", prop.name);
  // d_model x tokens: ScheMoE Table 7's 4.3 MB part (512 x 2,108) and Table 10's 644 MB (8,192 x
  // 19,664) among others; 8 bits a value, ScheMoE's compress_rate.
  const int shapes[][2] = {{512, 2108}, {1024, 2048}, {512, 4216}, {512, 16384}, {1024, 16384}, {2048, 32768}, {8192, 19664}, {4096, 65536}};
  for (double rate : {8.0})
    for (auto [nx, ny] : shapes) {
      const size_t n = size_t(nx) * ny, bytes = n * 4;
      std::vector<float> h(n); std::mt19937 g(1); std::normal_distribution<float> nd(0, 1);
      for (auto& v : h) v = nd(g);
      float *in, *out; cudaMalloc(&in, bytes); cudaMalloc(&out, bytes);
      cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice);
      cudaStream_t st; cudaStreamCreate(&st);
      zfp_field* f = zfp_field_2d(in, zfp_type_float, nx, ny); f->cuda_stream = &st;
      zfp_field* fo = zfp_field_2d(out, zfp_type_float, nx, ny); fo->cuda_stream = &st;
      zfp_stream* z = zfp_stream_open(nullptr);
      zfp_stream_set_rate(z, rate, zfp_type_float, 2, 0);
      if (!zfp_stream_set_execution(z, zfp_exec_cuda)) { std::printf("no cuda execution\n"); return 1; }
      const size_t cap = zfp_stream_maximum_size(z, f); void* buf; cudaMalloc(&buf, cap);
      bitstream* bs = stream_open(buf, cap); zfp_stream_set_bit_stream(z, bs);
      auto run = [&](bool comp) { zfp_stream_rewind(z); size_t r = comp ? zfp_compress(z, f) : zfp_decompress(z, fo); cudaStreamSynchronize(st); cudaDeviceSynchronize(); return r; };
      size_t len = run(true); run(false);
      const int reps = n > 50000000 ? 5 : 30;
      auto t0 = std::chrono::steady_clock::now(); for (int i = 0; i < reps; ++i) run(true);
      auto t1 = std::chrono::steady_clock::now(); for (int i = 0; i < reps; ++i) run(false);
      auto t2 = std::chrono::steady_clock::now();
      const double tc = std::chrono::duration<double>(t1 - t0).count() / reps, td = std::chrono::duration<double>(t2 - t1).count() / reps;
      std::vector<float> back(n); cudaMemcpy(back.data(), out, bytes, cudaMemcpyDeviceToHost);
      double err = 0; for (size_t i = 0; i < n; i += 997) err = std::max(err, double(std::fabs(back[i] - h[i])));
      std::printf("rate %4.0f  %5d x %6d  %8.2f MB  compress %8.1f us %7.1f GB/s  decompress %8.1f us %7.1f GB/s  stream %zu B  max err %.3g  %s\n",
                  rate, nx, ny, bytes / 1e6, tc * 1e6, bytes / tc / 1e9, td * 1e6, bytes / td / 1e9, len, err,
                  cudaGetErrorString(cudaGetLastError()));
      zfp_stream_close(z); stream_close(bs); zfp_field_free(f); zfp_field_free(fo);
      cudaFree(in); cudaFree(out); cudaFree(buf); cudaStreamDestroy(st);
    }
}
