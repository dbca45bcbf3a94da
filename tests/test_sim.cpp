// The SimGrid backend against analytic cases. Each TEST_CASE runs in its own process (SimGrid
// allows one engine per process), so each builds one cluster.
#include <catch2/catch.hpp>
#include <optional>
#include <set>

#include "cost_model.hpp"
#include "helpers.hpp"
#include "policy.hpp"
#include "runner.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

namespace {

struct Bench {
  Cluster cluster;
  GpuModel gpu;
  SimBackend sim;
  Bench(const std::string& platform, int nodes, bool aggregate = true)
      : cluster(test::platform(platform, nodes)),
        gpu(cluster.spec().gpu(), spec::FP16),
        sim(cluster, gpu, SimOptions{aggregate}) {}
};

double duration(const Timing& t, OpId id) { return t.end[id] - t.start[id]; }

Collective uniform_alltoall(int n, double bytes_per_pair) {
  Collective c{CollectiveType::all_to_all, {}, std::vector<double>(std::size_t(n) * n, bytes_per_pair), "linear"};
  for (int i = 0; i < n; ++i) c.group.push_back(i);
  return c;
}

}  // namespace

TEST_CASE("a single transfer takes bytes over the route's bandwidth plus its latency") {
  Bench b("dgx-a100", 2);
  const double B = 256e6;
  TaskGraph g(b.cluster.num_gpus());
  const OpId intra = g.add_transfer(Stream::comm, "intra", {0, 1, B});
  const OpId inter = g.add_transfer(Stream::comm, "inter", {0, 8, B}, {intra});
  const Timing t = b.sim.execute(g);
  // Inside a node: gpu0 -> NVSwitch -> gpu1, 300 GB/s, 2 × 0.5 µs.
  CHECK(duration(t, intra) == Approx(B / 300e9 + 1e-6).epsilon(1e-9));
  // Across nodes: PCIe 0.5 µs, NIC 25 GB/s 1 µs, two fabric links 0.25 µs each, NIC 1 µs, PCIe 0.5 µs;
  // and the NIC's 1 µs per message.
  CHECK(duration(t, inter) == Approx(B / 25e9 + 1e-6 + 3.5e-6).epsilon(1e-9));
  CHECK(t.start[inter] == Approx(t.end[intra]));
}

TEST_CASE("equal flows through one NIC share it fairly") {
  Bench b("v100-pcie", 2);  // one 50 Gb/s NIC per node (FasterMoE johnny)
  const int k = 4;
  const double B = 100e6;
  TaskGraph g(b.cluster.num_gpus());
  std::vector<OpId> ids;
  for (int i = 0; i < k; ++i) ids.push_back(g.add_transfer(Stream::comm, "f", {i, 8 + i, B}));
  const Timing t = b.sim.execute(g);
  // 4 flows on a 6.25 GB/s NIC: each gets a quarter and all end together, the NIC spending 1 µs per
  // message besides. Latency: PCIe 0.5, NIC slot 0.5, NIC 1, fabric 2 × 0.25, NIC 1, NIC slot 0.5,
  // PCIe 0.5 µs.
  for (OpId id : ids) {
    CHECK(t.start[id] == 0);
    CHECK(t.end[id] == Approx(k * (B / 6.25e9 + 1e-6) + 4.5e-6).epsilon(1e-9));
  }
}

// Each GPU sends 7·M through its 300 GB/s NVSwitch port and receives as much in the other
// direction; route latency 1 µs. Both forms of a collective step must give this.
void check_nvswitch_alltoall(bool aggregate) {
  Bench b("dgx-a100", 1, aggregate);
  const double M = 64e6;
  TaskGraph g(8);
  const OpId a2a = g.add_collective(Stream::comm, "a2a", uniform_alltoall(8, M));
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, a2a) == Approx(7 * M / 300e9 + 1e-6).epsilon(1e-9));
}

TEST_CASE("an all-to-all on one NVSwitch node matches the analytic time") { check_nvswitch_alltoall(true); }

TEST_CASE("per-flow all-to-all on one NVSwitch node matches the analytic time too") {
  check_nvswitch_alltoall(false);
}

TEST_CASE("a ring all-reduce on one node matches 2(n-1)/n S over the link bandwidth") {
  Bench b("dgx-a100", 1);
  const double S = 512e6;
  TaskGraph g(8);
  const OpId ar = g.add_collective(Stream::comm, "ar", {CollectiveType::all_reduce, {0, 1, 2, 3, 4, 5, 6, 7}, {S}, "ring"});
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, ar) == Approx(2.0 * 7 / 8 * S / 300e9 + 1e-6).epsilon(1e-9));
}

TEST_CASE("ops on one stream serialize and ops on two streams overlap") {
  Bench b("dgx-a100", 1);
  const Compute work{ComputeKind::gemm, {{8192, 8192, 8192, 1}}, 0};
  const double w = work.seconds(b.gpu);
  TaskGraph g(8);
  const OpId c1 = g.add_compute(0, "c1", work);
  const OpId c2 = g.add_compute(0, "c2", work);
  const OpId x = g.add_transfer(Stream::comm, "x", {0, 1, 300e6});
  const Timing t = b.sim.execute(g);
  CHECK(t.start[c2] == Approx(t.end[c1]));
  CHECK(t.end[c2] == Approx(2 * w));
  CHECK(t.start[x] == 0);  // the comm stream does not wait for the compute stream
  CHECK(t.end[x] < t.end[c1]);
}

// Nodes of one GPU: an aggregated all-to-all has no link inside a node, only NICs and the fabric.
// Uniform, each GPU sends 3 messages of B through its NIC, so the step lasts what one message of
// 3B + 2 overheads does between two nodes (one more message's overhead is the difference).
TEST_CASE("an all-to-all between one-GPU nodes lasts its NIC's bytes plus one route latency") {
  Bench b("h100-1gpu", 4);
  const double B = 64e6, overhead = b.cluster.message_overhead_bytes(0, 1);
  TaskGraph g(4);
  const OpId one = g.add_transfer(Stream::comm, "one", {0, 1, 3 * B + 2 * overhead});
  const OpId a2a = g.add_collective(Stream::comm, "a2a", uniform_alltoall(4, B), {one});
  const Timing t = b.sim.execute(g);
  REQUIRE(duration(t, one) > 0);
  CHECK(duration(t, a2a) == Approx(duration(t, one)).epsilon(1e-9));
}

// A compute op alone on its GPU is a timer inside the backend; a collective's copy that starts
// on that GPU while it runs must share the GPU with it as two execs would: both at half speed
// until the copy is done, then the compute alone again, so each copy costs the compute its own
// alone-time. Tutel's 2DH all-to-all makes two stride copies of each rank's whole buffer.
TEST_CASE("copies that join a running compute op share the GPU with it") {
  Bench b("dgx-a100", 2);
  const Compute work{ComputeKind::gemm, {{8192, 8192, 8192, 1}}, 0};
  const double w = work.seconds(b.gpu), B = 8e6;
  TaskGraph g(b.cluster.num_gpus());
  const OpId compute = g.add_compute(0, "compute", work);
  const OpId before = g.add_transfer(Stream::comm, "before", {8, 9, 300e6});
  Collective a2a = uniform_alltoall(16, B);
  a2a.algorithm = "2dh";
  const OpId after = g.add_collective(Stream::comm, "a2a", a2a, {before});
  const Timing t = b.sim.execute(g);
  const double joined = t.start[after], copy = b.gpu.memory_time(2 * 16 * B);  // a buffer: 16 chunks of B
  INFO("compute alone " << w << " s, a copy alone " << copy << " s, the all-to-all from " << joined << " to " << t.end[after]);
  REQUIRE(joined > w / 8);  // the compute ran alone first
  CHECK(t.end[compute] == Approx(w + 2 * copy).epsilon(1e-9));
}

TEST_CASE("with skewed routing the expert phase lasts as long as the most loaded GPU") {
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=1", "model.experts=16"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(ex.spec.model());
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  SimBackend sim(cluster, gpu);
  // Every GPU sends half its token-slots to expert 5 (on GPU 5), the rest spread evenly.
  RoutingMatrix R(16, 16);
  const int slots = model.tokens_per_gpu() * model.top_k();
  for (int s = 0; s < 16; ++s)
    for (int e = 0; e < 16; ++e) R.mutable_at(s, e) = e == 5 ? slots / 2 : slots / 2 / 15 + (e < (slots / 2) % 15 ? 1 : 0);
  for (int s = 0; s < 16; ++s) REQUIRE(R.row_sum(s) == slots);
  auto policy = make_policy(ex.spec.policy());
  const std::vector<RoutingMatrix> routing{R};
  PolicyReport report;
  const TaskGraph g = policy->build_iteration({cluster, model, gpu, ex.spec.policy(), routing, report});
  const Timing t = sim.execute(g);
  OpId dispatch = 0, combine = 0;
  std::vector<OpId> experts;
  for (const auto& op : g.ops()) {
    if (op.label == "L0.fwd.a2a_dispatch") dispatch = op.id;
    if (op.label == "L0.fwd.a2a_combine") combine = op.id;
    if (op.label == "L0.fwd.experts") experts.push_back(op.id);
  }
  REQUIRE(experts.size() == 16);
  double longest = 0, others = 0;
  for (OpId id : experts) {
    const double d = std::get<Compute>(g.op(id).body).seconds(gpu);
    CHECK(duration(t, id) == Approx(d));  // a GPU's expert op takes its own load's time
    if (g.op(id).rank == 5) longest = d;
    else others = std::max(others, d);
  }
  CHECK(longest > 3 * others);
  CHECK(t.start[combine] - t.end[dispatch] == Approx(longest));
}

TEST_CASE("the critical path adds up to every iteration's time") {
  const auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "iterations=2"});
  const auto r = run_experiment(ex).runs.front();
  REQUIRE(r.iterations.size() == 2);
  for (const auto& it : r.iterations) {
    const auto& a = it.attribution;
    CHECK(a.critical.total() == Approx(it.time).epsilon(1e-12));
    CHECK(a.critical[Phase::dense_compute] > 0);
    CHECK(all_to_all_seconds(a.critical) > 0);
    CHECK(a.critical[Phase::dense_allreduce] > 0);
    // Per layer: both layers are on the path, and they hold all of it but the dense part's
    // all-reduce and the optimizer (the ops outside the layers).
    REQUIRE(a.layer_critical.size() == 2);
    double layers = 0;
    for (const auto& l : a.layer_critical) layers += l.total();
    CHECK(a.layer_critical[0].total() > 0);
    CHECK(a.layer_critical[1].total() > 0);
    CHECK(layers + a.critical[Phase::dense_allreduce] + a.critical[Phase::optimizer] <= it.time * (1 + 1e-12));
    CHECK(a.busy[Phase::expert_compute] > 0);
  }
  CHECK(r.iterations[1].start == Approx(r.iterations[0].time));  // iterations run back to back
}

TEST_CASE("a dispatch sized by counts waits for their exchange and a host sync in every layer's forward") {
  // FastMoE's prepare_forward: an all-to-all of each GPU's per-expert counts (E/G int64 per peer),
  // then the host reads them. EP on 16 GPUs, 2 layers, 32 experts: 16 B per pair; a 1 ms host sync
  // (a hand value, well above the exchange's few µs) shows in the makespan once per layer.
  const test::SmallSetup t;
  auto gpu_spec = t.cluster.spec().gpu();
  gpu_spec.set_host_sync_us(1000);
  const GpuModel gpu(gpu_spec, t.model.dtype());
  const auto routing = t.routing(7);
  spec::PolicySpec ps;
  ps.set_name("ep");
  PolicyReport r0, r1;
  const TaskGraph plain = make_policy(ps)->build_iteration({t.cluster, t.model, gpu, ps, routing, r0, false});
  const TaskGraph counted = make_policy(ps)->build_iteration({t.cluster, t.model, gpu, ps, routing, r1, true});
  const int G = t.cluster.num_gpus(), L = t.model.layers();
  int exchanges = 0, syncs = 0;
  std::set<OpId> sync_ids;
  for (const auto& op : counted.ops()) {
    if (op.label.find("count_exchange") != std::string::npos) {
      ++exchanges;
      const auto& c = std::get<Collective>(op.body);
      CHECK(c.bytes.at(0, 1, std::size_t(G)) == 8.0 * t.model.experts() / G);
      CHECK(c.bytes.at(3, 3, std::size_t(G)) == 0);
    }
    if (op.label.find("host_sync") != std::string::npos) {
      ++syncs;
      sync_ids.insert(op.id);
      CHECK(std::get<Compute>(op.body).seconds(gpu) == Approx(1e-3));
    }
    if (op.label == "L1.fwd.a2a_dispatch")
      for (OpId d : op.deps) CHECK(sync_ids.count(d) == 1);  // after the host has layer 1's counts
  }
  CHECK(exchanges == L);
  CHECK(syncs == L * G);
  for (const auto& op : plain.ops()) CHECK(op.label.find("count_exchange") == std::string::npos);
  SimBackend sim(t.cluster, gpu);
  const double extra = sim.execute(counted).makespan() - sim.execute(plain).makespan();
  CHECK(extra >= L * 1e-3);
  CHECK(extra < L * 1.1e-3);
}

TEST_CASE("a linear all-to-all whose pairs go as m messages pays the NIC's per-message time m times") {
  // Tutel's pipelined all-to-all sends ΔE messages per peer (Collective::messages). Two GPUs on two
  // DGX-A100 nodes exchange B bytes each way, once as one message per pair, then as four: the NIC
  // (25 GB/s, 1 µs a message) carries 3 µs more, in the backend and in the cost model alike.
  Bench b("dgx-a100", 2);
  const double B = 64e6;
  Collective one{CollectiveType::all_to_all, {0, 8}, std::vector<double>{0, B, B, 0}, "linear"};
  Collective four = one;
  four.messages = 4;
  TaskGraph g(b.cluster.num_gpus());
  const OpId a = g.add_collective(Stream::comm, "one", one);
  const OpId c = g.add_collective(Stream::comm, "four", four, {a});
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, c) - duration(t, a) == Approx(3e-6).epsilon(1e-3));
  const CostModel cost(b.cluster, b.gpu);
  CHECK(cost.collective_time(four) - cost.collective_time(one) == Approx(3e-6).epsilon(1e-3));
  CHECK(cost.collective_time(one) == Approx((B + 1e-6 * 25e9) / 25e9).epsilon(1e-6));
}
