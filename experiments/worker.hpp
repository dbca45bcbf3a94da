// Worker processes. SimGrid allows one engine per process, so everything that simulates several
// experiments (a sweep's points, the report's missing experiments) runs each in a forked child.
#pragma once
#include <functional>
#include <string>
#include <sys/types.h>

namespace moesim {

/// Forks a child that runs `work` and exits 0, or, when `work` throws, writes the message to
/// `error_file` and exits 1. The child dies with its parent (a killed sweep leaves no orphans).
pid_t fork_worker(const std::function<void()>& work, const std::string& error_file);

/// Waits for `pid`; "" when it exited 0, else why it failed (the error file's message, or how it
/// ended), removing the error file.
std::string wait_worker(pid_t pid, const std::string& error_file);

/// Waits for whichever child ends first: its pid, and its wait status in `status`.
pid_t wait_any_worker(int& status);

/// Why a child with wait status `status` failed ("" when it exited 0), from its error file if any.
std::string worker_failure(int status, const std::string& error_file);

}  // namespace moesim
