// moesim algorithms: the collective algorithms (collectives.def) and the policies (policies.def).
#include <fmt/format.h>

#include "collectives/collectives.hpp"
#include "command.hpp"
#include "policy.hpp"

namespace moesim::cli {

void add_algorithms(CLI::App& app, Commands& commands) {
  auto* algorithms = app.add_subcommand("algorithms", "List the collective algorithms and policies");
  commands.push_back({algorithms, [] {
                        for (const auto* a : collective_algorithms())
                          fmt::print("{:<15} {:<20} {}\n", collective_type_name(a->type), a->name, a->summary);
                        for (const auto& p : policy_names()) fmt::print("{:<15} {:<20} {}\n", "policy", p, policy_summary(p));
                        return 0;
                      }});
}

}  // namespace moesim::cli
