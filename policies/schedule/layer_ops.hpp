// The primitives a layer schedule composes, offered by the iteration builder (moe_iteration.cpp):
// the layer's exchange as an all-to-all, a GPU's expert work on some sources' tokens, collectives
// and computes on the graph, and the replica transfers the plan's ReplicaSchedule puts under a
// layer's experts. A schedule sees one MoE layer at a time, after ready() on every rank.
#pragma once
#include <boost/container_hash/hash.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost_model.hpp"
#include "moe_iteration.hpp"

namespace moesim {

/// The backward GEMMs of forward GEMMs C[m×n] = A[m×k]·B[k×n]: dA = dC·Bᵀ (m×k, inner n) and
/// dB = Aᵀ·dC (k×n, inner m), reading B and A where the forward left them (transposed).
std::vector<Gemm> backward_gemms(const std::vector<Gemm>& forward);

class LayerOps {
 public:
  LayerOps(const IterationInput& in, const IterationPlan& plan);
  TaskGraph build();  // the iteration's skeleton around the layers (moe_iteration.cpp)

  // --- what a schedule reads
  int gpus() const { return gpus_; }
  int experts() const { return experts_; }
  const MoeModel& model() const { return in_.model; }
  const RoutingMatrix& routing(int l) const { return plan_.layers[std::size_t(l)].routing; }
  /// What the layer's communication waits for: the op of every GPU's last compute before the layer
  /// (its encode, or its host sync after the count exchange; in the backward its decode). A GPU's
  /// own compute after it follows it by the stream's order.
  const std::vector<OpId>& ready() const { return ready_; }
  const std::vector<int>& everyone() const { return everyone_; }
  double token_bytes() const { return token_bytes_; }
  double expert_bytes() const { return expert_bytes_; }  // one expert's parameters
  /// A layer's dense parameters (attention, gate, shared experts) on a GPU, in bytes.
  double layer_dense_bytes() const { return in_.model.layer_dense_params_per_gpu() * in_.model.dtype_bytes(); }
  /// "L{l}.{fwd|bwd}.{what}", the label of a layer's op.
  static std::string label(int l, Pass pass, const std::string& what);

  // --- what a schedule adds
  OpId collective(Stream stream, std::string label, Collective c, std::vector<OpId> deps = {});
  OpId compute(int rank, std::string label, Compute c, std::vector<OpId> deps = {});
  /// Every GPU's compute of one step, work(r) on GPU r, as one op of parts (equal works shared);
  /// with one Compute, the same work on every GPU.
  OpId every_gpu(std::string label, const std::function<Compute(int)>& work, std::vector<OpId> deps = {});
  OpId every_gpu(std::string label, Compute work, std::vector<OpId> deps = {});
  /// One marker op where ops meet, so that the next ops' dependencies stay short.
  OpId join(std::string label, std::vector<OpId> deps);
  /// Layer l's all-to-all: each source's token-slots to the GPU computing them or, transposed,
  /// back; with `step` ≥ 0, the smart schedule's step between groups of `group_size`
  /// (CollectiveBytes::group_step). Shared by the forward and the backward: gradients move along
  /// the forward's routes.
  Collective exchange(int l, bool transpose, int step = -1, int group_size = 0);
  /// Token-slots GPU src sends GPU dst through layer l's all-to-all, [src · G + dst].
  std::vector<double> exchanged(int l) const;
  /// GPU `rank`'s expert op for the tokens of sources [from, to) (with parts > 1, part `part` of
  /// each count): one GEMM pair per expert, after the broadcasts of the replicas it computes with.
  OpId expert_op(int l, int rank, const std::string& label, int from, int to, Pass pass, std::vector<OpId> deps,
                 int part = 0, int parts = 1);
  /// Every GPU's expert work on the tokens of its sources (GPU r: [sources[r].first, .second)), as
  /// expert_op() for each: one Computes op, or an op per GPU where a GPU computes with an expert's
  /// copy (its arrival and its gradient's reduce are the op's: per GPU) or per source chunk, or
  /// ZeRO's.
  std::vector<OpId> expert_ops(int l, const std::string& label, const std::vector<std::pair<int, int>>& sources, Pass pass,
                               const std::vector<OpId>& deps);
  /// The replica transfers the plan's ReplicaSchedule puts under layer l's experts (block-wise:
  /// the next layer's SubTrans1, or the later layer's SubAgg2).
  void under_experts(int l, Pass pass);
  /// A gradient reduction the dense all-reduce waits for (ZeRO's, Tutel's reduce-scatters).
  void add_gradient_reduce(OpId id) { reduces_.push_back(id); }

 private:
  int owner(int l, int e) const { return plan_owner(plan_.layers[std::size_t(l)], e, gpus_); }
  int target(int l, int s, int e) const;
  /// The GPU that every source's tokens for expert e go to in layer l, or −1 where a replica makes
  /// it depend on the source.
  int sole_target(int l, int e) const { return sole_target_[std::size_t(l)][std::size_t(e)]; }
  std::string all_reduce_algorithm(const std::vector<int>& group, double bytes) const;
  /// Tensor parallelism's sequence-parallel collective on each group of tp consecutive GPUs
  /// ("<label>.g<group>"): `tensors` tensors of the group's tokens × d_model gathered (before a
  /// tensor-parallel op) or reduce-scattered (after it), on the comm stream.
  std::vector<OpId> tp_collectives(const std::string& label, CollectiveType type, int tensors, std::vector<OpId> deps);
  /// Context parallelism's exchange beside `blocks` attention blocks, on each group of cp GPUs tp
  /// apart ("<pass>.cp_allgather<what>.g<group>"): every GPU's keys and values gathered (the
  /// forward), gathered again and their gradients reduce-scattered (the backward), on the comm
  /// stream after `deps`, what the attention itself waits for.
  std::vector<OpId> cp_collectives(const std::string& pass, const std::string& what, int blocks, Pass direction,
                                   const std::vector<OpId>& deps);
  std::vector<int> group_of(int l, const Replica& rep, std::size_t from = 0, std::size_t to = SIZE_MAX) const;
  void broadcast_replicas(int l, Stream stream, const std::vector<OpId>& deps = {}, int limit = -1);
  void broadcast_late(int l);
  void regather_replicas(int l);
  std::optional<OpId> replica_collectives(Stream stream, const std::string& label, CollectiveType type,
                                          std::vector<std::vector<int>> groups, const std::vector<int>& experts,
                                          std::vector<OpId> deps);
  std::optional<OpId> copy_arrival(int l, int rank, int e, Pass pass) const;
  void reduce_replicas(int l, Stream stream, int limit = -1);
  void exchange_counts(int l);
  void agree_capacity(int l);
  void search_shadows(int l);
  OpId host_sync(std::string label, OpId after);
  void shared_experts(int l, Pass pass);
  /// GPU r's encode (kind encode) or decode of layer l in a pass: Tutel's sparse kernels (the
  /// routed tokens read and written), or Fairseq's dense one-hot einsums (ExpertKernels::dense_encode).
  Compute codec(int l, int r, ComputeKind kind, Pass pass) const;
  long column_sum(int l, int from, int to, int e);
  Compute expert_work(int l, int rank, int from, int to, Pass pass, std::vector<OpId>& deps, std::vector<int>& copies,
                      int part, int parts);
  /// The expert GEMMs of each size (ascending), each run `count` times.
  std::vector<Gemm> repeated_expert_gemms(const std::vector<std::pair<long, std::uint64_t>>& count_of_size) const;

  const IterationInput& in_;
  const IterationPlan& plan_;
  const LayerSchedule& schedule_;
  const ExpertPlacement placement_;
  const ReplicaOptions& replicas_;
  const CostModel cost_;
  int gpus_, experts_;
  TaskGraph graph_;
  std::vector<int> everyone_;
  std::vector<OpId> ready_;
  std::shared_ptr<const CountVector> peers_;    // exchange_counts()' shared pair matrix
  std::shared_ptr<const CountVector> nothing_;  // join()s' G × G zeros, shared by all
  std::vector<std::vector<int>> target_;  // per layer: [source · E + expert] -> GPU, or [expert] when
                                          // no replica makes it depend on the source (target())
  std::vector<std::vector<int>> sole_target_;  // per layer, by expert: sole_target()
  ExpertLoads computes_;                  // per layer, per GPU: the experts it computes, in order (ZeRO:
                                          // none listed, every expert on its own tokens)
  // Per layer, per GPU: the places in its computes_ list of the experts not `local`, the only ones
  // a step without the GPU's own tokens counts (FasterMoE's smart schedule: every step but C_0,
  // where each GPU's list also holds its copies of every shadowed expert).
  std::vector<std::vector<std::vector<std::uint32_t>>> remote_;
  std::vector<std::map<int, OpId>> bcast_;                  // per layer: expert -> its broadcast
  std::map<std::pair<int, int>, OpId> late_bcast_;          // (layer, expert) -> its calibration broadcast
  std::map<std::pair<int, int>, OpId> regather_;            // (layer, expert) -> its re-materialization
  std::map<std::pair<int, int>, std::vector<OpId>> users_;  // (layer, expert) -> bwd ops on its copies
  std::vector<int> trans_sent_, agg_sent_;  // per layer: replicas whose broadcast / reduce is added
  std::vector<OpId> reduces_;
  std::vector<std::uint64_t> experts_of_size_;  // expert_work()'s count of a GPU's experts by token count, all 0 between calls
  // expert_ops()' works, by pass, shared by every op of parts it emits: a work by its GPU's
  // experts' token counts in order, the only input of expert_work() in that case.
  struct WorkTable {
    std::shared_ptr<std::vector<Compute>> works = std::make_shared<std::vector<Compute>>();
    std::unordered_map<std::vector<long>, std::uint32_t, boost::hash<std::vector<long>>> index;
    std::unordered_map<long, std::uint32_t> single;  // the works of one expert, by its count: most of
                                                     // the smart schedule's 3 million look-ups an iteration
  };
  WorkTable expert_works_[2];
  std::vector<std::pair<int, std::vector<long>>> block_sums_;  // per layer: column_sum()'s block size and sums
  std::map<std::tuple<int, bool, int>, CollectiveBytes> exchanges_;  // (layer, transposed, step) -> bytes
  std::map<std::pair<int, bool>, CollectiveBytes> network_;          // (layer, transposed) -> DeepEP's bytes once per node
  std::string a2a_, ar_;
  double token_bytes_ = 0, scores_bytes_ = 0, permute_bytes_ = 0, expert_bytes_ = 0;
};

}  // namespace moesim
