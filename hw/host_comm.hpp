// Threads as ranks, memcpy as transport: tagged point-to-point messages between the host device's
// ranks (what ncclSend/ncclRecv are on GPUs). A receive waits for the matching send, with a timeout
// that names what it waited for.
#pragma once
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace moesim::hw {

class HostComm {
 public:
  explicit HostComm(double timeout_s = 60) : timeout_s_(timeout_s) {}
  /// Posts `data` from rank `from` to rank `to` (it is copied: the sender may reuse its buffer).
  void send(int from, int to, long tag, std::vector<float> data);
  /// The oldest message from `from` to `to` with this tag; `what` names it in a timeout's message.
  std::vector<float> recv(int to, int from, long tag, const std::string& what);
  /// Bytes sent so far (all ranks).
  double bytes_sent() const;

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, long>, std::deque<std::vector<float>>> queues_;
  double timeout_s_, bytes_ = 0;
};

}  // namespace moesim::hw
