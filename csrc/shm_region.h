// The shared-memory transport between front-end worker processes and the one engine process
// (issue 27): one memfd region that every process maps at its own address, so everything in
// it is named by its offset from the region's start.
//
//   [RegionHeader]  magic, version, sizes; the engine's Doorbell
//   [worker 0]      WorkerHeader (the worker's Doorbell) | request ring | reply ring |
//                   slab pool to the engine | slab pool to the worker
//   [worker 1] ...  (every worker area has the same size; offsets follow from the Geometry)
//
// Request ring: many producers (a worker's threads or callbacks), one consumer (the engine).
// Reply ring: one producer (the engine), one consumer (the worker). A full ring is
// back-pressure: push returns false and nothing is lost or overwritten.
// Slab pools: blocks of a few fixed size classes, each class's free blocks kept as indices in
// an MPMC ring (so allocating and freeing are lock-free from any process, with no ABA problem).
// Tensor bytes are written once by the side that allocates the block and read in place by the
// other, which frees the block when it is done. Each direction has its own pool, so a flood of
// requests cannot take the blocks replies need.
// Wake-ups: the engine's Doorbell (one for every request ring: it sleeps once for all) and one
// per worker for its reply ring; eventfds created with the region, passed with its memfd.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "request.h"
#include "shm_ring.h"

namespace seqserve::shm {

constexpr uint64_t kRegionMagic = 0x53474e4952515353ull;  // "SSQRINGS", little-endian
constexpr uint32_t kRegionVersion = 2;  // 2: request records carry a client key and a slow flag
constexpr int kMaxWorkers = 256;
constexpr int kMaxSlabClasses = 8;
constexpr uint32_t kMaxRingSlots = 1u << 20;
constexpr uint32_t kMaxRecordBytes = 1u << 16;
constexpr uint32_t kMaxBlocksPerClass = 1u << 20;

struct SlabClass {
  uint64_t block_bytes = 0;  // a multiple of 64
  uint32_t blocks = 0;
  uint32_t reserved = 0;
};

// Everything the layout follows from; both sides compute the same offsets from it.
struct Geometry {
  uint32_t workers = 1;
  uint32_t request_slots = 1024;       // a power of two
  uint32_t request_record_bytes = 1008;  // the largest request record
  uint32_t reply_slots = 1024;         // a power of two
  uint32_t reply_record_bytes = 1008;  // the largest reply record
  uint32_t class_count = 0;            // slab classes, smallest first
  SlabClass classes[kMaxSlabClasses];  // the same classes in both directions of every worker
};

// Empty when the geometry is usable, else why not.
std::string check_geometry(const Geometry& g);

struct RegionHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t total_bytes;
  uint64_t worker_bytes;
  Geometry geometry;
  Doorbell engine;  // the engine's: rung by any worker that publishes a request
};

struct WorkerHeader {
  Doorbell worker;  // the worker's: rung by the engine when it publishes a reply
};

// Which way a slab pool's tensors travel (who allocates; the other side reads and frees).
enum class Direction : int { kToEngine = 0, kToWorker = 1 };

// A tensor in a slab block, as a record names it. offset: from the region's start.
struct SlabTensor {
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint32_t index = 0;  // which input (or output) of the model, in config order
  int ndim = 0;
  int64_t shape[kMaxRank] = {};
};

// Request records: what a worker sends the engine.
enum RecordKind : uint32_t {
  kSubmit = 1,  // queue the request (header, string id, inputs)
  kCancel = 2,  // the client is gone: header.handle names the request; no inputs
};

struct RequestRecord {
  uint32_t target = 0;  // the engine's number for the model (scheduler) it is for
  uint32_t kind = kSubmit;
  // The worker asks for the engine's Python path (a stream-scoped sequence, a traced request:
  // anything the compiled path does not do). Encoded as a bit beside the kind.
  bool slow = false;
  uint64_t client = 0;  // sessions: whom its tombstones count against (0: the shared key)
  RequestHeader header;
  std::string_view string_id;     // in the ring's cell: valid during the drain callback only
  std::vector<SlabTensor> inputs;  // reused from record to record
};

// Reply records: what the engine sends back.
enum ReplyFlag : uint32_t {
  kReplyError = 1u << 0,  // code and error say why; no outputs
  kReplyFinal = 1u << 1,  // the last reply for this handle (decoupled models send several)
  kReplyBacklogFull = 1u << 2,  // a refusal by admission control: worth retrying later
  kReplyReleased = 1u << 3,     // a refusal: the sequence was checkpointed and released from here
};
// Bits 8..31 of a refusal's flags: how long it lasts, in ms (0: not said).
constexpr int kReplyRetryShift = 8;
constexpr uint32_t kReplyRetryMaxMs = (1u << 24) - 1;

struct ReplyRecord {
  uint64_t handle = 0;
  uint32_t flags = kReplyFinal;
  int32_t code = 0;              // a Code when kReplyError
  std::string_view error;        // truncated to what fits in a record
  std::vector<SlabTensor> outputs;
};

// Encoded sizes (records are 8-byte aligned pieces: prefix, header, id bytes, tensors).
uint32_t request_record_size(const RequestRecord& r);
uint32_t reply_record_size(const ReplyRecord& r);  // with the error as given (before truncation)

// One worker's blocks in one direction. A view onto shared memory; cheap to copy.
class SlabPool {
 public:
  SlabPool() = default;
  SlabPool(uint8_t* region, uint64_t offset, const Geometry& g);
  static uint64_t bytes_for(const Geometry& g);
  void format();

  // A block of at least nbytes (the smallest class that has a free one), as its region offset;
  // 0 when none is free (back-pressure) or nbytes exceeds the largest class.
  uint64_t alloc(uint64_t nbytes);
  // Returns a block. False when `offset` is not an allocated block's start in this pool.
  bool free(uint64_t offset);
  // Whether [offset, offset + nbytes) lies in one allocated block of this pool.
  bool holds(uint64_t offset, uint64_t nbytes) const;
  uint64_t free_blocks() const;

 private:
  struct Class {
    uint64_t block_bytes = 0, blocks_at = 0;  // blocks_at: the region offset of block 0
    uint32_t blocks = 0;
    uint64_t ring_at = 0, state_at = 0;       // its free-index ring, its blocks' states
  };
  ShmRing free_ring(const Class& c) const;
  const Class* class_of(uint64_t offset, uint32_t* index) const;
  std::atomic<uint32_t>* state(const Class& c, uint32_t i) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(region_ + c.state_at) + i;
  }

  uint8_t* region_ = nullptr;
  int count_ = 0;
  Class classes_[kMaxSlabClasses];
};

class Region {
 public:
  // A new region (memfd, sized and formatted) and its eventfds; throws std::runtime_error.
  static std::unique_ptr<Region> create(const Geometry& g);
  // Maps a region another process created. Takes ownership of the descriptors (closed with the
  // Region); checks magic, version, size and layout; throws std::runtime_error.
  static std::unique_ptr<Region> attach(int memfd, int engine_eventfd, const std::vector<int>& worker_eventfds);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  int fd() const { return memfd_; }
  int engine_eventfd() const { return engine_efd_; }
  int worker_eventfd(int w) const { return worker_efds_[w]; }
  const Geometry& geometry() const { return geometry_; }  // this process's copy, checked
  int workers() const { return static_cast<int>(geometry().workers); }
  uint64_t bytes() const { return bytes_; }
  uint8_t* base() const { return base_; }

  ShmRing request_ring(int w) const {
    return ShmRing(base_ + worker_at(w) + request_ring_at_, geometry_.request_slots,
                   ShmRing::cell_bytes_for(geometry_.request_record_bytes));
  }
  ShmRing reply_ring(int w) const {
    return ShmRing(base_ + worker_at(w) + reply_ring_at_, geometry_.reply_slots,
                   ShmRing::cell_bytes_for(geometry_.reply_record_bytes));
  }
  SlabPool pool(int w, Direction d) const;
  Doorbell& engine_doorbell() const { return header()->engine; }
  Doorbell& worker_doorbell(int w) const { return reinterpret_cast<WorkerHeader*>(base_ + worker_at(w))->worker; }

  // ---- worker side
  // Publishes a request record on worker w's ring and rings the engine if it sleeps (wake: else
  // the caller calls wake_engine once it has published a burst). False when the ring is full;
  // throws std::invalid_argument when the record cannot fit any cell.
  bool push_request(int w, const RequestRecord& r, bool wake = true);
  void wake_engine() { notify(engine_doorbell(), engine_efd_); }
  // Hands fn(const ReplyRecord&) each reply now on w's ring, oldest first, at most `max`, in
  // place (valid during the call); returns how many. Malformed records are skipped and counted
  // (malformed()). One consumer thread per worker.
  size_t drain_replies(int w, const std::function<void(const ReplyRecord&)>& fn, size_t max = SIZE_MAX);
  Wake wait_replies(int w, int timeout_ms);
  // For an event loop watching worker_eventfd(w): see shm::arm. True: replies are there now.
  bool arm_replies(int w);

  // ---- engine side
  // Hands fn(worker, record) every request now on the workers' rings (at most max_per_worker
  // from each, round robin, so no worker starves the others); returns how many. The record and
  // its string id are valid during the call only; input bytes stay valid in their slab blocks
  // until the engine frees them (pool(w, kToEngine).free). Inputs are checked to lie in
  // worker w's to-engine blocks; malformed records are skipped and counted.
  template <class Fn>
  size_t drain_requests(Fn&& fn, size_t max_per_worker = SIZE_MAX) {
    size_t n = 0;
    for (int w = 0; w < workers(); ++w) {
      size_t k = 0;
      while (k < max_per_worker && pop_request(w, fn)) ++k;
      n += k;
    }
    return n;
  }
  // One record from worker w's ring, handed to fn(w, record) in place; false when there was
  // none. A malformed record is skipped (counted) and the next one taken.
  template <class Fn>
  bool pop_request(int w, Fn&& fn) {
    ShmRing ring = request_ring(w);
    for (;;) {
      bool ok = false;
      const bool popped = ring.pop([&](const uint8_t* p, uint32_t len) {
        ok = decode_request(w, p, len, scratch_request_);
        if (ok) fn(w, static_cast<const RequestRecord&>(scratch_request_));
      });
      if (!popped) return false;
      if (ok) return true;
      ++malformed_;
    }
  }
  bool has_requests() const;
  Wake wait_requests(int timeout_ms);
  // Lays worker w's rings, doorbell and both slab pools out afresh, as create() did: every
  // record and block of that worker is gone. For a worker that died, before its replacement
  // attaches. Precondition: no thread or process uses worker w's rings or pools meanwhile (the
  // engine's drain thread included) and the engine holds nothing of it (no request queued or
  // running whose blocks it would free later).
  void reset_worker(int w);
  // Publishes a reply on w's ring and rings the worker if it sleeps (wake: else the caller
  // calls wake_worker once it has published a burst). False when full.
  bool push_reply(int w, const ReplyRecord& r, bool wake = true);
  void wake_worker(int w) { notify(worker_doorbell(w), worker_efds_[w]); }

  // Bytes at a region offset, checked to lie in the region; nullptr otherwise.
  uint8_t* at(uint64_t offset, uint64_t nbytes) const {
    return offset <= bytes_ && nbytes <= bytes_ - offset ? base_ + offset : nullptr;
  }
  uint64_t malformed() const { return malformed_; }

 private:
  Region() = default;
  void lay_out();  // the offsets, from geometry_
  RegionHeader* header() const { return reinterpret_cast<RegionHeader*>(base_); }
  uint64_t worker_at(int w) const { return header_bytes_ + uint64_t(w) * worker_bytes_; }
  void format_worker(int w);
  bool decode_request(int w, const uint8_t* p, uint32_t len, RequestRecord& out) const;
  bool decode_reply(int w, const uint8_t* p, uint32_t len, ReplyRecord& out) const;
  bool decode_tensors(const uint8_t* p, const uint8_t* end, uint32_t count, std::vector<SlabTensor>& out,
                      const SlabPool& pool) const;

  Geometry geometry_;
  int memfd_ = -1, engine_efd_ = -1;
  std::vector<int> worker_efds_;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t header_bytes_ = 0, worker_bytes_ = 0;
  uint64_t request_ring_at_ = 0, reply_ring_at_ = 0, to_engine_at_ = 0, to_worker_at_ = 0;  // in a worker area
  RequestRecord scratch_request_;  // the engine's: the record a drain decodes into
  ReplyRecord scratch_reply_;      // the worker's
  uint64_t malformed_ = 0;
};

}  // namespace seqserve::shm
