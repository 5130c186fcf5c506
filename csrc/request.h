// A request as the core holds it: raw pointers to the caller's input buffers (the Python
// request object that owns them stays alive until its completion), pooled so that a
// steady-state step allocates nothing.
#pragma once

#include <memory>
#include <vector>

#include "common.h"

namespace seqserve {

constexpr int kMaxRank = 16;

struct TensorRef {
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int ndim = 0;
  int64_t shape[kMaxRank] = {};
};

// kForceEnd: idle expiry frees the slot silently; kNotify: idle expiry runs one final END step.
enum ReqKind : uint8_t { kNormal = 0, kForceEnd = 1, kNotify = 2 };

struct Request {
  uint64_t handle = 0;       // the caller's; 0 while the request is in the pool
  uint32_t index = 0;        // its place in the pool: the token submit() returns for cancel()
  bool cancelled = false;    // the client is gone: dropped where batch forming meets it
  uint64_t backlog = 0;      // sequences: the serial of the backlogged sequence it waits in (0: none)
  CorrId id;
  bool start = false, end = false;
  bool session = false;      // sequence models: START is implied when the id is not live
  uint8_t kind = kNormal;
  int64_t arrival_ns = 0;
  int64_t timeout_ns = 0;
  int64_t rows = 1;
  int level = 0;             // kDynamic: priority queue index
  int64_t deadline_ns = 0;   // kDynamic: queue timeout (0: none)
  bool expired = false;      // kDynamic: moved behind its level after a DELAY timeout
  int slot = -1;             // kOldest: the instance-local slot it came from
  int64_t handoff_ns = 0;    // kOldest: when it reached the instance's batcher
  std::vector<TensorRef> inputs;
};

// One row of a batch: a request, or padding (nullptr) in a sequence slot's position.
struct Row {
  Request* req = nullptr;
  int slot = 0;
};

// Requests waiting to be batched (in a slot or a queue), and waiting in the backlog for a slot.
struct QueueCounts {
  int64_t queued = 0, backlogged = 0;
};

// Requests are reused, never freed while the scheduler lives. Not thread-safe: callers hold the
// scheduler lock.
class RequestPool {
 public:
  Request* take() {
    if (free_.empty()) {
      owned_.push_back(std::make_unique<Request>());
      owned_.back()->index = static_cast<uint32_t>(owned_.size() - 1);
      return owned_.back().get();
    }
    Request* r = free_.back();
    free_.pop_back();
    return r;
  }
  void give(Request* r) {
    r->handle = 0;
    r->cancelled = false;
    r->backlog = 0;
    r->kind = kNormal;
    r->start = r->end = false;
    r->session = false;
    r->timeout_ns = 0;
    r->rows = 1;
    r->level = 0;
    r->deadline_ns = 0;
    r->expired = false;
    r->slot = -1;
    r->inputs.clear();
    free_.push_back(r);
  }
  // The queued or running request behind a cancel() token, if `handle` still owns it.
  Request* find(uint32_t index, uint64_t handle) {
    if (handle == 0 || index >= owned_.size()) return nullptr;
    Request* r = owned_[index].get();
    return r->handle == handle ? r : nullptr;
  }

 private:
  std::vector<Request*> free_;
  std::vector<std::unique_ptr<Request>> owned_;
};

}  // namespace seqserve
