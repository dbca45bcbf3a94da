// The suite's main: Catch2's, and a test case that checks nothing fails. CTest runs each case by
// its name with `-w NoTests` (tests/CMakeLists.txt), so a name that matches nothing fails; Catch v2
// takes one `-w`, and this listener is the other half: a case that ran and made no assertion
// (a loop over an empty list, a branch not taken) is a failure, not a pass, unless it was skipped
// (test::skip: the shared traces or gnuplot absent).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

std::vector<std::string> without_assertions;

struct RequireAssertions : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    moesim::test::case_skipped = false;
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (stats.totals.assertions.total() == 0 && !moesim::test::case_skipped) without_assertions.push_back(stats.testInfo.name);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(RequireAssertions)

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  for (const auto& name : without_assertions) std::fprintf(stderr, "test case without assertions: %s\n", name.c_str());
  return failed ? failed : without_assertions.empty() ? 0 : 1;
}
