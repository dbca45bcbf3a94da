// What this build of the hardware backend can do (placeholder until the GPU-backend issue).
#pragma once
namespace moesim {
/// True when this build found the CUDA toolkit and NCCL (the CUDA parts of hw/ are compiled).
bool hw_backend_built();
}  // namespace moesim
