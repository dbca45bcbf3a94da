#include "cost_model.hpp"

#include <algorithm>

#include "collectives/collectives.hpp"

namespace moesim {

// Directed link ids: [node links of every node][NICs of every node][node uplinks][leaf uplinks],
// two directions each (2·id forward / up, 2·id + 1 backward / down).
CostModel::CostModel(const Cluster& c, const GpuModel& g, CostOptions o) : cluster_(c), gpu_(g), options_(o) {
  const int N = c.nodes(), L = int(c.node_links().size()), K = int(c.nics().size());
  const auto& f = c.spec().fabric();
  const int leaves = N > int(f.nodes_per_leaf()) ? N / int(f.nodes_per_leaf()) : 0;
  node_base_ = 0;
  nic_base_ = N * L;
  uplink_base_ = nic_base_ + N * K;
  leaf_base_ = uplink_base_ + (N > 1 ? N : 0);
  has_leaves_ = leaves > 0;
  bandwidth_.resize(2 * std::size_t(leaf_base_ + leaves));
  for (int n = 0; n < N; ++n) {
    for (int l = 0; l < L; ++l) bandwidth_[2 * (n * L + l)] = bandwidth_[2 * (n * L + l) + 1] = c.node_links()[l].bandwidth;
    for (int k = 0; k < K; ++k)
      bandwidth_[2 * (nic_base_ + n * K + k)] = bandwidth_[2 * (nic_base_ + n * K + k) + 1] = c.nics()[k].bandwidth;
    if (N > 1) bandwidth_[2 * (uplink_base_ + n)] = bandwidth_[2 * (uplink_base_ + n) + 1] = c.node_uplink_bandwidth();
  }
  for (int leaf = 0; leaf < leaves; ++leaf)
    bandwidth_[2 * (leaf_base_ + leaf)] = bandwidth_[2 * (leaf_base_ + leaf) + 1] =
        c.node_uplink_bandwidth() * f.spines();
}

void CostModel::add_route(std::vector<double>& load, int i, int j, double bytes, int messages) const {
  bytes += messages * cluster_.message_overhead_bytes(i, j);  // as the backend charges them
  const int a = cluster_.node_of(i), b = cluster_.node_of(j), li = cluster_.local_of(i), lj = cluster_.local_of(j);
  const int L = int(cluster_.node_links().size()), K = int(cluster_.nics().size());
  auto hops = [&](int node, const Route& r, bool reverse) {
    for (const auto& h : r) load[2 * (node * L + h.link) + ((h.forward != reverse) ? 0 : 1)] += bytes;
  };
  if (a == b) {
    hops(a, cluster_.intra_route(li, lj), false);
    return;
  }
  hops(a, cluster_.nic_route(li), false);
  load[2 * (nic_base_ + a * K + cluster_.nic_of(li))] += bytes;
  load[2 * (uplink_base_ + a)] += bytes;
  const int per_leaf = int(cluster_.spec().fabric().nodes_per_leaf());
  if (has_leaves_ && a / per_leaf != b / per_leaf) {
    load[2 * (leaf_base_ + a / per_leaf)] += bytes;
    load[2 * (leaf_base_ + b / per_leaf) + 1] += bytes;
  }
  load[2 * (uplink_base_ + b) + 1] += bytes;
  load[2 * (nic_base_ + b * K + cluster_.nic_of(lj)) + 1] += bytes;
  hops(b, cluster_.nic_route(lj), true);
}

double CostModel::max_time(const std::vector<double>& load) const {
  double t = 0;
  for (std::size_t l = 0; l < load.size(); ++l)
    if (load[l] > 0) t = std::max(t, load[l] / bandwidth_[l]);
  return t;
}

double CostModel::alltoall_time(const std::vector<double>& bytes) const {
  const int G = cluster_.num_gpus();
  std::vector<double> load(bandwidth_.size(), 0.0);
  for (int i = 0; i < G; ++i)
    for (int j = 0; j < G; ++j)
      if (i != j && bytes[std::size_t(i) * G + j] > 0) add_route(load, i, j, bytes[std::size_t(i) * G + j]);
  return max_time(load);
}

double CostModel::collective_time(const Collective& c) const {
  const Lowering lowering = lower(c, cluster_);
  return lowering.empty() ? 0 : cluster_.nccl_call_latency() + lowering_time(lowering, true);
}

// Lanes run at the same time: the longest lane, or longer where they share links, at least every
// lane's bytes over the link they load most.
double CostModel::lowering_time(const Lowering& lowering, bool kernels) const {
  double longest = 0;
  std::vector<double> load(bandwidth_.size()), all(lowering.size() > 1 ? bandwidth_.size() : 0);
  for (const auto& lane : lowering) {
    double t = 0;
    for (const auto& step : lane) {
      std::fill(load.begin(), load.end(), 0.0);
      const double scale = kernels ? step.load_per_byte() : step.rounds;
      for (const auto& tr : step.transfers) add_route(load, tr.src, tr.dst, tr.bytes * scale, step.rounds * step.messages);
      t += std::max(max_time(load), kernels ? step.min_seconds : 0.0) + step.fill_seconds;
      for (std::size_t l = 0; l < all.size(); ++l) all[l] += load[l];
    }
    longest = std::max(longest, t);
  }
  return std::max(longest, all.empty() ? 0.0 : max_time(all));
}

double CostModel::allreduce_time(const std::vector<int>& group, double bytes) const {
  return collective_time({CollectiveType::all_reduce, group, {bytes}, nccl_all_reduce(group, bytes)});
}

NcclTunerInput CostModel::nccl_tuner_input(const std::vector<int>& group) const {
  NcclTunerInput in = nccl_platform_input(group, cluster_);
  if (in.ranks < 2) return in;
  const double S = double(1 << 30), n = in.ranks, C = in.channels;
  // The links' bandwidth, as NCCL's search measures it: without the Tree kernels' cap and the 0.92 a
  // tree reaches of its links (the lowering's min_seconds and link_rate), which the tuner applies itself.
  const double ring = lowering_time(lower({CollectiveType::all_reduce, group, {S}, "ring"}, cluster_), true);
  const double tree = lowering_time(lower({CollectiveType::all_reduce, group, {S}, "tree"}, cluster_), false);
  in.ring_bw = ring > 0 ? 2 * (n - 1) / n * S / ring / 1e9 / C : 0;
  in.tree_bw = tree > 0 ? 2 * S / tree / 1e9 / C : 0;
  return in;
}

std::string CostModel::nccl_all_reduce(const std::vector<int>& group, double bytes) const {
  if (group.size() < 2) return "ring";
  return nccl_all_reduce_choice(nccl_tuner_input(group), bytes).algorithm;
}

double CostModel::broadcast_time(const std::vector<int>& group, double bytes) const {
  return collective_time({CollectiveType::broadcast, group, {bytes}, "ring"});
}

double CostModel::expert_time(const MoeModel& model, double tokens) const {
  if (tokens <= 0) return 0;
  double t = 0;
  for (const auto& g : model.expert_gemms(long(tokens)))
    t += options_.fastermoe_90_percent ? g.flops() / (0.9 * gpu_.peak_flops()) : gpu_.gemm_time(g);
  return t;
}

double CostModel::expert_phase_time(const MoeModel& model, const RoutingMatrix& R) const {
  const int G = cluster_.num_gpus(), local = R.experts / G;
  const auto loads = R.expert_loads();
  double worst = 0;
  for (int w = 0; w < G; ++w) {
    double t = 0;
    for (int e = w * local; e < (w + 1) * local; ++e) t += expert_time(model, double(loads[std::size_t(e)]));
    worst = std::max(worst, t);
  }
  return worst;
}

std::vector<double> CostModel::dispatch_bytes(const MoeModel& model, const RoutingMatrix& R) const {
  const int G = cluster_.num_gpus(), local = R.experts / G;
  std::vector<double> bytes(std::size_t(G) * G, 0.0);
  for (int i = 0; i < R.sources; ++i)
    for (int e = 0; e < R.experts; ++e) bytes[std::size_t(i) * G + e / local] += double(R.at(i, e)) * model.token_bytes();
  return bytes;
}

Roofline CostModel::roofline(const MoeModel& model, const RoutingMatrix& R) const {
  Roofline r;
  const int G = cluster_.num_gpus();
  r.lat_comp = expert_phase_time(model, R);
  r.lat_comm = alltoall_time(dispatch_bytes(model, R));
  r.r_cc = r.lat_comm > 0 ? r.lat_comp / r.lat_comm : 0;
  r.lat_e2e = 3 * r.lat_comp + 4 * r.lat_comm;
  double tokens = 0, biggest = 0;
  for (const std::int64_t load : R.expert_loads()) {
    tokens += double(load);
    biggest = std::max(biggest, double(load));
  }
  const double per_token = 3 * 2 * model.expert_params();  // 12 α H² flops (fwd + bwd: 3 × 2 FLOPs per parameter)
  r.p_bar = r.lat_e2e > 0 ? per_token * tokens / (G * r.lat_e2e) : 0;
  r.p_worker = biggest > 0 ? per_token / 3 * biggest / expert_time(model, biggest) : 0;
  r.p_ideal = r.p_worker * std::min(1.0, r.r_cc);
  r.p_semi = r.p_worker * r.r_cc / (r.r_cc + 1);
  return r;
}

}  // namespace moesim
