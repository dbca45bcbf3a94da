// libmoesim_cuda.so's entry points (cuda_module.hpp): what CUDA, cuBLAS and NCCL say of this machine,
// and the CUDA backend.
#include "cuda_module.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace moesim::hw {
namespace {

int cuda_visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string version(int major, int minor) { return std::to_string(major) + "." + std::to_string(minor); }

std::optional<DeviceIdentity> cuda_device_identity(int device) {
  cudaDeviceProp prop{};
  if (device >= cuda_visible_gpus() || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return std::nullopt;
  int driver = 0, runtime = 0, nccl = 0, blas = 0, blas_minor = 0, blas_patch = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);  // MAJOR*10000 + MINOR*100 + PATCH since NCCL 2.9
  cublasGetProperty(MAJOR_VERSION, &blas);
  cublasGetProperty(MINOR_VERSION, &blas_minor);
  cublasGetProperty(PATCH_LEVEL, &blas_patch);
  DeviceIdentity id;
  id.name = prop.name;
  id.memory_gib = double(prop.totalGlobalMem) / double(1ull << 30);
  id.compute_capability = prop.major * 10 + prop.minor;
  id.software = "CUDA driver " + version(driver / 1000, driver % 1000 / 10) + ", runtime " +
                version(runtime / 1000, runtime % 1000 / 10) + ", cuBLAS " + version(blas, blas_minor) + "." +
                std::to_string(blas_patch) + ", NCCL " + version(nccl / 10000, nccl / 100 % 100) + "." + std::to_string(nccl % 100);
  return id;
}

std::string cuda_description() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  return "CUDA runtime " + version(runtime / 1000, runtime % 1000 / 10) + ", NCCL " + version(NCCL_MAJOR, NCCL_MINOR) + ", " +
         std::to_string(cuda_visible_gpus()) + " GPU(s) visible";
}

const CudaModule kModule{sizeof(CudaModule), cuda_visible_gpus, cuda_device_identity, cuda_description, make_cuda_backend};

}  // namespace
}  // namespace moesim::hw

extern "C" __attribute__((visibility("default"))) const moesim::hw::CudaModule* moesim_cuda_module() { return &moesim::hw::kModule; }
