// ScheMoE: OptSche's makespan recurrence on hand cases and against its own order; an exhaustive
// search over orders at r = 2 that never beats OptSche; the simulated layer against the
// recurrence on an uncontended node; compressors on the wire.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <random>

#include "collectives/collectives.hpp"
#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "routing.hpp"
#include "schemoe.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

TEST_CASE("OptSche's makespan: Eq. 10 at r = 1, max(2A, E + 2A/r) without compression") {
  const TaskTimes t{1, 3, 2, 5};
  CHECK(optsche_makespan(1, t) == Approx(2 * 1 + 2 * 3 + 2 * 2 + 5));
  for (int r : {2, 3, 4, 8}) {
    const TaskTimes nc{0, 7.0 / r, 0, 4.0 / r};  // A = 7, E = 4 for the whole layer
    CHECK(optsche_makespan(r, nc) == Approx(std::max(2 * 7.0, 4 + 2 * 7.0 / r)));
    const TaskTimes comp{4.0 / r, 7.0 / r, 2.0 / r, 4.0 / r};
    const auto [compute, comm] = optsche_order(r);
    CHECK(order_makespan(compute, comm, comp) == Approx(optsche_makespan(r, comp)));
  }
}

TEST_CASE("no order of the 7r tasks beats OptSche at r = 2") {
  // Every interleaving of the two parts' compute chains C1 D1 E C2 D2 (252) × every comm order
  // with A1ⁱ before A2ⁱ (6), on random task times.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  std::vector<std::vector<Task>> computes, comms;
  const int chain[5] = {0, 2, 3, 4, 6};
  for (int mask = 0; mask < 1 << 10; ++mask) {
    if (__builtin_popcount(unsigned(mask)) != 5) continue;
    std::vector<Task> order;
    int next[2] = {0, 0};
    for (int b = 0; b < 10; ++b) {
      const int part = (mask >> b) & 1;
      order.push_back({chain[next[part]++], part});
    }
    computes.push_back(order);
  }
  std::vector<Task> comm = {{1, 0}, {1, 1}, {5, 0}, {5, 1}};
  std::sort(comm.begin(), comm.end(), [](const Task& a, const Task& b) { return a.kind * 2 + a.part < b.kind * 2 + b.part; });
  do {
    bool ok = true;
    for (std::size_t i = 0; i < comm.size(); ++i)
      for (std::size_t j = i + 1; j < comm.size(); ++j)
        if (comm[i].part == comm[j].part && comm[i].kind > comm[j].kind) ok = false;
    if (ok) comms.push_back(comm);
  } while (std::next_permutation(comm.begin(), comm.end(), [](const Task& a, const Task& b) {
    return a.kind * 2 + a.part < b.kind * 2 + b.part;
  }));
  REQUIRE(computes.size() == 252);
  REQUIRE(comms.size() == 6);
  for (int trial = 0; trial < 40; ++trial) {
    const TaskTimes t{u(rng), u(rng), u(rng), u(rng)};
    const double best = optsche_makespan(2, t);
    double others = 1e300;
    for (const auto& c : computes)
      for (const auto& m : comms)
        if (const double x = order_makespan(c, m, t); x >= 0) others = std::min(others, x);
    INFO("c " << t.c << " a " << t.a << " d " << t.d << " e " << t.e);
    CHECK(best <= others * (1 + 1e-12));
  }
}

TEST_CASE("the simulated ScheMoE layer follows OptSche's recurrence and beats sequential parts") {
  // Two DGX-A100 nodes (the all-to-all on NVSwitch and NICs, compute on the GPUs: nothing shared
  // between the streams), every GPU sending 512 slots to every expert, so that parts are equal and
  // C1 = C2, D1 = D2, A1 = A2 as the recurrence assumes.
  const Cluster cluster(test::platform("dgx-a100", 2));
  spec::ModelSpec ms;
  ms.set_name("layer");
  ms.set_layers(1);
  ms.set_d_model(1024);
  ms.set_d_ffn(2048);
  ms.set_experts(16);
  ms.set_top_k(1);
  ms.set_seq_len(2048);
  ms.set_tokens_per_gpu(8192);
  ms.set_heads(16);
  ms.set_dtype(spec::FP16);
  const MoeModel model(ms);
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  SimBackend sim(cluster, gpu);
  RoutingMatrix R(16, 16);
  for (auto& x : R.mutable_counts()) x = 512;
  const std::vector<RoutingMatrix> routing{R};
  auto run = [&](int r, double bits) {
    spec::PolicySpec ps;
    ps.set_name("schemoe");
    ps.mutable_schemoe()->set_partitions(std::uint32_t(r));
    ps.mutable_schemoe()->mutable_compressor()->set_bits(bits);
    ps.mutable_schemoe()->mutable_compressor()->set_gbytes_per_s(400);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    const auto t = sim.execute(g);
    TaskTimes times;
    double first = 1e300, last = 0, wire = 0;
    for (const auto& op : g.ops()) {
      if (op.label.rfind("L0.fwd.", 0) != 0 || op.rank != 0) continue;
      const double d = t.end[op.id] - t.start[op.id];
      if (op.label.find(".C1.") != std::string::npos) times.c = d, first = std::min(first, t.start[op.id]);
      if (op.label.find(".D1.") != std::string::npos) times.d = d;
      if (op.label.find(".experts.") != std::string::npos) times.e = d;
      if (op.label.find(".a2a_dispatch.") != std::string::npos) {
        times.a = d;
        wire += std::get<Collective>(op.body).total_bytes();
      }
      if (op.label.find(".D2.") != std::string::npos) last = std::max(last, t.end[op.id]);
    }
    return std::make_tuple(last - first, times, wire);
  };
  const auto [span2, times, wire8] = run(2, 8);
  const auto [span4, times4, wire4] = run(4, 8);
  const auto [span_fp8, t16, wire16] = run(2, 16);
  const double sequential = 2 * (2 * times.c + 2 * times.a + 2 * times.d + times.e);  // Eq. 10 per part
  std::cout << fmt::format("ScheMoE layer, r = 2: c {:.1f} a {:.1f} d {:.1f} e {:.1f} µs; simulated {:.1f} µs, "
                           "recurrence {:.1f} µs, parts in sequence {:.1f} µs\n",
                           times.c * 1e6, times.a * 1e6, times.d * 1e6, times.e * 1e6, span2 * 1e6,
                           optsche_makespan(2, times) * 1e6, sequential * 1e6);
  CHECK(span2 == Approx(optsche_makespan(2, times)).epsilon(1e-6));
  CHECK(span4 == Approx(optsche_makespan(4, times4)).epsilon(1e-6));
  CHECK(span2 < 0.9 * sequential);
  // fp16 payloads: 8 bits on the wire is a half, 16 bits all of it.
  CHECK(wire16 == Approx(2 * wire8));
  CHECK(wire8 == Approx(16.0 * 8192 * 1024 * 2 / 2));  // 16 GPUs' 8192 slots of 1024 fp16, local ones included
}

TEST_CASE("Pipe-A2A's two lanes run as independent streams across ScheMoE's parts, as released") {
  // Two RTX 2080 Ti nodes (PCIe inside, a 79 Gb/s NIC between), uniform routing, r = 2 parts, no
  // compressor, all dispatches ready together. pipe.cpp sends each peer on its lane's communicator
  // and stream: part 1's intra-node exchange starts as soon as part 0's intra-node one ends, while
  // part 0's inter-node one still runs (or the other way round, whichever lane is shorter); and each
  // lane is the pipe algorithm's own lane.
  const Cluster cluster(test::platform("rtx2080ti-pcie", 2));
  const spec::ModelSpec ms = test::model_spec(1, 1024, 2048, 8, 1, 2048, 8192, 16, spec::FP32);
  const MoeModel model(ms);
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  SimBackend sim(cluster, gpu);
  RoutingMatrix R(8, 8);
  for (auto& x : R.mutable_counts()) x = 1024;
  const std::vector<RoutingMatrix> routing{R};
  spec::PolicySpec ps;
  ps.set_name("schemoe");
  ps.set_all_to_all("pipe");
  ps.mutable_schemoe()->set_partitions(2);
  ps.mutable_schemoe()->mutable_compressor()->set_name("none");
  PolicyReport report;
  const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
  const auto t = sim.execute(g);
  std::map<std::string, OpId> id;
  for (const auto& op : g.ops())
    if (op.label.rfind("L0.fwd.a2a_dispatch.", 0) == 0) id[op.label.substr(20)] = op.id;
  REQUIRE(id.size() == 4);
  const OpId intra0 = id.at("p0.intra"), inter0 = id.at("p0.inter"), intra1 = id.at("p1.intra"), inter1 = id.at("p1.inter");
  CHECK(g.ops()[intra0].stream == Stream::comm);
  CHECK(g.ops()[inter0].stream == Stream::comm2);
  // Whichever lane ends first goes on to part 1 at once, not held back by the other.
  const bool intra_first = t.end[intra0] < t.end[inter0];
  const OpId short0 = intra_first ? intra0 : inter0, long0 = intra_first ? inter0 : intra0;
  const OpId short1 = intra_first ? intra1 : inter1, long1 = intra_first ? inter1 : intra1;
  CHECK(t.end[short0] < 0.9 * t.end[long0]);
  CHECK(t.start[short1] == Approx(t.end[short0]));
  CHECK(t.start[long1] == Approx(t.end[long0]));
  // Each lane sends exactly its half of the pairs: together, the part's whole exchange.
  const auto& whole = std::get<Collective>(g.ops()[intra0].body);
  double intra_bytes = 0, inter_bytes = 0;
  for (const auto& lane : lower(whole, cluster))
    for (const auto& step : lane)
      for (const auto& tr : step.transfers) {
        CHECK(cluster.node_of(tr.src) == cluster.node_of(tr.dst));
        intra_bytes += tr.bytes;
      }
  for (const auto& lane : lower(std::get<Collective>(g.ops()[inter0].body), cluster))
    for (const auto& step : lane)
      for (const auto& tr : step.transfers) {
        CHECK(cluster.node_of(tr.src) != cluster.node_of(tr.dst));
        inter_bytes += tr.bytes;
      }
  const double part = 8.0 * 8192 * 1024 * 4 / 2;  // 8 GPUs' 8192 fp32 slots, half a part each
  CHECK(intra_bytes + inter_bytes == Approx(part * 7 / 8));  // the local slots do not move
  CHECK(inter_bytes == Approx(part / 2));
}

TEST_CASE("ScheMoE's compressors cost their released kernels' memory traffic, INT8 sends bias and scale too") {
  // Per payload value of b bytes (schemoe.cpp, from Fragile-azalea/ScheMoE's int8.cpp and zfpc.cpp):
  // INT8 9b + 3 to compress, 7b + 3 to decompress; ZFP (fp32 only) 4 + 1 each way at 8 bits, and a
  // 16-bit payload cast to fp32 and back, 2 + 4 more; the fp16 cast b + 2.
  const auto traffic = [](const char* name, double b) {
    spec::CompressorSpec s;
    s.set_name(name);
    const Compressor c = make_compressor(s, "zfp", b);
    return std::tuple{c.compress_bytes, c.decompress_bytes, c.side_all_to_alls};
  };
  CHECK(traffic("int8", 4) == std::tuple{39.0, 31.0, 2});
  CHECK(traffic("int8", 2) == std::tuple{21.0, 17.0, 2});
  CHECK(traffic("zfp", 4) == std::tuple{5.0, 5.0, 0});
  CHECK(traffic("zfp", 2) == std::tuple{11.0, 11.0, 0});
  CHECK(traffic("fp16", 4) == std::tuple{6.0, 6.0, 0});
  // In the layer: one fp32 CT-MoE-like layer on two DGX-A100 nodes, uniform routing, r = 2.
  const Cluster cluster(test::platform("dgx-a100", 2));
  const spec::ModelSpec ms = test::model_spec(1, 512, 512, 16, 1, 512, 4096, 8, spec::FP32);
  const MoeModel model(ms);
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  RoutingMatrix R(16, 16);
  for (auto& x : R.mutable_counts()) x = 256;
  const std::vector<RoutingMatrix> routing{R};
  for (const char* name : {"int8", "zfp"}) {
    INFO(name);
    spec::PolicySpec ps;
    ps.set_name("schemoe");
    ps.mutable_schemoe()->mutable_compressor()->set_name(name);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    const double payload = 4096.0 / 2 * 512 * 4;  // a part of GPU 0's slots, fp32
    const auto [compress, decompress, sides] = traffic(name, 4);
    int dispatches = 0;
    for (const auto& op : g.ops()) {
      if (op.label == "L0.fwd.C1.p0" && op.rank == 0) CHECK(std::get<Compute>(op.body).memory_bytes == Approx(payload * compress / 4));
      if (op.label == "L0.fwd.D2.p1" && op.rank == 0) CHECK(std::get<Compute>(op.body).memory_bytes == Approx(payload * decompress / 4));
      if (op.label.rfind("L0.fwd.a2a_dispatch.p0", 0) != 0) continue;
      ++dispatches;
      const double pair = std::get<Collective>(op.body).bytes.at(0, 1, 16);
      // The payload at 8 bits a value, then (INT8) the bias and the scale: one fp32 value a token.
      CHECK(pair == Approx(op.label == "L0.fwd.a2a_dispatch.p0" ? 256.0 / 2 * 512 : 256.0 / 2 * 4));
    }
    CHECK(dispatches == 1 + sides);
  }
}

TEST_CASE("schemoe-released: the MOELayer's defaults, one part, no compressor, the naive all-to-all") {
  // Fragile-azalea/ScheMoE moe_layer.py: a2a_ffn_overlap_degree=1, compress_name='no', comm_name='naive'.
  const Cluster cluster(test::platform("dgx-a100", 2));
  const spec::ModelSpec ms = test::model_spec(1, 512, 1024, 16, 1, 512, 2048, 8);
  const MoeModel model(ms);  // keeps a reference to its spec
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  RoutingMatrix R(16, 16);
  for (auto& x : R.mutable_counts()) x = 128;
  const std::vector<RoutingMatrix> routing{R};
  auto ops = [&](const spec::PolicySpec& ps) {
    PolicyReport report;
    std::vector<std::string> labels;
    const TaskGraph g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    for (const auto& op : g.ops()) labels.push_back(op.label);
    return labels;
  };
  spec::PolicySpec released;
  released.set_name("schemoe-released");
  const auto plain = ops(released);
  CHECK(std::find(plain.begin(), plain.end(), "L0.fwd.a2a_dispatch") != plain.end());
  for (const auto& l : plain) CHECK(l.find(".C1") == std::string::npos);
  // The paper's configuration is the release's options set: ZFP, r = 2.
  released.mutable_schemoe()->set_partitions(2);
  released.mutable_schemoe()->mutable_compressor()->set_name("zfp");
  spec::PolicySpec paper;
  paper.set_name("schemoe");
  CHECK(ops(released) == ops(paper));
}
