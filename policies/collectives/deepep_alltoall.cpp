// DeepEP's normal (high-throughput) dispatch and combine (deepseek-ai/DeepEP V1,
// csrc/kernels/legacy/internode.cu and intranode.cu; docs/spec/modern.md), for a group of whole
// nodes in rank order (anything else is lowered as linear):
//   dispatch: a token goes over the network once per target node b, to the GPU of b with the
//     sender's local index (RDMA, one rail), which forwards it over NVLink to each GPU of b that
//     holds one of its experts, once per GPU; tokens for the sender's own node go over NVLink
//     directly;
//   combine: the way back: each GPU's results for a token go over NVLink to the GPU of its own node
//     with the token owner's local index, which reduces them and sends the sum over the network
//     once (`Collective::combine`).
// With m GPUs per node, p = (a, i) (node a, local index i) and q = (b, j):
//   dispatch, a ≠ b: network p → (b, i), then NVLink (b, i) → q;
//   combine,  a ≠ b: NVLink p → (a, j), then network (a, j) → q.
// What each hop carries: the NVLink hop `bytes`(p, q), tokens once per GPU; the network hop
// `network_bytes` (tokens once per node, DeepEP's num_tokens_per_rdma_rank; only pairs of ranks
// with the same local index on different nodes), or where that is empty the sum of `bytes` over
// the hop's pairs (each token once per GPU; routing with no token-level counts).
//
// The kernels pipeline the two hops chunk by chunk (an RDMA chunk is forwarded while the next
// arrives) and send to every peer at once from a fixed set of SMs, so the lowering is one step
// holding both hops' transfers: the exchange lasts as long as its busiest link, NIC or NVLink, the
// pipeline's fill (one chunk) neglected. The GPU posts its RDMA writes itself (IBGDA, DeepEP's
// only internode transport since 3e54b78), so no message pays NCCL's CPU-proxy post cost
// (messages = 0).
//
// Between nodes the kernels also have a throughput of their own, whatever the links allow: the
// exchange lasts at least the tokens a GPU's experts hold (what it receives in a dispatch, sends
// back in a combine, its own included; DeepEP's benchmark counts these as "NVL" bytes) over the
// rate of the SMs the kernels run on (Collective::sm_share of the GPU's), internode_per_sm() each.
// Inside one node the kernels are intranode.cu's, which reach 77-88% of the NVLink port's rate on
// Hopper (H200s at 24 SMs 321-332 GB/s of NVL bytes, aws-samples/awsome-distributed-training
// deepep-benchmark; the H800's table 153-158): less on the faster port, which one rate does not
// fit, so no floor applies there and the links set the time. Not modelled: the per-call kernels
// beside the exchange (notify, which exchanges the counts, or with a cached layout cached_notify, a
// barrier and buffer clean, which DeepEP's benchmark timed with the exchange).
#include <algorithm>
#include <stdexcept>

#include "collectives/collectives.hpp"

namespace moesim {

extern const CollectiveAlgorithm linear_alltoall;

namespace {

// What one SM moves of the expert side's tokens in DeepEP's internode normal kernels, bytes a second
// (Hopper: SM90 is what these kernels are built for). Measured with DeepEP's benchmark
// (tests/test_internode.py, as at 3b1045d) on two nodes of 8 H200 with a 400 Gb/s CX7 per GPU, 24 SMs:
// "Best dispatch (FP8): SMs 24 ...: 38.19 GB/s (RDMA), 124.92 GB/s (NVL)" and "Best combine: SMs 24
// ...: 44.37 GB/s (RDMA), 145.16 GB/s (NVL)" (deepseek-ai/DeepEP#493, DeepEP a84a248). The H200's
// NVLink moves 2.3x the H800's (370 against 160 GB/s, the platforms), yet its NVL bytes match the
// H800's at EP 16 in DeepEP's own table (43 GB/s of RDMA counted is 140 of NVL), as do two H20 nodes'
// (up to 139.3 GB/s, DeepEP#137): the kernels bind, not the links. Per SM, linear in the SMs (an
// assumption: only 24 SMs were measured).
double internode_per_sm(bool combine) { return (combine ? 145.16e9 : 124.92e9) / 24; }

// The kernels' floor between nodes: the most tokens any GPU's experts hold (column sums of a
// dispatch's bytes, row sums of a combine's, the GPU's own share included) over its SMs' rate.
double internode_kernel_seconds(const Collective& c, const Cluster& cluster) {
  const double sms = c.sm_share * double(cluster.spec().gpu().sms());
  if (!(sms > 0)) return 0;
  std::vector<double> held(c.group.size());
  c.bytes.for_each(c.group.size(), [&](std::size_t p, std::size_t q, double b) {
    held[c.combine ? p : q] += b;
    return true;
  });
  return *std::max_element(held.begin(), held.end()) / (sms * internode_per_sm(c.combine));
}

Lowering lower_deepep(const Collective& c, const Cluster& cluster) {
  if (!whole_nodes(c.group, cluster)) return linear_alltoall.lower(c, cluster);
  const std::size_t n = c.group.size(), m = std::size_t(cluster.gpus_per_node());
  const bool counted = !c.network_bytes.empty();
  std::vector<double> nvlink(n * m);   // [p · m + j]: rank p to local GPU j of p's node
  std::vector<double> network(n * n);  // [p · n + r]: rank p to rank r, same local index, another node
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t q = 0; q < n; ++q) {
      const double b = c.bytes.at(p, q, n);
      if (!(b > 0) || p == q) continue;
      const std::size_t node_p = p / m, node_q = q / m;
      if (node_p == node_q) {
        nvlink[p * m + q % m] += b;
      } else if (!c.combine) {
        const std::size_t relay = node_q * m + p % m;
        if (relay != q) nvlink[relay * m + q % m] += b;
        if (!counted) network[p * n + relay] += b;
      } else {
        const std::size_t relay = node_p * m + q % m;
        if (relay != p) nvlink[p * m + q % m] += b;
        if (!counted) network[relay * n + q] += b;
      }
    }
  if (counted)
    c.network_bytes.for_each(n, [&](std::size_t p, std::size_t r, double b) {
      if (b > 0 && (p % m != r % m || p / m == r / m))
        throw std::logic_error("deepep: network bytes between ranks that are not the same GPU of two nodes");
      network[p * n + r] += b;
      return true;
    });
  Step step;
  for (std::size_t p = 0; p < n; ++p) {
    for (std::size_t j = 0; j < m; ++j)
      if (nvlink[p * m + j] > 0) step.transfers.push_back({c.group[p], c.group[p - p % m + j], nvlink[p * m + j]});
    for (std::size_t r = 0; r < n; ++r)
      if (network[p * n + r] > 0) step.transfers.push_back({c.group[p], c.group[r], network[p * n + r]});
  }
  if (step.transfers.empty()) return {};
  step.messages = 0;
  if (n > m) step.min_seconds = internode_kernel_seconds(c, cluster);
  return one_step(std::move(step));
}

}  // namespace

extern const CollectiveAlgorithm deepep_alltoall = {
    "deepep", CollectiveType::all_to_all,
    "DeepEP's normal kernels: over the network once per node to the same-index GPU, NVLink forward inside it",
    lower_deepep};

}  // namespace moesim
