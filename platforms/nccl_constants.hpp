// NCCL's own estimates of what it costs beyond the bytes, as src/graph/tuning.cc writes them (at
// NVIDIA/nccl 5067397c): the per-call latency and the network proxy's per-operation overhead. The
// platform's defaults come from here (cluster.cpp) and so does NCCL's tuner (policies/nccl_tuner.cpp).
#pragma once

namespace moesim::nccl {

/// tuning.cc:148-210, ncclTunerConstantsDefaults: baseLat[algorithm][protocol] in µs, algorithms
/// Tree and Ring, protocols LL, LL128 and Simple.
inline constexpr double baseLat[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
inline constexpr int kSimple = 2;

/// tuning.cc getNetOverhead(): µs the proxy spends posting one network operation, 2 on AMD hosts
/// and 1 otherwise; the tuner charges three times that with the Simple protocol ("Inter-node rings
/// still have to launch nsteps * net overhead").
constexpr double net_overhead_us(bool amd_cpu, bool simple) { return (amd_cpu ? 2.0 : 1.0) * (simple ? 3 : 1); }

/// src/graph/paths.cc, NCCL_PARAM(P2pPerChannelNetBw, "P2P_PER_CHANNEL_NET_BW", 14): GB/s one p2p
/// channel moves through the network, by which NCCL sizes a remote peer's channels.
inline constexpr double p2pPerChannelNetBw = 14;

/// Bytes a ring broadcast or reduce moves per channel and step with the Simple protocol: the 4 MiB
/// buffer (init.cc DEFAULT_BUFFSIZE) over NCCL_STEPS = 8 (devcomm.h), one step a chunk and a slice
/// (collectives.h BROADCAST_CHUNKSTEPS, REDUCE_CHUNKSTEPS = 1; broadcast.h and reduce.h: a chunk is
/// min(this, the bytes left / channels)). The same at v2.10.3-1, the NCCL of the V100 papers.
inline constexpr double simpleChainSlice = double(1 << 22) / 8;
/// tuning.cc:331 (:130 at v2.10.3-1): a Tree's bus bandwidth is 0.92 of what its channels' links
/// give ("busBw * .92"), before its kernels' per-channel cap (perChMaxTreeBws).
inline constexpr double treeLinkEfficiency = 0.92;
/// connect.cc ncclTopoPostset ("Duplicate channels rings/trees"): NCCL runs every channel its
/// search found twice, on the same ring, up to MAXCHANNELS.
inline constexpr int channelDuplication = 2;

}  // namespace moesim::nccl
