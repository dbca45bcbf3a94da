// Parallel layouts (policies/parallel_layout.cpp): EP groups inside data parallelism, pipeline
// stages and their 1F1B schedule, tensor and context parallelism, checked against hand layouts,
// Megatron's order and the 1F1B bubble formula.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>

#include "errors.hpp"
#include "helpers.hpp"
#include "memory_model.hpp"
#include "parallel_layout.hpp"
#include "rank_layout.hpp"
#include "simgrid_backend.hpp"

using namespace moesim;

TEST_CASE("every policy inside EP groups computes each token-slot once, its all-to-alls inside its group") {
  // 2 DGX-A100 nodes as 2 EP groups of 8 GPUs (parallel.ep = 8), then as 4 groups of 4 GPUs, half a
  // node each (parallel.ep = 4): each group runs the policy on its own GPUs' tokens with all 32
  // experts; the dense gradients are all-reduced over the 16 GPUs, GPU j's experts over the GPUs
  // with its place in the other groups, and each GPU's optimizer waits for both.
  const test::SmallSetup t;
  const auto routing = t.routing(11);
  for (const int ep : {8, 4}) {
    const int groups = 16 / ep;
    spec::ParallelSpec parallel;
    parallel.set_ep(std::uint32_t(ep));
    const ParallelLayout layout = parallel_layout(parallel, t.cluster);
    REQUIRE(layout.groups.size() == std::size_t(groups));
    for (int g = 0; g < groups; ++g) {
      CHECK(layout.groups[std::size_t(g)].front() == g * ep);
      CHECK(layout.groups[std::size_t(g)].back() == g * ep + ep - 1);
      CHECK(layout.replica[std::size_t(g)] == g);
      CHECK(layout.stage[std::size_t(g)] == 0);
    }
    const Cluster group(ep_group_cluster(t.cluster.spec(), ep));  // what a group's policy sees
    CHECK(group.num_gpus() == ep);
    CHECK(group.nodes() == std::max(1, ep / 8));
    const long slots = 2L * 16 * t.model.tokens_per_gpu() * 2;
    for (const char* name : {"ep", "fastermoe-shadow", "fastermoe-smart", "fastermoe", "zero2", "zero3", "smartmoe", "flexmoe", "hecate", "eplb"}) {
      INFO(name << ", EP " << ep);
      spec::PolicySpec ps;
      ps.set_name(name);
      PolicyReport report;
      LayoutIteration iteration(t.cluster.spec(), t.model, layout, ps);
      const TaskGraph g = iteration.build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
      CHECK(test::forward_tokens(g) == slots);
      CHECK(report.gpu_load.size() == 16u);
      CHECK(report.gpu_memory.size() == 16u);  // every GPU's, in GPU order
      int dense = 0, experts = 0;
      std::set<OpId> gradients;
      for (const auto& op : g.ops()) {
        const auto* c = std::get_if<Collective>(&op.body);
        if (c && c->type == CollectiveType::all_to_all) {
          CHECK(c->group.size() == std::size_t(ep));  // one group's GPUs
          CHECK(c->group.front() % ep == 0);
        }
        if (op.label == "allreduce.dense") {
          ++dense, gradients.insert(op.id);
          CHECK(c->group.size() == 16u);
        }
        if (op.label.rfind("expert_allreduce", 0) == 0) {
          ++experts, gradients.insert(op.id);
          REQUIRE(c->group.size() == std::size_t(groups));
          CHECK(c->group[1] == c->group[0] + ep);
          CHECK(op.phase == Phase::replica_reduce);
        }
        if (op.label == "optimizer")
          for (OpId gr : gradients) CHECK(std::count(op.deps.begin(), op.deps.end(), gr) == 1);
      }
      CHECK(dense == 1);
      CHECK(experts == ep);
    }
  }
  // Refused: groups that are neither whole nodes nor a divisor of a node, or not consecutive GPUs;
  // stages that do not divide the GPUs.
  spec::ParallelSpec parallel;
  parallel.set_ep(48);  // of 2 NVL72 racks: divides the 144 GPUs, but neither whole racks nor a part of one
  CHECK_THROWS_WITH(parallel_layout(parallel, Cluster(test::platform("gb200-nvl72", 2))),
                    Catch::Contains("whole nodes or a part of one"));
  parallel.set_ep(8);
  parallel.set_order("tp-cp-dp-ep-pp");
  CHECK_THROWS_WITH(parallel_layout(parallel, t.cluster), Catch::Contains("not consecutive"));
  parallel.set_order("tp-ep");
  CHECK_THROWS_AS(parallel_layout(parallel, t.cluster), FieldError);
  parallel.clear_order();
  parallel.set_pp(3);
  CHECK_THROWS_WITH(parallel_layout(parallel, t.cluster), Catch::Contains("do not divide the 16 GPUs"));
}

TEST_CASE("every policy in a 2-stage pipeline of 2 micro-batches computes each token-slot once a micro-batch, and simulates") {
  // 2 DGX-A100 nodes, a stage each (layer 0 on GPUs 0-7, layer 1 on 8-15), every policy per stage;
  // each layer's token-slots once per micro-batch, the stages' sends, and each cell's policy
  // observes its own part of the simulated iteration before deciding the next.
  const test::SmallSetup t;
  spec::ParallelSpec parallel;
  parallel.set_pp(2);
  parallel.set_micro_batches(2);
  const ParallelLayout layout = parallel_layout(parallel, t.cluster);
  const auto routing = t.routing(13, 0, layout.stage_gpus());
  const long slots = 2L * 8 * t.model.tokens_per_gpu() * 2 * 2;  // layers × GPUs a stage × tokens × top-2 × micro-batches
  SimBackend sim(t.cluster, t.gpu);
  for (const char* name : {"ep", "fastermoe-shadow", "fastermoe-smart", "fastermoe", "zero2", "zero3", "smartmoe", "flexmoe", "hecate",
                           "pro-prophet", "tutel", "schemoe", "eplb"}) {
    INFO(name);
    spec::PolicySpec ps;
    ps.set_name(name);
    ps.mutable_eplb()->set_interval(1);  // EPLB places from the first iteration's loads in the second
    LayoutIteration iteration(t.cluster.spec(), t.model, layout, ps);
    for (int it = 0; it < 2; ++it) {  // the second iteration after each cell observed the first
      PolicyReport report;
      const TaskGraph g = iteration.build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
      CHECK(test::forward_tokens(g) == slots);
      int sends = 0, optimizers = 0;
      for (const auto& op : g.ops()) {
        sends += op.phase == Phase::stage_send;
        optimizers += op.label == "optimizer";
        if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_to_all)
          CHECK(std::all_of(c->group.begin(), c->group.end(), [&](int r) { return r / 8 == c->group.front() / 8; }));  // inside a stage
      }
      CHECK(sends == 2 * 2 * 8);  // forward and backward, 2 micro-batches, 8 GPUs
      CHECK(optimizers == 2);
      const Timing timing = sim.execute(g);
      CHECK(timing.makespan() > 0);
      iteration.observe(g, timing);
    }
  }
}

TEST_CASE("1F1B runs each stage's passes in Megatron's order") {
  auto order = [](int stage, int stages, int m) {
    std::string s;
    for (const auto& p : one_f_one_b(stage, stages, m)) s += fmt::format("{}{} ", p.backward ? 'B' : 'F', p.micro_batch);
    return s;
  };
  // Megatron-LM's forward_backward_pipelining_without_interleaving: num_warmup_microbatches =
  // min(pipeline size − rank − 1, m), then 1F1B, then the cool-down backwards.
  CHECK(order(0, 4, 6) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  CHECK(order(2, 4, 6) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  CHECK(order(3, 4, 6) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  CHECK(order(0, 4, 2) == "F0 F1 B0 B1 ");  // fewer micro-batches than stages: all forwards first
  CHECK(order(0, 1, 3) == "F0 B0 F1 B1 F2 B2 ");  // no pipeline: gradient accumulation
  // Interleaved, 2 stages of 2 chunks, 4 micro-batches (micro-batch.chunk): Megatron's
  // forward_backward_pipelining_with_interleaving takes micro-batches in groups of pp through each
  // chunk; stage 0 warms up with 2·(2 − 0 − 1) + (2 − 1)·2 = 4 forwards, stage 1 with 2.
  auto interleaved = [](int stage) {
    std::string s;
    for (const auto& p : one_f_one_b(stage, 2, 4, 2)) s += fmt::format("{}{}.{} ", p.backward ? 'B' : 'F', p.micro_batch, p.chunk);
    return s;
  };
  CHECK(interleaved(0) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  CHECK(interleaved(1) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
}

TEST_CASE("DualPipe and DualPipeV run each stage's passes in DualPipe's order, F&B pairs overlapped") {
  // Stage s of 4, 10 micro-batches: the figure of deepseek-ai/DualPipe's README
  // (images/dualpipev.png, "4 PP ranks (8 PP stages) and 10 micro-batches"), read off device by
  // device with each W (backward for weights) folded into its B: micro-batch.chunk, chunk 0 the V's
  // way down, "F&B" a forward overlapped with a backward.
  auto text = [](const std::vector<PipelinePass>& passes) {
    std::string s;
    for (const auto& p : passes)
      s += fmt::format("{}{}{}.{}", p.overlapped ? "&" : s.empty() ? "" : " ", p.backward ? 'B' : 'F', p.micro_batch, p.chunk);
    return s;
  };
  auto order = [&](int stage) { return text(dualpipe_v(stage, 4, 10)); };
  // Stage 0 and stage 3 (the last, which turns the V: its first forward of chunk 0 in the main step
  // is not overlapped with the backward after it, "we don't overlap these two chunks to further
  // reduce bubble size").
  const std::string stage0 =
      "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F6.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 F7.0&B3.1 F4.1&B0.0 F8.0&B4.1 F5.1&B1.0 "
      "F9.0&B5.1 F6.1&B2.0 B6.1 F7.1&B3.0 B7.1 F8.1&B4.0 B8.1 F9.1&B5.0 B9.1 B6.0 B7.0 B8.0 B9.0";
  const std::string stage3 =
      "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 F4.0 B0.1 F4.1&B0.0 F5.0&B1.1 F5.1&B1.0 F6.0&B2.1 F6.1&B2.0 F7.0&B3.1 "
      "F7.1&B3.0 F8.0&B4.1 F8.1&B4.0 F9.0&B5.1 F9.1&B5.0 B6.1 B6.0 B7.1 B7.0 B8.1 B8.0 B9.1 B9.0";
  CHECK(order(0) == stage0);
  CHECK(order(3) == stage3);
  for (int stage = 0; stage < 4; ++stage) {  // every micro-batch's forward and backward of each chunk once
    std::set<std::tuple<bool, int, int>> seen;
    for (const auto& p : dualpipe_v(stage, 4, 10)) CHECK(seen.insert({p.backward, p.micro_batch, p.chunk}).second);
    CHECK(seen.size() == 40u);
  }
  // DualPipe, 8 stages and 20 micro-batches, 10 each way (chunk 0 the way down, chunk 1 back, each
  // way's micro-batches numbered from 0): the README's figure (images/dualpipe.png, which numbers
  // the way down's), device 0 and the middle device 3, read the same as DualPipeV's stages 0 and 3
  // (the cut-in-half).
  CHECK(text(dualpipe(0, 8, 20)) == stage0);
  CHECK(text(dualpipe(3, 8, 20)) == stage3);
  // The second half mirrors the first, the ways swapped (stage 7 is stage 0 fed from the other end).
  for (int stage = 0; stage < 4; ++stage) {
    auto mirrored = dualpipe(7 - stage, 8, 20);
    for (auto& p : mirrored) p.chunk = 1 - p.chunk;
    CHECK(mirrored == dualpipe(stage, 8, 20));
  }
  // The layout: chunks 2 in a V, at least 2 micro-batches a stage.
  const Cluster cluster(test::platform("dgx-a100", 4));
  spec::ParallelSpec parallel;
  parallel.set_pp(4);
  parallel.set_micro_batches(8);
  parallel.set_schedule("dualpipev");
  const ParallelLayout layout = parallel_layout(parallel, cluster);
  CHECK(layout.chunks == 2);
  CHECK(layout.virtual_stage(0, 1) == 1);
  CHECK(layout.virtual_stage(1, 1) == 6);
  CHECK(layout.stage_of(6) == 1);
  parallel.set_micro_batches(7);
  CHECK_THROWS_WITH(parallel_layout(parallel, cluster), Catch::Contains("at least 2 micro-batches a stage"));
  parallel.set_schedule("gpipe");
  CHECK_THROWS_WITH(parallel_layout(parallel, cluster), Catch::Contains("not a pipeline order"));
}

TEST_CASE("pipeline stages split the blocks as evenly as they go, dense blocks first (DeepSeek-V3: 61 over 16)") {
  auto model = test::model_spec(58, 256, 1024, 16, 8, 128, 128, 4);
  model.set_dense_layers(3);
  const auto stages = pipeline_stages(MoeModel(model), 16);
  REQUIRE(stages.size() == 16u);
  // 61 = 16 · 3 + 13: stages 0-12 have 4 blocks, 13-15 three.
  CHECK(stages[0].dense_layers == 3);
  CHECK(stages[0].layers == 1);
  CHECK(stages[1].first_layer == 1);
  CHECK(stages[1].layers == 4);
  CHECK(stages[12].layers == 4);
  CHECK(stages[13].layers == 3);
  CHECK(stages[15].first_layer == 55);
  CHECK(stages[15].output);
  CHECK(!stages[14].output);
  int layers = 0;
  for (const auto& s : stages) layers += s.layers;
  CHECK(layers == 58);
  const MoeModel first = stage_model(MoeModel(model), stages[0]);
  CHECK(first.layers() == 1);
  CHECK(first.dense_layers() == 3);
  CHECK_THROWS_WITH(pipeline_stages(MoeModel(model), 62), Catch::Contains("at most one stage a block"));
  model.set_layers(2);  // 5 blocks over 4 stages: 2, 1, 1, 1; stage 0 would be the two dense blocks... and stage 1 the third
  CHECK_THROWS_WITH(pipeline_stages(MoeModel(model), 4), Catch::Contains("only dense blocks"));
}

TEST_CASE("a 1F1B pipeline idles (p - 1)/(v·m + p - 1) of each stage's step, and sends each micro-batch's activations") {
  // 4 stages of one DGX-A100 node each, 8 micro-batches; v chunks a stage (1: plain 1F1B; 2:
  // interleaved), one MoE layer a chunk. Every token stays on its GPU (source g sends all to expert
  // g), so a pass is its compute: wide experts (d_ffn 524,288) make a stage's send (256 tokens × 256
  // × 2 B, 10 µs) a hundredth of a layer's forward.
  const int p = 4, m = 8, tokens = 256;
  const Cluster cluster(test::platform("dgx-a100", p));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);  // the backend keeps a reference to it
  SimBackend sim(cluster, gpu);
  for (const int v : {1, 2}) {
    INFO("chunks " << v);
    const MoeModel model(test::model_spec(p * v, 256, 524288, 8, 1, 256, tokens, 4));
    spec::ParallelSpec parallel;
    parallel.set_pp(p);
    parallel.set_micro_batches(m);
    parallel.set_chunks(std::uint32_t(v));
    const ParallelLayout layout = parallel_layout(parallel, cluster);
    REQUIRE(layout.ep == 8);
    REQUIRE(layout.stage_gpus() == 8);
    std::vector<RoutingMatrix> routing;
    for (int l = 0; l < p * v; ++l) {
      RoutingMatrix R(8, 8);
      for (int g = 0; g < 8; ++g) R.mutable_at(g, g) = tokens;
      routing.push_back(R);
    }
    spec::PolicySpec ps;
    ps.set_name("ep");
    PolicyReport report;
    LayoutIteration iteration(cluster.spec(), model, layout, ps);
    const TaskGraph g = iteration.build_iteration({cluster, model, gpu, ps, routing, report});
    int sends = 0;
    for (const auto& op : g.ops())
      if (op.phase == Phase::stage_send) {
        ++sends;
        const auto& t = std::get<Transfer>(op.body);
        CHECK(t.bytes == tokens * 256.0 * 2);
        CHECK(std::abs(t.dst - t.src) % 8 == 0);  // the same place in the next (or previous) virtual stage
      }
    CHECK(sends == 2 * (p * v - 1) * m * 8);
    CHECK(test::forward_tokens(g) == long(p) * v * m * 8 * tokens);  // every layer's token-slots, once per micro-batch
    const Timing timing = sim.execute(g);
    // The pipeline's step: from stage 0's first forward to its last backward. Per stage, on its first
    // GPU: the time its passes' compute occupies it, over the step.
    auto passes = [&](const auto& f) {  // f(rank, start, end) for each part of a pass's compute
      for (const auto& op : g.ops()) {
        if (op.label.find(".mb") == std::string::npos) continue;
        if (const auto* c = std::get_if<Computes>(&op.body))
          for (std::size_t i = 0; i < c->parts(); ++i) f(c->ranks[i], timing.part_start[c->first_part + i], timing.part_end[c->first_part + i]);
        else if (std::holds_alternative<Compute>(op.body))
          f(op.rank, timing.start[op.id], timing.end[op.id]);
      }
    };
    double first = 1e30, last = 0;
    passes([&](int, double start, double end) { first = std::min(first, start), last = std::max(last, end); });
    for (int stage = 0; stage < p; ++stage) {
      INFO("stage " << stage);
      double busy = 0;
      passes([&](int rank, double start, double end) {
        if (rank == 8 * stage) busy += end - start;
      });
      CHECK(1 - busy / (last - first) == Approx(double(p - 1) / (v * m + p - 1)).margin(0.01));
    }
  }
}

TEST_CASE("DualPipe and DualPipeV idle within DualPipe's bubble, (P/2 - 1)(F&B + B), below 1F1B's") {
  // The setup of the 1F1B bubble case above: 4 stages of one DGX-A100 node, 8 micro-batches, one
  // MoE layer a part, every token on its own GPU, so that a pass is its compute and F&B = F + B
  // (nothing to overlap). DualPipe's README gives the bubble as (PP/2 − 1)(F&B + B − 3W) for PP
  // parts; with W in B (W = 0 here) that is (P/2 − 1)(F + 2B). DualPipe on 4 stages runs the model
  // in 4 parts two ways (P = 4); DualPipeV in 8 parts of a V (P = 8). Their orders on idealized
  // passes (each rank's passes back to back, a pass when its input is there) idle between
  // (P/2 − 1)(F + B), when a pair's forward is done before its backward starts, and that formula,
  // when both are done only at the pair's end; the simulator interleaves the pair's ops, so the
  // stage idles in between. 1F1B over the same parts and stages idles (p − 1)(F + B) a part per
  // stage, (p − 1)(2F + 2B) with two: above both.
  const int p = 4, m = 8, tokens = 256;
  const Cluster cluster(test::platform("dgx-a100", p));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  spec::PolicySpec ps;
  ps.set_name("ep");
  // The idle time and step of stage `stage`, and a part's forward and backward compute there.
  auto idle = [&](const std::string& schedule, int parts, int stage, double& forward, double& backward) {
    const MoeModel model(test::model_spec(parts, 256, 524288, 8, 1, 256, tokens, 4));
    std::vector<RoutingMatrix> routing;
    for (int l = 0; l < parts; ++l) {
      RoutingMatrix R(8, 8);
      for (int g = 0; g < 8; ++g) R.mutable_at(g, g) = tokens;
      routing.push_back(R);
    }
    spec::ParallelSpec parallel;
    parallel.set_pp(p);
    parallel.set_micro_batches(m);
    parallel.set_schedule(schedule);
    PolicyReport report;
    LayoutIteration iteration(cluster.spec(), model, parallel_layout(parallel, cluster), ps);
    const TaskGraph g = iteration.build_iteration({cluster, model, gpu, ps, routing, report});
    CHECK(test::forward_tokens(g) == long(parts) * m * 8 * tokens);  // each micro-batch through the model once
    const Timing timing = sim.execute(g);
    double first = 1e30, last = 0, busy = 0;
    const int passes = m * parts / p;  // a stage's forwards (and backwards) of one layer
    forward = backward = 0;
    for (const auto& op : g.ops()) {
      if (op.label.find(".mb") == std::string::npos) continue;
      auto part = [&](int rank, double start, double end) {
        first = std::min(first, start), last = std::max(last, end);
        if (rank != 8 * stage) return;
        busy += end - start;
        (op.label.find("bwd.") != std::string::npos ? backward : forward) += (end - start) / passes;
      };
      if (const auto* c = std::get_if<Computes>(&op.body))
        for (std::size_t i = 0; i < c->parts(); ++i) part(c->ranks[i], timing.part_start[c->first_part + i], timing.part_end[c->first_part + i]);
      else if (std::holds_alternative<Compute>(op.body))
        part(op.rank, timing.start[op.id], timing.end[op.id]);
    }
    return std::pair{last - first - busy, last - first};
  };
  for (const auto& [schedule, P] : {std::pair{"dualpipe", p}, std::pair{"dualpipev", 2 * p}}) {
    for (int stage = 0; stage < p; ++stage) {
      INFO(schedule << ", stage " << stage);
      double F = 0, B = 0, F1 = 0, B1 = 0;
      const auto [bubble, step] = idle(schedule, P, stage, F, B);
      CHECK(B > F);
      CHECK(bubble >= 0.99 * (P / 2 - 1) * (F + B));
      CHECK(bubble <= 1.01 * (P / 2 - 1) * (F + 2 * B));
      const auto [bubble_1f1b, step_1f1b] = idle("1f1b", P, stage, F1, B1);
      CHECK(F1 == Approx(F));
      CHECK(B1 == Approx(B));
      CHECK(bubble_1f1b / step_1f1b == Approx(double(p - 1) / (m + p - 1)).margin(0.01));
      CHECK(bubble < bubble_1f1b);
    }
  }
}

TEST_CASE("DualPipe's twin stages hold the same two parts and reduce their gradients together") {
  // 4 one-node stages, DualPipe: stage s holds part s of the way down and part 3 − s of the way
  // back, so stages 0 and 3 (and 1 and 2) hold the same parameters: one dense all-reduce over both
  // stages' 16 GPUs, and each GPU's experts all-reduced with the same place of the twin.
  const int p = 4;
  const Cluster cluster(test::platform("dgx-a100", p));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  const MoeModel model(test::model_spec(p, 256, 1024, 8, 1, 64, 64, 4));
  spec::ParallelSpec parallel;
  parallel.set_pp(p);
  parallel.set_micro_batches(8);
  parallel.set_schedule("dualpipe");
  const ParallelLayout layout = parallel_layout(parallel, cluster);
  CHECK(layout.model_parts() == p);
  CHECK(layout.virtual_stage(1, 0) == 2 * p - 1);
  CHECK(layout.part_of(2 * p - 1) == p - 1);
  CHECK(layout.pipeline_micro_batches() == 4);
  spec::PolicySpec ps;
  ps.set_name("ep");
  std::vector<RoutingMatrix> routing(std::size_t(p), RoutingMatrix(8, 8));
  for (auto& R : routing)
    for (int g = 0; g < 8; ++g) R.mutable_at(g, (g + 1) % 8) = 64;
  PolicyReport report;
  LayoutIteration iteration(cluster.spec(), model, layout, ps);
  const TaskGraph g = iteration.build_iteration({cluster, model, gpu, ps, routing, report});
  std::vector<std::vector<int>> dense, experts;
  for (const auto& op : g.ops())
    if (const auto* c = std::get_if<Collective>(&op.body); c && c->type == CollectiveType::all_reduce)
      (op.label == "allreduce.dense" ? dense : experts).push_back(c->group);
  REQUIRE(dense.size() == 2u);
  for (int s = 0; s < 2; ++s) {
    std::vector<int> both;
    for (int t : {s, p - 1 - s})
      for (int i = 0; i < 8; ++i) both.push_back(8 * t + i);
    std::sort(both.begin(), both.end());
    CHECK(dense[std::size_t(s)] == both);
  }
  REQUIRE(experts.size() == 16u);  // 2 twin pairs × 8 places
  CHECK(experts[0] == std::vector<int>{0, 24});
  CHECK(experts[9] == std::vector<int>{9, 17});
  CHECK(test::forward_tokens(g) == long(p) * 8 * 8 * 64);  // each micro-batch through each part once
  // Stage 0's GPUs hold two parts' parameters: the memory of a 1F1B stage holding one, and the other.
  parallel.set_schedule("1f1b");
  PolicyReport one;
  LayoutIteration plain(cluster.spec(), model, parallel_layout(parallel, cluster), ps);
  plain.build_iteration({cluster, model, gpu, ps, routing, one});
  CHECK(report.memory.params == Approx(one.memory.params * 2).epsilon(0.05));
}

TEST_CASE("a DualPipe F&B pair runs one pass's all-to-alls while the other computes") {
  // 4 one-node stages, DualPipe, 8 micro-batches; every token goes to the next GPU's expert, so each
  // pass has all-to-alls over NVSwitch. In an F&B pair the backward's communication goes on the
  // other stream (comm2) and its ops are interleaved with the forward's: some backward all-to-all
  // runs while the forward computes on the same GPU, which the 1F1B order never does.
  const int p = 4;
  const Cluster cluster(test::platform("dgx-a100", p));
  const GpuModel gpu(cluster.spec().gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  const MoeModel model(test::model_spec(2 * p, 1024, 4096, 8, 2, 1024, 4096, 4));
  spec::PolicySpec ps;
  ps.set_name("ep");
  std::vector<RoutingMatrix> routing(std::size_t(2 * p), RoutingMatrix(8, 8));
  for (auto& R : routing)
    for (int g = 0; g < 8; ++g) R.mutable_at(g, (g + 1) % 8) = 2 * 4096;
  auto overlapped = [&](const std::string& schedule) {
    spec::ParallelSpec parallel;
    parallel.set_pp(p);
    parallel.set_micro_batches(8);
    parallel.set_schedule(schedule);
    PolicyReport report;
    LayoutIteration iteration(cluster.spec(), model, parallel_layout(parallel, cluster), ps);
    const TaskGraph g = iteration.build_iteration({cluster, model, gpu, ps, routing, report});
    const Timing timing = sim.execute(g);
    int count = 0;  // backward all-to-alls that some forward compute overlaps on one of their GPUs
    for (const auto& a : g.ops()) {
      const auto* c = std::get_if<Collective>(&a.body);
      if (!c || c->type != CollectiveType::all_to_all || a.label.find("bwd.") == std::string::npos) continue;
      bool hit = false;
      for (const auto& f : g.ops()) {
        if (f.label.find("fwd.") == std::string::npos || f.stream != Stream::compute) continue;
        auto during = [&](int rank, double start, double end) {
          hit |= std::find(c->group.begin(), c->group.end(), rank) != c->group.end() && start < timing.end[a.id] && end > timing.start[a.id];
        };
        if (const auto* parts = std::get_if<Computes>(&f.body))
          for (std::size_t i = 0; i < parts->parts(); ++i)
            during(parts->ranks[i], timing.part_start[parts->first_part + i], timing.part_end[parts->first_part + i]);
        else
          during(f.rank, timing.start[f.id], timing.end[f.id]);
      }
      if (hit) {
        CHECK(a.stream == Stream::comm2);
        ++count;
      }
    }
    return count;
  };
  CHECK(overlapped("1f1b") == 0);
  CHECK(overlapped("dualpipe") > 0);
}

TEST_CASE("a pipeline stage keeps the activations of the micro-batches 1F1B has in flight") {
  // Stage s of p holds min(p − s, m) micro-batches' activations: the memory model multiplies by
  // IterationInput::activation_copies, everything else unchanged.
  const test::SmallSetup t;
  const auto routing = t.routing(3);
  spec::PolicySpec ps;
  ps.set_name("ep");
  auto memory = [&](int copies) {
    PolicyReport report;
    IterationInput in{t.cluster, t.model, t.gpu, ps, routing, report};
    in.activation_copies = copies;
    make_policy(ps)->build_iteration(in);
    return report.memory;
  };
  const MemoryUse one = memory(1), three = memory(3);
  CHECK(one.activations > 0);
  CHECK(three.activations == Approx(3 * one.activations));
  CHECK(three.params == one.params);
  CHECK(three.optimizer == one.optimizer);
  // In a layout: a pipeline of 2 one-node stages over one layer each. With 4 micro-batches stage
  // 0's GPUs hold 2 micro-batches' activations, with one micro-batch one; stage 1's one either way.
  // Averaged over a stage's GPUs, a micro-batch's activations of a layer are those of top-k
  // token-slots per token (layer_activation_bytes() is linear in them).
  auto stage_means = [&](int micro_batches) {
    spec::ParallelSpec parallel;
    parallel.set_pp(2);
    parallel.set_micro_batches(std::uint32_t(micro_batches));
    const ParallelLayout layout = parallel_layout(parallel, t.cluster);
    LayoutIteration iteration(t.cluster.spec(), t.model, layout, ps);
    PolicyReport report;
    const auto stage_routing = t.routing(3, 0, layout.stage_gpus());
    iteration.build_iteration({t.cluster, t.model, t.gpu, ps, stage_routing, report});
    REQUIRE(report.gpu_memory.size() == 16u);
    std::pair<double, double> mean{0, 0};
    for (int g = 0; g < 8; ++g) mean.first += report.gpu_memory[std::size_t(g)] / 8, mean.second += report.gpu_memory[std::size_t(g + 8)] / 8;
    return mean;
  };
  const auto [first4, second4] = stage_means(4);
  const auto [first1, second1] = stage_means(1);
  const double tokens = t.model.tokens_per_gpu();
  CHECK(first4 - first1 == Approx(layer_activation_bytes(t.model, tokens, tokens * t.model.top_k())));
  CHECK(second4 == Approx(second1));
}

TEST_CASE("ZeRO-1: each GPU keeps and updates 1/N of the dense optimizer states and 1/D of its experts'") {
  // 2 EP groups of 8 GPUs: the dense states over the 16 GPUs, each expert's over its 2 copies.
  const test::SmallSetup t;
  const auto routing = t.routing(5);
  spec::PolicySpec ps;
  ps.set_name("ep");
  spec::ParallelSpec parallel;
  parallel.set_ep(8);
  parallel.set_distributed_optimizer(true);
  LayoutIteration iteration(t.cluster.spec(), t.model, parallel_layout(parallel, t.cluster), ps);
  PolicyReport report;
  const TaskGraph g = iteration.build_iteration({t.cluster, t.model, t.gpu, ps, routing, report});
  const double experts_per_gpu = double(t.model.layers()) * t.model.experts() / 8;
  const double dense = dense_memory(t.model).optimizer, experts = expert_state(t.model, experts_per_gpu).optimizer;
  CHECK(report.memory.optimizer == Approx(dense / 16 + experts / 2));
  CHECK(report.memory.params == Approx(dense_memory(t.model).params + expert_state(t.model, experts_per_gpu).params));  // kept whole
  // Adam reads and writes its shard only: p, m, v in fp32 and the gradient, and the fp16 copy.
  const double params = (t.model.dense_params_per_layer() * t.model.layers()) / 16 + experts_per_gpu * t.model.expert_params() / 2;
  int steps = 0;
  for (const auto& op : g.ops())
    if (op.label == "optimizer") {
      ++steps;
      test::for_each_compute(op, [&](const Compute& c, int) { CHECK(c.memory_bytes == Approx(params * (6 * 4 + 2 * 2))); });
    }
  CHECK(steps == 2);
}

namespace {

double flops(const std::vector<Gemm>& gemms) {
  double f = 0;
  for (const auto& g : gemms) f += g.flops();
  return f;
}

// Plain EP's iteration of `model` over the cluster's GPUs, each GPU's tokens routed at random.
TaskGraph ep_iteration(const Cluster& cluster, const GpuModel& gpu, const MoeModel& model) {
  std::vector<RoutingMatrix> routing;
  for (int l = 0; l < model.layers(); ++l)
    routing.push_back(generate_routing({}, cluster.num_gpus(), model.experts(), model.tokens_per_gpu(), model.top_k(), 1, 0, l));
  spec::PolicySpec ps;
  ps.set_name("ep");
  PolicyReport report;
  return make_policy(ps)->build_iteration({cluster, model, gpu, ps, routing, report});
}

}  // namespace

TEST_CASE("tensor parallelism: each TP op between an all-gather and a reduce-scatter of its group's tokens, 1/tp of its work") {
  // One DGX-A100 node, TP 2 (4 groups of 2 consecutive GPUs) with sequence parallelism: a group's
  // micro-batch is 2,048 tokens, each GPU routes its 1,024 to the experts.
  auto s = test::model_spec(2, 1024, 4096, 8, 2, 1024, 2048, 16);
  s.set_dense_layers(1);
  s.set_vocab(32000);
  const MoeModel whole(s), model = whole.tensor_parallel(2);
  CHECK(model.tp() == 2);
  CHECK(model.tokens_per_gpu() == 1024);
  CHECK(flops(model.dense_forward_gemms()) == Approx(flops(whole.dense_forward_gemms()) / 2));  // heads split
  CHECK(flops(model.dense_block_gemms()) == Approx(flops(whole.dense_block_gemms()) / 2));      // and d_ffn
  CHECK(flops(model.output_forward_gemms()) == Approx(flops(whole.output_forward_gemms()) / 2));  // and the vocabulary
  CHECK(model.dense_params_per_gpu() == Approx(whole.dense_params_per_gpu() / 2));
  const Cluster cluster(test::platform("dgx-a100", 1));
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  const TaskGraph g = ep_iteration(cluster, gpu, model);
  CHECK(test::forward_tokens(g) == 8L * 1024 * 2 * 2);  // each GPU's own 1,024 tokens, top-2, 2 layers
  const double tensor = 2048.0 * 1024 * 2;  // the group's tokens × d_model × 2 bytes
  int gathers = 0, scatters = 0;
  for (const auto& op : g.ops()) {
    const auto* c = std::get_if<Collective>(&op.body);
    if (op.phase != Phase::tensor_parallel) continue;
    REQUIRE(c);
    REQUIRE(c->group.size() == 2u);
    CHECK(c->group[0] % 2 == 0);
    CHECK(c->group[1] == c->group[0] + 1);
    CHECK(c->total_bytes() == tensor * (op.label.find(".blocks") != std::string::npos ? 2 : 1));  // a dense block: attention and FFN
    (c->type == CollectiveType::all_gather ? gathers : scatters)++;
    if (op.label == "L1.fwd.tp_reduce_scatter.g3")  // the gate waits for its group's reduce-scatter
      for (const auto& next : g.ops())
        if (next.label == "L1.fwd.gate") CHECK(std::count(next.deps.begin(), next.deps.end(), op.id) == 1);
  }
  // Per group: each MoE layer's attention forward and backward, the dense blocks' two passes, the output.
  CHECK(gathers == 4 * (2 * 2 + 2 + 1));
  CHECK(scatters == gathers);
  for (const auto& op : g.ops())
    if (op.label == "allreduce.dense") CHECK(std::get<Collective>(op.body).total_bytes() == Approx(model.dense_params_per_gpu() * 2));
  // Refused: a group across nodes, heads that do not split.
  spec::ParallelSpec parallel;
  parallel.set_tp(3);
  CHECK_THROWS_WITH(parallel_layout(parallel, cluster), Catch::Contains("parallel.tp") || Catch::Contains("inside a node"));
  CHECK_THROWS_WITH(whole.tensor_parallel(32), Catch::Contains("heads"));
}

TEST_CASE("context parallelism: each GPU attends its 1/cp slice of each sequence to the whole, K and V gathered in its CP group") {
  // One DGX-A100 node, TP 2 and CP 2 (Megatron's order tp-cp: CP groups {0,2} {1,3} {4,6} {5,7}),
  // one EP group of 8. A TP × CP group's micro-batch is 2 sequences of 1,024 tokens; each GPU holds
  // 512 tokens of each (its CP slice), routes 1/2 of its TP group's 1,024: 512, and attends its
  // slices' 512 queries a sequence to all 1,024 keys, with 8 of the 16 heads and 2 of the 4 K/V heads.
  auto s = test::model_spec(2, 1024, 4096, 8, 2, 1024, 2048, 16);
  s.set_kv_heads(4);
  s.set_dense_layers(1);
  const MoeModel whole(s), model = whole.tensor_parallel(2).context_parallel(2);
  CHECK(model.cp() == 2);
  CHECK(model.tokens_per_gpu() == 512);
  CHECK(model.group_tokens() == 1024);
  // Every part of the attention a quarter: the tokens by cp, the heads by tp.
  CHECK(flops(model.dense_forward_gemms()) == Approx(flops(whole.dense_forward_gemms()) / 4));
  CHECK(model.dense_forward_gemms()[1].m == 512);  // a slice's queries
  CHECK(model.dense_forward_gemms()[1].n == 1024);  // against the whole sequence's keys
  CHECK(whole.context_parallel(2).tensor_parallel(2).tokens_per_gpu() == 512);  // either order
  CHECK(whole.kv_gathered_bytes() == 0);
  // K and V of both whole sequences (2,048 tokens), 2 K/V heads of 64, 2 bytes.
  const double kv = 2048.0 * 2 * 2 * 64 * 2;
  CHECK(model.kv_gathered_bytes() == kv);

  const Cluster cluster(test::platform("dgx-a100", 1));
  const GpuModel gpu(cluster.spec().gpu(), model.dtype());
  const TaskGraph g = ep_iteration(cluster, gpu, model);
  CHECK(test::forward_tokens(g) == 8L * 512 * 2 * 2);  // each GPU's own 512 tokens, top-2, 2 layers
  std::map<std::string, OpId> by_label;
  for (const auto& op : g.ops()) by_label[op.label] = op.id;
  int gathers = 0, scatters = 0;
  std::set<std::vector<int>> groups;
  for (const auto& op : g.ops()) {
    if (op.phase != Phase::context_parallel) continue;
    const auto& c = std::get<Collective>(op.body);
    REQUIRE(c.group.size() == 2u);
    groups.insert(std::vector<int>(c.group.begin(), c.group.end()));
    CHECK(c.group[0] % 4 < 2);               // the first of a TP × CP block's two TP places
    CHECK(c.group[1] == c.group[0] + 2);     // cp GPUs tp apart
    const bool blocks = op.label.find(".blocks") != std::string::npos;
    CHECK(c.total_bytes() == kv);            // one dense block, or one MoE layer
    (c.type == CollectiveType::all_gather ? gathers : scatters)++;
    // Beside the attention, not after it.
    const std::string attention = blocks ? (op.label.rfind("fwd", 0) == 0 ? "fwd.dense_blocks" : "bwd.dense_blocks")
                                         : op.label.substr(0, op.label.find(".cp_")) + ".attention";
    REQUIRE(by_label.count(attention));
    CHECK(std::count(op.deps.begin(), op.deps.end(), by_label[attention]) == 0);
  }
  // Per CP group (4): the dense block's and 2 MoE layers' attention, a gather forward, a gather and a
  // reduce-scatter backward.
  CHECK(gathers == 4 * 3 * 2);
  CHECK(scatters == 4 * 3);
  // The CP groups are Megatron's for the order tp-cp-dp (tp 2, cp 2, the rest 2).
  const auto megatron = RankLayout("tp-cp-dp", {2, 2, 2}).groups("cp");
  CHECK(groups == std::set<std::vector<int>>(megatron.begin(), megatron.end()));
  const auto& gate = g.ops()[by_label.at("L1.fwd.gate")];
  CHECK(std::count(gate.deps.begin(), gate.deps.end(), by_label.at("L1.fwd.cp_allgather.g3")) == 1);  // the gate waits for it

  // Simulated: a ring's (cp - 1)/cp of the gathered bytes through each GPU's NVLink port (231.6 GB/s
  // a direction on the DGX A100) is the least an exchange takes.
  SimBackend sim(cluster, gpu);
  const Timing timing = sim.execute(g);
  const OpId first = by_label.at("L0.fwd.cp_allgather.g0");
  CHECK(timing.end[first] - timing.start[first] >= kv / 2 / 231.6e9);
  // The attention starts while it runs, after the TP all-gather (which the exchange does not delay).
  CHECK(timing.start[by_label.at("L0.fwd.attention")] < timing.end[first]);
  CHECK(timing.start[first] >= timing.end[by_label.at("L0.fwd.tp_allgather.g0")]);

  // Refused: a CP group across EP groups; cp not dividing seq_len.
  spec::ParallelSpec parallel;
  parallel.set_tp(2);
  parallel.set_cp(8);
  CHECK_THROWS_WITH(parallel_layout(parallel, cluster), Catch::Contains("parallel.cp") || Catch::Contains("inside an EP group"));
  parallel.set_cp(2);
  parallel.set_ep(2);
  CHECK_THROWS_WITH(parallel_layout(parallel, cluster), Catch::Contains("inside an EP group"));
  CHECK_THROWS_WITH(whole.context_parallel(3), Catch::Contains("seq_len"));
}
