// NCCL's choice between Ring and Tree for an all-reduce, and of a protocol for a ring broadcast or
// reduce (policies/nccl_tuner.cpp, a port of src/graph/tuning.cc): hand-computed predictions, the
// choices NCCL's model makes for the systems moesim models, and the policies' all-reduces taking them.
#include <catch2/catch.hpp>

#include "cost_model.hpp"
#include "gpu.hpp"
#include "helpers.hpp"
#include "policy.hpp"

using namespace moesim;

namespace {

std::vector<int> first(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

// Two p4d nodes as NCCL's search describes them (channels and per-channel bandwidths traced by
// hand, tools/nccl_tuning_model.py): EFA, so Simple only and aws-ofi-nccl's 75 µs.
NcclTunerInput p4d_two_nodes() {
  NcclTunerInput in;
  in.ranks = 16, in.nodes = 2, in.channels = 4, in.ring_bw = 12.5, in.tree_bw = 25, in.compute_capability = 80;
  in.nvlink = true, in.ll128 = true, in.simple_only = true, in.net_latency_us = 75;
  return in;
}

}  // namespace

TEST_CASE("NCCL's predicted all-reduce time, by hand: Ring and Tree, Simple, on two p4d nodes") {
  const NcclTunerInput in = p4d_two_nodes();
  const double S = 1 << 30;
  // Ring: busBw 4·12.5 = 50 GB/s, × nRanks/nsteps = 16/30. Latency 8.4 (base) + 28 intra steps ×
  // max(3.4 NVLink, 3·1 net overhead) + 2 inter steps × (14 + 75 + 75 flush), × 1.4 (Ampere plateau).
  const double ring = (8.4 + 28 * 3.4 + 2 * (14 + 75 + 75)) * 1.4 + S / (1000 * 50.0 * 16 / 30);
  CHECK(nccl_all_reduce_time_us(in, "ring", NcclProtocol::simple, S) == Approx(ring));
  // Tree: busBw min(4·25·0.92, 4·23.6) = 92, × 0.5. Latency 8.4 + 2·(7 intra × 4.0 + log2(2) × 164);
  // no size correction at 1 GiB (past 256 MB).
  const double tree = 8.4 + 2 * (7 * 4.0 + 1 * (14 + 75 + 75)) + S / (1000 * 92 * 0.5);
  CHECK(nccl_all_reduce_time_us(in, "tree", NcclProtocol::simple, S) == Approx(tree));
  // EFA: LL and LL128 are off.
  CHECK(nccl_all_reduce_time_us(in, "ring", NcclProtocol::ll, S) < 0);
  CHECK(nccl_all_reduce_time_us(in, "tree", NcclProtocol::ll128, S) < 0);
  const NcclChoice c = nccl_all_reduce_choice(in, S);
  CHECK(c.algorithm == "tree");
  CHECK(c.protocol == NcclProtocol::simple);
  CHECK(c.time_us == Approx(tree));
}

TEST_CASE("NCCL's choices: Tree on 2 p4d nodes at every size, Ring for large all-reduces on DGX A100 and PCIe") {
  for (const double S : {1 << 20, 64 << 20, 1 << 30}) CHECK(nccl_all_reduce_choice(p4d_two_nodes(), S).algorithm == "tree");
  NcclTunerInput p4d4 = p4d_two_nodes();
  p4d4.ranks = 32, p4d4.nodes = 4, p4d4.tree_bw = 12.5;  // 4 nodes: graph bwInter, 12 traced
  CHECK(nccl_all_reduce_choice(p4d4, 1 << 20).algorithm == "tree");
  CHECK(nccl_all_reduce_choice(p4d4, 1 << 30).algorithm == "ring");
  // DGX A100, 2 nodes: AMD hosts, InfiniBand, LL128 on (NCCL's search: ring 8 × 24, tree 8 × 30).
  NcclTunerInput dgx;
  dgx.ranks = 16, dgx.nodes = 2, dgx.channels = 8, dgx.ring_bw = 24, dgx.tree_bw = 30, dgx.compute_capability = 80;
  dgx.amd_cpu = true, dgx.nvlink = true, dgx.ll128 = true;
  CHECK(nccl_all_reduce_choice(dgx, 1 << 20).algorithm == "tree");
  CHECK(nccl_all_reduce_choice(dgx, 1 << 20).protocol == NcclProtocol::ll128);
  CHECK(nccl_all_reduce_choice(dgx, 64 << 20).algorithm == "ring");
  CHECK(nccl_all_reduce_choice(dgx, 1 << 30).protocol == NcclProtocol::simple);
  // Four GPUs on PCIe with one NIC: Tree's chain costs more than it saves, at every size.
  NcclTunerInput pcie;
  pcie.ranks = 8, pcie.nodes = 2, pcie.channels = 1, pcie.ring_bw = 12, pcie.tree_bw = 7, pcie.compute_capability = 70;
  for (const double S : {1 << 20, 64 << 20, 1 << 30}) CHECK(nccl_all_reduce_choice(pcie, S).algorithm == "ring");
}

TEST_CASE("the cost model feeds NCCL's tuner its own bandwidths, and the policies take its choice") {
  auto spec = test::platform("p4d-a100", 2);
  const GpuModel gpu(spec.gpu(), spec::FP16);
  const Cluster cluster(spec);
  const CostModel cost(cluster, gpu);
  const NcclTunerInput in = cost.nccl_tuner_input(first(16));
  CHECK(in.nodes == 2);
  CHECK(in.channels == 4);
  // What NCCL's search gives on p4d (12 and 24 GB/s per channel): the NICs' 12 GB/s, NCCL's speed for
  // a 100 Gb/s NIC (src/graph/search.cc speedArrayInter).
  CHECK(in.ring_bw == Approx(12).epsilon(0.02));
  CHECK(in.tree_bw == Approx(24).epsilon(0.02));
  CHECK(in.simple_only);
  CHECK(in.net_latency_us == 75);
  CHECK(in.nvlink);
  CHECK(cost.nccl_all_reduce(first(16), 1 << 30) == "tree");
  // allreduce_time is the chosen algorithm's, here Tree's: S per node each way over 4 × 12 GB/s, at
  // 0.92 of the links as NCCL's tuner rates a tree, S / 44.16 GB/s, under the tree kernels' cap of
  // 23.6 GB/s of bus bandwidth per channel (Ampere, 2 nodes; algorithm bandwidth 4 · 23.6 / 2 = 47.2).
  CHECK(cost.allreduce_time(first(16), 1 << 30) ==
        Approx(cost.collective_time({CollectiveType::all_reduce, first(16), {1 << 30}, "tree"})));
  CHECK(cost.allreduce_time(first(16), 1 << 30) == Approx(8.4e-6 + double(1 << 30) / (48e9 * 0.92)).epsilon(0.002));  // + NCCL's per-call latency
  CHECK(nccl_tree_channel_cap(80, 2) == 23.6);
  // DGX A100: Ring at 1 GiB, Tree at 1 MiB.
  const auto dgx_spec = test::platform("dgx-a100", 2);
  const Cluster dgx(dgx_spec);
  const CostModel dgx_cost(dgx, gpu);
  CHECK(dgx_cost.nccl_tuner_input(first(16)).amd_cpu);
  CHECK(dgx_cost.nccl_all_reduce(first(16), 1 << 30) == "ring");
  CHECK(dgx_cost.nccl_all_reduce(first(16), 1 << 20) == "tree");
  // A GeForce box without NVLink or GPUDirect: PCI latencies, no LL128.
  const Cluster geforce(test::platform("rtx2080ti-pcie", 2));
  const auto pcie = CostModel(geforce, gpu).nccl_tuner_input(first(8));
  CHECK_FALSE(pcie.nvlink);
  CHECK_FALSE(pcie.ll128);

}

TEST_CASE("an iteration's dense all-reduce runs what NCCL's tuner picks, or the algorithm the spec names") {
  const test::SmallSetup t;
  const auto routing = t.routing(1);
  for (const std::string asked : {"", "ring", "tree"}) {
    INFO(asked);
    spec::PolicySpec ps;
    ps.set_name("ep");
    ps.set_all_reduce(asked);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
    int found = 0;
    for (const auto& op : g.ops())
      if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_reduce) {
        const std::string nccl = CostModel(t.cluster, t.gpu).nccl_all_reduce(c->group, c->bytes[0]);
        CHECK(c->algorithm == (asked.empty() ? nccl : asked));
        ++found;
      }
    CHECK(found == 1);
  }
}

// A ring broadcast or reduce (nsteps = nRanks, tuning.cc:395-402): one hop's latency when the
// channels are all the same ring, else nRanks hops', Simple's at the Tree's Simple hop latency.
TEST_CASE("NCCL's protocol for a ring broadcast or reduce, by hand: LL, LL128 or Simple by size") {
  // Two PCIe nodes, one channel (the same ring): Simple 8.4 + 14 µs + S / 11 GB/s against LL
  // 6.6 + 2.7 µs + S / 5.5 GB/s (half the bandwidth): LL below S = 13.1 µs · 11 GB/s = 144 KB.
  NcclTunerInput pcie;
  pcie.ranks = 16, pcie.nodes = 2, pcie.channels = 1, pcie.ring_bw = 11, pcie.compute_capability = 70;
  CHECK(nccl_chain_protocol(pcie, true, 100e3) == NcclProtocol::ll);
  CHECK(nccl_chain_protocol(pcie, true, 200e3) == NcclProtocol::simple);
  // Two DGX-A100-like nodes, eight channels that are not the same ring: Simple 8.4 + 16 · 14 µs +
  // S / 200 GB/s; LL128 14 + 16 · 4 µs + S / 160 GB/s (8 channels at Ampere's 20 GB/s cap); LL
  // 6.6 + 16 · 2.7 µs + S / 39 GB/s. LL up to 1.45 MB, LL128 up to 123.5 MB, then Simple.
  NcclTunerInput dgx;
  dgx.ranks = 16, dgx.nodes = 2, dgx.channels = 8, dgx.ring_bw = 25, dgx.compute_capability = 80;
  dgx.nvlink = true, dgx.ll128 = true;
  CHECK(nccl_chain_protocol(dgx, false, 1.4e6) == NcclProtocol::ll);
  CHECK(nccl_chain_protocol(dgx, false, 1.5e6) == NcclProtocol::ll128);
  CHECK(nccl_chain_protocol(dgx, false, 120e6) == NcclProtocol::ll128);
  CHECK(nccl_chain_protocol(dgx, false, 127e6) == NcclProtocol::simple);
  // The same channels: one hop's latency each (Simple 22.4 µs, LL128 18, LL 9.3), so Simple's
  // bandwidth wins from 4.4 µs / (1/160 − 1/200 GB/s) = 3.52 MB on, and LL only below 449 KB.
  CHECK(nccl_chain_protocol(dgx, true, 400e3) == NcclProtocol::ll);
  CHECK(nccl_chain_protocol(dgx, true, 3.4e6) == NcclProtocol::ll128);
  CHECK(nccl_chain_protocol(dgx, true, 3.6e6) == NcclProtocol::simple);
  // NCCL_PROTO=simple (EFA): Simple at every size.
  dgx.simple_only = true;
  CHECK(nccl_chain_protocol(dgx, false, 1e3) == NcclProtocol::simple);
}
