// The hardware backends as the rest of moesim sees them: what this build has, and a Backend by
// name. hw/ is the only place that includes CUDA, NCCL or MPI headers.
#pragma once
#include <memory>
#include <string>

#include "backend.hpp"
#include "cluster.hpp"
#include "model.hpp"

namespace moesim {
/// True when this build found the CUDA toolkit and NCCL.
bool hw_backend_built();
/// CUDA GPUs this process can see (0 without CUDA, or without a driver).
int visible_gpus();
/// One line for `moesim --version`.
std::string hw_backend_description();
/// "host": the host device (always built). "hw": the GPUs through CUDA, cuBLAS and NCCL, one rank
/// per GPU of the cluster (or the first `ranks` of them: calibration); InputError when this build has no CUDA, when the machine has fewer GPUs
/// than the cluster has ranks, or when the model does not fit a GPU's memory (before allocating).
/// This process's rank under mpirun (OpenMPI's or PMI's environment), 0 otherwise: only rank 0
/// prints and writes results.
int launcher_rank();
std::unique_ptr<Backend> make_hw_backend(const std::string& name, const Cluster& cluster, const MoeModel& model,
                                         int ranks = 0);
}  // namespace moesim
