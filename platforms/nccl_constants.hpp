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

}  // namespace moesim::nccl
