// The cost model: the policies' belief about how long things take, before running them
// (docs/architecture.md §3). FasterMoE's performance model (docs/spec/fastermoe.md §1):
//   compute  Lat_comp = max over workers of the time of its expert GEMMs (load-aware, Eq. 1), from
//            the platform's GEMM-efficiency curve or, as FasterMoE does, 90% of peak;
//   network  Lat_comm = max over directed links l of T_l / W_l (Eq. 2), with every message's bytes
//            added to each directed link of its route; a collective (ring all-reduce, broadcast,
//            ...) as its algorithm lowers it, the same rings and channels the backends run
//            (policies/collectives): 2(n−1)/n·S per ring edge for an all-reduce, S per chain edge
//            for a broadcast, split over the channels.
// Routes are the cluster's: inside a node its links; between nodes GPU -> NIC -> node uplink ->
// (leaf uplinks, when the nodes are under different leaves) -> node uplink -> NIC -> GPU. Leaf
// uplinks are one aggregate of `spines` fabric links (perfect spreading, as adaptive routing
// gives). A message between nodes also costs its NIC's per-message overhead, as in the backend;
// route latency and NCCL's send/recv rounds are ignored (FasterMoE: messages are > 4 KB,
// bandwidth-only).
// One cost model serves every policy that needs a prediction.
#pragma once
#include <vector>

#include "cluster.hpp"
#include "collectives/collectives.hpp"
#include "gpu.hpp"
#include "model.hpp"
#include "nccl_tuner.hpp"
#include "routing.hpp"
#include "taskgraph.hpp"

namespace moesim {

struct CostOptions {
  bool fastermoe_90_percent = false;  // GEMMs at 90% of peak instead of the efficiency curve
};

/// DDL-Roofline quantities of one MoE layer (docs/spec/fastermoe.md §1.6, Eqs. 3-6).
struct Roofline {
  double lat_comp = 0;   // one forward pass of the expert GEMMs, slowest worker
  double lat_comm = 0;   // one all-to-all
  double r_cc = 0;       // Lat_comp / Lat_comm
  double lat_e2e = 0;    // 3 Lat_comp + 4 Lat_comm (synchronous EP, fwd + bwd)
  double p_bar = 0;      // 12 α H² Σ B_w / (N Lat_e2e), FLOP/s per worker
  double p_worker = 0;   // P_w: a worker's GEMM throughput at the layer's largest load
  double p_ideal = 0;    // P_w · min(1, R_CC)
  double p_semi = 0;     // P_w · R_CC / (R_CC + 1)
};

class CostModel {
 public:
  CostModel(const Cluster& cluster, const GpuModel& gpu, CostOptions options = {});

  const Cluster& cluster() const { return cluster_; }

  /// Seconds of a set of concurrent messages: bytes[i·G + j] from GPU i to GPU j (Eq. 2).
  double alltoall_time(const std::vector<double>& bytes) const;
  /// A collective as its algorithm lowers it: NCCL's per-call latency, then a step lasts as long as
  /// its most loaded directed link takes (each transfer × its rounds), a lane its steps one after
  /// another, lanes side by side.
  double collective_time(const Collective& c) const;
  /// All-reduce of S bytes over `group` with the algorithm NCCL would pick (nccl_all_reduce()), and
  /// ring broadcast from group[0]: collective_time().
  double allreduce_time(const std::vector<int>& group, double bytes) const;
  double broadcast_time(const std::vector<int>& group, double bytes) const;

  /// NCCL's tuner's view of an all-reduce over `group` (nccl_tuner.hpp): the channels and platform
  /// facts from the cluster, and each algorithm's per-channel bandwidth from this model's own lowering
  /// of it (a 1 GiB all-reduce: Ring's bus bandwidth / C, Tree's 2 · algorithm bandwidth / C, the
  /// quantities NCCL's topology search gives as graph->bwIntra/bwInter).
  NcclTunerInput nccl_tuner_input(const std::vector<int>& group) const;
  /// The all-reduce algorithm NCCL would run for `bytes` over `group`: "ring" or "tree".
  std::string nccl_all_reduce(const std::vector<int>& group, double bytes) const;
  /// The algorithm an all-reduce runs when the spec chose `chosen` (collective_algorithm()):
  /// "nccl", the default, resolved per call by nccl_all_reduce(); any other as it is.
  std::string all_reduce_algorithm(const std::string& chosen, const std::vector<int>& group, double bytes) const {
    return chosen == "nccl" ? nccl_all_reduce(group, bytes) : chosen;
  }

  /// Seconds of `tokens` tokens through one expert, one forward pass (2 GEMMs).
  double expert_time(const MoeModel& model, double tokens) const;
  /// Eq. 1: max over GPUs of their experts' forward time, experts placed E/G per GPU.
  double expert_phase_time(const MoeModel& model, const RoutingMatrix& routing) const;
  /// Bytes of the dispatch all-to-all of a routing under E/G-per-GPU placement.
  std::vector<double> dispatch_bytes(const MoeModel& model, const RoutingMatrix& routing) const;

  Roofline roofline(const MoeModel& model, const RoutingMatrix& routing) const;

  /// Directed links of the model, for reports: name and bandwidth.
  std::size_t num_links() const { return bandwidth_.size(); }

 private:
  // collective_time() of a lowering; `kernels`: with what its kernels lose to the links' rate, each
  // step's min_seconds and link_rate (without: the links alone, as NCCL's topology search rates them).
  double lowering_time(const Lowering& lowering, bool kernels) const;
  // Adds `bytes`, sent as `messages` messages (each with its NIC's overhead), to every directed link
  // on the route from GPU i to GPU j.
  void add_route(std::vector<double>& load, int i, int j, double bytes, int messages = 1) const;
  double max_time(const std::vector<double>& load) const;

  const Cluster& cluster_;
  const GpuModel& gpu_;
  CostOptions options_;
  std::vector<double> bandwidth_;  // per directed link
  int node_base_, nic_base_, uplink_base_, leaf_base_;
  bool has_leaves_ = false;
};

}  // namespace moesim
