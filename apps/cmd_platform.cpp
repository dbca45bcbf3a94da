// moesim platform list|show|export: the cluster catalog.
#include <fmt/format.h>

#include "catalog.hpp"
#include "cluster.hpp"
#include "command.hpp"
#include "errors.hpp"
#include "gpu.hpp"
#include "spec.hpp"
#include "textproto.hpp"

namespace moesim::cli {
namespace {

// A platform, its errors naming file, line and field as `moesim run` does.
Cluster platform_cluster(const std::string& name) {
  ParsedFile file;
  const spec::ClusterSpec spec = load_platform(name, &file);
  try {
    return Cluster(spec);
  } catch (const FieldError& e) {
    throw InputError(file.describe(e.field(), e.message()));
  }
}

int show(const std::string& name) {
  const Cluster c = platform_cluster(name);
  const auto& s = c.spec();
  fmt::print("{}: {}\n", s.name(), s.description());
  fmt::print("  nodes {} × {} GPUs ({}), {} GiB, {:.0f} GB/s memory\n", s.nodes(), s.node().gpus(), s.gpu().model(),
             s.gpu().memory_gib(), s.gpu().memory_gbytes_per_s());
  // Each dtype's peak, and its GEMM-efficiency curve read at a few sizes (its own points or the
  // untyped ones: EfficiencyPoint.dtype).
  for (const auto& p : s.gpu().peak()) {
    const GpuModel gpu(s.gpu(), p.dtype());
    fmt::print("  peak {:<5} {:8.1f} TFLOP/s; GEMMs of 0.1 / 1 / 10 / 100 GFLOP at {:.0f} / {:.0f} / {:.0f} / {:.0f}% of it\n",
               dtype_name(p.dtype()), p.tflops(), 100 * gpu.gemm_efficiency(1e8), 100 * gpu.gemm_efficiency(1e9),
               100 * gpu.gemm_efficiency(1e10), 100 * gpu.gemm_efficiency(1e11));
  }
  fmt::print("  routes inside a node (bottleneck GB/s, latency µs):\n");
  for (int i = 0; i < c.gpus_per_node(); ++i) {
    fmt::print("    gpu{}:", i);
    for (int j = 0; j < c.gpus_per_node(); ++j)
      if (i == j) fmt::print("      -    ");
      else fmt::print(" {:6.1f}/{:<3.1f}", c.route_bandwidth(c.intra_route(i, j)) / 1e9, c.route_latency(c.intra_route(i, j)) * 1e6);
    fmt::print("\n");
  }
  for (int i = 0; i < c.gpus_per_node() && !c.nics().empty(); ++i)
    if (c.nic_of(i) >= 0) {
      const Nic& nic = c.nics()[std::size_t(c.nic_of(i))];
      fmt::print("    gpu{} -> {} ({:.1f} GB/s{})\n", i, nic.name, nic.bandwidth / 1e9,
                 nic.staging_memory.empty() ? ", GPUDirect RDMA" : ", staged through host memory " + nic.staging_memory);
    }
  std::string ring;
  for (int g : c.ring_order()) ring += fmt::format(" {}", g);
  fmt::print("  ring order inside a node:{}; {} ring channel(s), entering a node at", ring, c.ring_channels());
  for (int ch = 0; ch < c.ring_channels(); ++ch) fmt::print(" gpu{}", c.ring_order()[std::size_t(c.channel_entry(ch))]);
  fmt::print("\n");
  fmt::print("  node uplink {:.1f} GB/s; fabric: {} nodes per leaf, {} spines\n", c.node_uplink_bandwidth() / 1e9,
             s.fabric().nodes_per_leaf(), s.fabric().spines());
  return 0;
}

}  // namespace

void add_platform(CLI::App& app, Commands& commands) {
  auto* platform = app.add_subcommand("platform", "The cluster catalog");
  platform->require_subcommand(1);
  auto name = std::make_shared<std::string>();
  auto* list = platform->add_subcommand("list", "List the catalog's platforms");
  commands.push_back({list, [] {
                        for (const auto& n : platform_names()) fmt::print("{:<16} {}\n", n, load_platform(n).description());
                        return 0;
                      }});
  auto* show_cmd = platform->add_subcommand("show", "Show a platform: GPUs, routes inside a node, NICs, fabric");
  show_cmd->add_option("name", *name, "Catalog name or .textproto path")->required();
  commands.push_back({show_cmd, [name] { return show(*name); }});
  auto* export_cmd = platform->add_subcommand("export", "Print a platform's text format");
  export_cmd->add_option("name", *name, "Catalog name or .textproto path")->required();
  commands.push_back({export_cmd, [name] {
                        fmt::print("{}", to_text(load_platform(*name)));
                        return 0;
                      }});
}

}  // namespace moesim::cli
