// NCCL's tuning model for all-reduce, Ring and Tree, as src/graph/tuning.cc writes it (line numbers
// at NVIDIA/nccl 5067397c). Symbols are NCCL's: busBw, latencies, intraLat, interLat, nsteps.
#include "nccl_tuner.hpp"

#include "nccl_constants.hpp"

#include <algorithm>
#include <cmath>

namespace moesim {
namespace {

constexpr int kTree = 0, kRing = 1;  // NCCL_ALGO_TREE, NCCL_ALGO_RING
// tuning.cc:148-210, ncclTunerConstantsDefaults (baseLat: platforms/nccl_constants.hpp).
using nccl::baseLat;
constexpr double hwLatNvlink[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
constexpr double hwLatPci[2][3] = {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}};
constexpr double hwLatNet[2][3] = {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}};
constexpr double llMaxBws[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}};
constexpr double perChMaxRingLL128Bws[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {40, 40, 40}};
constexpr double perChMaxTreeLL128Bws[4][3] = {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double perChMaxTreeBws[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
// tuning.cc:623-627: "Trees are not perfectly sticking to the model for medium sizes", 64 B to 256 MB.
constexpr double treeCorrectionFactor[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

int log2i(double x) { return x < 1 ? -1 : int(std::floor(std::log2(x))); }

// The row of the constants above for a GPU generation (tuning.cc compCapIndex); 0 (unknown) reads
// as Volta's, NCCL's lowest.
int comp_cap_index(int cc) { return cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0; }

struct Model {
  double busBw = 0, latency = 0;
};

// ncclTopoTuneModel for one algorithm and protocol (tuning.cc:258-437, 538): coll = AllReduce, or
// with `chain` a ring Broadcast or Reduce, whose latency NCCL models apart (tuning.cc:395-402): one
// hop's when its channels are all the same ring (`same_channels`), else nsteps = nRanks hops, with
// the Simple protocol each at the Tree's Simple hop latency ("Add some chunk latency, waiting for
// proper chunk modeling").
Model tune(const NcclTunerInput& in, int a, int p, bool chain = false, bool same_channels = false) {
  const int compCapIndex = comp_cap_index(in.compute_capability);
  const int index2 = in.nodes <= 2 ? in.nodes - 1 : 2;
  const int index1 = in.nodes == 1 ? compCapIndex : in.amd_cpu ? 1 : 0;
  const double llMaxBw = llMaxBws[index1][index2];
  const int nsteps = chain ? in.ranks : 2 * (in.ranks - 1);
  const double ppn = double(in.ranks) / in.nodes;

  Model m;
  if (p != int(NcclProtocol::simple) && in.simple_only) return m;  // NCCL_PROTO=simple
  if (p == int(NcclProtocol::ll128) && !in.ll128) return m;
  double busBw = in.channels * (a == kRing ? in.ring_bw : in.tree_bw);
  if (a == kRing && p == 0) busBw = std::min(llMaxBw, busBw * .5);
  if (a == kRing && p == 1) busBw = std::min(busBw * 0.92, in.channels * perChMaxRingLL128Bws[compCapIndex][index2]);
  if (a == kTree) busBw = std::min(busBw * .92, in.channels * perChMaxTreeBws[compCapIndex][index2]);
  if (a == kTree && p == 0) busBw = std::min(busBw * 1.0 / 3.8, llMaxBw);
  if (a == kTree && p == 1)
    busBw = std::min(busBw * (in.nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), in.channels * perChMaxTreeLL128Bws[compCapIndex][index2]);
  busBw *= a == kRing ? double(in.ranks) / nsteps : .5;  // bus bandwidth to algorithm bandwidth
  m.busBw = busBw;

  m.latency = baseLat[a][p];
  const auto& intraHw = in.nvlink ? hwLatNvlink : hwLatPci;
  if (chain) {
    const auto& hw = in.nodes == 1 ? intraHw : hwLatNet;
    m.latency += same_channels ? hw[kRing][p] : nsteps * (p == int(NcclProtocol::simple) ? hw[kTree][p] : hw[kRing][p]);
    return m;
  }
  double intraLat = intraHw[a][p];
  double interLat = (ppn == 1 ? hwLatNet[kTree][p] : hwLatNet[a][p]) + in.net_latency_us;
  if (p == int(NcclProtocol::simple)) interLat += in.net_latency_us;  // "the flush extra latency"
  if (a == kRing) {
    double netOverhead = 0;  // "Inter-node rings still have to launch nsteps * net overhead"
    if (in.nodes > 1) netOverhead = nccl::net_overhead_us(in.amd_cpu, p == int(NcclProtocol::simple));
    intraLat = std::max(intraLat, netOverhead);
    const int nInterSteps = in.nodes == 1 ? 0 : 2 * (in.nodes - 1);
    m.latency += (nsteps - nInterSteps) * intraLat + nInterSteps * interLat;
  } else {
    m.latency += 2 * ((in.ranks / in.nodes - 1) * intraLat + log2i(in.nodes) * interLat);
  }
  return m;
}

}  // namespace

double nccl_tree_channel_cap(int compute_capability, int nodes) {
  return perChMaxTreeBws[comp_cap_index(compute_capability)][nodes <= 2 ? std::max(nodes, 1) - 1 : 2];
}

const char* nccl_protocol_name(NcclProtocol p) {
  switch (p) {
    case NcclProtocol::ll: return "LL";
    case NcclProtocol::ll128: return "LL128";
    case NcclProtocol::simple: return "Simple";
  }
  return "?";
}

double nccl_all_reduce_time_us(const NcclTunerInput& in, const std::string& algorithm, NcclProtocol protocol,
                               double bytes) {
  if (in.ranks < 2 || in.nodes < 1) return 0;
  const int a = algorithm == "tree" ? kTree : kRing, p = int(protocol);
  const Model m = tune(in, a, p);
  double bw = m.busBw, lat = m.latency;
  if (bw <= 0) return -1;
  // ncclTopoGetAlgoTime (tuning.cc:630-655), one operation (numPipeOps = 1).
  const int logSize = log2i(std::floor(bytes / 64));
  if (a == kTree && logSize >= 0 && logSize < 23) bw *= treeCorrectionFactor[p][logSize];
  // comm->nChannels: the tree's graph channels are duplicated (connect.cc:460), so twice the graph's.
  if (a == kRing && p == int(NcclProtocol::simple) && in.nodes > 1 && bytes / (2.0 * in.channels * in.ranks) >= 64)
    lat *= in.compute_capability < 80 ? 1.9 : 1.4;  // "Plateau effect of ring"
  return lat + bytes / (1000 * bw);
}

NcclChoice nccl_all_reduce_choice(const NcclTunerInput& in, double bytes) {
  NcclChoice best{"ring", NcclProtocol::simple, -1};
  for (const char* a : {"tree", "ring"})  // NCCL_ALGO_TREE = 0 comes first; a later one must be faster
    for (const auto p : {NcclProtocol::ll, NcclProtocol::ll128, NcclProtocol::simple}) {
      const double t = nccl_all_reduce_time_us(in, a, p, bytes);
      if (t >= 0 && (best.time_us < 0 || t < best.time_us)) best = {a, p, t};
    }
  return best;
}

NcclProtocol nccl_chain_protocol(const NcclTunerInput& in, bool same_channels, double bytes) {
  NcclProtocol best = NcclProtocol::simple;
  double fastest = -1;
  for (const auto p : {NcclProtocol::ll, NcclProtocol::ll128, NcclProtocol::simple}) {
    const Model m = tune(in, kRing, int(p), true, same_channels);
    if (m.busBw <= 0) continue;
    const double t = m.latency + bytes / (1000 * m.busBw);
    if (fastest < 0 || t < fastest) best = p, fastest = t;
  }
  return best;
}

}  // namespace moesim
