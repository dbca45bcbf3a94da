#include "ep_groups.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "cost_model.hpp"
#include "errors.hpp"
#include "rank_layout.hpp"

namespace moesim {

namespace {

constexpr const char* kDenseAllReduce = "allreduce.dense";  // LayerOps::build()'s label

}  // namespace

std::vector<std::vector<int>> ep_groups(const spec::ParallelSpec& parallel, const Cluster& cluster) {
  const int G = cluster.num_gpus(), m = cluster.gpus_per_node();
  const int ep = parallel.ep() == 0 ? G : int(parallel.ep());
  if (ep > G || G % ep != 0)
    throw FieldError("parallel.ep", fmt::format("{} GPUs per EP group do not divide the {} GPUs", ep, G));
  if (ep % m != 0)
    throw FieldError("parallel.ep", fmt::format("an EP group is whole nodes for now: a multiple of the {} GPUs per node", m));
  const std::string order = parallel.order().empty() ? "tp-cp-ep-dp-pp" : parallel.order();
  std::vector<std::vector<int>> groups;
  try {
    const RankLayout layout = RankLayout::named(order, {{"ep", ep}, {"dp", G / ep}});
    if (layout.world_size() != G) throw std::invalid_argument("the order must name tp, cp, ep, dp and pp");
    groups = layout.groups("ep");
  } catch (const std::invalid_argument& e) {
    throw FieldError("parallel.order", e.what());
  }
  for (const auto& g : groups)
    for (std::size_t i = 1; i < g.size(); ++i)
      if (g[i] != g[0] + int(i))
        throw FieldError("parallel.order", "'" + order + "' makes EP groups of GPUs that are not consecutive; for now an "
                                           "EP group is whole nodes in order (ep before dp, as tp-cp-ep-dp-pp)");
  return groups;
}

spec::ClusterSpec ep_group_cluster(const spec::ClusterSpec& whole, int ep) {
  spec::ClusterSpec s = whole;
  s.set_nodes(std::uint32_t(ep / int(whole.node().gpus())));
  return s;
}

EpGroups::EpGroups(const spec::ClusterSpec& whole, std::vector<std::vector<int>> groups, const spec::PolicySpec& policy)
    : groups_(std::move(groups)) {
  if (groups_.size() > 1) group_cluster_.emplace(ep_group_cluster(whole, int(groups_.front().size())));
  for (std::size_t g = 0; g < groups_.size(); ++g) policies_.push_back(make_policy(policy));
}

TaskGraph EpGroups::build_iteration(const IterationInput& in) {
  if (!group_cluster_) return policies_.front()->build_iteration(in);
  const int G = in.cluster.num_gpus(), ep = group_cluster_->num_gpus(), D = int(groups_.size());
  // Each group's iteration, on its own cluster and tokens.
  last_.clear();
  std::vector<PolicyReport> reports(static_cast<std::size_t>(D));
  std::size_t ops = 0;
  for (int g = 0; g < D; ++g) {
    std::vector<RoutingMatrix> mine;
    for (const auto& R : in.routing) mine.push_back(R.rows(g * ep, (g + 1) * ep));
    const IterationInput sub{*group_cluster_, in.model, in.gpu, in.spec, mine, reports[std::size_t(g)], in.count_exchange};
    last_.push_back(policies_[std::size_t(g)]->build_iteration(sub));
    ops += last_.back().size();
  }
  // Merged: every group's ops up to its dense all-reduce, the gradient all-reduces, then the rest.
  TaskGraph out(G);
  out.reserve(ops + std::size_t(ep) + 1);
  merged_id_.assign(std::size_t(D), {});
  std::vector<OpId> allreduce_of(static_cast<std::size_t>(D));
  for (int g = 0; g < D; ++g) {
    const TaskGraph& sub = last_[std::size_t(g)];
    const auto it = std::find_if(sub.ops().begin(), sub.ops().end(), [](const Op& op) { return op.label == kDenseAllReduce; });
    if (it == sub.ops().end()) throw std::logic_error("EpGroups: a group's iteration has no " + std::string(kDenseAllReduce));
    allreduce_of[std::size_t(g)] = it->id;
    merged_id_[std::size_t(g)].assign(sub.size(), 0);
  }
  auto copy = [&](int g, OpId from, OpId to, const std::vector<OpId>& gradients) {
    const TaskGraph& sub = last_[std::size_t(g)];
    auto& id = merged_id_[std::size_t(g)];
    for (OpId i = from; i < to; ++i) {
      std::vector<OpId> deps;
      for (OpId d : sub.op(i).deps) {
        deps.push_back(id[d]);
        if (d == allreduce_of[std::size_t(g)]) deps.insert(deps.end(), gradients.begin(), gradients.end());
      }
      id[i] = out.add_shifted(sub.op(i), groups_[std::size_t(g)].front(), std::move(deps));
    }
  };
  for (int g = 0; g < D; ++g) copy(g, 0, allreduce_of[std::size_t(g)], {});
  std::vector<OpId> backward_done;
  for (int g = 0; g < D; ++g)
    for (OpId d : last_[std::size_t(g)].op(allreduce_of[std::size_t(g)]).deps) backward_done.push_back(merged_id_[std::size_t(g)][d]);
  const CostModel cost(in.cluster, in.gpu);
  const std::string ar = collective_algorithm(in.spec, CollectiveType::all_reduce);
  auto all_reduce = [&](const std::string& label, std::vector<int> group, double bytes) {
    const std::string algorithm = ar == "nccl" ? cost.nccl_all_reduce(group, bytes) : ar;
    return out.add_collective(Stream::comm, label, {CollectiveType::all_reduce, std::move(group), {bytes}, algorithm}, backward_done);
  };
  const auto& dense = std::get<Collective>(last_.front().op(allreduce_of.front()).body);
  std::vector<int> everyone(static_cast<std::size_t>(G));
  std::iota(everyone.begin(), everyone.end(), 0);
  const OpId dense_ar = all_reduce(kDenseAllReduce, everyone, dense.total_bytes());
  // A GPU's share of the experts' gradients: E/ep experts of every MoE layer (or 1/s of one).
  const double expert_bytes =
      double(in.model.experts()) / ep * in.model.layers() * in.model.expert_params() * in.model.dtype_bytes();
  std::vector<OpId> gradients;
  for (int place = 0; place < ep; ++place) {
    std::vector<int> copies;
    for (const auto& group : groups_) copies.push_back(group[std::size_t(place)]);
    gradients.push_back(all_reduce(fmt::format("expert_allreduce.p{}", place), std::move(copies), expert_bytes));
  }
  for (int g = 0; g < D; ++g) {
    merged_id_[std::size_t(g)][allreduce_of[std::size_t(g)]] = dense_ar;
    copy(g, allreduce_of[std::size_t(g)] + 1, OpId(last_[std::size_t(g)].size()), gradients);
  }
  // The groups' figures.
  PolicyReport& r = in.report;
  for (const auto& sub : reports) {
    r.rerouted_tokens += sub.rerouted_tokens;
    r.shadowed_experts += sub.shadowed_experts;
    r.decision_seconds += sub.decision_seconds;
    r.gpu_load.insert(r.gpu_load.end(), sub.gpu_load.begin(), sub.gpu_load.end());
    r.gpu_memory.insert(r.gpu_memory.end(), sub.gpu_memory.begin(), sub.gpu_memory.end());
    if (sub.memory.total() > r.memory.total()) r.memory = sub.memory;
    r.parallel_r = std::max(r.parallel_r, sub.parallel_r);
    auto most = [](std::vector<double>& into, const std::vector<double>& from) {
      into.resize(std::max(into.size(), from.size()), 0.0);
      for (std::size_t l = 0; l < from.size(); ++l) into[l] = std::max(into[l], from[l]);
    };
    most(r.load_stddev, sub.load_stddev);
    most(r.load_max_mean, sub.load_max_mean);
  }
  return out;
}

void EpGroups::observe(const TaskGraph& graph, const Timing& timing) {
  if (!group_cluster_) return policies_.front()->observe(graph, timing);
  for (std::size_t g = 0; g < last_.size(); ++g) {
    const TaskGraph& sub = last_[g];
    Timing mine;
    mine.start.resize(sub.size());
    mine.end.resize(sub.size());
    mine.part_start.resize(sub.num_parts());
    mine.part_end.resize(sub.num_parts());
    for (const Op& op : sub.ops()) {
      const OpId to = merged_id_[g][op.id];
      mine.start[op.id] = timing.start[to];
      mine.end[op.id] = timing.end[to];
      if (const auto* c = std::get_if<Computes>(&op.body)) {
        const std::size_t at = std::get<Computes>(graph.op(to).body).first_part;
        for (std::size_t k = 0; k < c->parts(); ++k) {
          mine.part_start[c->first_part + k] = timing.part_start[at + k];
          mine.part_end[c->first_part + k] = timing.part_end[at + k];
        }
      }
    }
    policies_[g]->observe(sub, mine);
  }
}

}  // namespace moesim
