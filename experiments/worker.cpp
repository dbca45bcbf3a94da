#include "worker.hpp"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace moesim {
namespace fs = std::filesystem;

pid_t fork_worker(const std::function<void()>& work, const std::string& error_file) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid > 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int rc = 0;
  try {
    work();
  } catch (const std::exception& e) {
    std::ofstream(error_file) << e.what();
    rc = 1;
  }
  std::fflush(nullptr);
  std::_Exit(rc);  // no atexit handlers, no SimGrid teardown: the results are on disk
}

std::string worker_failure(int status, const std::string& error_file) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  std::string why = WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                        : fmt::format("exited with status {}", WEXITSTATUS(status));
  if (fs::exists(error_file)) {
    std::stringstream text;
    text << std::ifstream(error_file).rdbuf();
    why = text.str();
  }
  fs::remove(error_file);
  return why;
}

namespace {

// waitpid() for `pid` (-1: any child), again when a signal interrupts it.
pid_t wait_child(pid_t pid, int& status) {
  pid_t ended;
  while ((ended = ::waitpid(pid, &status, 0)) < 0)
    if (errno != EINTR) throw std::runtime_error(fmt::format("waitpid failed: {}", std::strerror(errno)));
  return ended;
}

}  // namespace

pid_t wait_any_worker(int& status) { return wait_child(-1, status); }

std::string wait_worker(pid_t pid, const std::string& error_file) {
  int status = 0;
  wait_child(pid, status);
  return worker_failure(status, error_file);
}

}  // namespace moesim
