// The CUDA backend: a TaskGraph on real GPUs. Built only with the CUDA toolkit and NCCL.
//
// Ranks: one process driving every GPU of this machine (rank r on GPU r), or, under `mpirun -np N`,
// one process per rank (built with MPI; NCCL's unique id broadcast over MPI; rank 0 writes the
// results). Each rank has the TaskGraph's three streams; ops are enqueued in id order (the order is
// the same on every rank, as NCCL needs) with dependencies as CUDA events:
//   compute     GEMMs through cuBLAS (cublasGemmEx / strided-batched, the model's dtype, fp32
//               accumulation); gate, encode/decode, optimizer and elementwise bytes through
//               cuda_kernels.cu's kernels
//   transfer    ncclSend / ncclRecv between the two ranks (a copy when source = destination)
//   collective  its lowering (policies/collectives, as the simulator runs it): each step one
//               ncclGroupStart/End of its sends and receives, then its local copies
// Per-op start and end come from CUDA events (an op's start: its earliest rank's; its end: its
// latest's). A host sync (Compute::blocks_host) reads 8 bytes to the host and holds the host until
// they land, as .cpu() holds PyTorch's. The host polls for completion and NCCL's asynchronous
// errors, and a graph that has not finished after `timeout_s` fails naming the first op still
// running, after aborting the communicators: never a hang.
#pragma once
#include <cstddef>
#include <memory>

#include "backend.hpp"
#include "cluster.hpp"
#include "model.hpp"

namespace moesim::hw {

struct CudaOptions {
  double timeout_s = 300;
  int ranks = 0;  // ranks of the graphs to run (0: the cluster's GPUs)
};

std::unique_ptr<Backend> make_cuda_backend(const Cluster& cluster, const MoeModel& model, CudaOptions options = {});

/// host::gemm's contract (row-major fp32, C = op(A)·op(B) + beta·C) computed by cuBLAS's SGEMM on
/// the current GPU, in plain fp32 (no TF32): host memory in and out, one call at a time from any
/// thread. The data path's experts run on it on a GPU (data_path.hpp).
void cublas_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B, float* C,
                 float beta);

}  // namespace moesim::hw
