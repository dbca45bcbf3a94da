// libFuzzer target for platform files: parsed and validated into a Cluster (routes, rings,
// channels) and its cost model, or an InputError naming the field.
#include "cluster.hpp"
#include "cost_model.hpp"
#include "fuzz_common.hpp"
#include "gpu.hpp"
#include "spec.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moesim::fuzz::quiet_protobuf();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = moesim::fuzz::write_input(moesim::fuzz::scratch() / "platform.textproto", data, size);
  return moesim::fuzz::only_input_errors([&] {
    const moesim::Cluster cluster(moesim::load_platform(path));
    const moesim::GpuModel gpu(cluster.spec().gpu(), moesim::spec::FP16);
    std::vector<int> all;
    for (int r = 0; r < std::min(cluster.num_gpus(), 64); ++r) all.push_back(r);
    (void)moesim::CostModel(cluster, gpu).allreduce_time(all, 1 << 20);
  });
}
