// The cluster's analytic view: GPUs, the links inside a node, the route between any two GPUs of a
// node and from each GPU to its NIC, and the inter-node fabric's parameters. Built from a
// ClusterSpec and validated once; the SimGrid backend turns it into zones, links and routes, and the
// cost model reads the same routes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "moesim.pb.h"
#include "nccl_constants.hpp"

namespace moesim {

/// A duplex link inside a node: `bandwidth` bytes/s in each direction, `latency` seconds.
struct NodeLink {
  std::string name;  // "gpu0-nvswitch"
  std::string kind;  // nvlink, pcie, ...
  double bandwidth = 0;
  double latency = 0;
};

/// One hop of a route: a node link and the direction it is crossed in (a->b is forward).
struct Hop {
  int link = 0;
  bool forward = true;
};
using Route = std::vector<Hop>;

struct Nic {
  std::string name;
  double bandwidth = 0;  // bytes/s each way
  double latency = 0;
  double message_overhead = 0;  // seconds per message
  std::string staging_memory;   // the host-memory vertex NCCL stages its bytes through; empty: GPUDirect RDMA
};

/// The node as a job holding only its first `gpus` GPUs sees it (an allocation of part of a node or
/// rack, e.g. 64 of a GB200 NVL72's 72 GPUs): GPUs gpu0..gpu{gpus-1}, the switches and NICs they
/// reach without passing through another GPU or a NIC, and the links among those. Throws
/// FieldError("node.gpus") unless 1 <= gpus <= the node's GPUs.
spec::NodeSpec first_gpus(const spec::NodeSpec& node, int gpus);

class Cluster {
 public:
  /// Validates `spec` (FieldError with the field path on any problem) and computes the routes.
  explicit Cluster(spec::ClusterSpec spec);

  const spec::ClusterSpec& spec() const { return spec_; }
  /// A number no other Cluster built in this process has (a copy keeps it: a Cluster never changes),
  /// for caches of what is derived from one.
  std::uint64_t id() const { return id_; }
  const std::string& name() const { return spec_.name(); }
  int nodes() const { return int(spec_.nodes()); }
  int gpus_per_node() const { return int(spec_.node().gpus()); }
  int num_gpus() const { return nodes() * gpus_per_node(); }
  int node_of(int rank) const { return rank / gpus_per_node(); }
  int local_of(int rank) const { return rank % gpus_per_node(); }
  /// Send/recv rounds NCCL keeps in flight (NodeSpec.p2p_peers).
  int p2p_peers() const { return spec_.node().p2p_peers() ? int(spec_.node().p2p_peers()) : 8; }
  /// Seconds one NCCL call costs before its bytes move (NodeSpec.nccl_call_latency_us; NCCL's
  /// baseLat for the Simple protocol by default).
  double nccl_call_latency() const { return nccl_call_latency_; }
  /// Bytes/s at most of the send/recv messages from one GPU to one peer on another node: NCCL's
  /// channels to such a peer × 14 GB/s (NodeSpec.nccl_net_channels_per_peer); 0: no such cap.
  double net_peer_bandwidth() const {
    return spec_.node().nccl_net_channels_per_peer() * nccl::p2pPerChannelNetBw * 1e9;
  }

  /// The links of one node (every node has the same).
  const std::vector<NodeLink>& node_links() const { return links_; }
  /// Route between two local GPUs of one node (empty when i == j).
  const Route& intra_route(int local_src, int local_dst) const { return intra_[local_src][local_dst]; }
  /// The NIC a local GPU uses, and the route from the GPU to it.
  int nic_of(int local) const { return nic_of_[local]; }
  const Route& nic_route(int local) const { return nic_route_[local]; }
  const std::vector<Nic>& nics() const { return nics_; }
  /// The NIC a GPU (by rank) sends and receives through; the cluster must have NICs.
  const Nic& rank_nic(int rank) const { return nics_[std::size_t(std::max(nic_of(local_of(rank)), 0))]; }
  /// The GPU that sends a send/recv message from rank `src` to rank `dst` between nodes: with NCCL's
  /// PXN (NodeSpec.pxn), the GPU of src's node with dst's local index, which src reaches over
  /// NVLink, where its NIC is another; `src` otherwise (and inside a node).
  int pxn_proxy(int src, int dst) const {
    if (pxn_local_.empty() || node_of(src) == node_of(dst)) return src;
    return src - local_of(src) + pxn_local_[std::size_t(local_of(src) * gpus_per_node() + local_of(dst))];
  }
  /// Rings a ring collective runs side by side (NodeSpec.ring_channels; default one per NIC).
  int ring_channels() const { return int(channel_entry_.size()); }
  /// The node's ring: its local GPUs in the cyclic order NCCL's rings follow inside a node.
  const std::vector<int>& ring_order() const { return ring_order_; }
  /// Where channel c's ring enters a node: a position in ring_order(), a GPU of the channel's NIC.
  int channel_entry(int channel) const { return channel_entry_[std::size_t(channel)]; }
  /// Sum of the node's NIC bandwidths: the bandwidth of each node's fabric uplink.
  double node_uplink_bandwidth() const;

  /// Bytes a message between two GPUs costs beyond its own: the sender's NIC's per-message
  /// overhead × its bandwidth between nodes, 0 inside a node.
  double message_overhead_bytes(int src, int dst) const;

  /// Bandwidth and latency of the narrowest link of a route (inf/0 for an empty route).
  double route_bandwidth(const Route& r) const;
  double route_latency(const Route& r) const;

 private:
  spec::ClusterSpec spec_;
  std::uint64_t id_ = 0;
  double nccl_call_latency_ = 0;
  std::vector<NodeLink> links_;
  std::vector<std::vector<Route>> intra_;
  std::vector<int> nic_of_;
  std::vector<Route> nic_route_;
  std::vector<Nic> nics_;
  std::vector<int> ring_order_, channel_entry_;
  std::vector<int> pxn_local_;  // by (local src, local dst): the local GPU that sends (empty: no PXN)
  void build_rings(const spec::NodeSpec& node);
};

}  // namespace moesim
