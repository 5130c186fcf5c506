// A request on its way into the core (RequestHeader + one TensorRef per input), and as the
// core holds it (Request): raw pointers to the caller's input buffers (the Python request
// object that owns them stays alive until its completion), pooled so that a steady-state step
// allocates nothing.
#pragma once

#include <memory>
#include <string_view>
#include <type_traits>
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

// The scalars of one request as a front-end hands it to the core, by name. Fixed layout, plain
// fields, trivially copyable: it is meant to cross a process boundary by copy. A front-end
// worker process (issue 27) writes it as the fixed head of one record in a shared-memory
// request ring, followed by a string sequence id's bytes (string_id_bytes of them) and by
// input_count tensor descriptors whose data lie in shared-memory slabs. Tensors are never part
// of the header: in-process they are TensorRefs onto the caller's buffers. The binding fills a
// header from Python's RequestHeader; Request::take_header reads it, once.
enum RequestFlag : uint32_t {
  kFlagStart = 1u << 0,     // the sequence's START
  kFlagEnd = 1u << 1,       // the sequence's END
  kFlagSession = 1u << 2,   // named by a session: START is implied when the id is not live
  kFlagStringId = 1u << 3,  // the sequence id is a string (its bytes follow the header)
};

struct RequestHeader {
  uint64_t handle = 0;           // the caller's name for the request: answers and cancel() use it
  uint64_t sequence_id = 0;      // a numeric sequence id (0: none); unused with kFlagStringId
  uint64_t timeout_us = 0;       // queue timeout (0: the queue policy's default)
  int64_t rows = 1;              // batch rows the request occupies
  int32_t priority = 0;          // priority level (0: the model's default)
  uint32_t flags = 0;            // RequestFlag bits
  uint32_t string_id_bytes = 0;  // length of a string sequence id
  uint32_t input_count = 0;      // tensor descriptors that go with it (one per configured input)

  bool has(RequestFlag f) const { return (flags & f) != 0; }
};
static_assert(std::is_trivially_copyable<RequestHeader>::value && std::is_standard_layout<RequestHeader>::value,
              "a RequestHeader is copied byte for byte across processes");
static_assert(sizeof(RequestHeader) == 48, "the ring's record layout assumes a 48-byte header");

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
  uint64_t client = 0;       // sessions: whom its tombstone counts against (tombstones.h)
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

  // Takes the header's scalars (a string sequence id's bytes given apart); the pool's request
  // keeps its index and its inputs' storage.
  void take_header(const RequestHeader& h, std::string_view string_id) {
    handle = h.handle;
    start = h.has(kFlagStart);
    end = h.has(kFlagEnd);
    session = h.has(kFlagSession);
    timeout_ns = static_cast<int64_t>(h.timeout_us) * 1000;
    rows = h.rows;
    id.is_str = h.has(kFlagStringId);
    id.num = id.is_str ? 0 : h.sequence_id;
    id.str.assign(id.is_str ? string_id : std::string_view());
  }
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
    r->client = 0;
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
