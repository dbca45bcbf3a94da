// Skipping a test case that needs what this machine lacks (the shared traces, gnuplot).
#pragma once
#include <string>

namespace moesim::test {

/// Whether the running test case was skipped: main.cpp clears it before each case and lets a
/// skipped case pass without assertions (any other such case fails).
inline bool case_skipped = false;

/// Skips the running test case: warns "skipped: REASON" and sets case_skipped. The caller returns.
void skip(const std::string& reason);

}  // namespace moesim::test
