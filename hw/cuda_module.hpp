// The CUDA backend as a module (libmoesim_cuda.so) that moesim loads the first time it needs a GPU.
// Linked into every program, cuBLAS, cuBLASLt and NCCL cost each process about 0.4 s and 220 MB
// before main() (cuBLASLt's static constructors, under perf), and nearly every run simulates and
// never touches them. hw_info.cpp dlopen()s the module on the first call that needs CUDA; this
// header is the table of entry points both sides share, built from the same sources in one build.
// The module carries its own copy of the moesim code it calls (static libraries, their symbols kept
// inside it), so only these entry points cross.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "cuda_backend.hpp"
#include "hw_info.hpp"

namespace moesim::hw {

struct CudaModule {
  std::size_t size = sizeof(CudaModule);  // a module from another build of moesim is refused
  int (*visible_gpus)() = nullptr;
  std::optional<DeviceIdentity> (*device_identity)(int device) = nullptr;
  std::string (*description)() = nullptr;
  std::unique_ptr<Backend> (*make_backend)(const Cluster&, const MoeModel&, CudaOptions) = nullptr;
};

}  // namespace moesim::hw

/// The module's one exported entry: its table.
extern "C" const moesim::hw::CudaModule* moesim_cuda_module();
