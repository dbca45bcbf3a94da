#include "cluster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <set>

#include "errors.hpp"
#include "nccl_constants.hpp"
#include "gpu.hpp"

namespace moesim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A NIC's default per-message overhead: NCCL's proxy posting one operation with the Simple protocol.
double nccl_message_overhead_us(const spec::NodeSpec& node) { return nccl::net_overhead_us(node.cpu_vendor() == "amd", true); }

void require(bool ok, const std::string& field, const std::string& message) {
  if (!ok) throw FieldError(field, message);
}

// A finite number in [lo, hi] (or (lo, hi] with `open_low`): the ranges within which every figure
// the model computes from it stays finite and meaningful (NaN and infinity fail every test).
void require_in(double x, double lo, double hi, const std::string& field, const std::string& unit, bool open_low = false) {
  const bool ok = std::isfinite(x) && (open_low ? x > lo : x >= lo) && x <= hi;
  require(ok, field, fmt::format("must be in {}{:g}, {:g}] {}, got {}", open_low ? "(" : "[", lo, hi, unit, x));
}

// Ranges: well beyond any hardware, short of what overflows or stalls the model. Rates have a floor
// (1 MB/s; 1 MFLOP/s, below a host GEMM built unoptimized under the sanitizers, which `moesim
// calibrate` profiles; an efficiency of 0.01%) so that no op takes longer than the simulated clock
// can hold (a subnormal bandwidth made an op last forever). A node holds at most 256 GPUs: the
// routes inside a node are found for every GPU pair (1,024 GPUs took minutes; GB200 NVL72 has 72).
constexpr double kMinGBps = 1e-3, kMaxGBps = 1e6, kMaxLatencyUs = 1e6, kMinTflops = 1e-6, kMaxTflops = 1e6,
                 kMaxGib = 1e6, kMinEfficiency = 1e-4;
constexpr std::uint32_t kMaxNodes = 1u << 16, kMaxGpusPerNode = 256;

void validate_gpu(const spec::GpuSpec& gpu) {
  require(!gpu.model().empty(), "gpu.model", "is empty; name the GPU model");
  require_in(gpu.memory_gib(), 0, kMaxGib, "gpu.memory_gib", "GiB", true);
  require_in(gpu.memory_gbytes_per_s(), kMinGBps, kMaxGBps, "gpu.memory_gbytes_per_s", "GB/s");
  require(gpu.compute_capability() == 0 || (gpu.compute_capability() >= 30 && gpu.compute_capability() <= 200),
          "gpu.compute_capability", "must be the CUDA compute capability times 10 (80 for an A100), or 0 if unknown");
  require(gpu.memory_efficiency() == 0 || (gpu.memory_efficiency() >= kMinEfficiency && gpu.memory_efficiency() <= 1),
          "gpu.memory_efficiency", fmt::format("must be in [{:g}, 1] (0 means 1)", kMinEfficiency));
  if (gpu.has_host_sync_us()) require_in(gpu.host_sync_us(), 0, kMaxLatencyUs, "gpu.host_sync_us", "µs");
  if (gpu.has_launch_us()) require_in(gpu.launch_us(), 0, kMaxLatencyUs, "gpu.launch_us", "µs");
  if (gpu.has_kernel_us()) require_in(gpu.kernel_us(), 0, kMaxLatencyUs, "gpu.kernel_us", "µs");
  require(gpu.sms() <= 4096, "gpu.sms", fmt::format("{} SMs: a GPU has up to a few hundred (0: unknown)", gpu.sms()));
  require(gpu.peak_size() > 0, "gpu.peak", "is empty; give at least one `peak { dtype: ... tflops: ... }`");
  for (int i = 0; i < gpu.peak_size(); ++i)
    require_in(gpu.peak(i).tflops(), kMinTflops, kMaxTflops, fmt::format("gpu.peak[{}].tflops", i), "TFLOP/s");
  require(gpu.gemm_efficiency_size() > 0, "gpu.gemm_efficiency",
          "is empty: without a curve every GEMM would run at the peak, however small; give at least one "
          "`gemm_efficiency { gflops: ... efficiency: ... }` (the catalog's platforms have theirs), or measure one "
          "with `moesim calibrate`");
  std::map<int, double> last;  // by dtype (0: the points without one)
  for (int i = 0; i < gpu.gemm_efficiency_size(); ++i) {
    const auto& p = gpu.gemm_efficiency(i);
    require(std::isfinite(p.gflops()) && p.gflops() > last[p.dtype()], fmt::format("gpu.gemm_efficiency[{}].gflops", i),
            "must be > 0 and increase from point to point (among the points of one dtype)");
    require_in(p.efficiency(), kMinEfficiency, 1, fmt::format("gpu.gemm_efficiency[{}].efficiency", i), "");
    last[p.dtype()] = p.gflops();
  }
  for (int i = 0; i < gpu.peak_size(); ++i)
    require(gemm_curve_dtype(gpu, gpu.peak(i).dtype()).has_value(), fmt::format("gpu.peak[{}]", i),
            fmt::format("{} has a peak but no GEMM-efficiency curve: give points with `dtype: {}` or points without a dtype",
                        dtype_name(gpu.peak(i).dtype()), spec::DType_Name(gpu.peak(i).dtype())));
}

// Widest-shortest path: fewest hops, then the largest bottleneck bandwidth; first found on ties.
// Paths may transit only through vertices that are neither GPUs nor NICs (`endpoint[v]`).
struct Graph {
  std::vector<std::string> names;
  std::vector<bool> endpoint;
  std::vector<std::vector<std::pair<int, int>>> adj;  // (neighbour, link index)

  Route shortest(int src, int dst, const std::vector<NodeLink>& links,
                 const std::vector<std::pair<int, int>>& ends) const {
    const int n = int(names.size());
    std::vector<int> hops(n, std::numeric_limits<int>::max());
    std::vector<double> width(n, 0);
    std::vector<std::pair<int, int>> prev(n, {-1, -1});
    using Label = std::tuple<int, double, int>;  // hops, -width, vertex
    std::priority_queue<Label, std::vector<Label>, std::greater<>> queue;
    hops[src] = 0;
    width[src] = kInf;
    queue.emplace(0, -kInf, src);
    while (!queue.empty()) {
      auto [h, w, v] = queue.top();
      queue.pop();
      if (h != hops[v] || -w != width[v]) continue;
      if (v != src && endpoint[v]) continue;  // no transit through GPUs and NICs
      for (auto [u, l] : adj[v]) {
        const int nh = h + 1;
        const double nw = std::min(width[v], links[l].bandwidth);
        if (nh < hops[u] || (nh == hops[u] && nw > width[u])) {
          hops[u] = nh;
          width[u] = nw;
          prev[u] = {v, l};
          queue.emplace(nh, -nw, u);
        }
      }
    }
    Route route;
    if (hops[dst] == std::numeric_limits<int>::max()) return route;
    for (int v = dst; v != src; v = prev[v].first) {
      const int l = prev[v].second;
      route.push_back(Hop{l, ends[l].second == v});
    }
    std::reverse(route.begin(), route.end());
    return route;
  }
};

// A GPU's route to a NIC that NCCL reaches through host memory (NicSpec.staging_memory): into the
// memory vertex and out of it again, so that the memory link carries the bytes once each way (the
// GPU's write and the NIC's read, or the NIC's write and the GPU's read).
Route staged_route(const Graph& g, int gpu, int nic, const std::vector<Nic>& nics, const std::map<std::string, int>& index,
                   const std::vector<NodeLink>& links, const std::vector<std::pair<int, int>>& ends) {
  const std::string& memory = nics[std::size_t(nic)].staging_memory;
  const std::string field = fmt::format("node.nics[{}].staging_memory", nic);
  const auto at = index.find(memory);
  require(at != index.end(), field, fmt::format("'{}' is no vertex of the node's links; link the host memory to its "
                                                "CPU socket (e.g. `links {{ a: \"cpu0\" b: \"{}\" kind: \"memory\" }}`)",
                                                memory, memory));
  require(!g.endpoint[std::size_t(at->second)] && memory.rfind("gpu", 0) != 0, field,
          fmt::format("'{}' is a GPU or a NIC; name the host-memory vertex", memory));
  Route route = g.shortest(gpu, at->second, links, ends);
  const Route out = g.shortest(at->second, index.at(nics[std::size_t(nic)].name), links, ends);
  require(!route.empty() && !out.empty(), field, fmt::format("gpu{} cannot reach {} and {} through it", gpu, memory,
                                                             nics[std::size_t(nic)].name));
  route.insert(route.end(), out.begin(), out.end());
  return route;
}

}  // namespace

spec::NodeSpec first_gpus(const spec::NodeSpec& node, int gpus) {
  require(gpus >= 1 && gpus <= int(node.gpus()), "node.gpus",
          fmt::format("a job can hold 1 to the node's {} GPUs, not {}", node.gpus(), gpus));
  if (gpus == int(node.gpus())) return node;
  auto gpu_index = [](const std::string& name) {  // "gpu12" -> 12; -1 for any other vertex
    if (name.size() < 4 || name.rfind("gpu", 0) != 0 ||
        !std::all_of(name.begin() + 3, name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return name.size() > 9 ? std::numeric_limits<int>::max() : std::stoi(name.substr(3));
  };
  std::set<std::string> nics;
  for (const auto& nic : node.nics()) nics.insert(nic.name());
  // Breadth-first from the kept GPUs: a route may pass through switches only (as Cluster's routes).
  std::set<std::string> reached;
  std::queue<std::string> todo;
  for (int i = 0; i < gpus; ++i) reached.insert("gpu" + std::to_string(i)), todo.push("gpu" + std::to_string(i));
  while (!todo.empty()) {
    const std::string v = todo.front();
    todo.pop();
    if (nics.count(v)) continue;  // a NIC ends a route inside the node
    for (const auto& l : node.links())
      for (const auto& [from, to] : {std::pair(l.a(), l.b()), std::pair(l.b(), l.a())})
        if (from == v && gpu_index(to) < gpus && reached.insert(to).second && gpu_index(to) < 0) todo.push(to);
  }
  spec::NodeSpec out = node;
  out.set_gpus(std::uint32_t(gpus));
  out.clear_links();
  out.clear_nics();
  for (const auto& l : node.links())
    if (reached.count(l.a()) && reached.count(l.b())) *out.add_links() = l;
  for (const auto& nic : node.nics())
    if (reached.count(nic.name())) *out.add_nics() = nic;
  return out;
}

Cluster::Cluster(spec::ClusterSpec spec) : spec_(std::move(spec)) {
  static std::atomic<std::uint64_t> clusters{0};
  id_ = ++clusters;
  require(!spec_.name().empty(), "name", "is empty; name the cluster");
  require(spec_.nodes() >= 1 && spec_.nodes() <= kMaxNodes, "nodes", fmt::format("must be in [1, {}]", kMaxNodes));
  validate_gpu(spec_.gpu());
  const auto& node = spec_.node();
  const int gpus = int(node.gpus());
  require(node.gpus() >= 1 && node.gpus() <= kMaxGpusPerNode, "node.gpus", fmt::format("must be in [1, {}]", kMaxGpusPerNode));
  require(node.cpu_vendor().empty() || node.cpu_vendor() == "intel" || node.cpu_vendor() == "amd", "node.cpu_vendor",
          "'" + node.cpu_vendor() + "' is not \"intel\" or \"amd\"");
  if (node.has_nccl_call_latency_us()) require_in(node.nccl_call_latency_us(), 0, kMaxLatencyUs, "node.nccl_call_latency_us", "µs");
  require(node.nccl_net_channels_per_peer() <= 64, "node.nccl_net_channels_per_peer", "at most 64 (NCCL's MAXCHANNELS)");
  nccl_call_latency_ = (node.has_nccl_call_latency_us() ? node.nccl_call_latency_us() : nccl::baseLat[1][nccl::kSimple]) * 1e-6;

  // Vertices: gpu0..gpuN-1 first, then every other name in link order.
  Graph g;
  std::map<std::string, int> index;
  for (int i = 0; i < gpus; ++i) {
    index["gpu" + std::to_string(i)] = i;
    g.names.push_back("gpu" + std::to_string(i));
    g.endpoint.push_back(true);
  }
  std::set<std::string> nic_names;
  for (int i = 0; i < node.nics_size(); ++i) {
    const auto& nic = node.nics(i);
    require(!nic.name().empty(), fmt::format("node.nics[{}].name", i), "is empty");
    require_in(nic.gbits_per_s(), 8 * kMinGBps, 8 * kMaxGBps, fmt::format("node.nics[{}].gbits_per_s", i), "Gb/s");
    require_in(nic.latency_us(), 0, kMaxLatencyUs, fmt::format("node.nics[{}].latency_us", i), "µs");
    require_in(nic.nccl_latency_us(), 0, kMaxLatencyUs, fmt::format("node.nics[{}].nccl_latency_us", i), "µs");
    if (nic.has_message_overhead_us())
      require_in(nic.message_overhead_us(), 0, kMaxLatencyUs, fmt::format("node.nics[{}].message_overhead_us", i), "µs");
    require(nic_names.insert(nic.name()).second, fmt::format("node.nics[{}].name", i),
            "'" + nic.name() + "' is used by two NICs");
    nics_.push_back(Nic{nic.name(), nic.gbits_per_s() * 1e9 / 8, nic.latency_us() * 1e-6,
                        (nic.has_message_overhead_us() ? nic.message_overhead_us() : nccl_message_overhead_us(node)) * 1e-6,
                        nic.staging_memory()});
  }
  auto vertex = [&](const std::string& name, const std::string& field) {
    require(!name.empty(), field, "is empty; name a vertex such as gpu0, nvswitch or nic0");
    if (name.rfind("gpu", 0) == 0 && !index.count(name))
      throw FieldError(field, fmt::format("'{}' is not a GPU of this node (gpu0..gpu{})", name, gpus - 1));
    auto [it, added] = index.emplace(name, int(g.names.size()));
    if (added) {
      g.names.push_back(name);
      g.endpoint.push_back(nic_names.count(name) > 0);
    }
    return it->second;
  };
  std::vector<std::pair<int, int>> ends;
  for (int i = 0; i < node.links_size(); ++i) {
    const auto& l = node.links(i);
    const std::string f = fmt::format("node.links[{}]", i);
    const int a = vertex(l.a(), f + ".a"), b = vertex(l.b(), f + ".b");
    require(a != b, f + ".b", "a link must join two different vertices");
    for (std::size_t j = 0; j < ends.size(); ++j)
      require(ends[j] != std::make_pair(a, b) && ends[j] != std::make_pair(b, a), f,
              fmt::format("joins {} and {}, as node.links[{}] does; give one link with the summed bandwidth", l.a(), l.b(), j));
    require_in(l.gbytes_per_s(), kMinGBps, kMaxGBps, f + ".gbytes_per_s", "GB/s per direction");
    require_in(l.latency_us(), 0, kMaxLatencyUs, f + ".latency_us", "µs");
    links_.push_back(NodeLink{l.a() + "-" + l.b(), l.kind(), l.gbytes_per_s() * 1e9, l.latency_us() * 1e-6});
    ends.emplace_back(a, b);
  }
  for (int i = 0; i < node.nics_size(); ++i)
    require(index.count(node.nics(i).name()) > 0, fmt::format("node.nics[{}].name", i),
            fmt::format("'{}' is in no link; link it to the PCIe switch or GPU it hangs off", node.nics(i).name()));
  g.adj.resize(g.names.size());
  for (size_t l = 0; l < ends.size(); ++l) {
    g.adj[ends[l].first].emplace_back(ends[l].second, int(l));
    g.adj[ends[l].second].emplace_back(ends[l].first, int(l));
  }

  intra_.assign(gpus, std::vector<Route>(gpus));
  for (int i = 0; i < gpus; ++i)
    for (int j = 0; j < gpus; ++j) {
      if (i == j) continue;
      intra_[i][j] = g.shortest(i, j, links_, ends);
      require(!intra_[i][j].empty(), "node.links",
              fmt::format("gpu{} cannot reach gpu{} (routes never pass through a third GPU); add a link", i, j));
    }

  if (spec_.nodes() == 1 && spec_.fabric().nodes_per_leaf() == 0) {  // no fabric to speak of: one switch
    spec_.mutable_fabric()->set_nodes_per_leaf(1);
    spec_.mutable_fabric()->set_spines(std::max(1u, spec_.fabric().spines()));
  }
  require(spec_.has_fabric() || spec_.nodes() == 1, "fabric",
          fmt::format("is missing: a cluster of {} nodes needs its network between nodes, e.g. "
                      "`fabric {{ nodes_per_leaf: 16 spines: 16 latency_us: 0.25 }}` (a two-level fat-tree)", spec_.nodes()));
  const auto& fabric = spec_.fabric();  // checked with one node too: the cost model divides by it
  require(fabric.nodes_per_leaf() >= 1 && fabric.nodes_per_leaf() <= kMaxNodes, "fabric.nodes_per_leaf",
          fmt::format("must be in [1, {}]", kMaxNodes));
  require(fabric.spines() >= 1 && fabric.spines() <= kMaxNodes, "fabric.spines", fmt::format("must be in [1, {}]", kMaxNodes));
  require_in(fabric.latency_us(), 0, kMaxLatencyUs, "fabric.latency_us", "µs");
  if (spec_.nodes() > 1) {
    require(!nics_.empty(), "node.nics", "a cluster of more than one node needs at least one NIC per node");
    require(spec_.nodes() <= fabric.nodes_per_leaf() || spec_.nodes() % fabric.nodes_per_leaf() == 0, "nodes",
            fmt::format("{} nodes do not fit a fat-tree of {} nodes per leaf switch; use at most {} nodes or a "
                        "multiple of {}",
                        spec_.nodes(), fabric.nodes_per_leaf(), fabric.nodes_per_leaf(), fabric.nodes_per_leaf()));
  }
  for (int i = 0; i < gpus; ++i) {
    int best = -1;
    Route best_route;
    for (size_t n = 0; n < nics_.size(); ++n) {
      Route r = g.shortest(i, index.at(nics_[n].name), links_, ends);
      if (r.empty()) continue;
      if (best < 0 || r.size() < best_route.size() ||
          (r.size() == best_route.size() && route_bandwidth(r) > route_bandwidth(best_route))) {
        best = int(n);
        best_route = std::move(r);
      }
    }
    if (spec_.nodes() > 1)
      require(best >= 0, "node.links", fmt::format("gpu{} reaches no NIC; link it to one of the node's NICs", i));
    if (best >= 0 && !nics_[std::size_t(best)].staging_memory.empty())
      best_route = staged_route(g, i, best, nics_, index, links_, ends);
    nic_of_.push_back(best);
    nic_route_.push_back(std::move(best_route));
  }
  build_rings(node);
  // PXN: GPU i sends to local index j's rail through GPU j where its NIC is another and every link
  // between them is NVLink (NCCL's PATH_NVL: direct or through NVSwitch).
  if (node.pxn()) {
    require(!nics_.empty(), "node.pxn", "needs NICs: PXN moves a message to another GPU's NIC");
    pxn_local_.resize(std::size_t(gpus) * std::size_t(gpus));
    for (int i = 0; i < gpus; ++i)
      for (int j = 0; j < gpus; ++j) {
        const Route& r = intra_[std::size_t(i)][std::size_t(j)];
        const bool nvlink = !r.empty() && std::all_of(r.begin(), r.end(), [&](const Hop& h) {
          return links_[std::size_t(h.link)].kind.rfind("nv", 0) == 0;
        });
        pxn_local_[std::size_t(i * gpus + j)] = nvlink && nic_of_[std::size_t(i)] != nic_of_[std::size_t(j)] && nic_of_[std::size_t(j)] >= 0 ? j : i;
      }
  }
}

// NCCL's rings inside a node (its graph search, src/graph/search.cc, looks for rings over the fastest
// paths): the cyclic order of the GPUs whose narrowest hop is widest, then with the fewest link
// hops, then the first in lexicographic order; so on NVSwitch and uniform PCIe nodes GPU order, and
// on DGX-1's hybrid cube-mesh 0 3 2 1 5 6 7 4, every hop an NVLink pair. Exhaustive up to 9 GPUs
// per node (8! orders); a larger node keeps GPU order. Channel c enters each node at a GPU of NIC
// c mod K, where possible one whose ring predecessor (the GPU it leaves the node from) is on the
// same NIC (p4d: GPUs 2k+1 ... 2k), so the channels cross between nodes through different NICs.
void Cluster::build_rings(const spec::NodeSpec& node) {
  const int g = gpus_per_node();
  ring_order_.resize(std::size_t(g));
  std::iota(ring_order_.begin(), ring_order_.end(), 0);
  if (g > 2 && g <= 9) {
    std::vector<int> order = ring_order_, best = order;
    auto score = [&](const std::vector<int>& o) {
      double narrowest = kInf;
      std::size_t hops = 0;
      for (int p = 0; p < g; ++p) {
        const Route& r = intra_route(o[std::size_t(p)], o[std::size_t((p + 1) % g)]);
        narrowest = std::min(narrowest, route_bandwidth(r));
        hops += r.size();
      }
      return std::make_pair(narrowest, -double(hops));
    };
    auto best_score = score(best);
    while (std::next_permutation(order.begin() + 1, order.end()))
      if (const auto s = score(order); s > best_score) best = order, best_score = s;
    ring_order_ = best;
  }
  const int K = int(nics_.size());
  require(node.p2p_peers() <= kMaxGpusPerNode * kMaxNodes, "node.p2p_peers",
          "must be at most the cluster's GPUs (NCCL's send/recv peers in flight); 0 means 8");
  require(node.ring_channels() <= 64, "node.ring_channels", "must be at most 64 (NCCL's MAXCHANNELS); 0 means one per NIC");
  const int channels = node.ring_channels() > 0 ? int(node.ring_channels()) : std::max(1, K);
  for (int c = 0; c < channels; ++c) {
    int entry = -1;
    for (int p = 0; p < g && K > 0; ++p) {
      if (nic_of_[std::size_t(ring_order_[std::size_t(p)])] != c % K) continue;
      if (entry < 0) entry = p;
      if (nic_of_[std::size_t(ring_order_[std::size_t((p + g - 1) % g)])] == c % K) {
        entry = p;
        break;
      }
    }
    channel_entry_.push_back(entry >= 0 ? entry : c * g / channels % g);
  }
}

double Cluster::message_overhead_bytes(int src, int dst) const {
  if (node_of(src) == node_of(dst) || nics_.empty()) return 0;
  const Nic& nic = rank_nic(src);
  return nic.message_overhead * nic.bandwidth;
}

double Cluster::node_uplink_bandwidth() const {
  double sum = 0;
  for (const auto& n : nics_) sum += n.bandwidth;
  return sum;
}

double Cluster::route_bandwidth(const Route& r) const {
  double bw = kInf;
  for (const auto& h : r) bw = std::min(bw, links_[h.link].bandwidth);
  return bw;
}

double Cluster::route_latency(const Route& r) const {
  double lat = 0;
  for (const auto& h : r) lat += links_[h.link].latency;
  return lat;
}

}  // namespace moesim
