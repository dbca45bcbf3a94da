#include "hw_info.hpp"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "errors.hpp"
#include "host_backend.hpp"
#if MOESIM_HAVE_CUDA
#include <dlfcn.h>

#include "cuda_module.hpp"
#endif

namespace moesim {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

bool hw_backend_built() { return MOESIM_HAVE_CUDA; }

namespace {

#if MOESIM_HAVE_CUDA
// libmoesim_cuda.so (cuda_module.hpp), loaded once, on the first call that needs CUDA: next to the
// program (an installed or bundled moesim), in the build's directory (the tests' programs sit
// below it), else wherever the loader looks (LD_LIBRARY_PATH: the device bundle). Its table, or
// nullptr with the loader's reason in `why`.
struct Loaded {
  const hw::CudaModule* module = nullptr;
  std::string why;
};

const Loaded& cuda_module() {
  static const Loaded loaded = [] {
    Loaded l;
    constexpr const char* kName = "libmoesim_cuda.so";
    std::error_code ec;
    const auto program = std::filesystem::read_symlink("/proc/self/exe", ec);
    std::vector<std::string> tries;
    if (!ec) tries.push_back((program.parent_path() / kName).string());
    tries.push_back(std::string(MOESIM_CUDA_MODULE_DIR) + "/" + kName);
    tries.push_back(kName);
    for (const auto& path : tries) {
      if (path.find('/') != std::string::npos && !std::filesystem::exists(path, ec)) continue;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {  // not on the loader's path, or found but a library it needs is not: say which
        l.why = std::string(dlerror()) + "; looked next to the program, in " + MOESIM_CUDA_MODULE_DIR + " and on LD_LIBRARY_PATH";
        return l;
      }
      using Entry = const hw::CudaModule* (*)();
      const auto entry = reinterpret_cast<Entry>(dlsym(handle, "moesim_cuda_module"));
      const hw::CudaModule* m = entry ? entry() : nullptr;
      if (!m || m->size != sizeof(hw::CudaModule)) {
        l.why = path + " is not this build's CUDA module (rebuild moesim)";
        return l;
      }
      l.module = m;
      return l;
    }
    return l;
  }();
  return loaded;
}
#endif

}  // namespace

int visible_gpus() {
#if MOESIM_HAVE_CUDA
  const auto& l = cuda_module();
  return l.module ? l.module->visible_gpus() : 0;
#else
  return 0;
#endif
}

std::optional<DeviceIdentity> device_identity(int device) {
#if MOESIM_HAVE_CUDA
  const auto& l = cuda_module();
  return l.module ? l.module->device_identity(device) : std::nullopt;
#else
  (void)device;
  return std::nullopt;
#endif
}

std::string hw_backend_description() {
#if MOESIM_HAVE_CUDA
  const auto& l = cuda_module();
  return (l.module ? l.module->description() : "CUDA backend not loadable (" + l.why + ")") + "; host device";
#else
  return "built without CUDA (no toolkit found); host device";
#endif
}

std::unique_ptr<Backend> make_hw_backend(const std::string& name, const Cluster& cluster, const MoeModel& model,
                                         int ranks) {
  if (name == "host") return std::make_unique<hw::HostBackend>(cluster, model);
  if (name != "hw") throw InputError("--backend " + name + ": use sim, host or hw");
#if MOESIM_HAVE_CUDA
  const auto& l = cuda_module();
  if (!l.module) throw InputError("--backend hw: the CUDA backend could not be loaded: " + l.why + "; or use --backend host");
  hw::CudaOptions options;
  options.ranks = ranks;
  return l.module->make_backend(cluster, model, options);
#else
  (void)cluster;
  (void)model;
  (void)ranks;
  throw InputError("--backend hw: this build of moesim has no CUDA (the toolkit and NCCL were not found when it was "
                   "configured); rebuild on a machine with /usr/local/cuda, or use --backend host");
#endif
}

}  // namespace moesim
