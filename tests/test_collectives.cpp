// Collective lowerings: bytes per ring edge, NCCL's rotating rounds, and a layout check for every
// all-to-all algorithm: chunk sizes are distinct powers of two, so every transfer's byte count says
// exactly which chunks it carries; following them through the lowered steps, every chunk (s, d)
// must be held by its sender when sent and end at d, every intra-node step must stay in a node and
// 2DH's inter-node step on one rail.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "collectives/collectives.hpp"
#include "collective_sweep.hpp"
#include "helpers.hpp"
#include "routing.hpp"

using namespace moesim;

namespace {

// `nodes` DGX-A100-like nodes of `gpus` GPUs (an NVSwitch, one NIC per GPU), small enough that n²
// chunk bits fit in a double's 53-bit mantissa.
Cluster small_cluster(int nodes, int gpus) {
  spec::ClusterSpec s = test::platform("dgx-a100", nodes);
  auto* node = s.mutable_node();
  node->set_gpus(std::uint32_t(gpus));
  node->clear_links();
  node->clear_nics();
  for (int g = 0; g < gpus; ++g) {
    auto* l = node->add_links();
    l->set_a("gpu" + std::to_string(g));
    l->set_b("nvswitch");
    l->set_gbytes_per_s(300);
    l->set_latency_us(0.5);
    l->set_kind("nvswitch");
    auto* nic = node->add_nics();
    nic->set_name("nic" + std::to_string(g));
    nic->set_gbits_per_s(200);
    nic->set_latency_us(1);
    auto* pcie = node->add_links();
    pcie->set_a("gpu" + std::to_string(g));
    pcie->set_b("nic" + std::to_string(g));
    pcie->set_gbytes_per_s(25);
    pcie->set_latency_us(0.5);
    pcie->set_kind("pcie");
  }
  return Cluster(s);
}

// Follows chunks of sizes 2^(s·n + d) through the lowering; returns the chunks each rank ends with.
std::map<int, std::set<int>> follow(const Lowering& lowering, int n) {
  std::map<int, std::set<int>> held;  // rank -> chunk ids s·n + d
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) held[s].insert(s * n + d);
  for (const auto& lane : lowering)  // lanes are disjoint in what they carry, so any order will do
    for (const auto& step : lane) {
      std::vector<std::pair<int, std::vector<int>>> arriving;
      for (const auto& t : step.transfers) {
        auto bits = std::uint64_t(t.bytes);
        REQUIRE(double(bits) == t.bytes);
        std::vector<int> chunks;
        for (int id = 0; bits; ++id, bits >>= 1)
          if (bits & 1) {
            INFO("rank " << t.src << " sends chunk " << id << " it does not hold");
            CHECK(held[t.src].count(id) == 1);
            chunks.push_back(id);
          }
        for (int id : chunks) held[t.src].erase(id);
        arriving.push_back({t.dst, chunks});
      }
      for (const auto& [dst, chunks] : arriving) held[dst].insert(chunks.begin(), chunks.end());
    }
  return held;
}

Collective powers_of_two(const std::string& algorithm, int n) {
  std::vector<double> bytes(std::size_t(n) * n);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) bytes[std::size_t(s) * n + d] = std::ldexp(1.0, s * n + d);
  Collective c{CollectiveType::all_to_all, {}, std::move(bytes), algorithm};
  for (int r = 0; r < n; ++r) c.group.push_back(r);
  return c;
}

}  // namespace

TEST_CASE("every all-to-all algorithm delivers each chunk to its destination") {
  // Nodes × GPUs per node with rows ≠ columns in 2DH's stride copies (the extract's index fix).
  for (const auto& [nodes, gpus] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {2, 3}, {3, 2}, {7, 1}}) {
    const Cluster cluster = small_cluster(nodes, gpus);
    const int n = cluster.num_gpus();
    for (const char* algorithm : {"linear", "2dh", "pipe", "1dh"}) {
      INFO(algorithm << " on " << nodes << " x " << gpus << " GPUs");
      const auto lowering = lower(powers_of_two(algorithm, n), cluster);
      const auto held = follow(lowering, n);
      for (int d = 0; d < n; ++d) {
        std::set<int> want;
        for (int s = 0; s < n; ++s) want.insert(s * n + d);
        CHECK(held.at(d) == want);
      }
      if (std::string(algorithm) == "2dh" && nodes > 1) {
        // copy, intra-node exchange, copy, inter-node exchange on one rail
        REQUIRE(lowering.size() == 1);
        const auto& lane = lowering[0];
        REQUIRE(lane.size() == std::size_t(gpus > 1 ? 4 : 3));
        CHECK(lane.front().copies.size() == std::size_t(n));
        for (const auto& t : lane[1].transfers) CHECK(cluster.node_of(t.src) == cluster.node_of(t.dst));
        for (const auto& t : lane.back().transfers) CHECK(cluster.local_of(t.src) == cluster.local_of(t.dst));
      }
      if (std::string(algorithm) == "pipe" && nodes > 1 && gpus > 1) {
        REQUIRE(lowering.size() == 2);  // an intra-node and an inter-node lane
        for (const auto& t : lowering[0][0].transfers) CHECK(cluster.node_of(t.src) == cluster.node_of(t.dst));
        for (const auto& t : lowering[1][0].transfers) CHECK(cluster.node_of(t.src) != cluster.node_of(t.dst));
      }
    }
  }
}

TEST_CASE("linear all-to-all runs NCCL's rotating rounds, p2p_peers at a time") {
  spec::ClusterSpec s = test::platform("dgx-a100", 2);
  s.mutable_node()->set_p2p_peers(4);
  const Cluster cluster(s);  // 16 GPUs: 15 rounds, 4 in flight: a chain of 4 rounds per channel
  Collective c{CollectiveType::all_to_all, {}, std::vector<double>(256, 1.0), "linear"};
  for (int r = 0; r < 16; ++r) c.group.push_back(r);
  const auto l = lower(c, cluster);
  REQUIRE(l.size() == 1);
  REQUIRE(l[0].size() == 1);
  CHECK(l[0][0].serial_rounds == 4);
  CHECK(l[0][0].transfers.size() == 16 * 15);  // the diagonal is not sent
  // One node sending to another only: 8 ranks × 8 peers, at offsets 1..15 from each sender: 15 busy
  // rounds, a chain of 4; and a ring exchange (offset 1 only) is one round.
  Collective sparse = c;
  std::vector<double> bytes(16 * 16);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) bytes[std::size_t(i) * 16 + j] = (i < 8 && j >= 8) ? 1.0 : 0.0;
  sparse.bytes = bytes;
  CHECK(lower(sparse, cluster)[0][0].serial_rounds == 4);
  CHECK(lower(sparse, cluster)[0][0].transfers.size() == 64);
  Collective ring = c;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) bytes[std::size_t(i) * 16 + j] = j == (i + 1) % 16 ? 1.0 : 0.0;
  ring.bytes = bytes;
  CHECK(lower(ring, cluster)[0][0].serial_rounds == 1);
}

// lower_unlisted() leaves a linear all-to-all's transfers unlisted (Step::all_pairs); everything
// else about the step must be what lower() gives, whatever the matrix's zeros.
TEST_CASE("an unlisted linear all-to-all step is the listed one without its list") {
  spec::ClusterSpec s = test::platform("dgx-a100", 2);
  s.mutable_node()->set_p2p_peers(4);
  const Cluster cluster(s);
  Collective c{CollectiveType::all_to_all, {}, {}, "linear"};
  for (int r = 0; r < 16; ++r) c.group.push_back(15 - r);  // positions are not ranks
  auto unlisted = [&](const std::vector<double>& bytes) {
    c.bytes = bytes;
    const auto listed = lower(c, cluster), bare = lower_unlisted(c, cluster);
    REQUIRE(listed.size() == bare.size());
    if (listed.empty()) return 0;
    REQUIRE(bare[0].size() == 1);
    const Step& step = bare[0][0];
    CHECK(step.all_pairs == &c);
    CHECK(step.transfers.empty());
    CHECK(step.sends());
    CHECK(step.serial_rounds == listed[0][0].serial_rounds);
    CHECK(step.rounds == listed[0][0].rounds);
    return step.serial_rounds;
  };
  std::vector<double> bytes(256, 0.0);
  CHECK(unlisted(bytes) == 0);  // nothing to send: no step either way
  bytes[1 * 16 + 2] = 5;        // one round busy
  CHECK(unlisted(bytes) == 1);
  for (int i = 0; i < 16; ++i) bytes[std::size_t(i) * 16 + std::size_t(i + 5) % 16] = 1, bytes[std::size_t(i) * 16 + std::size_t(i + 9) % 16] = 1;
  CHECK(unlisted(bytes) == 1);  // three busy rounds (1, 5, 9), four in flight
  for (std::size_t k = 0; k < bytes.size(); ++k) bytes[k] = double(k % 7);
  CHECK(unlisted(bytes) == 4);  // every round busy: 15 rounds, 4 in flight
  c.algorithm = "2dh";          // other algorithms are listed as ever
  c.bytes = bytes;
  CHECK(lower_unlisted(c, cluster)[0][0].all_pairs == nullptr);
}

TEST_CASE("2DH loses to linear at small scale and wins at large scale, sooner for small messages") {
  // Tutel §3.4 (Fig. 20): at 1 MiB 2DH is faster from small scales on; at 32 and 256 MiB it is
  // slower at small scale (two extra copies, more NVLink traffic) and wins as the GPU count grows
  // (n/m instead of n messages). DGX-A100 nodes, 16 and 512 GPUs.
  CollectiveSweep sweep;
  sweep.gpus = {16, 512};
  sweep.sizes = {1 << 20, 32 << 20, 256 << 20};
  sweep.algorithms = {"linear", "2dh"};
  const auto p = run_collective_sweep(sweep);
  REQUIRE(p.size() == 12);
  auto speedup = [&](int gpus, double bytes) {  // linear / 2DH
    double lin = 0, two = 0;
    for (const auto& x : p)
      if (x.gpus == gpus && x.bytes == bytes) (x.algorithm == "linear" ? lin : two) = x.seconds;
    return lin / two;
  };
  CHECK(speedup(16, 32 << 20) < 0.9);
  CHECK(speedup(16, 256 << 20) < 0.9);
  CHECK(speedup(512, 1 << 20) > 2);
  CHECK(speedup(512, 32 << 20) > 1);
  CHECK(speedup(512, 256 << 20) > speedup(16, 256 << 20));  // the gap closes with scale
  CHECK(speedup(512, 1 << 20) > speedup(512, 32 << 20));      // and sooner for small messages
}

TEST_CASE("moesim collective runs a sweep spec, compares its claims and rejects a claim it cannot check") {
  const auto dir = test::temp_dir("sweep");
  const std::string good = dir + "/sweep.textproto", bad = dir + "/bad.textproto";
  const std::string head = "name: \"s\"\nplatform: \"dgx-a100\"\ngpus: [16]\nsizes: [\"1M\"]\nalgorithms: [\"linear\", \"2dh\"]\n";
  test::write_file(good, head + "paper { claim: \"c\" gpus: 16 size: \"1M\" algorithm: \"2dh\" baseline: \"linear\" value: 1 }\n");
  test::write_file(bad, head + "paper { claim: \"c\" gpus: 64 size: \"1M\" algorithm: \"2dh\" baseline: \"linear\" value: 1 }\n");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " collective " + good + " -q --out " + dir + "/out", out) == 0);
  INFO(out);
  CHECK_THAT(out, Catch::Matchers::Contains("| c | 1.00× |"));
  CHECK(test::read_file(dir + "/out/paper.md").find("| c |") != std::string::npos);
  const int rc = test::run_command(std::string(MOESIM_BIN) + " collective " + bad + " -q", out);
  CHECK(rc == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("bad.textproto:6: field 'paper[0]'"));
}

TEST_CASE("moesim collective times every collective with each algorithm and writes nccl-tests' figures") {
  const auto dir = test::temp_dir("collective-all");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " collective --platform p4d-a100 --gpus 16 --sizes 64M -q --out " + dir, out) == 0);
  INFO(out);
  for (const char* table : {"all_to_all on", "all_reduce on", "all_gather on", "reduce_scatter on", "broadcast on", "reduce on"})
    CHECK_THAT(out, Catch::Matchers::Contains(table));
  const auto j = nlohmann::json::parse(test::read_file(dir + "/collective.json"));
  REQUIRE(j.at("points").size() == collective_algorithms().size());  // one record per collective and algorithm
  for (const auto& p : j.at("points")) {
    INFO(p.dump());
    const auto type = parse_collective_type(p.at("collective").get<std::string>());
    CHECK(find_collective_algorithm(type, p.at("algorithm").get<std::string>()) != nullptr);
    CHECK(p.at("gpus") == 16);
    CHECK(p.at("bytes").get<double>() == 64.0 * 1024 * 1024);
    const double algbw = p.at("bytes").get<double>() / (p.at("time_us").get<double>() * 1e-6) / 1e9;
    CHECK(p.at("algbw_gbps").get<double>() == Approx(algbw));
    CHECK(p.at("busbw_gbps").get<double>() == Approx(algbw * bus_bandwidth_factor(type, 16)));
  }
  // Read back as the plots and the report read it.
  const auto points = collective_points(j);
  REQUIRE(points.size() == j.at("points").size());
  CHECK(points.front().seconds == Approx(j.at("points")[0].at("time_us").get<double>() * 1e-6));
  // An algorithm that no chosen collective has is refused, naming what there is.
  CHECK(test::run_command(std::string(MOESIM_BIN) + " collective --collectives all_reduce --algorithms linear -q", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("all_reduce") && Catch::Matchers::Contains("ring"));
  CHECK(test::run_command(std::string(MOESIM_BIN) + " collective --collectives allreduce -q", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no collective 'allreduce'"));
}

namespace {
/// The ScheMoE/PipeMoE group's fit of NCCL's all-to-all on its 8 × 4 RTX 2080 Ti, 100 Gb/s IB
/// cluster (Fragile-azalea/PipeMoE solver.py): t = α + β·S, S the bytes per GPU, with α, β =
/// 5.70e-4 s, 2.96e-10 s/B at 16 GPUs, 2.09e-4 s, 3.55e-10 s/B at 32 and 7.83e-4 s, 3.84e-10 s/B
/// at 64.
double geforce_alltoall_fit(int gpus, double bytes) {
  switch (gpus) {
    case 16: return 5.70e-4 + 2.96e-10 * bytes;
    case 32: return 2.09e-4 + 3.55e-10 * bytes;
    case 64: return 7.83e-4 + 3.84e-10 * bytes;
  }
  throw std::invalid_argument(fmt::format("the GeForce all-to-all fit has 16, 32 and 64 GPUs, not {}", gpus));
}

/// A linear all-to-all of 64 and 256 MiB a GPU on `platform`, each GPU count's time within 5% of
/// that fit. Large messages, where the fit is the measurement's slope. One sweep (SimGrid allows
/// one engine a process).
void check_against_geforce_fit(const std::string& platform, const std::vector<int>& gpus) {
  CollectiveSweep sweep;
  sweep.platform = platform;
  sweep.gpus = gpus;
  sweep.sizes = {64 << 20, 256 << 20};
  sweep.collectives = {CollectiveType::all_to_all};
  sweep.algorithms = {"linear"};
  const auto p = run_collective_sweep(sweep);
  REQUIRE(p.size() == 2 * gpus.size());
  for (const auto& x : p) {
    const double measured = geforce_alltoall_fit(x.gpus, x.bytes);
    INFO(platform << ", " << x.gpus << " GPUs, " << x.bytes << " B: simulated " << x.seconds << " s, measured fit " << measured << " s");
    CHECK(x.seconds == Approx(measured).epsilon(0.05));
  }
}
}  // namespace

TEST_CASE("the RTX 2080 Ti testbed's all-to-all matches the time its owners measured for it") {
  // The platform's NIC rate comes from the fit's β at 32 GPUs; the 16- and 64-GPU fits, the route
  // through PCIe and host memory and the message costs are the model's own.
  check_against_geforce_fit("rtx2080ti-pcie", {16, 32, 64});
}

TEST_CASE("Pro-Prophet's RTX 3090 nodes move an all-to-all as the 2080 Ti testbed's GeForce hosts measured") {
  // HPWNV and LPWNV share their hosts and their 100 Gb/s InfiniBand (docs/spec/pro-prophet.md §5.1):
  // GeForce cards on PCIe 3.0 with no GPUDirect RDMA, the 2080 Ti testbed's class, whose owners'
  // 16-GPU fit the 16 3090s of HPWNV reach too, bound by the same NIC. Before, their NIC moved the
  // 12 GB/s of one with GPUDirect RDMA: 17% faster.
  check_against_geforce_fit("rtx3090-pcie", {16});
}

namespace {
/// An all-to-all of S = 256 MiB a GPU over 2 and 4 dgx-a100 nodes (16 and 32 GPUs), 2 nodes a leaf
/// switch on `spines` spines: the 32-GPU time over the 16-GPU time. One sweep (SimGrid allows one
/// engine a process).
double four_over_two_nodes(int spines) {
  std::string base = test::read_file(std::string(MOESIM_SOURCE_DIR) + "/platforms/dgx-a100.textproto");
  const auto at = base.find("\nfabric {");
  REQUIRE(at != std::string::npos);
  base.erase(at + 1, base.find('}', at) - at);
  const std::string path = test::temp_dir("spines" + std::to_string(spines)) + "/platform.textproto";
  test::write_file(path, base + "fabric { nodes_per_leaf: 2 spines: " + std::to_string(spines) + " latency_us: 0.25 }\n");
  CollectiveSweep sweep;
  sweep.platform = path;
  sweep.gpus = {16, 32};
  sweep.sizes = {256 << 20};
  sweep.collectives = {CollectiveType::all_to_all};
  sweep.algorithms = {"linear"};
  const auto p = run_collective_sweep(sweep);
  REQUIRE(p.size() == 2);
  return p[1].seconds / p[0].seconds;
}
}  // namespace

// An oversubscribed fat-tree is platform data (fabric.spines below nodes_per_leaf). S/n bytes go to
// each peer. 2 nodes (one leaf): a node's uplink carries 8 GPUs × 8/16 S = 4S. 4 nodes: a node's
// uplink 8 × 24/32 S = 6S, a leaf's spine links 16 × 16/32 S = 8S, at one node's NIC bandwidth
// per spine link. Non-blocking (2 spines: 2 links a leaf) the node uplink stays the bottleneck, 6S /
// 4S = 1.5; at 2:1 (1 spine) the leaf's link is, 8S / 4S = 2.
TEST_CASE("a non-blocking fat-tree: 4 nodes' all-to-all is bound by the node uplinks") {
  CHECK(four_over_two_nodes(2) == Approx(1.5).epsilon(0.05));
}
TEST_CASE("a 2-to-1 oversubscribed fat-tree: 4 nodes' all-to-all is bound by the leaf's spine link") {
  CHECK(four_over_two_nodes(1) == Approx(2.0).epsilon(0.05));
}

namespace {

// Bytes per (sender, receiver) over a lowering's transfers (a pipelined step's rounds each).
std::map<std::pair<int, int>, double> link_bytes(const Lowering& lowering) {
  std::map<std::pair<int, int>, double> out;
  for (const auto& lane : lowering)
    for (const auto& step : lane)
      for (const auto& t : step.transfers) out[{t.src, t.dst}] += t.bytes * step.rounds;
  return out;
}

// 2 nodes of 2 GPUs: ranks 0, 1 on node 0 and 2, 3 on node 1. Tokens once per GPU: B(p, q) =
// 10p + q + 1; once per node over the network, between same-index GPUs: 0→2 5, 1→3 7, 2→0 11, 3→1 13.
Collective deepep_hand_case(bool counted_per_node) {
  std::vector<double> bytes(16, 0.0), network(16, 0.0);
  for (int p = 0; p < 4; ++p)
    for (int q = 0; q < 4; ++q)
      if (p != q) bytes[std::size_t(p * 4 + q)] = 10 * p + q + 1;
  network[0 * 4 + 2] = 5, network[1 * 4 + 3] = 7, network[2 * 4 + 0] = 11, network[3 * 4 + 1] = 13;
  Collective c{CollectiveType::all_to_all, {0, 1, 2, 3}, std::move(bytes), "deepep"};
  if (counted_per_node) c.network_bytes = std::move(network);
  return c;
}

}  // namespace

TEST_CASE("DeepEP's dispatch: over the network once per node to the same-index GPU, then NVLink inside it") {
  const Cluster cluster = small_cluster(2, 2);
  const auto lowering = lower(deepep_hand_case(true), cluster);
  REQUIRE(lowering.size() == 1);
  REQUIRE(lowering[0].size() == 1);  // both hops in one step: the kernel pipelines them
  CHECK(lowering[0][0].serial_rounds == 1);
  CHECK(lowering[0][0].messages == 0);  // the GPU posts its RDMA writes (IBGDA): no CPU proxy's post cost
  // Worked out by hand: a token from p = (a, i) to q = (b, j) on another node is forwarded by (b, i),
  // so 2 → 3 carries B(2, 3) = 24 and 0's tokens for 3, B(0, 3) = 4; the relay is q itself when
  // j = i (0 → 2: nothing on NVLink).
  const std::map<std::pair<int, int>, double> want = {
      {{0, 1}, 2 + 22}, {{1, 0}, 11 + 31}, {{2, 3}, 24 + 4}, {{3, 2}, 33 + 13},  // NVLink: own + forwarded
      {{0, 2}, 5},      {{1, 3}, 7},       {{2, 0}, 11},     {{3, 1}, 13}};      // the network, once per node
  CHECK(link_bytes(lowering) == want);
  // Without counts per node every token-slot crosses the network on its own: 0 → 2 carries
  // B(0, 2) + B(0, 3) = 3 + 4.
  const auto slots = link_bytes(lower(deepep_hand_case(false), cluster));
  CHECK(slots.at({0, 2}) == 7);
  CHECK(slots.at({3, 1}) == 31 + 32);
  CHECK(slots.at({2, 3}) == 28);
}

TEST_CASE("DeepEP's combine is its dispatch run backwards: NVLink to the owner's same-index GPU, then the network") {
  const Cluster cluster = small_cluster(2, 2);
  const Collective dispatch = deepep_hand_case(true);
  Collective combine = dispatch;
  combine.bytes = dispatch.bytes.transposed();
  combine.network_bytes = dispatch.network_bytes.transposed();
  combine.combine = true;
  const auto there = link_bytes(lower(dispatch, cluster)), back = link_bytes(lower(combine, cluster));
  REQUIRE(back.size() == there.size());
  for (const auto& [link, bytes] : there) CHECK(back.at({link.second, link.first}) == bytes);
  // Network bytes between GPUs of different local indices are refused.
  Collective bad = deepep_hand_case(true);
  std::vector<double> network(16, 0.0);
  network[0 * 4 + 3] = 1;
  bad.network_bytes = std::move(network);
  CHECK_THROWS_AS(lower(bad, cluster), std::logic_error);
  // A group that is not whole nodes goes as linear.
  Collective part{CollectiveType::all_to_all, {0, 1, 2}, std::vector<double>(9, 1.0), "deepep"};
  CHECK(link_bytes(lower(part, cluster)).size() == 6);
}

TEST_CASE("a routed sweep: DeepEP's intranode dispatch lasts its busiest NVLink port's bytes over its rate") {
  // Inside one H800 node the dispatch sends each token once to each GPU that holds one of its
  // experts: the time is the most any GPU receives from the others over 160 GB/s (the platform's
  // port; its latency is below 0.1%), after the per-call latency every collective pays (NCCL's
  // 8.4 µs, taken for DeepEP's launch too). The routing is the sweep's own: uniform top-8 of 256
  // experts, seed derive_seed(seed, GPUs).
  CollectiveSweep sweep;
  sweep.platform = "hgx-h800";
  sweep.gpus = {8};
  sweep.algorithms = {"deepep"};
  sweep.routed = RoutedExchange{};
  sweep.routed->tokens = 1024;
  const auto points = run_collective_sweep(sweep);
  REQUIRE(points.size() == 2);
  CHECK(points[0].exchange == "dispatch");
  CHECK(points[1].exchange == "combine");
  const RoutedExchange& r = *sweep.routed;
  std::vector<TokenSpread> spreads = {{r.experts / 8, 0, {}}};
  Rng rng(derive_seed(r.seed, 8));
  sample_routing(std::vector<double>(std::size_t(r.experts), 1.0 / r.experts), 8, r.tokens, r.top_k, rng, {}, &spreads);
  const double token = r.hidden * r.dispatch_bytes_per_element;
  double busiest = 0, to_rank0 = 0;
  for (int q = 0; q < 8; ++q) {
    double in = 0;
    for (int p = 0; p < 8; ++p) in += p == q ? 0 : double(spreads[0].at(p, q)) * token;
    busiest = std::max(busiest, in);
  }
  for (int p = 0; p < 8; ++p) to_rank0 += double(spreads[0].at(p, 0)) * token;
  CHECK(points[0].seconds == Approx(8.4e-6 + busiest / 160e9).epsilon(0.005));
  CHECK(points[0].bytes == Approx(to_rank0));  // DeepEP's count: what rank 0 receives, from itself too
  // The combine moves the same tokens back in BF16: 2 / 1.03125 times the bytes and their time.
  CHECK((points[1].seconds - 8.4e-6) / (points[0].seconds - 8.4e-6) == Approx(2 / 1.03125).epsilon(0.005));
}

TEST_CASE("DeepEP's benchmark routing at EP 16: RDMA over NVL bytes as an H200 run of it measured") {
  // DeepEP's test_internode.py prints, for rank 0, the tokens it sends once per node (RDMA, its own
  // node too) and the tokens it receives (NVL, from itself too) over the same time, so their ratio is
  // a property of the routing alone. Two nodes of 8 H200 (deepseek-ai/DeepEP#493): 40.89 / 133.78 =
  // 0.3057 (BF16 dispatch) and 44.37 / 145.16 = 0.3057 (combine). moesim's sampler, with the
  // benchmark's statistics (uniform scores, top-8 of 256 within 4 nodes), gives the same: the rate the
  // kernels' floor takes from that run (deepep_alltoall.cpp) is in the bytes moesim counts.
  const RoutedExchange r;
  const int n = 16, per_gpu = r.experts / n;
  std::vector<TokenSpread> spreads = {{per_gpu, 0, {}}, {per_gpu * 8, 0, {}}};
  Rng rng(derive_seed(r.seed, std::uint64_t(n)));
  sample_routing(std::vector<double>(std::size_t(r.experts), 1.0 / r.experts), n, r.tokens, r.top_k, rng, GroupLimit{2, 2},
                 &spreads);
  double rdma = 0, nvl = 0;
  for (int node = 0; node < 2; ++node) rdma += double(spreads[1].at(0, node));
  for (int p = 0; p < n; ++p) nvl += double(spreads[0].at(p, 0));
  CHECK(rdma / nvl == Approx(0.3057).epsilon(0.02));
}

TEST_CASE("a routed sweep spec: claims in GB/s of the dispatch or the combine, and what it refuses") {
  const auto dir = test::temp_dir("routed");
  const std::string head = "name: \"r\"\nplatform: \"hgx-h800\"\ngpus: [8, 16]\nalgorithms: [\"deepep\", \"linear\"]\n"
                           "routed { tokens: 64 hidden: 128 experts: 32 top_k: 4 node_limit: 1 dispatch_bytes_per_element: 1 "
                           "combine_bytes_per_element: 2 }\n";
  const std::string good = dir + "/good.textproto";
  test::write_file(good, head + "paper { claim: \"c\" gpus: 16 algorithm: \"deepep\" exchange: \"combine\" value: 40 }\n");
  std::string out;
  REQUIRE(test::run_command(std::string(MOESIM_BIN) + " collective " + good + " -q --out " + dir + "/out", out) == 0);
  INFO(out);
  CHECK_THAT(out, Catch::Matchers::Contains("| c | 40.00 GB/s |"));
  const auto points = collective_points(nlohmann::json::parse(test::read_file(dir + "/out/collective.json")));
  REQUIRE(points.size() == 8);  // 2 algorithms × 2 GPU counts × dispatch and combine
  for (const auto& p : points) {
    CHECK((p.exchange == "dispatch" || p.exchange == "combine"));
    // node_limit 1: each token's experts on one node, so rank 0 sends each token over once
    // (64 tokens × 128 B; the combine's BF16 twice that) at 16 GPUs.
    if (p.gpus == 16) CHECK(p.bytes == (p.exchange == "dispatch" ? 64 * 128 : 2 * 64 * 128));
  }
  for (const auto& [claim, field] : std::vector<std::pair<std::string, std::string>>{
           {"paper { claim: \"c\" gpus: 16 algorithm: \"deepep\" exchange: \"combine\" baseline: \"linear\" value: 1 }", "paper[0]'"},
           {"paper { claim: \"c\" gpus: 16 algorithm: \"deepep\" value: 1 }", "paper[0].exchange'"},
           {"sizes: [\"1M\"]", "field 'sizes'"}}) {
    const std::string bad = dir + "/bad.textproto";
    test::write_file(bad, head + claim + "\n");
    INFO(claim);
    CHECK(test::run_command(std::string(MOESIM_BIN) + " collective " + bad + " -q", out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains(field));
  }
  // DeepEP's SMs: at least one, and no more than the GPU has (the H800's 132).
  for (const auto& [sms, what] : std::vector<std::pair<std::string, std::string>>{
           {"0", "field 'routed.sms'"}, {"133", "routed.sms: 133 SMs: give 1 to the GPU's 132"}}) {
    std::string spec = head;
    spec.replace(spec.find("combine_bytes_per_element: 2 }"), 30, "combine_bytes_per_element: 2 sms: " + sms + " }");
    const std::string bad = dir + "/sms.textproto";
    test::write_file(bad, spec);
    INFO(sms);
    CHECK(test::run_command(std::string(MOESIM_BIN) + " collective " + bad + " -q", out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains(what));
  }
}

TEST_CASE("Megatron's all-gather dispatcher: a ring all-gather of every rank's tokens, whatever the routing") {
  const Cluster cluster = small_cluster(2, 2);
  // Two routings, one skewed onto rank 3: the same exchange, as every token goes to every rank.
  Collective skewed{CollectiveType::all_to_all, {0, 1, 2, 3}, std::vector<double>(16, 0.0), "allgather"};
  Collective even{CollectiveType::all_to_all, {0, 1, 2, 3}, std::vector<double>(16, 25.0), "allgather"};
  std::vector<double> onto3(16, 0.0);
  for (int p = 0; p < 3; ++p) onto3[std::size_t(p * 4 + 3)] = 100;
  skewed.bytes = std::move(onto3);
  skewed.gathered = even.gathered = 100;  // each rank's tokens
  const auto a = link_bytes(lower(skewed, cluster)), b = link_bytes(lower(even, cluster));
  CHECK(a == b);
  const Collective gather{CollectiveType::all_gather, {0, 1, 2, 3}, {400}, "ring"};
  CHECK(a == link_bytes(lower(gather, cluster)));  // S = 4 × 100: each rank sends 3/4 of it
  double sent = 0;
  for (const auto& [link, bytes] : a) sent += link.first == 0 ? bytes : 0;
  CHECK(sent == Approx(300));
  // The combine reduce-scatters the same S; without token sizes the pairs go as linear.
  Collective back = even;
  back.combine = true;
  CHECK(link_bytes(lower(back, cluster)) == link_bytes(lower(Collective{CollectiveType::reduce_scatter, {0, 1, 2, 3}, {400}, "ring"}, cluster)));
  Collective unknown = even;
  unknown.gathered = 0;
  unknown.algorithm = "linear";
  const auto as_linear = link_bytes(lower(unknown, cluster));
  unknown.algorithm = "allgather";
  CHECK(link_bytes(lower(unknown, cluster)) == as_linear);
}
