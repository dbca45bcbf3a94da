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
      : cluster(test::without_launches(test::platform(platform, nodes))),
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
  // Inside a node: gpu0 -> NVSwitch -> gpu1, 231.6 GB/s (as NCCL measures the port), 2 × 0.5 µs.
  CHECK(duration(t, intra) == Approx(B / 231.6e9 + 1e-6).epsilon(1e-9));
  // Across nodes: PCIe 0.5 µs, NIC 24 GB/s 1 µs, two fabric links 0.25 µs each, NIC 1 µs, PCIe 0.5 µs;
  // and the NIC's 6 µs per message (NCCL's proxy overhead on AMD hosts, Simple protocol).
  CHECK(duration(t, inter) == Approx(B / 24e9 + 6e-6 + 3.5e-6).epsilon(1e-9));
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
  // 4 flows on a 6.25 GB/s NIC: each gets a quarter and all end together, the NIC spending 3 µs per
  // message besides (NCCL's proxy overhead on Intel hosts, Simple protocol). Latency: PCIe 0.5, NIC
  // slot 0.5, NIC 1, fabric 2 × 0.25, NIC 1, NIC slot 0.5, PCIe 0.5 µs.
  for (OpId id : ids) {
    CHECK(t.start[id] == 0);
    CHECK(t.end[id] == Approx(k * (B / 6.25e9 + 3e-6) + 4.5e-6).epsilon(1e-9));
  }
}

// Each GPU sends 7·M through its 231.6 GB/s NVSwitch port and receives as much in the other
// direction; route latency 1 µs, after NCCL's 8.4 µs per call. Both forms of a collective step must
// give this.
void check_nvswitch_alltoall(bool aggregate) {
  Bench b("dgx-a100", 1, aggregate);
  const double M = 64e6;
  TaskGraph g(8);
  const OpId a2a = g.add_collective(Stream::comm, "a2a", uniform_alltoall(8, M));
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, a2a) == Approx(8.4e-6 + 7 * M / 231.6e9 + 1e-6).epsilon(1e-9));
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
  CHECK(duration(t, ar) == Approx(8.4e-6 + 2.0 * 7 / 8 * S / 231.6e9 + 1e-6).epsilon(1e-9));
}

// The overheads NCCL itself estimates (platforms/nccl_constants.hpp, from src/graph/tuning.cc): a
// call pays baseLat (Simple: 8.4 µs) before its bytes move, and each message through a NIC the
// proxy's overhead, 3 µs on Intel hosts and 6 µs on AMD ones with the Simple protocol. A tiny
// all-to-all on one node is all latency: the call's, then one route's (gpu -> NVSwitch -> gpu).
TEST_CASE("a tiny collective costs NCCL's per-call latency, and each NIC message the proxy's overhead") {
  Bench b("dgx-a100", 2);  // AMD EPYC hosts
  TaskGraph g(b.cluster.num_gpus());
  Collective tiny = uniform_alltoall(8, 16);
  const OpId a2a = g.add_collective(Stream::comm, "a2a", tiny);
  const OpId again = g.add_collective(Stream::comm, "again", tiny, {a2a});
  const OpId send = g.add_transfer(Stream::comm, "send", {0, 1, 16}, {again});
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, a2a) == Approx(8.4e-6 + 1e-6 + 7 * 16 / 231.6e9).epsilon(1e-6));
  CHECK(duration(t, again) == Approx(duration(t, a2a)).epsilon(1e-9));  // every call pays it
  CHECK(duration(t, send) == Approx(1e-6 + 16 / 231.6e9).epsilon(1e-6));  // a transfer op is no NCCL call
  CHECK(b.cluster.message_overhead_bytes(0, 8) == Approx(6e-6 * 24e9));
  CHECK(b.cluster.message_overhead_bytes(0, 1) == 0);  // inside a node: no NIC
  CHECK(Cluster(test::platform("dgx-h100", 2)).message_overhead_bytes(0, 8) == Approx(3e-6 * 48e9));  // Intel
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
// 3B + 2 overheads does between two nodes (one more message's overhead is the difference), after
// NCCL's per-call latency (the transfer alone is no NCCL call of its own here).
TEST_CASE("an all-to-all between one-GPU nodes lasts its NIC's bytes plus one route latency") {
  Bench b("h100-1gpu", 4);
  const double B = 64e6, overhead = b.cluster.message_overhead_bytes(0, 1);
  TaskGraph g(4);
  const OpId one = g.add_transfer(Stream::comm, "one", {0, 1, 3 * B + 2 * overhead});
  const OpId a2a = g.add_collective(Stream::comm, "a2a", uniform_alltoall(4, B), {one});
  const Timing t = b.sim.execute(g);
  REQUIRE(duration(t, one) > 0);
  CHECK(duration(t, a2a) == Approx(b.cluster.nccl_call_latency() + duration(t, one)).epsilon(1e-9));
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

// The other way round: a copy that starts on an idle GPU runs there alone (a timer inside the
// backend); a compute op issued on that GPU part-way through it shares the GPU from that instant,
// both at half speed until the copy is done. With R of the copy left when the compute starts at
// t0, the copy ends at t0 + 2R, R of the compute's work done meanwhile; the all-to-all's second
// copy (as long as the first) joins the compute still running and costs it its whole length: the
// compute ends at t0 + w + R + copy.
TEST_CASE("a compute op that joins a copy running alone shares the GPU with it") {
  Bench b("dgx-a100", 2);
  const Compute work{ComputeKind::gemm, {{8192, 8192, 8192, 1}}, 0};
  const double w = work.seconds(b.gpu), B = 8e6, copy = b.gpu.memory_time(2 * 16 * B);
  TaskGraph g(b.cluster.num_gpus());
  Collective a2a = uniform_alltoall(16, B);
  a2a.algorithm = "2dh";  // its first step: a stride copy on every GPU, from nccl_call_latency on
  const OpId all = g.add_collective(Stream::comm, "a2a", a2a);
  const double start = b.cluster.nccl_call_latency();
  // A transfer inside node 1 that ends part-way through the copy, then a compute on GPU 0.
  const OpId cue = g.add_transfer(Stream::comm2, "cue", {8, 9, copy / 2 * 100e9});
  const OpId compute = g.add_compute(0, "compute", work, {cue});
  const Timing t = b.sim.execute(g);
  const double t0 = t.start[compute], R = start + copy - t0;
  INFO("copy alone " << copy << " s from " << start << " s; the compute from " << t0 << " s");
  REQUIRE(t0 > start);
  REQUIRE(R > 0);
  REQUIRE(t.end[all] < t.end[compute]);
  CHECK(t.end[compute] == Approx(t0 + w + R + copy).epsilon(1e-9));
  CHECK(t.end[all] > t0 + 2 * R + copy);
}

// DeepEP's kernels hold 20 of an H800's 132 SMs while they run: a GEMM overlapping a dispatch on
// one of its GPUs runs at 112/132 of the GPU meanwhile, so it ends s·D later (s = 20/132, D the
// dispatch's time); on a GPU outside the dispatch, and with no share, it ends on time.
TEST_CASE("DeepEP's SMs are taken from compute that overlaps its kernels on their GPUs") {
  Bench b("hgx-h800", 2);
  const Compute work{ComputeKind::gemm, {{16384, 16384, 16384, 1}}, 0};
  const double w = work.seconds(b.gpu), s = 20.0 / 132;
  TaskGraph g(b.cluster.num_gpus());
  auto dispatch_on = [&](int first, double share) {  // ranks first..first+3, as DeepEP
    Collective d{CollectiveType::all_to_all, {first, first + 1, first + 2, first + 3}, std::vector<double>(16, 4e6), "deepep"};
    d.sm_share = share;
    return g.add_collective(Stream::comm, "dispatch", d);
  };
  const OpId with = dispatch_on(0, s), without = dispatch_on(4, 0);
  const OpId shared = g.add_compute(0, "shared", work), unshared = g.add_compute(4, "unshared", work),
             outside = g.add_compute(12, "outside", work);
  const Timing t = b.sim.execute(g);
  const double D = duration(t, with);
  INFO("GEMM " << w << " s, dispatch " << D << " s");
  REQUIRE(D < w / 2);  // the dispatch ends inside the GEMM
  REQUIRE(duration(t, without) > 0);
  CHECK(t.end[shared] == Approx(w + s * D).epsilon(1e-9));
  CHECK(t.end[unshared] == Approx(w).epsilon(1e-12));
  CHECK(t.end[outside] == Approx(w).epsilon(1e-12));
  // From the spec: DeepEP's 20 SMs (or policy.deepep.sms) over the GPU's.
  spec::PolicySpec p;
  spec::GpuSpec h800 = test::platform("hgx-h800", 1).gpu();
  CHECK(deepep_sm_share(p, h800) == Approx(20.0 / 132));
  p.mutable_deepep()->set_sms(24);
  CHECK(deepep_sm_share(p, h800) == Approx(24.0 / 132));
  h800.set_sms(0);
  CHECK(deepep_sm_share(p, h800) == 0);  // unknown SMs: nothing taken
  p.mutable_deepep()->set_sms(200);
  CHECK_THROWS_WITH(deepep_sm_share(p, test::platform("hgx-h800", 1).gpu()), Catch::Contains("give 1 to the GPU's 132"));
}

// Between nodes DeepEP's kernels move no more than their SMs do. On 2 H800 nodes every GPU sends B to
// every other (the network carrying each token once per node, B a rail), so each GPU's experts hold
// 15 B: its NVLink port would take 14 B (7 node-mates' own and 7 forwarded) in 14 B / 160 GB/s, while
// 24 SMs at 124.92 / 24 GB/s each (deepep_alltoall.cpp, measured on H200s) take 15 B / 124.92 GB/s:
// the kernels bind, in the simulation and the cost model. A combine's SMs move 145.16 / 24 GB/s each.
// With no SMs known, or inside one node, the links alone set the time.
TEST_CASE("DeepEP between nodes lasts at least its experts' tokens over its SMs' rate") {
  Bench b("hgx-h800", 2);
  const double B = 64e6, share = 24.0 / 132;
  auto exchange = [&](int n, bool combine, double sm_share, bool cost_model = false) {
    std::vector<double> bytes(std::size_t(n * n), B), network(std::size_t(n * n), 0.0);
    for (int p = 0; p < n; ++p) {
      bytes[std::size_t(p * n + p)] = 0;
      if (n > 8) network[std::size_t(p * n + (p + 8) % 16)] = B;
    }
    Collective c{CollectiveType::all_to_all, {}, bytes, "deepep"};
    for (int i = 0; i < n; ++i) c.group.push_back(i);
    if (n > 8) c.network_bytes = network;
    if (combine) {
      c.bytes = c.bytes.transposed();
      c.network_bytes = c.network_bytes.transposed();
      c.combine = true;
    }
    c.sm_share = sm_share;
    if (cost_model) return CostModel(b.cluster, b.gpu).collective_time(c);
    TaskGraph g(b.cluster.num_gpus());
    const OpId id = g.add_collective(Stream::comm, "exchange", c);
    return duration(b.sim.execute(g), id);
  };
  CHECK(exchange(16, false, share) == Approx(15 * B / 124.92e9).epsilon(0.01));
  CHECK(exchange(16, false, share, true) == Approx(15 * B / 124.92e9).epsilon(0.01));
  CHECK(exchange(16, true, share) == Approx(15 * B / 145.16e9).epsilon(0.01));
  CHECK(exchange(16, false, 0) == Approx(14 * B / 160e9).epsilon(0.01));
  CHECK(exchange(8, false, share) == Approx(exchange(8, false, 0)).epsilon(1e-9));
  CHECK(exchange(8, false, share) == Approx(7 * B / 160e9).epsilon(0.01));
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

namespace {
// EP on 16 GPUs, 2 layers, 32 experts, with a 1 ms host sync (a hand value, far above a count
// exchange's or a capacity all-reduce's few µs, so that each layer's shows in the makespan).
struct HostSyncCase {
  test::SmallSetup t;
  GpuModel gpu{[&] {
    auto g = t.cluster.spec().gpu();
    g.set_host_sync_us(1000);
    return g;
  }(), t.model.dtype()};
  std::vector<RoutingMatrix> routing = t.routing(7);
  TaskGraph build(const std::string& policy, DispatchSizing sizing) const {
    spec::PolicySpec ps;
    ps.set_name(policy);
    PolicyReport report;
    return make_policy(ps)->build_iteration({t.cluster, t.model, gpu, ps, routing, report, sizing});
  }
};
}  // namespace

TEST_CASE("a dispatch sized by counts waits for their exchange and a host sync in every layer's forward") {
  // FastMoE's prepare_forward: an all-to-all of each GPU's per-expert counts (E/G int64 per peer:
  // 16 B), then the host reads them.
  const HostSyncCase c;
  const auto& t = c.t;
  const auto& gpu = c.gpu;
  const TaskGraph plain = c.build("ep", DispatchSizing::fixed);
  const TaskGraph counted = c.build("ep", DispatchSizing::counts);
  const int G = t.cluster.num_gpus(), L = t.model.layers();
  int exchanges = 0, syncs = 0;
  std::set<OpId> sync_ids;
  for (const auto& op : counted.ops()) {
    if (op.label.find("count_exchange") != std::string::npos) {
      ++exchanges;
      const auto& coll = std::get<Collective>(op.body);
      CHECK(coll.bytes.at(0, 1, std::size_t(G)) == 8.0 * t.model.experts() / G);
      CHECK(coll.bytes.at(3, 3, std::size_t(G)) == 0);
    }
    if (op.label.find("host_sync") != std::string::npos) {
      sync_ids.insert(op.id);
      test::for_each_compute(op, [&](const Compute& work, int) {
        ++syncs;
        CHECK(work.seconds(gpu) == Approx(1e-3));
      });
    }
    if (op.label == "L1.fwd.a2a_dispatch")
      for (OpId d : op.deps) CHECK(sync_ids.count(d) == 1);  // after the host has layer 1's counts
  }
  CHECK(exchanges == L);
  CHECK(syncs == L * G);
  for (const auto& op : plain.ops()) CHECK(op.label.find("count_exchange") == std::string::npos);
  // FasterMoE exchanges its counts even where the run's gate pads to capacity (FastMoE's
  // prepare_forward has no other path).
  const TaskGraph fastermoe = c.build("fastermoe-shadow", DispatchSizing::fixed);
  CHECK(std::count_if(fastermoe.ops().begin(), fastermoe.ops().end(),
                      [](const auto& op) { return op.label.find("count_exchange") != std::string::npos; }) == L);
  SimBackend sim(t.cluster, gpu);
  const double extra = sim.execute(counted).makespan() - sim.execute(plain).makespan();
  CHECK(extra >= L * 1e-3);
  CHECK(extra < L * 1.1e-3);
}

TEST_CASE("a dispatch padded to the group's largest count waits for its all-reduce and a host sync in every layer's forward") {
  // DeepSpeed-MoE with drop_tokens=False (sharded_moe.py: dist.all_reduce(new_capacity, MAX), then
  // the capacity sizes F.one_hot on the host) and Tutel with capacity_factor <= 0: one int64
  // all-reduced over the EP group, then read on the host. The gate decides which sizing a run has.
  spec::GateSpec gate;
  CHECK(dispatch_sizing(gate) == DispatchSizing::counts);  // not padded: sized by counts
  gate.set_pad_to_capacity(true);
  CHECK(dispatch_sizing(gate) == DispatchSizing::group_max);  // padded, no factor: dropless
  gate.set_capacity_factor(-2);
  CHECK(dispatch_sizing(gate) == DispatchSizing::group_max);  // Tutel's dynamic factor, capped
  gate.set_capacity_factor(1.25);
  CHECK(dispatch_sizing(gate) == DispatchSizing::fixed);  // a fixed capacity: nothing to agree on
  const HostSyncCase c;
  const auto& t = c.t;
  const TaskGraph fixed = c.build("ep", DispatchSizing::fixed);
  const TaskGraph agreed = c.build("ep", DispatchSizing::group_max);
  const int G = t.cluster.num_gpus(), L = t.model.layers();
  int reduces = 0;
  std::set<OpId> sync_ids;
  for (const auto& op : agreed.ops()) {
    CHECK(op.label.find("count_exchange") == std::string::npos);
    if (op.label.find("capacity_allreduce") != std::string::npos) {
      ++reduces;
      const auto& coll = std::get<Collective>(op.body);
      CHECK(coll.type == CollectiveType::all_reduce);
      CHECK(coll.group.size() == std::size_t(G));
      CHECK(coll.bytes[0] == 8.0);
    }
    if (op.label.find("host_sync") != std::string::npos) sync_ids.insert(op.id);
    if (op.label == "L1.fwd.a2a_dispatch")
      for (OpId d : op.deps) CHECK(sync_ids.count(d) == 1);  // after the host has layer 1's capacity
  }
  CHECK(reduces == L);
  CHECK(sync_ids.size() == std::size_t(L));
  for (const auto& op : fixed.ops()) CHECK(op.label.find("capacity_allreduce") == std::string::npos);
  SimBackend sim(t.cluster, c.gpu);
  const double extra = sim.execute(agreed).makespan() - sim.execute(fixed).makespan();
  CHECK(extra >= L * 1e-3);
  CHECK(extra < L * 1.1e-3);
}

TEST_CASE("a linear all-to-all whose pairs go as m messages pays the NIC's per-message time m times") {
  // Tutel's pipelined all-to-all sends ΔE messages per peer (Collective::messages). Two GPUs on two
  // DGX-A100 nodes exchange B bytes each way, once as one message per pair, then as four: the NIC
  // (24 GB/s, 6 µs a message: NCCL's proxy overhead on AMD hosts) carries 18 µs more, in the backend
  // and in the cost model alike; the cost model adds NCCL's 8.4 µs per call.
  Bench b("dgx-a100", 2);
  const double B = 64e6;
  Collective one{CollectiveType::all_to_all, {0, 8}, std::vector<double>{0, B, B, 0}, "linear"};
  Collective four = one;
  four.messages = 4;
  TaskGraph g(b.cluster.num_gpus());
  const OpId a = g.add_collective(Stream::comm, "one", one);
  const OpId c = g.add_collective(Stream::comm, "four", four, {a});
  const Timing t = b.sim.execute(g);
  CHECK(duration(t, c) - duration(t, a) == Approx(18e-6).epsilon(1e-3));
  const CostModel cost(b.cluster, b.gpu);
  CHECK(cost.collective_time(four) - cost.collective_time(one) == Approx(18e-6).epsilon(1e-3));
  CHECK(cost.collective_time(one) == Approx(8.4e-6 + (B + 6e-6 * 24e9) / 24e9).epsilon(1e-6));
}

TEST_CASE("the parts of a Computes op chain on each GPU's stream, not step by step") {
  // Two steps on two GPUs: GPU 0's parts take 3 and 1 ms, GPU 1's 1 and 3 ms. Each GPU runs its
  // second part as soon as its first is done (at 3 and 1 ms), as two ops of one part each would; a
  // step as a whole would hold GPU 1 until GPU 0's first part ended and end at 6 ms.
  Bench b("dgx-a100", 1);
  auto work = [](double ms, ComputeKind kind = ComputeKind::grouped_gemm) {
    Compute c{kind, {}, 0};
    c.fixed_seconds = ms * 1e-3;
    return c;
  };
  auto step = [&](double ms0, double ms1) { return Computes{{0, 1}, make_works({work(ms0), work(ms1)}), {0, 1}}; };
  TaskGraph g(b.cluster.num_gpus());
  const OpId c0 = g.add_computes("L0.fwd.C0", step(3, 1));
  const OpId c1 = g.add_computes("L0.fwd.C1", step(1, 3));
  const OpId after0 = g.add_compute(0, "after", work(1, ComputeKind::gemm));  // on GPU 0's stream after its part of C1
  const OpId all = g.add_compute(1, "all", work(0, ComputeKind::gemm), {c1});  // waits for every part of C1
  const Timing t = b.sim.execute(g);
  REQUIRE(t.part_start.size() == 4);
  const auto part = [&](OpId op, int i) {
    const std::size_t k = std::get<Computes>(g.op(op).body).first_part + std::size_t(i);
    return std::pair(t.part_start[k] * 1e3, t.part_end[k] * 1e3);
  };
  CHECK(part(c0, 0).second == Approx(3));
  CHECK(part(c0, 1).second == Approx(1));
  CHECK(part(c1, 0).first == Approx(3));
  CHECK(part(c1, 0).second == Approx(4));
  CHECK(part(c1, 1).first == Approx(1));  // GPU 1 did not wait for GPU 0's first part
  CHECK(part(c1, 1).second == Approx(4));
  CHECK(t.end[c0] * 1e3 == Approx(3));
  CHECK(t.start[c1] * 1e3 == Approx(1));  // an op of parts: from its first part's start to its last one's end
  CHECK(t.end[c1] * 1e3 == Approx(4));
  CHECK(t.start[after0] * 1e3 == Approx(4));
  CHECK(t.start[all] * 1e3 == Approx(4));
  // The critical path: `after` back through GPU 0's parts, 3 + 1 ms of experts and 1 ms after them.
  const Attribution a = attribute(g, t);
  CHECK(a.critical.total() * 1e3 == Approx(5));
  CHECK(a.critical[Phase::expert_compute] * 1e3 == Approx(4));
  CHECK(a.busy[Phase::expert_compute] * 1e3 * b.cluster.num_gpus() == Approx(3 + 1 + 1 + 3));
}

namespace {

// The graph with each Computes op replaced by a Compute op per part (what waited for the op waits
// for all of them); `parts[k]` is part k's op there, `ops[id]` an op's own id there.
struct Expanded {
  TaskGraph graph;
  std::vector<OpId> ops, parts;
};
Expanded expand(const TaskGraph& g) {
  Expanded x{TaskGraph(g.num_ranks()), {}, std::vector<OpId>(g.num_parts())};
  std::vector<std::vector<OpId>> as(g.size());  // an op's ids in the expanded graph
  for (const auto& op : g.ops()) {
    std::vector<OpId> deps;
    for (OpId d : op.deps) deps.insert(deps.end(), as[d].begin(), as[d].end());
    if (const auto* parts = std::get_if<Computes>(&op.body)) {
      for (std::size_t i = 0; i < parts->parts(); ++i)
        as[op.id].push_back(x.parts[parts->first_part + i] = x.graph.add_compute(parts->ranks[i], op.label, parts->work(i), deps));
    } else if (const auto* c = std::get_if<Compute>(&op.body)) {
      as[op.id] = {x.graph.add_compute(op.rank, op.label, *c, deps)};
    } else if (const auto* k = std::get_if<Collective>(&op.body)) {
      as[op.id] = {x.graph.add_collective(op.stream, op.label, *k, deps)};
    } else {
      as[op.id] = {x.graph.add_transfer(op.stream, op.label, std::get<Transfer>(op.body), deps)};
    }
    x.ops.push_back(as[op.id].back());
  }
  return x;
}

}  // namespace

TEST_CASE("an op of parts times every part as an op of its own would, when copies share its GPUs") {
  // Two steps of expert work on 16 GPUs, uneven from GPU to GPU, while a 2DH all-to-all's stride
  // copies start on every GPU part-way through them: the parts running then become execs that share
  // their GPU with the copies, the ones after them wait again. The same graph with an op per part
  // must give every op and part the same start and end.
  Bench b("dgx-a100", 2);
  const int G = b.cluster.num_gpus();
  auto step = [&](int salt) {
    Computes c;
    std::vector<Compute> works;
    for (int r = 0; r < G; ++r) {
      c.ranks.push_back(r);
      works.push_back({ComputeKind::grouped_gemm, {{std::uint64_t(1024 + 512 * ((r * 7 + salt) % 5)), 4096, 4096, 1}}, 0});
      c.work_of.push_back(std::uint32_t(r));
    }
    c.works = make_works(std::move(works));
    return c;
  };
  TaskGraph g(G);
  const OpId c0 = g.add_computes("L0.fwd.C0", step(1));
  const OpId c1 = g.add_computes("L0.fwd.C1", step(3));
  const OpId late = g.add_transfer(Stream::comm, "before", {8, 9, 60e6});  // delays the all-to-all into the steps
  Collective a2a = uniform_alltoall(G, 8e6);
  a2a.algorithm = "2dh";
  const OpId copies = g.add_collective(Stream::comm, "a2a", a2a, {late});
  const OpId next = g.add_computes("L0.fwd.C2", step(4), {c0});
  const OpId tail = g.add_compute(5, "after", {ComputeKind::gemm, {{2048, 2048, 2048, 1}}, 0}, {c1});
  const Expanded x = expand(g);
  const Timing t = b.sim.execute(g);
  const Timing e = b.sim.execute(x.graph);
  for (OpId id : {c0, c1, next})
    for (std::size_t i = 0; i < std::size_t(G); ++i) {
      const std::size_t k = std::get<Computes>(g.op(id).body).first_part + i;
      INFO(g.op(id).label << " part " << i);
      CHECK(t.part_start[k] == Approx(e.start[x.parts[k]]).epsilon(1e-12).margin(1e-15));
      CHECK(t.part_end[k] == Approx(e.end[x.parts[k]]).epsilon(1e-12).margin(1e-15));
    }
  for (OpId id : {late, copies, tail}) {
    CHECK(t.start[id] == Approx(e.start[x.ops[id]]).epsilon(1e-12));
    CHECK(t.end[id] == Approx(e.end[x.ops[id]]).epsilon(1e-12));
  }
  // The copies did slow some part: a part lasted longer than its work alone.
  int shared = 0;
  for (OpId id : {c0, c1, next}) {
    const auto& parts = std::get<Computes>(g.op(id).body);
    for (std::size_t i = 0; i < parts.parts(); ++i)
      shared += t.part_end[parts.first_part + i] - t.part_start[parts.first_part + i] > parts.work(i).seconds(b.gpu) * (1 + 1e-9);
  }
  CHECK(shared > 0);
  CHECK(t.start[copies] > t.part_start[std::get<Computes>(g.op(c0).body).first_part]);
  CHECK(t.start[copies] < t.end[c1]);
}

TEST_CASE("the critical path adds up to the iteration's time through the smart schedule's ops of parts") {
  const auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=2", "model.layers=2", "policy.name=fastermoe-smart"});
  const auto r = run_experiment(ex).runs.front();
  const auto& g = r.graphs.at(0);
  REQUIRE(g.num_parts() > 0);  // its steps' expert work is one op each
  const auto& it = r.iterations.at(std::size_t(r.first_graph));
  CHECK(it.attribution.critical.total() == Approx(it.time).epsilon(1e-12));
  CHECK(it.attribution.critical[Phase::expert_compute] > 0);
  CHECK(it.attribution.busy[Phase::expert_compute] > 0);
}

// NCCL's PXN (NodeSpec.pxn): each GPU of node 0 of 3 DGX H100s sends B to GPU 0 of node 1 and to
// GPU 0 of node 2, as an all-to-all. Without PXN each GPU's own NIC sends its 2B, and each
// receiving NIC 0 takes 8B: 8B at 48 GB/s. With PXN every message crosses NVLink to GPU 0 of node 0
// first and leaves through its NIC 0, the receivers' rail: 16B through one NIC, twice as long. The
// aggregated step and one flow per message must agree.
double pxn_incast(bool pxn, bool aggregate) {
  auto spec = test::platform("dgx-h100", 3);
  spec.mutable_node()->set_pxn(pxn);
  const Cluster cluster(spec);
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu, SimOptions{aggregate});
  const double B = 1e9;
  std::vector<double> bytes(24 * 24, 0.0);
  for (std::size_t i = 0; i < 8; ++i) bytes[i * 24 + 8] = bytes[i * 24 + 16] = B;
  Collective c{CollectiveType::all_to_all, {}, bytes, "linear"};
  for (int i = 0; i < 24; ++i) c.group.push_back(i);
  TaskGraph g(cluster.num_gpus());
  const OpId a2a = g.add_collective(Stream::comm, "a2a", c);
  const Timing t = sim.execute(g);
  return duration(t, a2a) / (8 * B / 48e9);
}

TEST_CASE("without PXN the receivers' NICs bind an incast") { CHECK(pxn_incast(false, true) == Approx(1).epsilon(1e-3)); }
TEST_CASE("with PXN the sender's NIC on the receivers' rail carries every message to them") {
  CHECK(pxn_incast(true, true) == Approx(2).epsilon(1e-3));
}
TEST_CASE("with PXN one flow per message gives the aggregated step's time") { CHECK(pxn_incast(true, false) == Approx(2).epsilon(1e-3)); }

// NCCL's channels to a send/recv peer on another node (NodeSpec.nccl_net_channels_per_peer), 14 GB/s
// each: on 2 DGX A100s (24 GB/s NICs) GPU i of node 0 and GPU i of node 1 exchange B, each GPU's one
// remote peer (2DH's inter-node phase on 2 nodes). With one channel (NCCL before 2.12) the exchange
// lasts B / 14 GB/s, with two (28 GB/s) or none set the NIC binds: B / 24 GB/s. A linear all-to-all
// of the 16 GPUs, 8 remote peers each, is the same with the cap and without. Returns the
// all-to-all's time over B / 14 GB/s, simulated (sim) or as the cost model times it.
double peer_capped(int channels, bool one_peer, bool sim_backend) {
  auto spec = test::platform("dgx-a100", 2);
  spec.mutable_node()->set_nccl_net_channels_per_peer(std::uint32_t(channels));
  const Cluster cluster(spec);
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  const double B = 1e9;
  std::vector<double> bytes(16 * 16, one_peer ? 0.0 : B / 8);
  if (one_peer)
    for (std::size_t i = 0; i < 8; ++i) bytes[i * 16 + i + 8] = bytes[(i + 8) * 16 + i] = B;
  Collective c{CollectiveType::all_to_all, {}, bytes, "linear"};
  for (int i = 0; i < 16; ++i) c.group.push_back(i);
  if (!sim_backend) return CostModel(cluster, gpu).collective_time(c) / (B / 14e9);
  SimBackend sim(cluster, gpu);
  TaskGraph g(cluster.num_gpus());
  const OpId a2a = g.add_collective(Stream::comm, "a2a", c);
  return duration(sim.execute(g), a2a) / (B / 14e9);
}

TEST_CASE("one NCCL channel to a remote peer caps its messages at 14 GB/s below the NIC's 24") {
  CHECK(peer_capped(1, true, true) == Approx(1).epsilon(1e-3));
  CHECK(peer_capped(1, true, false) == Approx(1).epsilon(1e-3));  // the cost model agrees
}
TEST_CASE("two NCCL channels to a remote peer leave the NIC to bind") {
  CHECK(peer_capped(2, true, true) == Approx(14.0 / 24).epsilon(2e-3));
  CHECK(peer_capped(0, true, false) == Approx(14.0 / 24).epsilon(2e-3));  // no cap set, in the cost model
}
TEST_CASE("a linear all-to-all with 8 remote peers a GPU is the same under a one-channel cap") {
  CHECK(peer_capped(1, false, true) == Approx(peer_capped(0, false, false)).epsilon(0.05));
}

TEST_CASE("a transfer between nodes under PXN leaves through the receiver's rail, sharing that NIC") {
  // 3 DGX H100s with PXN: GPU 0 -> GPU 1 of node 1 and GPU 1 -> GPU 1 of node 2, side by side, both
  // through node 0's NIC 1 (GPU 0's message over NVLink to GPU 1 first): each at half of 48 GB/s.
  // GPU 2 -> GPU 2 of node 1, on its own rail, alone at 48 GB/s.
  auto spec = test::platform("dgx-h100", 3);
  spec.mutable_node()->set_pxn(true);
  const Cluster cluster(spec);
  CHECK(cluster.pxn_proxy(0, 9) == 1);
  CHECK(cluster.pxn_proxy(1, 17) == 1);
  CHECK(cluster.pxn_proxy(0, 1) == 0);   // inside a node: NVLink only
  CHECK(cluster.pxn_proxy(10, 2) == 10);  // already on the receiver's rail
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  const double B = 1e9;
  TaskGraph g(cluster.num_gpus());
  const OpId a = g.add_transfer(Stream::comm, "a", {0, 9, B});
  const OpId b = g.add_transfer(Stream::comm, "b", {1, 17, B});
  const OpId c = g.add_transfer(Stream::comm, "c", {2, 10, B});
  const Timing t = sim.execute(g);
  CHECK(duration(t, a) == Approx(2 * B / 48e9).epsilon(1e-3));
  CHECK(duration(t, b) == Approx(2 * B / 48e9).epsilon(1e-3));
  CHECK(duration(t, c) == Approx(B / 48e9).epsilon(1e-3));
}

// Timed steps (sim/timed_steps.cpp): a collective that no other network op can overlap, or only ops
// on other nodes of its leaf switch, is a timer of the time its steps' parallel tasks would take
// alone. Three DGX-A100 nodes: a skewed all-to-all between nodes 0 and 1, alone, then beside a
// transfer inside node 2 (which shares no link with it): the same time both ways. Beside a transfer
// through node 0's NIC 0 it is slower: a collective that may share a link with another is
// simulated with it.
TEST_CASE("a collective nothing can overlap is timed as its tasks would run alone") {
  Bench b("dgx-a100", 3);
  std::vector<double> bytes(16 * 16, 0.0);
  for (std::size_t i = 0; i < 16; ++i)
    for (std::size_t j = 0; j < 16; ++j) bytes[i * 16 + j] = i == j ? 0 : 1e6 * double(1 + (i * 7 + j * 3) % 11);
  Collective c{CollectiveType::all_to_all, {}, bytes, "linear"};
  for (int i = 0; i < 16; ++i) c.group.push_back(i);
  auto a2a_time = [&](const std::optional<Transfer>& beside) {
    TaskGraph g(b.cluster.num_gpus());
    const OpId a2a = g.add_collective(Stream::comm, "a2a", c);
    if (beside) g.add_transfer(Stream::comm2, "beside", *beside);
    return duration(b.sim.execute(g), a2a);
  };
  const double alone = a2a_time(std::nullopt);
  CHECK(a2a_time(Transfer{16, 17, 1e9}) == Approx(alone).epsilon(1e-12));
  CHECK(a2a_time(Transfer{0, 16, 1e9}) > 1.05 * alone);
}

// A timed step's seconds are kept for the iteration by the view of its matrix (timed_step()), as a
// layer's forward and backward send the same matrices. Four all-to-alls one after another on two
// DGX-A100 nodes: a skewed matrix, the same view again, that view scaled by 2 and the view
// transposed. Each takes what it takes in a graph of its own (for the transposed view: a matrix
// holding the transposed values), and the scaled one is not taken for the first.
TEST_CASE("a timed step's seconds are kept by the view of its matrix, never another view's") {
  Bench b("dgx-a100", 2);
  const std::size_t n = 16;
  std::vector<double> bytes(n * n, 0.0), flipped(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (i != j) bytes[i * n + j] = flipped[j * n + i] = 1e6 * double(1 + (i * 7 + j * 3) % 11) * (i < 3 ? 8 : 1);
  const CollectiveBytes matrix(bytes);
  std::vector<int> group(n);
  for (std::size_t i = 0; i < n; ++i) group[i] = int(i);
  const std::vector<CollectiveBytes> views{matrix, matrix, matrix.scaled(2.0), matrix.transposed()};
  auto own_graph = [&](const CollectiveBytes& v) {
    TaskGraph g(b.cluster.num_gpus());
    const OpId a2a = g.add_collective(Stream::comm, "a2a", {CollectiveType::all_to_all, group, v, "linear"});
    return duration(b.sim.execute(g), a2a);
  };
  TaskGraph g(b.cluster.num_gpus());
  std::vector<OpId> ids;
  for (const auto& v : views)
    ids.push_back(g.add_collective(Stream::comm, fmt::format("a2a{}", ids.size()), {CollectiveType::all_to_all, group, v, "linear"},
                                   ids.empty() ? std::vector<OpId>{} : std::vector<OpId>{ids.back()}));
  const Timing t = b.sim.execute(g);
  for (std::size_t k = 0; k < views.size(); ++k) CHECK(duration(t, ids[k]) == Approx(own_graph(views[k])).epsilon(1e-12));
  CHECK(duration(t, ids[3]) == Approx(own_graph(CollectiveBytes(flipped))).epsilon(1e-12));
  CHECK(duration(t, ids[1]) == duration(t, ids[0]));
  CHECK(duration(t, ids[2]) > 1.5 * duration(t, ids[0]));
}
