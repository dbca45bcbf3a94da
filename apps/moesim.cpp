// The moesim command line: each subcommand is a cmd_<name>.cpp (command.hpp); main() parses,
// runs the chosen one, and turns errors into exit statuses: 0 success, 2 bad input (a message
// naming the file, line and field), 1 a machine or internal failure.
#include <fmt/format.h>
#include <google/protobuf/stubs/logging.h>

#include <cstdio>

#include "allocator.hpp"
#include "command.hpp"
#include "errors.hpp"
#include "hw_info.hpp"

using namespace moesim;

int main(int argc, char** argv) {
  use_large_pages();
  // Every parse failure reaches the user as our own message (file, line, field); protobuf's log
  // lines would only repeat it less clearly.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  CLI::App app{
      "moesim: simulate distributed Mixture-of-Experts training on GPU clusters.\n"
      "A policy (expert parallelism, shadowing, ...) turns each iteration's token routing into a graph of\n"
      "compute and communication ops; SimGrid times it on a model of the cluster.\n\n"
      "  moesim run                          the default experiment (64 simulated A100s)\n"
      "  moesim run my.textproto --out res   an experiment of yours (schema: proto/moesim.proto)\n"
      "  moesim run experiments/fastermoe/fig13-johnny.textproto   a paper's figure: paper.md compares\n"
      "  moesim run --set policy.name=fastermoe --set cluster.nodes=4   any field, from the command line\n"
      "  moesim trace import|gen|stats|rescale|export ...   gating traces\n"
      "  moesim platform list                the cluster catalog; `moesim algorithms` the policies\n",
      "moesim"};
  app.require_subcommand(1);
  // A callback: the description loads the CUDA module (hw_info.hpp), which no other command pays for.
  app.set_version_flag("--version", [] { return "moesim 0.1.0; hw backend: " + hw_backend_description(); });
  const cli::Invocation invocation{argc, argv};
  cli::Commands commands;
  cli::add_run(app, commands);
  cli::add_platform(app, commands);
  cli::add_algorithms(app, commands);
  cli::add_compare(app, commands);
  cli::add_timeline(app, commands);
  cli::add_calibrate(app, commands, invocation);
  cli::add_collective(app, commands);
  cli::add_plot(app, commands);
  cli::add_report(app, commands, invocation);
  cli::add_sweep(app, commands, invocation);
  cli::add_results(app, commands);
  cli::add_trace(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    for (const auto& command : commands)
      if (command.app->parsed()) return command.run();
  } catch (const InputError& e) {
    fmt::print(stderr, "moesim: error: {}\n", e.what());
    return 2;
  } catch (const MachineError& e) {
    fmt::print(stderr, "moesim: machine error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moesim: internal error: {}\n", e.what());
    return 1;
  }
  return 0;
}
