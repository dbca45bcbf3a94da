// The moesim command line, one file per subcommand (cmd_<name>.cpp): each add_<name>() declares
// its options on the app and registers what runs when it is chosen; main() (moesim.cpp) parses,
// runs the chosen one, and turns errors into exit statuses (0 success, 2 bad input, 1 internal
// failure). The work itself lives in the libraries.
#pragma once
#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace moesim::cli {

/// The process's arguments, for commands that echo how they were called.
struct Invocation {
  int argc = 0;
  char** argv = nullptr;
  /// The command as typed, "moesim ..." (written into files: control characters become spaces),
  /// without -q / --quiet when `drop_quiet`.
  std::string command(bool drop_quiet = false) const;
};

/// A subcommand and what it does when the command line chose it; returns the exit status.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

/// Progress of long work on stderr, one line rewritten in place: "  what done/total ...  elapsed,
/// ETA" (nothing when quiet); a newline once done == total.
class Progress {
 public:
  Progress(bool quiet, std::string what) : quiet_(quiet), what_(std::move(what)), t0_(std::chrono::steady_clock::now()) {}
  /// `detail` follows the count ("(3 running)"); the ETA assumes the rest goes as fast as what is done.
  void operator()(int done, int total, const std::string& detail = "") const;
  /// The same line with the caller's own clock (a resumed sweep counts only this run's points).
  void show(int done, int total, const std::string& detail, double elapsed_s, double eta_s) const;
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  bool quiet_;
  std::string what_;
  std::chrono::steady_clock::time_point t0_;
};

void add_run(CLI::App& app, Commands& commands);
void add_platform(CLI::App& app, Commands& commands);
void add_algorithms(CLI::App& app, Commands& commands);
void add_compare(CLI::App& app, Commands& commands);
void add_timeline(CLI::App& app, Commands& commands);
void add_calibrate(CLI::App& app, Commands& commands, const Invocation& invocation);
void add_collective(CLI::App& app, Commands& commands);
void add_plot(CLI::App& app, Commands& commands);
void add_report(CLI::App& app, Commands& commands, const Invocation& invocation);
void add_sweep(CLI::App& app, Commands& commands, const Invocation& invocation);
void add_results(CLI::App& app, Commands& commands);
void add_trace(CLI::App& app, Commands& commands);

}  // namespace moesim::cli
