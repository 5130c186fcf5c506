// The two lock-free pieces of the worker <-> engine transport (issue 27), both living in a
// shared-memory region that several processes map (shm_region.h lays them out):
//
// ShmRing: a bounded ring of fixed-size cells, each holding one record of up to
// max_payload() bytes. It is Dmitry Vyukov's bounded MPMC queue: every cell carries a sequence
// number that says whose turn it is, so producers claim a position with one CAS on `tail`,
// fill the cell in place and publish it with one release store; the consumer reads the cell in
// place and hands it back with one release store. Nothing is ever overwritten: a producer that
// finds the cell of its position still unread reports "full" (back-pressure) instead.
// Positions are 64-bit and never wrap in practice.
//
// Doorbell: how a consumer sleeps without losing a wake-up (see sleep_until and notify).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace seqserve::shm {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "atomics shared between processes must be lock-free (address-free)");

constexpr size_t kCacheLine = 64;

inline constexpr uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
inline constexpr bool is_pow2(uint64_t n) { return n && (n & (n - 1)) == 0; }

// At the start of a ring's bytes; its cells follow. Producers and the consumer write different
// cache lines.
struct RingHeader {
  alignas(kCacheLine) std::atomic<uint64_t> tail;  // the next position a producer claims
  alignas(kCacheLine) std::atomic<uint64_t> head;  // the next position the consumer reads
  alignas(kCacheLine) uint32_t slots;              // a power of two
  uint32_t cell_bytes;                             // a multiple of 16, cell head included
};

struct CellHead {
  std::atomic<uint64_t> seq;  // == position: free for the producer of that position;
                              // == position + 1: published, for the consumer
  uint32_t length;            // payload bytes
  uint32_t reserved;
};
static_assert(sizeof(CellHead) == 16, "a cell's payload starts 16 bytes in");

class ShmRing {
 public:
  ShmRing() = default;
  // slots and cell_bytes come from this process's own copy of the layout, never from the shared
  // header: another process scribbling on the region cannot send this one out of bounds.
  ShmRing(uint8_t* at, uint32_t slots, uint32_t cell_bytes)
      : h_(reinterpret_cast<RingHeader*>(at)), slots_(slots), cell_bytes_(cell_bytes) {}

  static uint32_t cell_bytes_for(uint32_t max_payload) {
    return static_cast<uint32_t>(round_up(sizeof(CellHead) + max_payload, 16));
  }
  static uint64_t bytes_for(uint32_t slots, uint32_t cell_bytes) {
    return round_up(sizeof(RingHeader) + uint64_t(slots) * cell_bytes, kCacheLine);
  }
  // Lays out an empty ring at `at` (the creator does this once, before anyone attaches).
  static void format(uint8_t* at, uint32_t slots, uint32_t cell_bytes) {
    auto* h = new (at) RingHeader();
    h->tail.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    h->slots = slots;
    h->cell_bytes = cell_bytes;
    for (uint32_t i = 0; i < slots; ++i) {
      auto* c = new (at + sizeof(RingHeader) + uint64_t(i) * cell_bytes) CellHead();
      c->seq.store(i, std::memory_order_relaxed);
      c->length = 0;
    }
  }

  uint32_t slots() const { return slots_; }
  uint32_t max_payload() const { return cell_bytes_ - sizeof(CellHead); }

  // Claims a cell, lets fill(uint8_t* payload) write `length` bytes into it in place, then
  // publishes it. False (and fill is not called) when the ring is full or length is too large.
  // Safe from any number of threads and processes at once.
  template <class Fill>
  bool push(uint32_t length, Fill&& fill) {
    if (length > max_payload()) return false;
    uint64_t pos = h_->tail.load(std::memory_order_relaxed);
    CellHead* c;
    for (;;) {
      c = cell(pos);
      const uint64_t seq = c->seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq - pos);
      if (diff == 0) {
        if (h_->tail.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;  // the cell still holds an unread record from one lap ago: full
      } else {
        pos = h_->tail.load(std::memory_order_relaxed);  // another producer took it
      }
    }
    fill(payload(c));
    c->length = length;
    c->seq.store(pos + 1, std::memory_order_release);  // publishes payload and length
    return true;
  }
  bool push_bytes(const void* data, uint32_t length) {
    return push(length, [&](uint8_t* p) { std::memcpy(p, data, length); });
  }

  // Takes the oldest published record, lets use(const uint8_t* payload, uint32_t length) read
  // it in place, then frees its cell. False when there is none. Safe with several consumers,
  // though the transport has one per ring.
  template <class Use>
  bool pop(Use&& use) {
    uint64_t pos = h_->head.load(std::memory_order_relaxed);
    CellHead* c;
    for (;;) {
      c = cell(pos);
      const uint64_t seq = c->seq.load(std::memory_order_acquire);
      const int64_t diff = static_cast<int64_t>(seq - (pos + 1));
      if (diff == 0) {
        if (h_->head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;  // empty, or its producer has claimed the cell but not published yet
      } else {
        pos = h_->head.load(std::memory_order_relaxed);
      }
    }
    // The cell's next lap may start once `use` is done with it, even if `use` throws.
    struct Release {
      CellHead* c;
      uint64_t next;
      ~Release() { c->seq.store(next, std::memory_order_release); }
    } release{c, pos + slots_};
    const uint32_t length = c->length <= max_payload() ? c->length : max_payload();
    use(static_cast<const uint8_t*>(payload(c)), length);
    return true;
  }

  // Whether the next record is published (acquire: its bytes are visible once this is true).
  bool has_record() const {
    const uint64_t pos = h_->head.load(std::memory_order_relaxed);
    return cell(pos)->seq.load(std::memory_order_acquire) == pos + 1;
  }
  // Records claimed and not yet taken (a snapshot; exact when nothing moves).
  uint64_t size() const {
    const uint64_t t = h_->tail.load(std::memory_order_acquire), hd = h_->head.load(std::memory_order_acquire);
    return t > hd ? t - hd : 0;
  }

 private:
  CellHead* cell(uint64_t pos) const {
    auto* cells = reinterpret_cast<uint8_t*>(h_) + sizeof(RingHeader);
    return reinterpret_cast<CellHead*>(cells + (pos & (slots_ - 1)) * uint64_t(cell_bytes_));
  }
  static uint8_t* payload(CellHead* c) { return reinterpret_cast<uint8_t*>(c) + sizeof(CellHead); }

  RingHeader* h_ = nullptr;
  uint32_t slots_ = 0, cell_bytes_ = 0;
};

// One consumer's sleep flag in shared memory, with an eventfd (a per-process descriptor of one
// kernel object) to wake it. Producers pay a fence and one load per push; a system call only
// when the consumer has said it sleeps.
//
// Why no wake-up is lost: the consumer does   W(sleeping=1); fence(seq_cst); R(ring)
// and a producer does                        W(ring: publish); fence(seq_cst); R(sleeping).
// With a seq_cst fence between each side's write and read, the two fences are ordered, and
// whichever comes second sees the other side's write ([atomics.fences], the store-buffering
// case). So either the consumer's re-check sees the record (it does not sleep), or the producer
// sees sleeping == 1 (it writes the eventfd, which stays readable until read, so a write that
// lands before the consumer blocks in poll() still wakes it). Spurious wake-ups (an eventfd
// written for a record the consumer had already taken) are harmless: the consumer re-checks.
struct alignas(kCacheLine) Doorbell {
  std::atomic<uint32_t> sleeping;
  uint32_t reserved;
  std::atomic<uint64_t> wakes;   // eventfd writes made (statistics)
  std::atomic<uint64_t> sleeps;  // times the consumer blocked (statistics)
};

// The producer's side, after publishing. exchange(0) makes one producer of many pay the write.
inline void notify(Doorbell& d, int eventfd) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (d.sleeping.load(std::memory_order_relaxed) == 0) return;
  if (d.sleeping.exchange(0, std::memory_order_acq_rel) == 0) return;
  d.wakes.fetch_add(1, std::memory_order_relaxed);
  const uint64_t one = 1;
  while (::write(eventfd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

// For a consumer that waits in an event loop (epoll on the eventfd) rather than in poll():
// declares it sleeps and re-checks, as sleep_until does. True: work is already there, drain it
// (the flag is withdrawn). False: the eventfd becomes readable when a producer publishes; the
// loop reads it (resetting it), drains, and arms again.
template <class HasWork>
bool arm(Doorbell& d, HasWork&& has_work) {
  d.sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!has_work()) return false;
  d.sleeping.store(0, std::memory_order_relaxed);
  return true;
}

enum class Wake { kHadWork, kRang, kTimedOut };

// The consumer's side: sleeps on the eventfd until a producer rings or timeout_ms passes (-1:
// no limit), unless has_work() (which must read the rings with acquire loads) already says
// there is something. The consumer re-checks its rings whatever this returns.
template <class HasWork>
Wake sleep_until(Doorbell& d, int eventfd, int timeout_ms, HasWork&& has_work) {
  d.sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (has_work()) {
    d.sleeping.store(0, std::memory_order_relaxed);
    return Wake::kHadWork;
  }
  d.sleeps.fetch_add(1, std::memory_order_relaxed);
  pollfd p{eventfd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r > 0) {
    uint64_t count;
    (void)!::read(eventfd, &count, sizeof count);  // non-blocking: resets the counter
  }
  d.sleeping.store(0, std::memory_order_relaxed);
  return r > 0 ? Wake::kRang : Wake::kTimedOut;
}

}  // namespace seqserve::shm
