// Expert parallelism inside data and pipeline parallelism: Megatron-Core's expert-data-parallel
// groups and 1F1B pipeline, DeepSeek-V3's PP 16 × EP 64 × ZeRO-1 DP on 2,048 H800s
// (docs/spec/modern.md). The cluster's G GPUs as pp pipeline stages of G/pp GPUs, each stage's GPUs
// as D = G/(pp·ep) EP groups of ep consecutive GPUs (whole nodes, or a part of one: 8 GPUs of a
// 72-GPU NVL72 rack), in RankLayout order.
//
// A cell is one EP group of one stage (of one of its model chunks, with interleaving). It runs the
// policy on its own GPUs' tokens as if those GPUs were the whole cluster and its blocks the whole
// model: all E experts of each of its layers, E/ep per GPU, its all-to-alls inside the group, its
// own replicas and decisions (a policy instance per cell). Its graph is one micro-batch's forward
// and backward. The merged iteration has a copy of each per micro-batch, in the order 1F1B (or its
// interleaved form) runs them (one_f_one_b()), or DualPipe (dualpipe(), dualpipe_v()) with each
// F&B pair's ops interleaved. A forward of micro-batch k starts when the previous
// (virtual) stage's activations of k have arrived (each GPU sends to the GPU with the same place in
// the next stage), a backward when the next stage's gradients of k have. Tensor parallelism is
// inside a cell (MoeModel::tensor_parallel(), LayerOps). After its last backward, each stage
// reduces its gradients:
//   the dense part's, over the stage's GPUs (data parallelism);
//   each GPU's experts', over the D GPUs of the stage that hold the same experts, one per place in
//   a group (expert data parallelism);
// and each cell's optimizer waits for both. The cells share the cluster's fabric.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "model.hpp"
#include "policy.hpp"

namespace moesim {

/// A pipeline stage's slice of the model's blocks, which run in order: the dense blocks, then the
/// MoE layers.
struct PipelineStage {
  int first_layer = 0;   // its first MoE layer, in the model's numbering of MoE layers
  int layers = 0;        // its MoE layers
  int dense_layers = 0;  // its dense blocks
  /// The vocabulary's ends, the last stage's: the output projection, the loss and the embedding
  /// lookup, and the embedding's parameters (Megatron keeps the first stage's embedding beside
  /// them; moesim counts all of it on the last stage, the one that does the big GEMM).
  bool output = false;
};
/// The model's blocks over pp stages, as evenly as they go, the first (blocks mod pp) stages one
/// block more (DeepSeek-V3's 61 blocks over 16 stages: 4, ..., 4, 3, 3, 3; stage 0 is its 3 dense
/// blocks and 1 MoE layer). FieldError "parallel.pp" where a stage would hold no MoE layer.
std::vector<PipelineStage> pipeline_stages(const MoeModel& model, int pp);
/// The model a stage runs: its blocks as the whole model.
MoeModel stage_model(const MoeModel& model, const PipelineStage& stage);

/// One micro-batch's forward or backward of one of a stage's model chunks.
struct PipelinePass {
  bool backward = false;
  int micro_batch = 0;
  int chunk = 0;
  /// Runs beside the pass before it, each one's compute while the other communicates (DualPipe's
  /// F&B pair: a forward, then this backward).
  bool overlapped = false;
  friend bool operator==(const PipelinePass&, const PipelinePass&) = default;
};
/// The order 1F1B (PipeDream-Flush, Narayanan et al., SC'21; Megatron-LM's
/// forward_backward_pipelining_without_interleaving) runs stage s's passes in, of `stages` stages
/// and m micro-batches: w = min(stages − s − 1, m) forwards to fill the pipeline, then a forward
/// and a backward in turn, then the w backwards left. With v > 1 chunks a stage, Megatron's
/// interleaved order (forward_backward_pipelining_with_interleaving): m·v passes each way, the
/// k-th forward of chunk (k mod p·v) / p on micro-batch (k / p·v)·p + k mod p (the backwards'
/// chunks the other way round), w = min(2·(stages − s − 1) + (v − 1)·stages, m·v) forwards first.
std::vector<PipelinePass> one_f_one_b(int stage, int stages, int micro_batches, int chunks = 1);
/// The order DualPipe (DeepSeek-V3 §3.2.1; deepseek-ai/DualPipe, dualpipe/dualpipe.py,
/// DualPipe.step()) runs stage s of an even number of `stages` in: m ≥ 2·stages micro-batches (even),
/// half of them fed from each end; chunk 0 the way down (part s, micro-batches entering at stage 0),
/// chunk 1 the way back (part stages − 1 − s, entering at the last stage), each micro-batch
/// numbered within its direction. Each F&B pair is a forward and an overlapped backward; every W
/// ("backward for weights", which zero bubble defers) is inside its B.
std::vector<PipelinePass> dualpipe(int stage, int stages, int micro_batches);
/// The order DualPipeV (deepseek-ai/DualPipe, dualpipe/dualpipev.py, DualPipeV.step()) runs stage s
/// of `stages` in, m ≥ 2·stages micro-batches, chunk 0 the V's way down (part s), chunk 1 its way
/// back (part 2·stages − 1 − s): DualPipe's order for stage s of 2·stages with 2m micro-batches
/// (the cut-in-half its README credits to Sea AI Lab), each F&B pair a forward and an overlapped
/// backward, with every W inside its B.
std::vector<PipelinePass> dualpipe_v(int stage, int stages, int micro_batches);

/// Who is where: the EP groups (cells) of a ParallelSpec on a cluster.
struct ParallelLayout {
  int pp = 1, dp = 1, ep = 1, micro_batches = 1, tp = 1, chunks = 1;
  int cp = 1;  // GPUs per context-parallel group: cp GPUs tp apart, inside an EP group (parallel.cp)
  bool distributed_optimizer = false;  // ZeRO-1: Adam's states sharded (IterationInput's shards)
  /// The pipeline's order (parallel.schedule): 1F1B (interleaved with chunks > 1), DualPipe (two
  /// pipelines the opposite ways, each stage holding a part of each: chunks = 2) or DualPipeV (one
  /// pipeline of 2·pp parts in a V: chunks = 2).
  enum class Order { one_f_one_b, dualpipe, dualpipe_v } order = Order::one_f_one_b;
  bool dual() const { return order != Order::one_f_one_b; }
  /// The virtual stages, pp · chunks, each a cell's part of the model. Virtual stage `chunk` · pp +
  /// stage of Megatron's interleaving; in DualPipe's and DualPipeV's V, chunk 1 of stage s is
  /// 2·pp − 1 − s, so that the way back runs from the last stage to the first.
  int virtual_stage(int chunk, int stage) const { return dual() && chunk == 1 ? 2 * pp - 1 - stage : chunk * pp + stage; }
  /// The stage that holds a virtual stage.
  int stage_of(int virtual_stage) const { return dual() && virtual_stage >= pp ? 2 * pp - 1 - virtual_stage : virtual_stage % pp; }
  /// The parts the model's blocks split into: DualPipe's two pipelines each run all of it in pp
  /// parts (two copies of the parameters); otherwise one part a virtual stage.
  int model_parts() const { return order == Order::dualpipe ? pp : pp * chunks; }
  /// The model part of a virtual stage.
  int part_of(int virtual_stage) const { return virtual_stage % model_parts(); }
  /// Micro-batches through each virtual stage: DualPipe's each way, half of them.
  int pipeline_micro_batches() const { return order == Order::dualpipe ? micro_batches / 2 : micro_batches; }
  std::vector<std::vector<int>> groups;  // the EP groups, each its GPUs in place order
  std::vector<int> stage, replica;       // per group: its pipeline stage and DP coordinate
  /// A stage's GPUs: the routing's sources (a GPU's index in its stage is replica · ep + place).
  int stage_gpus() const { return dp * ep; }
};
/// FieldError ("parallel.ep", "parallel.pp", "parallel.tp", "parallel.cp", "parallel.micro_batches",
/// "parallel.order") where tp does not divide a node's GPUs, tp·cp (cp > 1) does not divide ep,
/// ep does not divide a stage's GPUs into whole nodes or parts of one, pp does not divide the GPUs,
/// or the order makes an EP group other than consecutive GPUs. ep 0: one group per stage.
ParallelLayout parallel_layout(const spec::ParallelSpec& parallel, const Cluster& cluster);

/// The cluster one EP group sees: the platform with ep / (GPUs per node) nodes, or one node of its
/// first ep GPUs (first_gpus()) for a group inside a node.
spec::ClusterSpec ep_group_cluster(const spec::ClusterSpec& whole, int ep);

class LayoutIteration {
 public:
  /// `whole`: the cluster's spec. One cell and one micro-batch: the policy's own iteration, nothing
  /// merged.
  LayoutIteration(const spec::ClusterSpec& whole, const MoeModel& model, ParallelLayout layout, const spec::PolicySpec& policy);
  /// The policy's registered name.
  const std::string& policy_name() const { return cells_.front().policy->name(); }
  /// The iteration of every cell, merged into one graph over the whole cluster. `in.routing`: per
  /// MoE layer of the model, the stage_gpus() sources of the stage that holds it. `in.report` gets
  /// the cells' figures (the memory of the GPU that needs the most, summed counts, per GPU loads
  /// and memory in GPU order, per layer the largest balance figures of any group).
  TaskGraph build_iteration(const IterationInput& whole);
  /// Each cell's policy observes its own graph, timed as its last micro-batch ran.
  void observe(const TaskGraph& graph, const Timing& timing);

 private:
  // A cell: one EP group's part of one model chunk (a virtual stage: chunk · pp + its stage).
  struct Cell {
    int stage = 0, replica = 0;  // its virtual stage, its DP coordinate
    int in_flight = 1;           // micro-batches whose activations it holds at most (its order's)
    std::vector<int> gpus;
    std::unique_ptr<Policy> policy;
    TaskGraph last{0};  // its graph of the last iteration: one micro-batch
    // Where its graph's parts start: expert moves [0, fwd), forward [fwd, bwd), backward
    // [bwd, reduce), then the dense all-reduce and what follows it.
    OpId fwd = 0, bwd = 0, reduce = 0;
    std::vector<OpId> merged;  // its op -> the merged graph's (the last micro-batch's copy)
  };
  TaskGraph merge(const IterationInput& in);
  std::size_t cell_at(int virtual_stage, int replica) const { return std::size_t(virtual_stage * layout_.dp + replica); }
  ParallelLayout layout_;
  std::vector<PipelineStage> stages_;  // the virtual stages (pp · chunks)
  std::vector<std::vector<PipelinePass>> orders_;  // per EP group (layout_.groups), its passes in order
  std::vector<MoeModel> stage_models_;
  std::optional<Cluster> cell_cluster_;  // but for one cell and one micro-batch
  std::vector<Cell> cells_;
};

}  // namespace moesim
