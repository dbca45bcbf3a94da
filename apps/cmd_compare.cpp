// moesim compare: two runs (or two variants of one) side by side, phase and op by op.
#include <fmt/format.h>

#include "command.hpp"
#include "compare.hpp"

namespace moesim::cli {

void add_compare(CLI::App& app, Commands& commands) {
  auto* compare = app.add_subcommand(
      "compare",
      R"(Two runs side by side: iteration time, critical-path phases, op classes, the ops that differ most
  moesim run experiments/hw/moe-small.textproto --out sim-out
  moesim run experiments/hw/moe-small.textproto --backend hw --out gpu-out
  moesim compare sim-out gpu-out
  moesim compare moesim-out moesim-out --a-variant ep --b-variant hecate   two variants of one run)");
  struct Options {
    std::string a, b;
    CompareOptions compare;
  };
  auto o = std::make_shared<Options>();
  compare->add_option("A", o->a, "A results directory (or its summary.json)")->required();
  compare->add_option("B", o->b, "Another, of the same spec")->required();
  compare->add_option("--top", o->compare.top_ops, "How many of the most different ops to list")->capture_default_str();
  compare->add_option("--a-variant", o->compare.a_variant,
                      "Compare this variant of A (with --b-variant: two variants, of one run when A and B are the same)");
  compare->add_option("--b-variant", o->compare.b_variant, "... with this variant of B");
  commands.push_back({compare, [o] {
                        fmt::print("{}", compare_runs(o->a, o->b, o->compare));
                        return 0;
                      }});
}

}  // namespace moesim::cli
