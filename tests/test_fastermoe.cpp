// FasterMoE: the cost model on hand cases and against the SimGrid backend, dynamic shadowing on
// constructed loads, the smart schedule against its bound, the topology-aware gate, and token
// conservation under every policy.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <sstream>
#include <set>

#include "collectives/collectives.hpp"
#include "cost_model.hpp"
#include "fastermoe.hpp"
#include "errors.hpp"
#include "helpers.hpp"
#include "moe_iteration.hpp"
#include "runner.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

namespace {

spec::ModelSpec layer_model(int experts, int d_model, int tokens, int top_k = 2) {
  spec::ModelSpec m;
  m.set_name("layer");
  m.set_layers(1);
  m.set_d_model(d_model);
  m.set_d_ffn(2 * d_model);  // α = 2, as in FasterMoE's models
  m.set_experts(experts);
  m.set_top_k(top_k);
  m.set_seq_len(tokens);
  m.set_tokens_per_gpu(tokens);
  m.set_heads(16);
  m.set_dtype(spec::FP16);
  return m;
}

// The MoE part of a layer in a timed graph: from the first op of the layer's exchange to the end
// of its last one, forward plus backward.
double moe_part(const TaskGraph& g, const Timing& t) {
  double total = 0;
  for (const char* dir : {".fwd.", ".bwd."}) {
    double start = 1e30, end = 0;
    for (const auto& op : g.ops()) {
      const bool moe = op.label.find(dir) != std::string::npos &&
                       (std::holds_alternative<Collective>(op.body) || op.label.find("experts") != std::string::npos ||
                        op.label.find(".C") != std::string::npos);
      if (!moe) continue;
      start = std::min(start, t.start[op.id]);
      end = std::max(end, t.end[op.id]);
    }
    total += end - start;
  }
  return total;
}

// FasterMoE's smart-schedule expert steps: "L<l>.<pass>.C<j>".
bool op_name_is_step(const std::string& label) {
  const auto at = label.rfind(".C");
  return at != std::string::npos && at + 2 < label.size() &&
         std::all_of(label.begin() + std::ptrdiff_t(at) + 2, label.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; });
}

// The iteration policy `name` builds on the small setup.
TaskGraph iteration_of(const char* name, const test::SmallSetup& t, const std::vector<RoutingMatrix>& routing) {
  spec::PolicySpec ps;
  ps.set_name(name);
  PolicyReport report;
  return make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
}
}  // namespace

TEST_CASE("cost model: all-to-all, all-reduce and compute on hand cases") {
  const Cluster c(test::platform("dgx-a100", 2));
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  std::vector<double> bytes(16 * 16, 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j)
      if (i != j) bytes[i * 16 + j] = 1e6;  // node 0 only: each NVSwitch port carries 7 MB each way
  CHECK(cost.alltoall_time(bytes) == Approx(7e6 / 231.6e9));
  bytes[0 * 16 + 8] = 50e6;  // plus 50 MB from GPU 0 to GPU 8 over its 24 GB/s rail (6 µs per message)
  CHECK(cost.alltoall_time(bytes) == Approx(50e6 / 24e9 + 6e-6));
  std::vector<int> ring(16);
  for (int r = 0; r < 16; ++r) ring[r] = r;
  // Eight rings (a channel per NIC), each on S/8: channel c leaves each node from GPU c-1 and enters
  // at GPU c, so each 24 GB/s rail carries one ring edge each way, 2·15/16·S/8 in 30 messages, after
  // NCCL's 8.4 µs per call.
  CHECK(cost.allreduce_time(ring, 100e6) == Approx(8.4e-6 + 2.0 * 15 / 16 * 100e6 / 8 / 24e9 + 30 * 6e-6));
  // A broadcast from GPU 0: each channel's ring cut at 0 leaves and enters each node once, S/8 a
  // rail; then the chain's fill. NCCL runs it with LL128 here (eight channels that are not the same
  // ring: its tuner charges Simple 16 hops of 14 µs, LL128 16 of 4), whose lines cross a hop as they
  // land, so the fill is the other hops' latencies only (16 µs), no 512 KiB slices (Simple's
  // would add 13 NVSwitch hops of 1.7 µs and a 21 µs one through a NIC: over 40 µs in all).
  const Lowering bcast = lower(Collective{CollectiveType::broadcast, ring, {100e6}, "ring"}, c);
  const double fill = bcast.at(0).at(0).fill_seconds;
  CHECK(fill > 0);
  CHECK(fill < 20e-6);
  CHECK(cost.broadcast_time(ring, 100e6) == Approx(8.4e-6 + 100e6 / 8 / 24e9 + 6e-6 + fill));
  const MoeModel m(layer_model(16, 1024, 4096));
  RoutingMatrix R(16, 16);
  for (int s = 0; s < 16; ++s) R.mutable_at(s, 3) = 4096, R.mutable_at(s, 9) = 4096;
  CHECK(cost.expert_phase_time(m, R) == Approx(cost.expert_time(m, 16 * 4096)));  // Eq. 1: the busiest worker
  CostModel ninety(c, gpu, {true});
  CHECK(ninety.expert_time(m, 1000) == Approx(2 * 2 * 1000.0 * 1024 * 2048 / (0.9 * 312e12)));
  const auto roof = cost.roofline(m, R);
  CHECK(roof.r_cc == Approx(roof.lat_comp / roof.lat_comm));
  CHECK(roof.p_semi == Approx(roof.p_worker * roof.r_cc / (roof.r_cc + 1)));
  CHECK(roof.p_bar <= roof.p_semi * (1 + 1e-9));  // EP is synchronous: at most the semi-ideal bound
}

TEST_CASE("dynamic shadowing picks the hot experts and none under a uniform load") {
  const Cluster c(test::platform("v100-pcie", 2));  // FasterMoE johnny: 16 GPUs, 6.25 GB/s per node
  const GpuModel gpu(c.spec().gpu(), spec::FP16);
  const CostModel cost(c, gpu);
  const MoeModel m(layer_model(16, 1024, 4096));
  RoutingMatrix uniform(16, 16);
  for (int s = 0; s < 16; ++s)
    for (int e = 0; e < 16; ++e) uniform.mutable_at(s, e) = 512;
  CHECK(dynamic_shadowing(cost, m, uniform).empty());
  CHECK(released_shadowing(1024, uniform, ReleasedCounting::per_expert).empty());
  // Experts 5 and 11 take 3/8 of every source's slots each (B = 49,152 tokens ≫ α·H = 2048:
  // sending the inputs costs more than sending the model, Eq. 9); shadowing only one of them leaves
  // the other's worker as slow as before, shadowing both wins. The other 14 share 1/4
  // (B ≈ 2,340 tokens): shadowing one of them costs a model transfer for a negligible gain.
  // Exactly {5, 11}.
  RoutingMatrix hot(16, 16);
  for (int s = 0; s < 16; ++s)
    for (int e = 0; e < 16; ++e) hot.mutable_at(s, e) = (e == 5 || e == 11) ? 3072 : 146 + (e < 4 ? 1 : 0);
  for (int s = 0; s < 16; ++s) REQUIRE(hot.row_sum(s) == 8192);
  auto chosen = dynamic_shadowing(cost, m, hot);
  std::sort(chosen.begin(), chosen.end());
  CHECK(chosen == std::vector<int>{5, 11});
  // One hot expert: shadowing it alone lowers the maximum, by the latency comparison too.
  RoutingMatrix one(16, 16);
  for (int s = 0; s < 16; ++s)
    for (int e = 0; e < 16; ++e) one.mutable_at(s, e) = e == 7 ? 4096 : 273 + (e < 1 ? 1 : 0);
  for (int s = 0; s < 16; ++s) REQUIRE(one.row_sum(s) == 8192);
  CHECK(dynamic_shadowing(cost, m, one) == std::vector<int>{7});
  // The released rule, by hand with its constants (d = 1024, alpha = 2): comp = 4·2·1024²/11.5e12 =
  // 0.729 µs and send_feature = 1024·4/6.25e9 = 0.655 µs per token, so 3·comp + 4·send_feature =
  // 4.81 µs per token; send_model = 2·2·1024²·4/6.25e9 = 2.68 ms. One hot expert: lat_base =
  // 65,536 · 4.81 µs = 315 ms; shadowing expert 7 leaves B_1 = 4,384: 21.1 + 2.68 = 23.8 ms < 315,
  // taken; then B_2 ≈ 4,384 again: 21.1 + 5.37 = 26.4 ms > 23.8, stop. Exactly {7}.
  CHECK(released_shadowing(1024, one, ReleasedCounting::per_expert) == std::vector<int>{7});
  // Two equally hot experts: shadowing the first leaves the second as hot (49,152 tokens) plus a
  // model transfer, which never beats lat_base: the released rule shadows nothing where Algorithm 1
  // shadows both (Hecate's "strict trigger conditions").
  CHECK(released_shadowing(1024, hot, ReleasedCounting::per_expert).empty());
  // A halving tail (64k, 32k, ..., 1k, then 512s): each step is taken while its saving beats one
  // more model transfer. lat_new in ms: 157.6 + 2.7 = 160.3, 78.8 + 5.4 = 84.2, 39.4 + 8.1 = 47.5,
  // 19.7 + 10.7 = 30.4, 9.9 + 13.4 = 23.3, 4.9 + 16.1 = 21.0 (each below the last: taken), then
  // 2.5 + 18.8 = 21.3 > 21.0: stop. The six hottest.
  RoutingMatrix zipf(16, 16);
  for (int e = 0; e < 16; ++e) zipf.mutable_at(0, e) = e < 8 ? 65536 >> e : 512;  // one source holds the loads
  CHECK(released_shadowing(1024, zipf, ReleasedCounting::per_expert) == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("the artifact's shadowing rule (thu-pacman/FasterMoE transformer.py) on hand cases") {
  // H = 1024, alpha = 2 (d_hidden 2048), as the code has them: alphaHsquared = 2·1024²·4 = 8,388,608;
  // a token's compute 12·alphaHsquared/11.5e12 = 8.7535 µs, its features 4·1024·4/6.25e9 = 2.6214 µs;
  // a shadowed model 2·alphaHsquared/6.25e9 · 2 = 5.369 ms.
  // Expert 0 hot: every source sends it 1,000 tokens and 100 to each other expert. lat_comp =
  // 4,000 · (8.7535 + 2.6214) µs = 45.5 ms. Shadowing expert 0 leaves the others 1,400 each: 12.25 +
  // 5.37 = 17.62 ms, the least; then expert 1 (ties keep their order) leaves 1,500 on experts 2 and
  // 3: 13.13 + 10.74 = 23.87 ms, above it: stop, and shadow expert 0 (45.5 > 17.62).
  RoutingMatrix hot(4, 4);
  for (int s = 0; s < 4; ++s)
    for (int e = 0; e < 4; ++e) hot.mutable_at(s, e) = e == 0 ? 1000 : 100;
  CHECK(prototype_shadowing(1024, 2048, hot) == std::vector<int>{0});
  // Even loads, 250 from each source to each expert: lat_comp = 1,000 · 11.375 µs = 11.4 ms, and the
  // best candidate, 1,250 · 8.7535 µs + 5.37 ms = 16.3 ms, is slower: nothing shadowed.
  RoutingMatrix even(4, 4);
  for (int s = 0; s < 4; ++s)
    for (int e = 0; e < 4; ++e) even.mutable_at(s, e) = 250;
  CHECK(prototype_shadowing(1024, 2048, even).empty());
  // Two equally hot experts, 1,000 tokens from each source each and 10 to the two others: lat_comp =
  // 4,000 · 11.375 µs = 45.5 ms. Shadowing expert 0 adds each worker's own 1,000 of it: 5,000 on
  // worker 1, 43.77 + 5.37 = 49.14 ms, the least so far (where the released rule, each step to beat
  // the last, stops); expert 1 too leaves 2,000 / 1,000 / 2,040 / 2,040: 17.86 + 10.74 = 28.60 ms,
  // less; expert 2 too (2,050 on worker 3: 17.94 + 16.11 = 34.05 ms) is more: stop, shadow 0 and 1.
  RoutingMatrix two(4, 4);
  for (int s = 0; s < 4; ++s)
    for (int e = 0; e < 4; ++e) two.mutable_at(s, e) = e < 2 ? 1000 : 10;
  CHECK(prototype_shadowing(1024, 2048, two) == std::vector<int>{0, 1});
}

// The released function's own decisions (tools/fastermoe_released_policy.py ran laekov/fastmoe's
// global_policy in a gloo group of 4, 8 and 16 ranks over 246 routings): moesim's released rule must
// shadow exactly the experts it shadowed, summing the counts as shipped (per rank) and per expert,
// under the environment constants each row set.
TEST_CASE("the released shadowing rule reproduces every decision of laekov/fastmoe's global_policy") {
  std::ifstream in(std::string(MOESIM_SOURCE_DIR) + "/tests/data/fastermoe-released-policy.tsv");
  REQUIRE(in);
  auto split = [](const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string f; std::getline(ss, f, sep);) out.push_back(f);
    return out;
  };
  auto experts = [&](const std::string& s) {
    std::vector<int> v;
    if (s != "-")
      for (const auto& f : split(s, ',')) v.push_back(std::stoi(f));
    return v;
  };
  int rows = 0, shadowing_rows = 0, as_shipped_rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split(line, '\t');
    REQUIRE(f.size() == 9);
    const int W = std::stoi(f[0]), E = W * std::stoi(f[1]);
    const double d = std::stod(f[2]);
    ReleasedConstants k;
    if (f[3] != "-") k.bw_net = std::stod(f[3]);
    if (f[4] != "-") k.bw_mm = std::stod(f[4]);
    if (f[5] != "-") k.alpha = std::stod(f[5]);
    const auto counts = split(f[6], ',');
    REQUIRE(counts.size() == std::size_t(W) * E);
    RoutingMatrix R(W, E);
    for (int r = 0; r < W; ++r)
      for (int e = 0; e < E; ++e) R.mutable_at(r, e) = std::stoll(counts[std::size_t(r) * E + e]);
    for (const auto& [counting, column] : {std::pair{ReleasedCounting::per_rank, 7}, std::pair{ReleasedCounting::per_expert, 8}}) {
      auto got = released_shadowing(d, R, counting, k);
      std::sort(got.begin(), got.end());
      INFO(fmt::format("row {}: {} ranks, d_model {}, {} counting", rows + 1, W, d,
                       counting == ReleasedCounting::per_rank ? "per-rank" : "per-expert"));
      CHECK(got == experts(f[std::size_t(column)]));
    }
    shadowing_rows += f[8] != "-";
    as_shipped_rows += f[7] != "-";
    ++rows;
  }
  CHECK(rows == 246);
  CHECK(shadowing_rows > rows / 2);  // the table exercises the rule, not only its empty answer
  CHECK(as_shipped_rows > 0);        // ranks sending unequal slots: the only case the shipped sum acts on
}

TEST_CASE("every policy computes each routed token-slot exactly once") {
  const test::SmallSetup t;
  const auto& cluster = t.cluster;
  const auto& model = t.model;
  const auto& gpu = t.gpu;
  const auto routing = t.routing(11);
  const long slots = 2L * 16 * model.tokens_per_gpu() * 2;
  for (const char* name : {"ep", "fastermoe-shadow", "fastermoe-smart", "fastermoe", "zero2", "zero3", "smartmoe", "flexmoe", "hecate"}) {
    INFO(name);
    spec::PolicySpec ps;
    ps.set_name(name);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
    CHECK(test::forward_tokens(g) == slots);
    if (std::string(name).rfind("zero", 0) == 0)  // data parallel experts: tokens never leave their GPU
      for (const auto& op : g.ops())
        if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_to_all)
          CHECK(c->total_bytes() == 0);
    if (std::string(name).find("shadow") != std::string::npos || std::string(name) == "fastermoe")
      CHECK(report.shadowed_experts > 0);
  }
}

TEST_CASE("fastermoe-released: the release's switches, off by default, and its shipped counting") {
  const test::SmallSetup t;
  const auto routing = t.routing(11);
  auto build = [&](const std::string& name, const std::function<void(spec::FasterMoeSpec::Released&)>& set = {}) {
    spec::PolicySpec ps;
    ps.set_name(name);
    if (set) set(*ps.mutable_fastermoe()->mutable_released());
    PolicyReport report;
    auto policy = make_policy(ps);
    policy->validate(t.cluster, t.model, ps);
    // FastMoE sizes its dispatch by counts whatever the gate: EP as FastMoE runs it exchanges them too.
    auto g = policy->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report, name == "ep" ? DispatchSizing::counts : DispatchSizing::fixed});
    std::vector<std::string> labels;
    for (const auto& op : g.ops()) labels.push_back(op.label);
    return std::pair{labels, report.shadowed_experts};
  };
  // Both environment switches off (the release's default): FastMoE, i.e. EP's iteration op by op.
  CHECK(build("fastermoe-released").first == build("ep").first);
  // FMOE_FASTER_SCHEDULE_ENABLE alone: the smart schedule.
  const auto smart = build("fastermoe-smart");
  CHECK(build("fastermoe-released", [](auto& r) { r.set_schedule(true); }).first == smart.first);
  // Both on, counts summed per rank as shipped: every rank sends as many slots, nothing is shadowed;
  // the smart schedule's ops and, in each layer's forward, the decision: the counts all-gathered and
  // read on the host (global_policy runs whatever it decides).
  const auto shipped = build("fastermoe-released", [](auto& r) { r.set_schedule(true), r.set_shadow(true); });
  CHECK(shipped.second == 0);
  std::vector<std::string> without_search;
  int searches = 0;
  for (const auto& label : shipped.first) {
    const bool search = label.find(".fwd.count_allgather") != std::string::npos || label.find(".fwd.host_sync.search") != std::string::npos;
    searches += search;
    if (!search) without_search.push_back(label);
  }
  CHECK(searches == 2 * t.model.layers());
  CHECK(without_search == smart.first);
  // Per expert: the experts the rule picks, layer by layer.
  int expected = 0;
  for (const auto& R : routing)
    expected += int(released_shadowing(t.model.spec().d_model(), R, ReleasedCounting::per_expert).size());
  REQUIRE(expected > 0);
  const auto per_expert = build("fastermoe-released", [](auto& r) {
    r.set_schedule(true), r.set_shadow(true), r.set_counting(spec::FasterMoeSpec::Released::PER_EXPERT);
  });
  CHECK(per_expert.second == expected);
  // Shadowing without the smart schedule is no configuration of the release: refused, by field.
  CHECK_THROWS_WITH(build("fastermoe-released", [](auto& r) { r.set_shadow(true); }),
                    Catch::Contains("policy.fastermoe.released.shadow") && Catch::Contains("schedule"));
  CHECK_THROWS_WITH(build("fastermoe-released", [](auto& r) { r.set_alpha(-1); }),
                    Catch::Contains("policy.fastermoe.released.alpha"));
}

TEST_CASE("the all-to-alls send the routing they were built from, even once the caller changes it") {
  // EP's exchange shares the routing's counts (expert e on GPU e); the smart schedule's steps are
  // views of that matrix. Dispatch from s to GPU e: routing(s, e) token-slots (over every step);
  // the combine: the same, back.
  const test::SmallSetup t({"model.experts=16"});
  const auto routing = t.routing(5);
  const int G = t.cluster.num_gpus(), L = int(routing.size());
  REQUIRE(t.model.experts() == G);
  std::vector<std::vector<std::int32_t>> counts;  // plain copies, which no RoutingMatrix shares
  for (const auto& R : routing) counts.emplace_back(R.counts().begin(), R.counts().end());
  for (const char* name : {"ep", "fastermoe-smart"}) {
    INFO(name);
    spec::PolicySpec ps;
    ps.set_name(name);
    PolicyReport report;
    auto mine = routing;  // the caller's copy, built from and then reused
    const auto g = make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, mine, report});
    for (auto& R : mine) std::fill(R.mutable_counts().begin(), R.mutable_counts().end(), 7);
    std::vector<std::vector<double>> there(std::size_t(L), std::vector<double>(std::size_t(G) * G, 0.0)), back = there;
    for (const auto& op : g.ops()) {
      const auto* c = std::get_if<Collective>(&op.body);
      if (!c || c->type != CollectiveType::all_to_all || op.label.find(".fwd.") == std::string::npos) continue;
      const int l = std::stoi(op.label.substr(1));
      const bool dispatch = op.label.find("a2a_dispatch") != std::string::npos || op.label.find(".fwd.S") != std::string::npos;
      const bool combine = op.label.find("a2a_combine") != std::string::npos || op.label.find(".fwd.R") != std::string::npos;
      for (int i = 0; i < G; ++i)
        for (int j = 0; j < G; ++j) {
          if (dispatch) there[std::size_t(l)][std::size_t(i) * G + j] += c->bytes.at(std::size_t(i), std::size_t(j), std::size_t(G));
          if (combine) back[std::size_t(l)][std::size_t(j) * G + i] += c->bytes.at(std::size_t(i), std::size_t(j), std::size_t(G));
        }
    }
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < G; ++s)
        for (int e = 0; e < G; ++e) {
          const double expect = double(counts[std::size_t(l)][std::size_t(s) * G + e]) * t.model.token_bytes();
          CHECK(there[std::size_t(l)][std::size_t(s) * G + e] == expect);
          CHECK(back[std::size_t(l)][std::size_t(s) * G + e] == expect);
        }
  }
}

TEST_CASE("ZeRO partitions every tensor of a layer: its collectives carry the experts and the dense parameters, nothing is all-reduced, and ZeRO-2 reduces each shard into its owner") {
  // DeepSpeed's ZeRO (the FasterMoE and Pro-Prophet papers' baseline: "every tensor partitioned")
  // keeps whole only parameters below 1e5 elements; a layer's attention and gate go with its experts.
  const test::SmallSetup t;
  const auto routing = t.routing(3);
  const double layer = (t.model.experts() * t.model.expert_params() + t.model.dense_params_per_layer()) * t.model.dtype_bytes();
  for (const char* name : {"zero2", "zero3"}) {
    INFO(name);
    const auto g = iteration_of(name, t, routing);
    std::map<std::string, double> carried;  // label (less its layer) -> bytes
    std::vector<int> roots;                  // ZeRO-2's layer-1 reduces, in turn: the GPU each reduces into
    for (const auto& op : g.ops())
      if (const auto* c = std::get_if<Collective>(&op.body)) {
        carried[op.label.substr(op.label.find('.') + 1)] = c->bytes[0];
        if (op.label == "L1.bwd.grads_reduce" && c->type == CollectiveType::reduce) {
          CHECK(c->in_turn);
          for (const auto& group : c->grouped) roots.push_back(group.front());
        }
      }
    CHECK(carried.at("dense") == 0);  // allreduce.dense: nothing outside the layers in this model
    if (std::string(name) == "zero3") {
      CHECK(carried.at("fwd.experts_allgather") == Approx(layer));  // the backward's: the next case
      CHECK(carried.at("bwd.grads_reduce_scatter") == Approx(layer));
    } else {  // DeepSpeed v0.4.4's stage 2: a reduce of each owner's shard into it, for every GPU
      const int G = t.cluster.num_gpus();
      std::vector<int> owners(static_cast<std::size_t>(G));
      std::iota(owners.begin(), owners.end(), 0);
      CHECK(roots == owners);  // stage2.py's loop: the owners in rank order
      CHECK(carried.at("bwd.grads_reduce") == Approx(layer / G));
      CHECK(carried.at("experts_allgather_updated") == Approx(layer));
    }
  }
}

TEST_CASE("ZeRO-3 gathers again before a layer's backward only the modules DeepSpeed's reuse distance released") {
  // DeepSpeed's stage3_max_reuse_distance, 1e9 elements: a module keeps its gathered parameters
  // if fewer elements run between its forward and its backward. MoE-GPT-S's layer in fp32 (the
  // FasterMoE artifact's ZeRO): experts' first and second GEMMs 16 · 1024 · 2048 = 33,554,432
  // elements each, the attention and gate 4 · 1024² + 1024 · 16 = 4,210,688, the layer 71,319,552.
  const double w = 33'554'432, dense = 4'210'688, layer = 2 * w + dense;
  auto regathered = [](const test::SmallSetup& t) {
    std::map<int, double> bytes;  // layer -> the backward's gather
    const auto routing = t.routing(1);
    const TaskGraph g = iteration_of("zero3", t, routing);
    for (const auto& op : g.ops())
      if (op.label.ends_with(".bwd.experts_allgather")) bytes[std::stoi(op.label.substr(1))] = std::get<Collective>(op.body).bytes[0];
    return bytes;
  };
  const std::vector<std::string> gpt_s = {"model.d_model=1024", "model.d_ffn=2048", "model.experts=16", "model.heads=16", "model.dtype=FP32"};
  auto with = [&](std::string layers) {
    auto v = gpt_s;
    v.push_back(std::move(layers));
    return test::SmallSetup(v);
  };
  const test::SmallSetup twelve = with("model.layers=12");
  REQUIRE(twelve.model.experts() * twelve.model.expert_params() + twelve.model.dense_params_per_layer() == layer);
  const auto bytes = regathered(twelve);
  // Layers 5-11: at most 2 · 6 layers run between, 855.8M elements, and 134.2M more of their own
  // layer for the attention: all kept. Layer 4: 2 · 7 layers, 998.5M: the second GEMM kept, the
  // first (+ 2 · 33.6M) and the attention released. Layers 0-3: 2 · 8 layers or more, all released.
  for (int l = 5; l < 12; ++l) CHECK(bytes.count(l) == 0);
  CHECK(bytes.at(4) == Approx((w + dense) * 4));
  for (int l = 0; l < 4; ++l) CHECK(bytes.at(l) == Approx(layer * 4));
  // The artifact's ZeRO runs one FMoETransformerMLP layer: gathered once, kept for the backward;
  // a layer benchmark (model.moe_layer_only) of twelve layers times each so.
  CHECK(regathered(with("model.layers=1")).empty());
  auto alone = gpt_s;
  alone.insert(alone.end(), {"model.layers=12", "model.moe_layer_only=true"});
  CHECK(regathered(test::SmallSetup(alone)).empty());
}

TEST_CASE("a layer benchmark (model.moe_layer_only) is the iteration less the attention, the all-reduce and the optimizer") {
  // FasterMoE's artifact times FMoETransformerMLP's forward and backward alone (run_iters.py,
  // run_ds.py): every op of the MoE layers stays as it is, nothing of the blocks' rest is left.
  for (const char* name : {"ep", "fastermoe", "zero2", "zero3"}) {
    INFO(name);
    const test::SmallSetup full, alone({"model.moe_layer_only=true"});
    const auto routing = full.routing(2);
    const TaskGraph g = iteration_of(name, full, routing), h = iteration_of(name, alone, routing);
    auto rest = [](const std::string& label) {
      return label.find("attention") != std::string::npos || label == "allreduce.dense" || label == "optimizer" ||
             label.find("allgather_updated") != std::string::npos;  // ZeRO-2's, after the optimizer step
    };
    std::vector<std::string> kept;  // and ZeRO-3's second gathers: a layer benchmark keeps its layer (the next case)
    for (const auto& op : g.ops())
      if (!rest(op.label) && !op.label.ends_with(".bwd.experts_allgather")) kept.push_back(op.label);
    std::vector<std::string> layer_only;
    for (const auto& op : h.ops()) layer_only.push_back(op.label);
    CHECK(layer_only == kept);
    CHECK(kept.size() < g.ops().size());
    double full_bytes = 0, alone_bytes = 0;  // what the layers' collectives carry, the same
    for (const auto& [graph, sum] : {std::pair{&g, &full_bytes}, std::pair{&h, &alone_bytes}})
      for (const auto& op : graph->ops())
        if (const auto* c = std::get_if<Collective>(&op.body); c && !rest(op.label))
          for (std::size_t i = 0; i < c->bytes.size(); ++i) *sum += c->bytes[i];
    if (std::string(name).starts_with("zero"))  // ZeRO's collectives carry the layer's attention too
      CHECK(alone_bytes < full_bytes);
    else
      CHECK(alone_bytes == Approx(full_bytes));
  }
  const test::SmallSetup alone({"model.moe_layer_only=true"});  // the layer's dense parameters: the gate's
  CHECK(alone.model.dense_params_per_layer() == double(alone.model.spec().d_model()) * alone.model.experts());
  CHECK_THROWS_WITH(test::SmallSetup({"model.moe_layer_only=true", "model.vocab=50304"}), Catch::Contains("model.moe_layer_only"));
  CHECK_THROWS_WITH(test::SmallSetup({"model.moe_layer_only=true", "parallel.tp=2"}), Catch::Contains("parallel.tp"));
}

TEST_CASE("ZeRO's expert op on a GPU times each expert's GEMMs on that GPU's own tokens") {
  // Experts with equal token counts are one GEMM entry, repeated: the time must be that of the
  // experts one by one (Σ_e of expert_gemms(R(r, e)), forward and backward).
  const test::SmallSetup t;
  const auto routing = t.routing(3);
  for (const char* name : {"zero2", "zero3"}) {
    INFO(name);
    const auto g = iteration_of(name, t, routing);
    int checked = 0;
    for (const auto& op : g.ops()) {
      const bool fwd = op.label == "L1.fwd.experts", bwd = op.label == "L1.bwd.experts";
      if (!fwd && !bwd) continue;
      const auto& c = std::get<Compute>(op.body);
      double expect = 0;
      std::set<long> sizes;
      for (int e = 0; e < t.model.experts(); ++e)
        if (const long x = long(routing[1].at(op.rank, e)); x > 0) {
          sizes.insert(x);
          for (const Gemm& f : t.model.expert_gemms(x))
            if (fwd)
              expect += t.gpu.gemm_time(f);
            else  // the input's and the weight's gradients
              expect += t.gpu.gemm_time({f.m, f.k, f.n, 1}) + t.gpu.gemm_time({f.k, f.n, f.m, 1});
        }
      CHECK(c.seconds(t.gpu) == Approx(expect).epsilon(1e-12));
      CHECK(c.gemms.size() == sizes.size() * (fwd ? 2 : 4));  // one entry per distinct size
      ++checked;
    }
    CHECK(checked == 2 * t.cluster.num_gpus());
  }
}

TEST_CASE("the smart schedule's per-layer speedup stays under its bound and nears it") {
  // 64 GPUs = 8 DGX-A100 nodes, groups of one node: step 0 stays in the node, steps 1..7 each pair
  // a node with one other node, so no link is shared within a step (uncontended). Large messages
  // and GEMMs (d_model 4096, 16,384 tokens per GPU) keep per-step latency and the efficiency loss
  // of smaller GEMMs small. With groups of 4, or 4,096 tokens, the schedule reaches 79-93% of the
  // bound (measured): more steps, smaller GEMMs, steps sharing NICs.
  auto ex = load_experiment(test::kBaseSpec, {"cluster.nodes=8", "model.experts=64", "gating.uniform={}",
                                           "policy.fastermoe.group_size=8"});
  const Cluster cluster(ex.cluster_spec);
  const MoeModel model(layer_model(64, 4096, 16384));
  const GpuModel gpu(ex.cluster_spec.gpu(), model.dtype());
  SimBackend sim(cluster, gpu);
  const std::vector<RoutingMatrix> routing{generate_routing(ex.spec.gating(), 64, 64, model.tokens_per_gpu(), 2, 1, 0, 0)};
  auto run = [&](const char* name) {
    spec::PolicySpec ps = ex.spec.policy();
    ps.set_name(name);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report, DispatchSizing::counts});  // FastMoE's count exchange, as FasterMoE's
    const auto t = sim.execute(g);
    return std::make_pair(g, t);
  };
  const auto [ep, ep_t] = run("ep");
  const auto [smart, smart_t] = run("fastermoe-smart");
  double c = 0, p = 0;  // measured: one all-to-all, one forward expert pass (slowest GPU)
  for (const auto& op : ep.ops()) {
    if (op.label == "L0.fwd.a2a_dispatch") c = ep_t.end[op.id] - ep_t.start[op.id];
    if (op.label == "L0.fwd.experts") p = std::max(p, ep_t.end[op.id] - ep_t.start[op.id]);
  }
  const double bound = (4 * c + 3 * p) / (std::max(2 * c, p) + std::max(2 * c, 2 * p));
  const double speedup = moe_part(ep, ep_t) / moe_part(smart, smart_t);
  std::cout << fmt::format("smart schedule: c = {:.3f} ms, p = {:.3f} ms, speedup {:.3f}, bound {:.3f} ({:.1f}%)\n",
                           c * 1e3, p * 1e3, speedup, bound, 100 * speedup / bound);
  CHECK(speedup <= bound * 1.001);
  CHECK(speedup >= 0.95 * bound);
}

TEST_CASE("the topology-aware gate keeps each worker's off-node slots under L") {
  const Cluster c(test::platform("dgx-a100", 2));
  spec::GatingSpec uniform;
  uniform.mutable_uniform();
  RoutingMatrix R = generate_routing(uniform, 16, 16, 4096, 2, 3, 0, 0);
  const RoutingMatrix before = R;
  // L = W_net / (M · W_local) · B = 200 / (8 · 300) · 8192 slots = 682.67 (W_local the datasheet's: a test input)
  const double L = c.node_uplink_bandwidth() / (8 * 300e9) * 8192;
  const auto moved = topology_aware_gate(R, c, 4096, L);
  std::int64_t expected = 0;
  for (int s = 0; s < 16; ++s) {
    std::int64_t off = 0, off_before = 0;
    for (int e = 0; e < 16; ++e)
      if (e / 8 != s / 8) off += R.at(s, e), off_before += before.at(s, e);
    CHECK(off == std::int64_t(std::floor(L)));
    CHECK(R.row_sum(s) == before.row_sum(s));
    for (int e = 0; e < 16; ++e) CHECK(R.at(s, e) <= 4096);
    expected += off_before - off;
  }
  CHECK(moved == expected);
  CHECK(moved > 16 * 3000);  // uniform routing sends half of 8192 slots off-node
}

namespace {

// R² of predicted against simulated per-layer times over a sweep of layer configurations.
void check_prediction_accuracy(const std::string& platform, int nodes) {
  const Cluster cluster(test::platform(platform, nodes));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  const CostModel cost(cluster, gpu);
  const int G = cluster.num_gpus();
  std::vector<double> predicted, simulated;
  for (int d_model : {1024, 2048})
    for (int tokens : {1024, 2048, 4096, 8192})
      for (double skew : {0.0, 0.5, 1.0, 1.5})
        for (int per_gpu : {1, 2}) {
          const MoeModel model(layer_model(G * per_gpu, d_model, tokens));
          spec::GatingSpec gating;
          gating.mutable_zipf()->set_exponent(skew);
          const std::vector<RoutingMatrix> routing{
              generate_routing(gating, G, G * per_gpu, tokens, 2, std::uint64_t(d_model + tokens), 0, 0)};
          spec::PolicySpec ps;
          PolicyReport report;
          const auto g = make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
          simulated.push_back(moe_part(g, sim.execute(g)));
          // FasterMoE §1.5: Lat_e2e = 3 Lat_comp + 4 Lat_comm for one MoE layer, fwd + bwd.
          predicted.push_back(3 * cost.expert_phase_time(model, routing[0]) +
                              4 * cost.alltoall_time(cost.dispatch_bytes(model, routing[0])));
        }
  double mean = 0;
  for (double y : simulated) mean += y / double(simulated.size());
  double ss_res = 0, ss_tot = 0;
  for (std::size_t i = 0; i < simulated.size(); ++i) {
    ss_res += (simulated[i] - predicted[i]) * (simulated[i] - predicted[i]);
    ss_tot += (simulated[i] - mean) * (simulated[i] - mean);
  }
  const double r2 = 1 - ss_res / ss_tot;
  std::cout << fmt::format("cost model vs SimGrid on {} × {}: R² = {:.4f} over {} layer configurations\n", nodes,
                           platform, r2, simulated.size());
  CHECK(simulated.size() >= 50);
  CHECK(r2 >= 0.98);
}

}  // namespace

TEST_CASE("the cost model predicts the simulated layer time on johnny") { check_prediction_accuracy("v100-pcie", 2); }
TEST_CASE("the cost model predicts the simulated layer time on trevor") { check_prediction_accuracy("trevor", 16); }

TEST_CASE("a backward pass's GEMMs read the forward's operands transposed, twice its FLOPs") {
  // dA = dC·Bᵀ reads B transposed, dB = Aᵀ·dC reads A transposed: what a framework's autograd runs,
  // so the GPU backend's leading dimensions are d_model and d_ffn, never a token count (an odd
  // count there kept cuBLAS off its fast kernels on an H200: docs/hardware.md).
  const test::SmallSetup t;
  for (const char* name : {"ep", "fastermoe", "hecate"}) {
    INFO(name);
    PolicyReport report;
    const auto g = t.build(test::policy(name), 3, report);
    std::map<std::string, double> fwd_flops, bwd_flops;  // per "L0.experts GPU r"
    int backward_ops = 0;
    for (const auto& op : g.ops())
      test::for_each_compute(op, [&](const Compute& c, int rank) {
        if (c.gemms.empty()) return;
        const bool bwd = op.label.find(".bwd.") != std::string::npos;
        for (std::size_t i = 0; i < c.gemms.size(); ++i) {
          const Gemm& m = c.gemms[i];
          if (bwd) {
            CHECK(m.tb == (i % 2 == 0));  // dA first, then dB
            CHECK(m.ta == (i % 2 == 1));
          } else {
            CHECK_FALSE((m.ta || m.tb));
          }
        }
        if (op.label.find("experts") != std::string::npos || op_name_is_step(op.label)) {
          std::string key = op.label;
          key.replace(key.find(bwd ? ".bwd." : ".fwd."), 5, ".");
          (bwd ? bwd_flops : fwd_flops)[key + " GPU " + std::to_string(rank)] += c.flops();
        }
        backward_ops += bwd;
      });
    CHECK(backward_ops > 0);
    for (const auto& [key, f] : fwd_flops) CHECK(bwd_flops[key] == Approx(2 * f));
  }
}

TEST_CASE("blocking shadowing: the backward's next compute waits for the shadowed experts' reduces") {
  // Pro-Prophet §5.3's FasterMoE ("scheduling is coarse-grained and blocking",
  // policy.fastermoe.blocking); by default the reduces run under the rest of the backward.
  const test::SmallSetup t;
  const auto routing = t.routing(11);
  for (const bool blocking : {false, true}) {
    INFO((blocking ? "blocking" : "in stream order"));
    spec::PolicySpec ps;
    ps.set_name("fastermoe-shadow");
    ps.mutable_fastermoe()->set_blocking(blocking);
    PolicyReport report;
    const auto g = make_policy(ps)->build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
    REQUIRE(report.shadowed_experts > 0);
    int reduces = 0, waited = 0;
    for (const auto& op : g.ops()) {
      if (op.phase != Phase::replica_reduce) continue;
      ++reduces;
      const std::string layer = op.label.substr(0, op.label.find('.'));
      for (const auto& next : g.ops())
        if (next.label == layer + ".bwd.encode") waited += int(std::count(next.deps.begin(), next.deps.end(), op.id));
    }
    REQUIRE(reduces > 0);
    CHECK(waited == (blocking ? reduces : 0));
  }
  spec::PolicySpec smart;
  smart.set_name("fastermoe");
  smart.mutable_fastermoe()->set_blocking(true);
  CHECK_THROWS_WITH(make_policy(smart)->validate(t.cluster, t.model, smart), Catch::Contains("policy.fastermoe.blocking"));
}

TEST_CASE("FasterMoE's shadowing decision gathers every GPU's counts and reads them on the host before the dispatch") {
  // global_policy (laekov/fastmoe fmoe/fastermoe/shadow_policy.py): dist.all_gather of each GPU's
  // local_expert_count (E int64), then .sum(1).cpu(): an all-gather and a host sync a layer.
  const test::SmallSetup t;
  auto ps = test::policy("fastermoe-shadow");
  PolicyReport report;
  const auto g = t.build(ps, 11, report);
  const int G = t.cluster.num_gpus(), E = t.model.experts();
  std::map<std::string, const Op*> by_label;
  for (const auto& op : g.ops()) by_label[op.label] = &op;
  for (int l = 0; l < t.model.layers(); ++l) {
    const std::string L = "L" + std::to_string(l) + ".fwd.";
    REQUIRE(by_label.count(L + "count_allgather"));
    REQUIRE(by_label.count(L + "host_sync.search"));
    const Op& gather = *by_label[L + "count_allgather"];
    const auto& c = std::get<Collective>(gather.body);
    CHECK(c.type == CollectiveType::all_gather);
    CHECK(int(c.group.size()) == G);
    CHECK(c.total_bytes() == Approx(8.0 * E * G));
    const Op& sync = *by_label[L + "host_sync.search"];
    CHECK(std::count(sync.deps.begin(), sync.deps.end(), gather.id) == 1);
    const Op& dispatch = *by_label[L + "a2a_dispatch"];  // waits for the decision, through ready()
    CHECK(std::count(dispatch.deps.begin(), dispatch.deps.end(), sync.id) == 1);
  }
  ps.set_name("fastermoe-smart");  // no shadowing, no decision
  PolicyReport smart_report;
  const auto smart = t.build(ps, 11, smart_report);
  for (const auto& op : smart.ops()) CHECK(op.label.find("count_allgather") == std::string::npos);
}
