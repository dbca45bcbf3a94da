// A layer schedule: how one MoE layer's exchange and expert work become ops, forward or backward.
// A policy names exactly one in its IterationPlan; the iteration builder (moe_iteration.cpp) lays
// out everything around the MoE layers and calls emit() for each layer and pass. Each schedule is
// one file beside this one, written like its paper's description with the paper's symbols, and has
// a golden timeline in tests/golden/ (docs/model.md lists them):
//
//   sequential.cpp  dispatch all-to-all → experts → combine all-to-all (expert parallelism)
//   smart.cpp       FasterMoE's smart schedule: n steps S_j, C_j, R_j over groups of workers
//   pipelined.cpp   ScheMoE's OptSche / Tutel's pipelining: r parts, optionally compressed
//   sharded.cpp     Tutel's adaptive parallelism with fewer experts than GPUs (r of s)
//   zero.cpp        ZeRO-2/3 over the experts: every GPU computes every expert on its own tokens
//
// Adding a schedule: a file here with a class deriving from LayerSchedule and a factory below;
// docs/extending.md lists the steps.
#pragma once
#include <memory>
#include <string>

#include "taskgraph.hpp"

namespace moesim {

class LayerOps;  // layer_ops.hpp: the primitives a schedule composes

enum class Pass { forward, backward };
inline const char* pass_name(Pass p) { return p == Pass::forward ? "fwd" : "bwd"; }

/// Where a layer's experts live and who computes which tokens; the builder sizes exchanges,
/// expert work and memory from it.
struct ExpertPlacement {
  enum Kind {
    owner,          // each expert on one GPU (plus the plan's replicas): expert parallelism
    data_parallel,  // every GPU computes every expert on its own tokens (ZeRO over the experts)
    sharded,        // expert e on the s = G/E GPUs e·s .. e·s + s − 1, in r slices (Tutel)
  } kind = owner;
  int zero_stage = 0;  // data_parallel: ZeRO stage 2 or 3
  int r = 0;           // sharded: the r of Tutel's adaptive parallelism (a divisor of s)
};

class LayerSchedule {
 public:
  virtual ~LayerSchedule() = default;
  virtual std::string name() const = 0;
  /// One MoE layer, forward or backward, after ops.ready() on every rank; returns the op the
  /// layer's next ops wait for.
  virtual OpId emit(LayerOps& ops, int layer, Pass pass) const = 0;
  virtual ExpertPlacement placement() const { return {}; }
  /// Ops after every GPU's optimizer step (`steps`), e.g. ZeRO-2's gather of updated parameters.
  virtual void after_optimizer(LayerOps&, const std::vector<OpId>& /*steps*/) const {}
};

/// A compressor's tasks around a pipelined layer's all-to-alls (ScheMoE; none when `on()` is
/// false): at a given throughput (payload bytes per second), or as memory traffic per payload
/// byte at the GPU's elementwise bandwidth; and the all-to-alls it sends besides the payload's
/// (one value per token each: INT8's bias and scale).
struct Codec {
  double bytes_per_s = 0;
  double compress_traffic = 0, decompress_traffic = 0;
  int side_all_to_alls = 0;
  bool on() const { return bytes_per_s > 0 || compress_traffic > 0; }
};

/// How a pipelined layer is cut and what its all-to-alls carry.
struct Pipelining {
  int partitions = 1;        // r parts along the capacity dimension
  double wire_ratio = 1;     // bytes on the wire / payload bytes (a compressor's bits / dtype bits)
  int messages_per_peer = 1; // Collective::messages: Tutel's linear all-to-all sends ΔE = E/G per peer
  Codec codec = {};
};

std::shared_ptr<const LayerSchedule> sequential_schedule();
std::shared_ptr<const LayerSchedule> smart_schedule(int group_size);
std::shared_ptr<const LayerSchedule> pipelined_schedule(const Pipelining& pipelining);
std::shared_ptr<const LayerSchedule> sharded_schedule(int r, int partitions);
std::shared_ptr<const LayerSchedule> zero_schedule(int stage);

}  // namespace moesim
