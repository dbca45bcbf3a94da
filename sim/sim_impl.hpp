// SimBackend's implementation (simgrid_backend.hpp), one struct whose parts live in a file each,
// by role:
//   platform.cpp     the engine and the cluster as SimGrid zones: hosts, links, routes
//   link_shares.cpp  the groups an aggregated collective step loads (a link and direction each,
//                    in zones of their own) and a step's bytes measured per group
//   step_tasks.cpp   an op as SimGrid activities: a step as a few parallel tasks (or one flow per
//                    transfer), a compute as an exec, its entry and exit markers
//   timed_steps.cpp  the collectives nothing can overlap, whose steps are timers
//   host_issue.cpp   each GPU's host issuing the kernels of its ops in program order
//   executor.cpp     a TaskGraph run: ops issued as their predecessors end, lone computes and
//                    copies as timers
// Only sim/ includes SimGrid.
#pragma once
#include "simgrid_backend.hpp"

#include <fmt/format.h>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "collectives/collectives.hpp"

namespace sg4 = simgrid::s4u;

namespace moesim {

using NetPoint = simgrid::kernel::routing::NetPoint;
using Dir = sg4::LinkInRoute::Direction;

struct SimBackend::Impl {
  const Cluster& cluster;
  const GpuModel& gpu;
  SimOptions options;
  std::unique_ptr<sg4::Engine> engine;
  std::vector<sg4::Host*> hosts;  // by rank
  std::vector<sg4::Host*> ports;  // by node: a host at the node's uplink (see build_node)
  std::vector<std::vector<sg4::Link*>> node_links, nic_links;  // by node, then cluster link / NIC index
  std::vector<sg4::Link*> port_links;                           // by node: its port's (build_node())
  // Aggregated collective steps (aggregated_tasks()): each (link, direction) an aggregated task may
  // load is a group, the route between a pair of hosts of its share's own zone ("agg<share>") that
  // crosses that one link. Node groups are numbered node by node, the fabric's after them.
  struct Groups {
    std::vector<std::array<int, 2>> link;  // by node link: the node's group per direction (backward,
                                           // forward), -1 when left out (link_needed())
    std::vector<std::array<int, 2>> nic;   // by NIC: (down, up)
    std::vector<std::pair<int, int>> of_node;  // a node's groups: (link index, or links + NIC index; direction)
    int fabric = 0;                            // the first fabric group
    std::vector<sg4::Link*> fabric_links;      // by fabric group
    int nodes_per_leaf = 1;
    std::vector<int> up, down;                 // by node: its fabric uplink's group, each way
    std::vector<std::array<int, 2>> between;   // by (source leaf, destination node): the groups between the
                                               // leaves' switches (-1: none)
    std::vector<int> share;                    // by group: the step's share it belongs to (aggregated_tasks())
    std::vector<sg4::Host*> hosts;             // the agg zones' hosts, share after share
    std::vector<std::array<std::size_t, 2>> ends;  // by group: its route's two hosts (indices in `hosts`)
    // The latency a step's tasks pay, that of its longest route, as a class: an index in
    // `latencies`, the distinct route latencies SimGrid gives between two GPUs of a node
    // (intra_class, by local source and destination) or two nodes' ports (inter_class, by fabric
    // hops: 2 or 4). Each share's zone has a route of each class, over a link of its own.
    std::vector<double> latencies;
    std::vector<int> intra_class;
    std::array<int, 5> inter_class{-1, -1, -1, -1, -1};
    std::vector<std::vector<std::array<std::size_t, 2>>> latency_ends;  // by share, by class
    std::size_t count() const { return std::size_t(fabric) + fabric_links.size(); }
    int per_node() const { return int(of_node.size()); }
  } groups;
  std::vector<double> intra_latency;  // by (local source, local destination): the route's latency
  std::vector<double> group_load;     // by group, for aggregated_tasks(): zero but for a step's `loaded`
  std::vector<int> loaded;            // the groups a step loads
  std::vector<std::vector<int>> share_groups;  // by share: its loaded groups, for aggregated_tasks()
  std::vector<int> agg_index;                  // by agg host: its index in the task being built, or -1
  std::vector<double> group_bandwidth, group_latency;        // by group: its link's (timed steps)
  std::vector<double> share_rate, share_latency, share_window;  // by share, for a timed step
  // A step's bytes, gathered in one pass over its transfers (a step of an all-to-all has G² of
  // them) for aggregated_tasks() and latency_bound(), over the step's own ranks and nodes: a step
  // of one EP group among many costs its group's size, not the cluster's (and a cached one its
  // group's memory).
  struct StepBytes {
    std::vector<int> ranks, nodes;        // the step's ranks (its group's, or its transfers' ends) and their nodes, ascending
    std::vector<double> intra;            // inside a node, by (index in `ranks` of the source, local destination)
    std::vector<double> out, in;          // between nodes, by index in `ranks` of the source and of the destination
    // Between nodes, the node pairs that carry bytes, by (index in `nodes`)² ascending: a step of
    // FasterMoE's smart schedule loads N of the N² (a dense matrix cost 16,384 entries a step at
    // 1,024 GPUs, twice: written, then read).
    std::vector<std::uint32_t> pair_at;   // a · |nodes| + b
    std::vector<double> pair_bytes;
    bool any_intra = false, any_inter = false;  // with bytes
    bool crosses = false;                 // a transfer between nodes, even of no bytes
    double nic_latency = 0;               // the longest route to its NIC (and the NIC) of a GPU that sends out
    int intra_pair = -1;                  // the longest route inside a node: local source · g + local destination
    int hops = 0;                         // the longest between nodes: fabric hops (2 or 4)
  } step_bytes;
  // measure()'s sums by rank and node of the whole cluster, zero between steps (a step clears the
  // entries of its own ranks and nodes), and its marks of the ranks and nodes seen.
  std::vector<double> sum_intra, sum_out, sum_in, sum_pairs;
  std::vector<char> rank_seen, node_seen;
  std::vector<std::uint32_t> touched;  // the entries of sum_pairs a step made non-zero (a · N + b)
  std::vector<int> node_index;         // by node: its index in the step's `nodes`
  // By rank: node and local index; by local GPU: its NIC's per-message overhead in bytes, the
  // latency of its route to the NIC and of the NIC, the NIC's bandwidth (the divisions and lookups
  // of Cluster's accessors, done once: they were a fifth of a large step's cost).
  std::vector<int> node_of_rank, local_of_rank;
  std::vector<double> overhead_of_local, nic_latency_of_local, nic_bandwidth_of_local;
  // What decides a step's StepBytes, and so its time: the view of its matrix, its group, rounds,
  // serial rounds, messages and PXN (the caches below are keyed by it, for one execute()).
  struct StepView {
    CollectiveBytes bytes;          // held, so that its values outlive the entry
    const std::vector<int>* group;  // the op's, alive for the execute()
    int rounds, serial_rounds, messages;
    bool p2p;
    StepView(const Step& step, const Collective& c)
        : bytes(c.bytes), group(&c.group), rounds(step.rounds), serial_rounds(step.serial_rounds), messages(step.messages),
          p2p(step.p2p) {}
    bool operator==(const StepView& o) const {
      return bytes.same_view(o.bytes) && rounds == o.rounds && serial_rounds == o.serial_rounds && messages == o.messages &&
             p2p == o.p2p && (group == o.group || *group == *o.group);
    }
  };
  struct StepViewHash {
    std::size_t operator()(const StepView& v) const {
      return v.bytes.view_hash() ^ (std::size_t(v.rounds) << 40) ^ (std::size_t(v.messages) << 20) ^ v.group->size();
    }
  };
  // measure(), but an unlisted step (an all-to-all's whole matrix) is measured once per execute()
  // for each view of each matrix: a layer's forward and backward all-to-alls send the same bytes.
  // Not a group step's (FasterMoE's smart schedule): n · group entries cost less to read again
  // than its copy of the StepBytes (G · g + N² doubles; 12,288 steps an iteration at 1,024 GPUs).
  std::unordered_map<StepView, StepBytes, StepViewHash> measured;  // this execute()'s
  // What issue() needs of a timed step: its seconds alone (aggregated_tasks(s, &seconds)) and
  // whether its chain of send/recv rounds can outlast its bytes (latency_bound()), kept by its
  // view; its StepBytes are not (25 KB a group step, 3 MB a whole matrix at 4,096 GPUs). A layer's
  // forward and backward send the same matrices: each of the 6,144 distinct group steps an
  // iteration of FasterMoE's smart schedule at 1,024 GPUs (8,192 entries each, then its links'
  // loads) was measured twice, a quarter of the simulation.
  struct TimedStep {
    double seconds;
    bool latency_bound;
  };
  std::unordered_map<StepView, TimedStep, StepViewHash> timed_steps;  // this execute()'s
  // Ops are issued when their predecessors have finished, not all at once: SimGrid keeps every
  // started-or-vetoed activity of the maestro in one list that each completion walks
  // (ExecImpl::post), so issuing a whole iteration up front made the run quadratic in its
  // activities. An op's completion (its exit activity's) records its end, releases its
  // activities (a collective step's byte matrix is G² doubles) and counts down its successors.
  // The parts of a Computes op are nodes of their own (TaskGraph::Waits), each counted down by
  // its op's deps (as one) and the node before it on its stream.
  struct Run {
    const TaskGraph* graph = nullptr;
    Node parts_from = 0;                                     // graph->size(): nodes from here are parts
    std::vector<std::vector<Node>> successors;               // per op, the nodes waiting for it
    std::vector<Node> part_pred, part_next;                  // per part, the nodes before and after it on its stream
    std::vector<int> waiting;                                // per op, its predecessors not finished (a Computes op: its deps)
    std::vector<std::uint32_t> part_waiting;                 // per part, its predecessors not resolved (its op's deps count as one)
    std::vector<OpId> op_of;                                 // per part, its op
    std::vector<int> rank_of;                                // per part, its rank
    enum class Part : std::uint8_t { waiting, chained, exec, done };
    std::vector<Part> part_state;
    std::vector<int> open;                                   // per op, its parts neither chained nor done
    std::vector<simgrid::kernel::timer::Timer*> op_timer;    // per op: a Computes op's end, all its parts' ends known
    // Per table of works (Computes::works), each work's seconds once a part needs them (NaN before).
    std::unordered_map<const std::vector<Compute>*, std::vector<double>> work_seconds;
    std::vector<std::vector<double>*> op_work_seconds;  // per op: its table's entry in work_seconds (null: not looked up yet)
    std::unordered_map<Node, simgrid::kernel::timer::Timer*> boundary;  // a chained part's end, for the op after it on its stream
    std::vector<std::vector<sg4::ActivityPtr>> activities;   // per op, until it ends
    std::unordered_map<const sg4::Activity*, Node> exit_of;  // exit activity -> its node
    Timing timing;                                           // absolute times until the end
    std::vector<char> ended;
    std::vector<sg4::ActivityPtr> deferred;                  // the last exit, released at the next
    // A collective whose kernels hold SMs of each member GPU (Collective::sm_share): per op, its
    // ranks and the SMs it holds on each, from the op's issue to its end (reserve_sms()).
    std::unordered_map<OpId, std::vector<std::pair<int, int>>> reserved;
    // A collective step's copies (memory-bound kernels, one a GPU): started when the step starts,
    // each alone on its GPU as a timer (Alone), or as an exec where its GPU computes something
    // else; the step's gate opens when the last one ends (start_copies()). 2,048 copy execs a
    // 2D-hierarchical all-to-all at 1,024 GPUs were nine tenths of Tutel's simulation.
    struct Copies {
      OpId op = 0;
      std::vector<std::pair<int, double>> copies;  // rank, seconds alone
      std::size_t left = 0;                         // not ended
      sg4::ExecPtr gate;
    };
    std::deque<Copies> copies;
    // A step's start activity -> the copies of the steps it starts (each lane's first step starts
    // at the collective's start marker).
    std::unordered_map<const sg4::Activity*, std::vector<std::size_t>> copies_at;
    std::unordered_map<const sg4::Activity*, std::size_t> copy_execs;   // a copy that runs as an exec -> its copies
  };
  // Which network ops (collectives and transfers) may overlap which (timed_steps.cpp): bitsets over
  // them, per network op, of those before it and after it; and those that have ended. Its arrays
  // are kept from one execute() to the next (words = 0 between them): taken afresh from the OS, the
  // 60 MB of FasterMoE's smart schedule at 1,024 GPUs cost 0.13 s of page faults an iteration.
  struct Overlaps {
    std::vector<std::int64_t> index;  // by op: its network op number, or -1
    std::size_t words = 0;            // 64-bit words a bitset (0: no analysis, nothing timed)
    std::vector<std::uint64_t> before, after, ended;
    // By network op x: the words of its bitsets where some op is neither before nor after it,
    // open_words[open_from[x] .. open_from[x + 1]), the only ones alone() reads (a collective
    // over every rank is ordered with every other: at 1,024 GPUs a bitset is 200 words).
    std::vector<std::uint32_t> open_from, open_words;
    // By network op: the first and last node it touches, and whether its nodes span leaf switches
    // (then it may load the links between the switches, which other such ops may share).
    std::vector<int> first_node, last_node;
    std::vector<char> spans_leaves;
    // network_overlaps()'s sweeps: by op, the network ops it waits for, with itself and without.
    std::vector<std::uint64_t> full, in;
    /// Every network op that may overlap network op `id` has ended or shares no link with it (its
    /// nodes apart, and not both spanning leaf switches): its steps can be timed.
    bool alone(OpId id) const;
    void end(OpId id);
  };
  Overlaps overlaps;
  Run* run = nullptr;
  // GPU compute that runs alone is not an activity of the solver. A compute op issued on a GPU
  // that runs nothing else (no exec that computes: a compute or a collective's copy) ends
  // `seconds` later whatever the network does, exactly as an exec alone on its host would; it is a
  // SimGrid timer, which costs no variable in the fair-bottleneck system (re-solved whole at every
  // event) and no update at each event. Should an exec start on that GPU while it runs, the op
  // becomes an exec of its remaining flops at that instant (started()), and the two share the GPU
  // as they would have from the start. At 1,024 GPUs an iteration's ~124,000 compute ops made
  // ~1,000 variables live through its ~22,000 events.
  struct Alone {
    simgrid::kernel::timer::Timer* timer = nullptr;  // null: nothing runs alone on this GPU
    OpId op = 0;
    double end = 0;
    std::int64_t copies = -1;  // a collective's copy (Run::copies' index), not op `op` itself
  };
  std::vector<Alone> alone;                              // by rank
  // The parts of Computes ops go further: a part whose GPU runs nothing else is *chained*, its start
  // and end computed when its predecessors are known (start: the later of now and the end of the
  // part before it on its stream, itself chained; end: start + its seconds), with no event at all.
  // A rank's chained parts not yet over wait in its chain, in stream order. An op whose parts all
  // are chained or done ends by one timer, at its last part's end; a part followed on its stream by
  // an op that is not a part releases that op by a timer at its end. Should an exec that computes
  // start on a GPU whose chain holds a part not over, the part running becomes an exec of its
  // remaining flops (as an Alone op would) and the parts after it wait again, as if never chained.
  std::vector<std::deque<Node>> chain;                   // by rank
  std::vector<int> loading;                              // by rank: execs that compute (or SMs held), running
  std::vector<int> sms_held;                             // by rank: SMs that communication kernels hold
  std::unordered_map<const sg4::Activity*, int> loads;   // such an exec -> its rank, until it ends
  // A step's start activity -> the gates of its min_seconds, each with its delay (issue()).
  std::unordered_map<const sg4::Activity*, std::vector<std::pair<sg4::ExecPtr, double>>> floors;
  // The hosts that launch the kernels (host_issue.cpp), when GpuModel::launch_seconds() > 0: each
  // GPU's host issues the nodes it takes part in (an op, or its part of a Computes op) one after
  // another in the graph's order (the program's), each taking its kernels × the launch time, and a
  // node starts no earlier than the last of its hosts issued it. A host that issued a node that
  // blocks it (Compute::blocks_host: a host sync) issues nothing more until that node ends. A
  // node ready before its hosts issued it waits (parked) and goes on when they do.
  // The ops every rank takes part in (a Computes op of a part per rank in rank order, a collective
  // over all: 6.4 million parts and 12.6 million collective calls an iteration of FasterMoE's smart
  // schedule at 1,024 GPUs) are listed once, and a host goes through a run of them at once: its
  // clock before shared op x of such a run is the run's offset plus prefix[x]. Only the shared
  // parts that launch differently from one GPU to another, or block the host, are stops, issued one
  // by one as a host's own nodes are.
  struct Hosts {
    bool on = false, starting = false;
    struct Shared {
      OpId op;
      Node first;                 // its first part (the part of rank r: first + r), or the op
      std::uint32_t kernels = 1;  // of each part: its largest work's (0: some parts block, some not; each looked up)
      bool blocks = false;        // each part blocks its host
      bool parts = false;         // a Computes op
      bool stop() const { return parts && (kernels == 0 || blocks); }
    };
    std::vector<Shared> shared;             // in op order
    std::vector<double> prefix;             // by shared index: the launches of the runs' ops before it
    std::vector<std::uint32_t> next_stop;   // by shared index x: the first stop at or after x (or the end)
    std::vector<std::int32_t> shared_of;    // by op: its index in `shared`, or -1 (not shared, or a stop)
    struct Segment {
      std::uint32_t x;  // from shared op x on
      double offset;    // the host's clock before shared op y is offset + prefix[y]
    };
    std::vector<std::vector<Segment>> segments;  // by rank, ascending
    std::vector<std::size_t> segment_hint;       // by rank: the segment clock_before() found last
    std::vector<std::uint32_t> shared_next;      // by rank: the next shared op its host issues
    std::uint32_t min_next = 0;                  // the least of shared_next: the shared ops before it are issued by all
    std::uint32_t latest_from = 0;               // the latest start of any host's last segment
    double latest_offset = 0;                    // the largest offset of the hosts' last segments
    std::vector<OpId> parked_ops;                // shared ops ready before every host issued them
    std::vector<std::vector<Node>> order;   // by rank: its other nodes, in op order
    std::vector<std::size_t> next;          // by rank: the index in `order` of the next to issue
    std::vector<std::vector<Node>> parked;  // by rank: its parts ready before its host issued them
    std::vector<int> unblocked;             // hosts unblocked at this instant, to go on together
    std::vector<double> clock;              // by rank: when its host issued the last one
    std::vector<Node> blocked;              // by rank: the node its host waits for (kNoNode: none)
    std::vector<std::uint32_t> left;        // by op not shared: its ranks whose hosts have not issued it
    std::vector<double> at;                 // by op not shared: when the last of its hosts issued it. A
                                            // stop's or own part's is its Timing::part_start until it is
                                            // scheduled (NaN: not issued)
  } cpu;

  // platform.cpp
  Impl(const Cluster& c, const GpuModel& g, SimOptions o);
  void build_links(sg4::NetZone* world, bool fabric);
  std::pair<NetPoint*, NetPoint*> build_node(const sg4::NetZone* parent, bool fabric, int n);
  void build_platform(sg4::NetZone* world);

  // link_shares.cpp
  int fabric_hops(int a, int b) const;
  std::vector<std::array<bool, 2>> links_needed() const;
  void build_groups(const sg4::NetZone* world);
  void tabulate();
  const StepBytes& measure(const Step& step);
  const StepBytes& measure_once(const Step& step);
  /// A timed step's seconds alone and latency_bound(), measured once per StepView.
  TimedStep timed_step(const Step& step);

  // step_tasks.cpp
  Transfer chain_route(const Step& step) const;
  /// The step's shares as parallel tasks; with `alone`, no task: *alone is set to the seconds the
  /// tasks would take with nothing else on their links (timed steps, network_overlaps()).
  std::vector<sg4::ExecPtr> aggregated_tasks(const StepBytes& s, double* alone = nullptr);
  /// A (link, direction) group's SimGrid link (aggregated_tasks()).
  sg4::Link* group_link(int q) const;
  sg4::ExecPtr transfer_task(const Transfer& t, double scale, bool probe = false, int messages = 1, bool p2p = false);
  bool latency_bound(const Step& step, const StepBytes& s) const;
  sg4::ExecPtr marker(int rank);
  sg4::ExecPtr issue(const Op& op, std::vector<sg4::ActivityPtr>& all);
  void reserve_sms(OpId id, const Collective& coll);
  void hold_sms(int rank, int k);

  // host_issue.cpp
  void start_hosts(const TaskGraph& graph, double t0);
  struct Issue {
    std::uint64_t kernels = 1;  // it launches
    bool blocks = false;        // its host, until it ends
  };
  Issue issue_of(Node n) const;
  void advance_hosts(const std::vector<int>& ranks);
  void host_issues(int rank, Node n, Issue it);
  /// What an op of `kernels` kernels and `seconds` on its GPU waits after its first launch for
  /// the later ones, where its kernels are shorter than their launches (host_issue.cpp).
  double short_kernels_wait(std::uint64_t kernels, double seconds) const {
    const double L = gpu.launch_seconds(), k = double(kernels);
    return k > 1 ? (k - 1) * std::max(0.0, L - seconds / k) : 0.0;
  }
  /// Whether op `id`, ready, waits for its hosts (not issued by all, or a timer set to go on at its issue).
  bool held_by_hosts(OpId id);
  /// When part i (of op `op`, on `rank`) had its first kernel launched by its host; NaN while its
  /// host has not issued it.
  double part_issue(std::size_t i, OpId op, int rank);
  /// `rank`'s host clock before shared op x, which it has issued.
  double clock_before(int rank, std::uint32_t x);
  /// Node `n` that blocked `rank`'s host has ended: the host goes on issuing.
  void host_unblocked(int rank, Node n);

  // executor.cpp
  void issue_op(OpId id);
  void alone_done(int rank);
  void start_copies(std::size_t i);
  void copy_as_exec(std::size_t i, int rank, double seconds);
  void copy_ended(std::size_t i);
  void started(const sg4::Exec& e);
  void share_gpu(int rank);
  void completed(const sg4::Activity& a);
  void op_done(OpId done);
  void release(Node n);
  double part_seconds(std::size_t part);
  void schedule_part(std::size_t part);
  void part_done(std::size_t part);
  void part_resolved(OpId op);
  void unchain(int rank);
  sg4::ExecPtr compute_exec(int rank, double seconds);
  sg4::ExecPtr rest_as_exec(int rank, double end, OpId op, Node node);
  Timing execute(const TaskGraph& graph);
  /// The network ops of `graph` that precede and follow each, by its dependencies and streams'
  /// order (`w`, graph.waits(); timed_steps.cpp), into `o` (its arrays reused); none (nothing
  /// timed: o.words = 0) where that would take more than `max_bits` bits.
  void network_overlaps(const TaskGraph& graph, const TaskGraph::Waits& w, std::uint64_t max_bits, Overlaps& o) const;
};

}  // namespace moesim
