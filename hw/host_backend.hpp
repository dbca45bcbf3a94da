// The host device: the hardware backend's executor on the CPU, so that CI runs real work of the
// graph's shapes. Threads are ranks, memcpy is the transport, GEMMs are host::gemm (fp32).
//
// Each rank's thread runs the ops it takes part in (op_work.hpp) in id order, which is a
// topological order consistent on every rank, so the rendezvous of a transfer or collective can
// never wait for a rank that is blocked behind it. A rank's streams are run one op at a time: the
// host device shows the data path and real message sizes, not GPU stream overlap (that is the
// CUDA backend's and the simulator's business). Every wait has a timeout that names the op.
#pragma once
#include <memory>

#include "backend.hpp"
#include "cluster.hpp"
#include "model.hpp"

namespace moesim::hw {

struct HostOptions {
  double timeout_s = 120;  // a rank waiting longer than this for a peer fails the op, naming it
};

class HostBackend final : public Backend {
 public:
  HostBackend(const Cluster& cluster, const MoeModel& model, HostOptions options = {});
  ~HostBackend() override;
  std::string name() const override { return "host"; }
  Timing execute(const TaskGraph& graph) override;
  double now() const override { return clock_; }

 private:
  const Cluster& cluster_;
  MoeModel model_;  // the shapes of its memory-bound kernels (op_work.hpp)
  HostOptions options_;
  double clock_ = 0;
};

}  // namespace moesim::hw
