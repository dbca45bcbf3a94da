// NCCL's choice of all-reduce algorithm: its tuner predicts, for every algorithm and protocol, a
// latency plus bytes over a bandwidth, and runs the fastest (src/graph/tuning.cc ncclTopoTuneModel
// and ncclTopoGetAlgoTime, src/enqueue.cc's topoGetAlgoInfo, at NVIDIA/nccl 5067397c). This is that
// model for Ring and Tree (NVLS, CollNet and PAT need hardware moesim does not model), with its
// constants; the per-channel bandwidths that NCCL's topology search would find come from moesim's
// own lowering of each algorithm on the cluster (CostModel::nccl_tuner_input()).
#pragma once
#include <string>

namespace moesim {

enum class NcclProtocol { ll = 0, ll128 = 1, simple = 2 };
const char* nccl_protocol_name(NcclProtocol p);

struct NcclTunerInput {
  int ranks = 0;     // comm->nRanks
  int nodes = 0;     // comm->nNodes
  int channels = 1;  // graphs[a]->nChannels (Ring's and Tree's are equal here)
  double ring_bw = 0;  // GB/s per channel: graphs[RING]->bwIntra (≤ 2 nodes) or bwInter
  double tree_bw = 0;  // the same for Tree
  int compute_capability = 70;
  bool amd_cpu = false;       // cpuVendor == AMD: higher net overhead, lower LL cap
  bool nvlink = false;        // typeIntra == LINK_NVL: NVLink latencies, not PCI's
  bool ll128 = false;         // LL128 enabled (NVLink inside nodes, GPUDirect between them)
  bool simple_only = false;   // NCCL_PROTO=simple
  double net_latency_us = 0;  // graphs[a]->latencyInter: the network plugin's reported latency
};

struct NcclChoice {
  std::string algorithm;  // "ring" or "tree": moesim's lowering of that name
  NcclProtocol protocol = NcclProtocol::simple;
  double time_us = 0;
};

/// NCCL's per-channel bus-bandwidth cap of its Tree all-reduce, GB/s (tuning.cc perChMaxTreeBws,
/// Simple protocol): what one channel's tree kernel moves at most, by GPU generation and node count.
double nccl_tree_channel_cap(int compute_capability, int nodes);

/// ncclTopoGetAlgoTime for one all-reduce of `bytes`: the predicted µs, or a negative value where the
/// algorithm/protocol pair is disabled.
double nccl_all_reduce_time_us(const NcclTunerInput& in, const std::string& algorithm, NcclProtocol p, double bytes);
/// The algorithm and protocol NCCL would run (the fastest; Tree before Ring on a tie, as NCCL scans).
NcclChoice nccl_all_reduce_choice(const NcclTunerInput& in, double bytes);

/// The protocol NCCL runs a ring broadcast or reduce of `bytes` with (Ring is its only algorithm
/// for them): the fastest by its tuner, whose latency for them is one hop's when all its channels
/// are the same ring (`same_channels`) and nRanks hops' otherwise (tuning.cc:395-402).
NcclProtocol nccl_chain_protocol(const NcclTunerInput& in, bool same_channels, double bytes);

}  // namespace moesim
