#include "hw_info.hpp"

#if MOESIM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace moesim {

bool hw_backend_built() { return MOESIM_HAVE_CUDA; }

std::string hw_backend_description() {
#if MOESIM_HAVE_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  return "CUDA runtime " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ", NCCL " +
         std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + " (GPU backend not implemented yet)";
#else
  return "built without CUDA (no toolkit found)";
#endif
}

}  // namespace moesim
