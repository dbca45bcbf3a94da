#include <fmt/format.h>

#include <cstdio>

#include "command.hpp"

namespace moesim::cli {

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
