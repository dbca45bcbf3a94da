#include "hw_info.hpp"
namespace moesim {
bool hw_backend_built() { return MOESIM_HAVE_CUDA; }
}  // namespace moesim
