// The shared pieces of the command line (command.hpp): the command as typed, the progress line.
#include <fmt/format.h>

#include <cstdio>

#include "command.hpp"

namespace moesim::cli {

std::string Invocation::command(bool drop_quiet) const {
  std::string out = "moesim";
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (drop_quiet && (word == "-q" || word == "--quiet")) continue;
    for (char& ch : word)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
    out += " " + word;
  }
  return out;
}

void Progress::operator()(int done, int total, const std::string& detail) const {
  const double s = elapsed();
  show(done, total, detail, s, done > 0 ? s / done * (total - done) : 0);
}

void Progress::show(int done, int total, const std::string& detail, double elapsed_s, double eta_s) const {
  if (quiet_ || total <= 0) return;
  fmt::print(stderr, "\r  {} {}/{}{}  {:.1f} s elapsed, ETA {:.1f} s   ", what_, done, total, detail, elapsed_s, eta_s);
  if (done == total) fmt::print(stderr, "\n");
}

}  // namespace moesim::cli
