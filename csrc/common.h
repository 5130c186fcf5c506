// Shared definitions of the seqserve core: status codes, correlation ids, clocks, a growable
// ring queue and an aligned buffer that allocate nothing in steady state.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

// Tensor data is little-endian on the wire (BYTES length prefixes) and in numpy's '<' dtypes;
// the core copies both as native bytes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the seqserve core assumes a little-endian host");

namespace seqserve {

// Same numbering as seqserve.engine.errors.Code (and Triton's error codes).
enum Code : int {
  kUnknown = 0,
  kInternal = 1,
  kNotFound = 2,
  kInvalidArg = 3,
  kUnavailable = 4,
  kUnsupported = 5,
  kAlreadyExists = 6,
  kCancelled = 7,
};

// Names the calling thread as top -H, ps -L, perf and the bench's per-thread CPU show it (at
// most 15 characters on Linux; a no-op elsewhere).
inline void name_this_thread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A correlation id is typed: uint64 5 and string "5" are different sequences.
struct CorrId {
  uint64_t num = 0;
  std::string str;
  bool is_str = false;

  bool none() const { return is_str ? str.empty() : num == 0; }
  bool operator==(const CorrId& o) const {
    return is_str == o.is_str && (is_str ? str == o.str : num == o.num);
  }
  std::string repr() const { return is_str ? str : std::to_string(num); }
};

struct CorrIdHash {
  size_t operator()(const CorrId& c) const {
    return c.is_str ? std::hash<std::string>{}(c.str) * 31u + 1u : std::hash<uint64_t>{}(c.num);
  }
};

// FIFO ring that grows by doubling and never shrinks: pushes and pops allocate nothing once
// the queue has reached its working size.
template <class T>
class Ring {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  T& at(size_t i) { return buf_[(head_ + i) % buf_.size()]; }
  void push(T v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) % buf_.size()] = std::move(v);
    ++size_;
  }
  // At the front: the next pop() returns it.
  void push_front(T v) {
    if (size_ == buf_.size()) grow();
    head_ = (head_ + buf_.size() - 1) % buf_.size();
    buf_[head_] = std::move(v);
    ++size_;
  }
  T pop() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) % buf_.size();
    --size_;
    return v;
  }
  void clear() { head_ = size_ = 0; }

 private:
  void grow() {
    std::vector<T> nb(buf_.empty() ? 4 : buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) nb[i] = std::move(buf_[(head_ + i) % buf_.size()]);
    buf_.swap(nb);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0;
  size_t size_ = 0;
};

// Heap-allocated byte buffer with 64-byte alignment; grows, never shrinks.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(o.p_), cap_(o.cap_) { o.p_ = nullptr; o.cap_ = 0; }
  ~Buffer() { std::free(p_); }
  uint8_t* data() const { return p_; }
  size_t capacity() const { return cap_; }
  friend void swap(Buffer& a, Buffer& b) noexcept {
    std::swap(a.p_, b.p_);
    std::swap(a.cap_, b.cap_);
  }
  // Ensures room for n bytes, keeping the first `keep` bytes.
  void reserve(size_t n, size_t keep = 0) {
    if (n <= cap_) return;
    size_t cap = cap_ ? cap_ : 64;
    while (cap < n) cap *= 2;
    auto* np = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
    if (!np) throw std::bad_alloc();
    std::memset(np, 0, cap);
    if (keep && p_) std::memcpy(np, p_, keep < cap_ ? keep : cap_);
    std::free(p_);
    p_ = np;
    cap_ = cap;
  }

 private:
  uint8_t* p_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace seqserve
