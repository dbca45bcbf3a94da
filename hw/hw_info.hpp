// What this build of the hardware backend can do (a placeholder until the GPU-backend issue).
// hw/ is the only place that includes CUDA, NCCL or MPI headers.
#pragma once
#include <string>

namespace moesim {
/// True when this build found the CUDA toolkit and NCCL.
bool hw_backend_built();
/// One line for `moesim --version`.
std::string hw_backend_description();
}  // namespace moesim
