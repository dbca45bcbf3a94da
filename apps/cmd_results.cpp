// moesim results export|merge: sweep results databases.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "command.hpp"
#include "errors.hpp"
#include "results_db.hpp"

namespace moesim::cli {
namespace {

// The database as CSV to stdout or to a file written whole (nothing half-written on failure).
int export_db(const std::string& db_path, const std::string& out, bool iterations) {
  const ResultsDb db(db_path, false);
  if (out.empty()) {
    db.export_csv(std::cout, iterations);
    return 0;
  }
  const std::string tmp = out + ".tmp";
  try {
    std::ofstream f(tmp);
    if (!f) throw InputError("-o " + out + ": cannot write there (does its folder exist?)");
    db.export_csv(f, iterations);
    if (!f.flush()) throw InputError("-o " + out + ": writing failed (disk full?)");
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::filesystem::rename(tmp, out);
  return 0;
}

}  // namespace

void add_results(CLI::App& app, Commands& commands) {
  auto* results = app.add_subcommand("results", "Sweep results databases: export, merge");
  results->require_subcommand(1);
  struct Options {
    std::string db, out, merged;
    std::vector<std::string> inputs;
    bool csv = true, iterations = false;
  };
  auto* exp = results->add_subcommand("export", "Write a results.db as CSV (one row per point and variant)");
  auto o = std::make_shared<Options>();
  exp->add_option("db", o->db, "The results database")->required();
  exp->add_flag("--csv", o->csv, "CSV (the only format; for the reader's clarity)");
  exp->add_flag("--iterations", o->iterations, "One row per iteration instead of per run");
  exp->add_option("--out,-o", o->out, "Output file (default: stdout)");
  commands.push_back({exp, [o] { return export_db(o->db, o->out, o->iterations); }});
  auto* merge = results->add_subcommand("merge", "Combine shard databases of one sweep into a new one");
  merge->add_option("out", o->merged, "The database to create")->required();
  merge->add_option("inputs", o->inputs, "Shard databases")->required();
  commands.push_back({merge, [o] {
                        const int n = merge_results(o->merged, o->inputs);
                        fmt::print("{}: {} points from {} databases\n", o->merged, n, o->inputs.size());
                        return 0;
                      }});
}

}  // namespace moesim::cli
