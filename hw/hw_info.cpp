#include "hw_info.hpp"

#include <cstdlib>

#include "errors.hpp"
#include "host_backend.hpp"
#if MOESIM_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cuda_backend.hpp"
#endif

namespace moesim {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

bool hw_backend_built() { return MOESIM_HAVE_CUDA; }

int visible_gpus() {
#if MOESIM_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
#else
  return 0;
#endif
}

std::optional<DeviceIdentity> device_identity(int device) {
#if MOESIM_HAVE_CUDA
  cudaDeviceProp prop{};
  if (device >= visible_gpus() || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return std::nullopt;
  int driver = 0, runtime = 0, nccl = 0, blas = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);  // MAJOR*10000 + MINOR*100 + PATCH since NCCL 2.9
  cublasGetProperty(MAJOR_VERSION, &blas);
  int blas_minor = 0, blas_patch = 0;
  cublasGetProperty(MINOR_VERSION, &blas_minor);
  cublasGetProperty(PATCH_LEVEL, &blas_patch);
  DeviceIdentity id;
  id.name = prop.name;
  id.memory_gib = double(prop.totalGlobalMem) / double(1ull << 30);
  id.compute_capability = prop.major * 10 + prop.minor;
  id.software = "CUDA driver " + std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) + ", runtime " +
                std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ", cuBLAS " +
                std::to_string(blas) + "." + std::to_string(blas_minor) + "." + std::to_string(blas_patch) + ", NCCL " +
                std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  return id;
#else
  (void)device;
  return std::nullopt;
#endif
}

std::string hw_backend_description() {
#if MOESIM_HAVE_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  return "CUDA runtime " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ", NCCL " +
         std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + ", " + std::to_string(visible_gpus()) +
         " GPU(s) visible; host device";
#else
  return "built without CUDA (no toolkit found); host device";
#endif
}

std::unique_ptr<Backend> make_hw_backend(const std::string& name, const Cluster& cluster, const MoeModel& model,
                                         int ranks) {
  if (name == "host") return std::make_unique<hw::HostBackend>(cluster, model);
  if (name != "hw") throw InputError("--backend " + name + ": use sim, host or hw");
#if MOESIM_HAVE_CUDA
  hw::CudaOptions options;
  options.ranks = ranks;
  return hw::make_cuda_backend(cluster, model, options);
#else
  (void)cluster;
  (void)model;
  (void)ranks;
  throw InputError("--backend hw: this build of moesim has no CUDA (the toolkit and NCCL were not found when it was "
                   "configured); rebuild on a machine with /usr/local/cuda, or use --backend host");
#endif
}

}  // namespace moesim
