// The TaskGraph: the contract between policies and backends (docs/architecture.md §3).
// A DAG of ops for one iteration. Each op runs on a rank's stream; ops on one stream run in the
// order they were added (as on a CUDA stream), ops on different streams may overlap. A backend
// executes the graph and returns a Timing: start and end of every op.
#pragma once
#include <algorithm>
#include <compare>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "count_vector.hpp"

#include "gpu.hpp"

namespace moesim {

using OpId = std::uint32_t;

/// Streams of a rank. Compute ops go on `compute`, communication on `comm`; a policy that overlaps
/// two communications uses `comm2`.
enum class Stream : std::uint8_t { compute = 0, comm = 1, comm2 = 2 };
constexpr int kNumStreams = 3;
const char* stream_name(Stream s);

enum class ComputeKind : std::uint8_t { gemm, grouped_gemm, elementwise, gate, encode, decode, optimizer, compress };
const char* compute_kind_name(ComputeKind k);

/// Work on one GPU: GEMMs (run one after another) plus memory-bound traffic in bytes.
struct Compute {
  ComputeKind kind = ComputeKind::gemm;
  std::vector<Gemm> gemms;
  double memory_bytes = 0;
  long tokens = 0;  // token-slots an expert op computes (0 for other ops)
  double fixed_seconds = 0;  // time given directly (a compressor's modelled throughput)
  /// Its GPU's host waits for it to end before issuing anything more (a host sync: .item(), .cpu()).
  bool blocks_host = false;
  double flops() const;
  /// The kernels its GPU's host launches for it: one per GEMM run, and one for its memory-bound
  /// traffic or fixed time (at least one).
  std::uint64_t kernels() const;
  /// Seconds on one GPU: its GEMMs through the GEMM-efficiency curve plus its memory traffic, each
  /// kernel at least the GPU's floor (GpuModel::kernel_time).
  double seconds(const GpuModel& gpu) const;
  /// Field by field (equal works are one work of an op of parts).
  friend auto operator<=>(const Compute&, const Compute&) = default;
};

/// A host sync (.item(), .cpu()): the host reads what the GPU produced. On the GPU it lasts
/// GpuSpec.host_sync_us (the round trip beyond its launch), and its host issues nothing more until
/// it ends (sim/host_issue.cpp); the CUDA backend waits for it on the host.
Compute host_sync_work(const GpuModel& gpu);

/// One step's work on several GPUs, each its own: every GPU's attention, gate, encode or optimizer
/// step, or FasterMoE's smart schedule's C_j (every GPU's experts on the tokens of one group of
/// workers). One op of G parts where G ops of one part each would cost an op per GPU per step (6.3
/// million an iteration at 1,024 GPUs in the smart schedule). Each part runs on
/// its rank's compute stream exactly as a Compute op of its own would there: after the op's deps
/// and what precedes it on that stream (a Computes op there: that op's part on this rank); what
/// follows it on that stream waits for this part only. The op ends when its last part ends; an op
/// that depends on it waits for every part.
/// Distinct works, shared by the ops of parts that index them: one op's, or a table a policy
/// fills as it emits ops (LayerOps::expert_ops(): FasterMoE's smart schedule at 1,024 GPUs has 6.3
/// million parts of some 731,000 works an op at a time, far fewer in one table).
using Works = std::shared_ptr<const std::vector<Compute>>;
inline Works make_works(std::vector<Compute> works) { return std::make_shared<const std::vector<Compute>>(std::move(works)); }

struct Computes {
  std::vector<int> ranks;                 // part i runs on ranks[i], one part per rank
  Works works;                            // the distinct works: parts with equal work share one
  std::vector<std::uint32_t> work_of;     // by part: its index in `works`
  std::size_t first_part = 0;             // its first part's index among the graph's parts (TaskGraph::add sets it)
  std::size_t parts() const { return ranks.size(); }
  const Compute& work(std::size_t part) const { return (*works)[work_of[part]]; }
};

/// One point-to-point message from the op's rank (`src`) to `dst`.
struct Transfer {
  int src = 0, dst = 0;
  double bytes = 0;
};

enum class CollectiveType : std::uint8_t { all_to_all, all_reduce, broadcast, reduce, all_gather, reduce_scatter };
const char* collective_type_name(CollectiveType t);
inline constexpr CollectiveType kCollectiveTypes[] = {CollectiveType::all_to_all, CollectiveType::all_reduce,
                                                      CollectiveType::all_gather, CollectiveType::reduce_scatter,
                                                      CollectiveType::broadcast,  CollectiveType::reduce};

/// A collective's byte counts, immutable and shared between copies: a layer's forward and backward
/// all-to-alls carry the same matrices (at 4,096 GPUs one is 64 MiB of counts), its dispatch and
/// combine the same matrix, one transposed(), Tutel's pipeline parts it scaled(), and FasterMoE's
/// smart schedule's steps each a group_step() of it.
class CollectiveBytes {
 public:
  CollectiveBytes() = default;
  CollectiveBytes(std::vector<double> values) : values_(std::make_shared<const std::vector<double>>(std::move(values))) {}
  CollectiveBytes(std::initializer_list<double> values) : CollectiveBytes(std::vector<double>(values)) {}
  /// counts × unit (an all-to-all's token-slots × bytes per token): half the memory of doubles.
  CollectiveBytes(CountVector counts, double unit) : CollectiveBytes(std::make_shared<const CountVector>(std::move(counts)), unit) {}
  CollectiveBytes(std::vector<std::int32_t> counts, double unit) : CollectiveBytes(CountVector(std::move(counts)), unit) {}
  /// The same, sharing counts that never change (a routing's, RoutingMatrix::shared_counts()).
  CollectiveBytes(std::shared_ptr<const CountVector> counts, double unit) : counts_(std::move(counts)), unit_(unit) {}
  std::size_t size() const { return counts_ ? counts_->size() : values_ ? values_->size() : 0; }
  bool empty() const { return size() == 0; }
  /// Entry k of the values, row by row (a ring collective's one size: [0]).
  double operator[](std::size_t k) const {
    return transposed_ || group_ ? at(k / side_, k % side_, side_) : scale_ * stored(k);
  }
  /// Entry (i, j) of the matrix, n × n.
  double at(std::size_t i, std::size_t j, std::size_t n) const {
    const std::size_t p = transposed_ ? j : i, q = transposed_ ? i : j;  // as stored
    if (group_) return kept(p, q) ? scale_ * stored(p * group_ + q - to_group(p / group_) * group_) : 0.0;
    return scale_ * stored(p * n + q);
  }
  /// The matrix transposed, sharing these values (an all-to-all's way back).
  CollectiveBytes transposed() const;
  /// The values × factor, sharing these values.
  CollectiveBytes scaled(double factor) const;
  /// Step `step` of FasterMoE's smart schedule (of a matrix not transposed): with the n ranks in
  /// groups of `group` consecutive ones and m = n / group groups, only the entries from group a to
  /// group (a − step) mod m, copied out (n · group values, each row's `group` side by side); the
  /// others read as 0 and for_each() skips them. A step costs n · group entries, not n², read
  /// in one sweep: as a view of the whole matrix each of its rows was a cache miss of its own
  /// (1,024 a step, 12,288 steps an iteration at 1,024 GPUs).
  CollectiveBytes group_step(std::size_t group, std::size_t step) const;
  bool is_group_step() const { return group_ != 0; }
  /// How many distinct rounds d = (j − i) mod n, j ≠ i, the entries it keeps can fall in: n − 1,
  /// or for a group step those from a group to the one it sends to (at most 2 · group − 1).
  std::size_t rounds_possible(std::size_t n) const;
  /// f(i, j, bytes) for each entry of the n × n matrix, in the order the values are stored (the
  /// fast way through a big matrix), until f returns false.
  template <class F>
  [[gnu::always_inline]] void for_each(std::size_t n, const F& f) const {  // inlined, so that f's state stays in registers
    visit_stored([&](const auto* v) __attribute__((always_inline)) { walk(n, v, f); });
  }
  /// The rows of the n × n matrix as stored, in one call: f(row_of, value), where row_of(p) is
  /// {values, first, count}: the `count` values stored row p holds, of columns first, first + 1,
  /// ... (all n from 0, or a group step's `group`), and value(values[k]) one's bytes. Stored row p
  /// holds entries (p, first + k), or (first + k, p) when is_transposed(). For loops that keep
  /// their sums in registers across a row (the simulator's measure()); for_each() visits the same
  /// entries in the same order.
  template <class T>
  struct StoredRow {
    const T* values;
    std::size_t first, count;
  };
  template <class F>
  [[gnu::always_inline]] void with_stored_rows(std::size_t n, const F& f) const {
    visit_stored([&](const auto* v) __attribute__((always_inline)) {
      using T = std::remove_cvref_t<decltype(*v)>;
      const auto value = value_of<T>();
      if (group_)
        f([v, this](std::size_t p) __attribute__((always_inline)) {
            return StoredRow<T>{v + p * group_, to_group(p / group_) * group_, group_};
          }, value);
      else
        f([v, n](std::size_t p) __attribute__((always_inline)) { return StoredRow<T>{v + p * n, 0, n}; }, value);
    });
  }
  bool is_transposed() const { return transposed_; }
  double total() const;
  /// Whether both are the same view of the same values (not merely equal values).
  bool same_view(const CollectiveBytes& o) const {
    return values_ == o.values_ && counts_ == o.counts_ && transposed_ == o.transposed_ && scale_ == o.scale_ &&
           group_ == o.group_ && step_ == o.step_;
  }
  /// A hash of the view: equal for two that are the same_view().
  std::size_t view_hash() const;

 private:
  double stored(std::size_t k) const { return counts_ ? double((*counts_)[k]) * unit_ : (*values_)[k]; }
  // n, for n² values (logic_error naming `what` otherwise).
  std::size_t square_side(const char* what) const;
  // The group that group a sends to in step_ (group_step()).
  std::size_t to_group(std::size_t a) const {
    const std::size_t m = side_ / group_;
    return (a + m - step_) % m;
  }
  bool kept(std::size_t p, std::size_t q) const { return q / group_ == to_group(p / group_); }
  // f(the stored values' data) for whichever storage this matrix has (counts of either width, or doubles).
  template <class F>
  [[gnu::always_inline]] void visit_stored(const F& f) const {
    if (counts_)
      counts_->visit(f);
    else
      f(values_->data());
  }
  // A stored value's bytes: scale · stored(k), to the last bit (walk() and with_stored_rows()).
  template <class T>
  auto value_of() const {
    return [scale = scale_, unit = unit_](T x) __attribute__((always_inline)) {
      if constexpr (std::is_same_v<T, double>) return scale * x;
      else return scale * (double(x) * unit);
    };
  }
  template <class T, class F>
  [[gnu::always_inline]] void walk(std::size_t n, const T* v, const F& f) const {
    const auto value = value_of<T>();
    if (group_) {  // row p: its `group` entries, the columns of the group its group sends to
      for (std::size_t p = 0; p < n; ++p, v += group_)
        for (std::size_t k = 0, q = to_group(p / group_) * group_; k < group_; ++k, ++q)
          if (!(transposed_ ? f(q, p, value(v[k])) : f(p, q, value(v[k])))) return;
    } else if (transposed_) {
      for (std::size_t p = 0; p < n; ++p, v += n)
        for (std::size_t q = 0; q < n; ++q)
          if (!f(q, p, value(v[q]))) return;
    } else {
      for (std::size_t p = 0; p < n; ++p, v += n)
        for (std::size_t q = 0; q < n; ++q)
          if (!f(p, q, value(v[q]))) return;
    }
  }
  std::shared_ptr<const std::vector<double>> values_;
  std::shared_ptr<const CountVector> counts_;
  double unit_ = 1.0;
  bool transposed_ = false;
  std::size_t side_ = 0;  // n, when transposed or a group step
  std::size_t group_ = 0, step_ = 0;  // group_step()'s (group_ 0: every entry)
  double scale_ = 1.0;
};

/// A collective over `group` (ranks). For all-to-all(v), `bytes` is the group.size()² matrix
/// bytes[i·n + j] sent from group[i] to group[j]; for the others it holds one size, the buffer
/// every rank contributes. `algorithm` names the lowering in policies/collectives.
struct Collective {
  CollectiveType type = CollectiveType::all_to_all;
  std::vector<int> group;
  CollectiveBytes bytes;
  std::string algorithm;
  /// An all-to-all's bytes each member of `group` sends (the matrix's rows), kept by
  /// TaskGraph::drop_collective_matrices() when it replaces the matrix by its total.
  std::vector<double> sent = {};
  /// Messages each pair's bytes go as, in equal parts, in the linear all-to-all (each pays its NIC's
  /// per-message overhead): Tutel's pipelined all-to-all sends one per expert slice, ΔE per peer.
  int messages = 1;
  /// Pipe-A2A run as two ops, one per lane (ScheMoE's pipelined layer): 0 sends only the pairs inside
  /// a node, 1 only those between nodes; −1 (default) both, side by side.
  int lane = -1;
  /// DeepEP's hierarchical exchange (collectives/deepep_alltoall.cpp): `network_bytes`, an n × n
  /// matrix, holds what crosses the network between two ranks of the same local index, a token once
  /// per node (empty: every byte of `bytes` between nodes crosses it on its own); `combine`: the way
  /// back, forwarded inside the sender's node first and then over the network (a dispatch goes over
  /// the network first).
  CollectiveBytes network_bytes = {};
  bool combine = false;
  /// Megatron's all-gather dispatcher (collectives/allgather_alltoall.cpp): the bytes of each
  /// rank's tokens, which every other rank gathers whatever the routing (0: not known).
  double gathered = 0;
  /// The share of each member GPU's compute its kernels hold while it runs (DeepEP's normal
  /// kernels: their SMs over the GPU's), which compute overlapping it on that GPU goes without.
  double sm_share = 0;
  /// An NCCL group call (ncclGroupStart ... ncclGroupEnd) of this collective over each of these
  /// groups, root first: NCCL runs them at the same time, sharing the links (Hecate's sparse
  /// collectives, "a series of Broadcast and Reduce operations at the same time": docs/spec/hecate.md
  /// §2.2). Each moves `bytes`; `group` is then every member of them (the op's ranks), and a
  /// lowering is theirs side by side, one lane each (collectives.cpp lower()).
  std::vector<std::vector<int>> grouped = {};
  /// With `grouped`: the groups' collectives are not one group call but NCCL calls one after another
  /// on the op's stream, in the order of `grouped` (FasterMoE's loop of ncclBroadcast over its
  /// shadowed experts, DeepSpeed's loop of dist.reduce to each shard's owner). NCCL ends a call on
  /// each rank when that rank's part of it is done, with no barrier, so a rank goes on to the next
  /// call while the ranks down the chain still forward the last one: the chains' pipeline fills
  /// overlap (collectives.cpp, lower_in_turn()).
  bool in_turn = false;
  double total_bytes() const;
  /// Every byte count × factor (a pipeline's part, a compressed payload): `bytes`, `network_bytes`
  /// and `gathered`.
  void scale_bytes(double factor) {
    bytes = bytes.scaled(factor);
    if (!network_bytes.empty()) network_bytes = network_bytes.scaled(factor);
    gathered *= factor;
  }
};

/// An NCCL group call of `type` over each of `groups` (each its root first), `bytes` each: the
/// Collective whose `grouped` are the groups and whose `group` is every member of them, once, in
/// rank order.
Collective group_call(CollectiveType type, std::vector<std::vector<int>> groups, double bytes, std::string algorithm);
/// The same collectives as calls one after another on one stream (Collective::in_turn), in the
/// order of `groups`.
Collective calls_in_turn(CollectiveType type, std::vector<std::vector<int>> groups, double bytes, std::string algorithm);

/// What an op's time is accounted to: the phases of an iteration. An op's phase follows from its
/// name (kOpNames in taskgraph.cpp, documented op by op in docs/timeline.md), or from its kind where
/// the name is not one of moesim's (a calibration op, a test's).
enum class Phase : std::uint8_t {
  dense_compute,      // attention and dense-FFN GEMMs, the output layer
  routing,            // the gate, the count exchange and the host's wait for the counts
  codec,              // encode and decode: tokens into expert order and back
  expert_compute,     // the experts' GEMMs (and sharded experts' partial sums)
  compression,        // ScheMoE's compression and decompression of the all-to-all's payload
  dispatch,           // the all-to-all that sends tokens to their experts
  combine,            // the all-to-all that brings them back
  sync,               // joins: every rank waits for the others (a step's end)
  replica_broadcast,  // copies of experts sent to the GPUs that hold replicas
  replica_reduce,     // gradients of replicated or sharded experts reduced to their owners
  parameter_gather,   // sharded expert parameters gathered before use (ZeRO-3, Hecate's FSSDP)
  expert_moves,       // experts moved to new GPUs (a rearrangement: parameters and optimizer state)
  dense_allreduce,    // the dense part's gradient all-reduce
  optimizer,          // the optimizer step
  stage_send,         // activations and their gradients sent between pipeline stages
  tensor_parallel,    // tensor parallelism's all-gathers and reduce-scatters around attention and dense FFNs
  context_parallel,   // context parallelism's keys and values gathered for attention, their gradients reduce-scattered
  idle,               // on the critical path, no op runs (waiting; only in critical-path figures)
};
constexpr int kNumPhases = 18;
/// A phase's names, the one table of them: `name` in summary.json, CSVs and results.db; `column` in
/// the console's tables; `title` in figures' keys.
struct PhaseNames {
  const char* name;
  const char* column;
  const char* title;
};
const PhaseNames& phase_names(Phase p);
inline const char* phase_name(Phase p) { return phase_names(p).name; }
/// Whether `label` (an op's name) is one of the names kOpNames lists.
bool known_op_name(const std::string& label);
/// The names kOpNames lists, each with its phase.
std::vector<std::pair<std::string, Phase>> known_op_names();
/// The model layer an op belongs to ("L3.fwd.gate": 3), or -1 (the optimizer, the dense all-reduce).
int op_layer(const std::string& label);

struct Op {
  OpId id = 0;
  int rank = 0;  // the rank it runs on (a collective: every rank of its group)
  Stream stream = Stream::compute;
  std::string label;  // "L3.fwd.a2a_dispatch"
  std::vector<OpId> deps;
  std::variant<Compute, Transfer, Collective, Computes> body;
  Phase phase = Phase::dense_compute;  // set by TaskGraph::add from the label and the body

  /// Ranks whose `stream` this op occupies (a view of the op's own: no copy of a collective's group).
  std::span<const int> ranks() const;
};

/// A node of a graph's schedule: an op (its id) or a part of a Computes op (the graph's size() plus
/// the part's index among the graph's parts, Computes::first_part + i).
using Node = std::uint32_t;
inline constexpr Node kNoNode = ~Node(0);

class TaskGraph {
 public:
  explicit TaskGraph(int num_ranks) : num_ranks_(num_ranks) {}

  int num_ranks() const { return num_ranks_; }
  const std::vector<Op>& ops() const { return ops_; }
  /// Replaces each collective's G × G byte matrix by its total (one entry) and its row sums
  /// (Collective::sent): for a graph kept after it ran, for its timeline (at 2,048 GPUs a matrix is
  /// 33 MB).
  void drop_collective_matrices();
  const Op& op(OpId id) const { return ops_[id]; }
  std::size_t size() const { return ops_.size(); }

  OpId add_compute(int rank, std::string label, Compute c, std::vector<OpId> deps = {});
  OpId add_transfer(Stream stream, std::string label, Transfer t, std::vector<OpId> deps = {});
  OpId add_collective(Stream stream, std::string label, Collective c, std::vector<OpId> deps = {});
  /// Room for n ops before the graph's storage moves (moving 545,000 ops and first touching their new
  /// memory was a tenth of building the 4,096-GPU EP graph); room not used costs only address space.
  void reserve(std::size_t n) { ops_.reserve(n); }
  /// A Computes op, on the compute stream of each of its ranks.
  OpId add_computes(std::string label, Computes c, std::vector<OpId> deps = {});
  /// A copy of another graph's op with every rank it names shifted by `rank_offset`, these deps
  /// (ids in this graph) and this label: an EP group's iteration placed on its GPUs
  /// (parallel_layout.cpp). `swap_comm`: on comm2 what was on comm and the other way round (one of
  /// two passes that run side by side, each on its own communication stream).
  OpId add_shifted(const Op& op, int rank_offset, std::vector<OpId> deps, std::string label, bool swap_comm = false);
  /// Parts of the graph's Computes ops, all together.
  std::size_t num_parts() const { return parts_; }

  /// What each node waits for. `of_op`: per op, its deps and, but for a Computes op, the node before
  /// it on each (rank, stream) it occupies, sorted and unique. `stream_pred`: per part, the node
  /// before it on its rank's compute stream (kNoNode: none); a part also waits for its op's deps.
  /// `op_of`: per part, its op.
  struct Waits {
    std::vector<std::vector<Node>> of_op;
    std::vector<Node> stream_pred;
    std::vector<OpId> op_of;
    Node parts_from = 0;  // the graph's size(): the first part's node
    /// The op a node is or is part of.
    OpId op(Node n) const { return n < parts_from ? OpId(n) : op_of[n - parts_from]; }
    /// Nodes in op order, the parts of one op in rank order: the order an op per part had.
    void order(std::vector<Node>& nodes) const {
      std::sort(nodes.begin(), nodes.end(), [&](Node a, Node b) { return std::pair(op(a), a) < std::pair(op(b), b); });
    }
  };
  Waits waits() const;
  /// For each op, every op it waits for (a part's wait counts as its op's): its deps and the op
  /// before it on each (rank, stream) it occupies. Computed on demand.
  std::vector<std::vector<OpId>> predecessors() const;

 private:
  OpId add(Op op);
  int num_ranks_;
  std::vector<Op> ops_;
  std::size_t parts_ = 0;
};

/// Start and end (seconds from the iteration's start) of every op of a graph.
struct Timing {
  std::vector<double> start, end;  // by op (a Computes op: its first part's start, its last part's end)
  std::vector<double> part_start, part_end;  // by part of the graph's Computes ops
  /// Per rank, the device memory the backend allocated at most (bytes); empty where not measured
  /// (the simulator's figure is the memory model's, PolicyReport::memory).
  std::vector<double> memory_peak;
  double makespan() const;
};

/// Seconds per phase.
struct Breakdown {
  double seconds[kNumPhases] = {};
  double total() const;
  double operator[](Phase p) const { return seconds[int(p)]; }
  Breakdown& operator+=(const Breakdown& o);
  Breakdown scaled(double f) const;
};

/// Where an iteration's time went, in total and per layer.
/// `critical`: the critical path per phase. Walking back from the op that ends last, each step goes
/// to the predecessor that ended last; a gap between the two is `idle`. The phases add up to the
/// makespan exactly. `busy`: per phase, the seconds ops occupy a GPU's streams, summed over the
/// GPUs and divided by their number (streams overlap, so the phases may add up to more than the
/// makespan). Per layer: the same over the ops named "L<layer>."; a gap goes to the layer of the op
/// that waited.
struct Attribution {
  Breakdown critical, busy;
  std::vector<Breakdown> layer_critical, layer_busy;  // [layer]
  Attribution& operator+=(const Attribution& o);
  Attribution scaled(double f) const;
};
Attribution attribute(const TaskGraph& graph, const Timing& timing);

/// Groups of phases that papers time. The token all-to-alls: dispatch and combine (Hecate Fig. 12's "A2A").
double all_to_all_seconds(const Breakdown& b);
/// The sparse collectives of replicating and sharding policies: replica broadcasts and reduces,
/// parameter gathers and expert moves (Hecate Fig. 12's Rearr + SpAG + SpRS).
double sparse_collective_seconds(const Breakdown& b);

}  // namespace moesim
