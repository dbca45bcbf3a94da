#include "host_comm.hpp"

#include <chrono>
#include <stdexcept>

#include <fmt/format.h>

#include "errors.hpp"

namespace moesim::hw {

void HostComm::send(int from, int to, long tag, std::vector<float> data) {
  {
    std::lock_guard lock(m_);
    bytes_ += double(data.size() * sizeof(float));
    queues_[{from, to, tag}].push_back(std::move(data));
  }
  cv_.notify_all();
}

std::vector<float> HostComm::recv(int to, int from, long tag, const std::string& what) {
  std::unique_lock lock(m_);
  auto& q = queues_[{from, to, tag}];
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return !q.empty(); }))
    throw MachineError(fmt::format("host device: rank {} waited {} s for {} from rank {}", to, timeout_s_, what, from));
  std::vector<float> data = std::move(q.front());
  q.pop_front();
  return data;
}

double HostComm::bytes_sent() const {
  std::lock_guard lock(m_);
  return bytes_;
}

}  // namespace moesim::hw
