// The hardware backends as the rest of moesim sees them: what this build has, and a Backend by
// name. hw/ is the only place that includes CUDA, NCCL or MPI headers.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "backend.hpp"
#include "cluster.hpp"
#include "model.hpp"

namespace moesim {
/// True when this build found the CUDA toolkit and NCCL.
bool hw_backend_built();
/// CUDA GPUs this process can see (0 without CUDA, or without a driver).
int visible_gpus();
/// GPU `device` as CUDA reports it, and the software it runs under: what a measured profile's
/// header names. Without CUDA, or without that device: nothing.
struct DeviceIdentity {
  std::string name;             // "NVIDIA H200"
  double memory_gib = 0;
  int compute_capability = 0;   // 90 for 9.0
  std::string software;         // "CUDA driver 13.0, runtime 13.0, cuBLAS 13.1.0, NCCL 2.28.3"
};
std::optional<DeviceIdentity> device_identity(int device);
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
