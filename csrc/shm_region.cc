// The shared-memory region of the worker <-> engine transport: layout, slab pools, record
// encoding and checking. See shm_region.h for the layout and the roles.
#include "shm_region.h"

#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>

#include <stdexcept>

// memfd and eventfd are Linux's; elsewhere the core builds and a region cannot be created.
#if defined(__linux__)
#include <sys/eventfd.h>
#define SEQSERVE_HAS_RINGS 1
#endif

namespace seqserve::shm {

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMaxRegionBytes = 1ull << 40;
constexpr uint32_t kTensorHeadBytes = 24;  // offset, nbytes, index, ndim; then ndim int64 dims
constexpr uint32_t kReplyHeadBytes = 24;   // handle, flags, code, output_count, error_bytes
constexpr uint32_t kRequestPrefixBytes = 16;  // target, kind (| kSlowBit), client
constexpr uint32_t kSlowBit = 1u << 8;

uint32_t pad8(uint64_t n) { return static_cast<uint32_t>(round_up(n, 8)); }

uint64_t next_pow2(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// A free-index ring never holds more than `blocks` indices, but an allocator that has claimed a
// cell and not yet handed it back makes a push one lap behind see "full". Twice the room makes
// that need `blocks` allocators stalled at once; free() retries until then.
uint32_t free_ring_slots(uint32_t blocks) { return static_cast<uint32_t>(next_pow2(2ull * blocks)); }

uint32_t tensors_size(const std::vector<SlabTensor>& ts) {
  uint64_t n = 0;
  for (const SlabTensor& t : ts) n += kTensorHeadBytes + 8ull * static_cast<uint64_t>(t.ndim < 0 ? 0 : t.ndim);
  return static_cast<uint32_t>(n > UINT32_MAX ? UINT32_MAX : n);
}

uint8_t* put(uint8_t* p, const void* v, size_t n) {
  std::memcpy(p, v, n);
  return p + n;
}

uint8_t* put_tensors(uint8_t* p, const std::vector<SlabTensor>& ts) {
  for (const SlabTensor& t : ts) {
    const uint32_t ndim = static_cast<uint32_t>(t.ndim);
    p = put(p, &t.offset, 8);
    p = put(p, &t.nbytes, 8);
    p = put(p, &t.index, 4);
    p = put(p, &ndim, 4);
    p = put(p, t.shape, 8ull * ndim);
  }
  return p;
}

void throw_errno(const char* what) { throw std::runtime_error(std::string(what) + ": " + std::strerror(errno)); }

}  // namespace

std::string check_geometry(const Geometry& g) {
  if (g.workers < 1 || g.workers > kMaxWorkers) return "workers must be 1 to " + std::to_string(kMaxWorkers);
  for (uint32_t slots : {g.request_slots, g.reply_slots})
    if (!is_pow2(slots) || slots < 2 || slots > kMaxRingSlots)
      return "ring slots must be a power of two from 2 to " + std::to_string(kMaxRingSlots);
  for (uint32_t bytes : {g.request_record_bytes, g.reply_record_bytes})
    if (bytes < 128 || bytes > kMaxRecordBytes)
      return "record bytes must be 128 to " + std::to_string(kMaxRecordBytes);
  if (g.class_count < 1 || g.class_count > kMaxSlabClasses)
    return "there must be 1 to " + std::to_string(kMaxSlabClasses) + " slab classes";
  for (uint32_t i = 0; i < g.class_count; ++i) {
    const SlabClass& c = g.classes[i];
    if (c.block_bytes == 0 || c.block_bytes % 64 != 0 || c.block_bytes > (1ull << 32))
      return "slab block sizes must be multiples of 64 bytes, at most 4 GiB";
    if (i > 0 && c.block_bytes <= g.classes[i - 1].block_bytes) return "slab classes must grow in size";
    if (c.blocks < 1 || c.blocks > kMaxBlocksPerClass)
      return "a slab class holds 1 to " + std::to_string(kMaxBlocksPerClass) + " blocks";
  }
  const uint64_t pool = SlabPool::bytes_for(g);
  if (pool > kMaxRegionBytes / (2ull * g.workers)) return "the region would exceed 1 TiB";
  return "";
}

// ---- SlabPool: per class [free-index ring][block states][blocks]

uint64_t SlabPool::bytes_for(const Geometry& g) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < g.class_count; ++i) {
    const SlabClass& c = g.classes[i];
    n += ShmRing::bytes_for(free_ring_slots(c.blocks), ShmRing::cell_bytes_for(4));
    n += round_up(4ull * c.blocks, kCacheLine);
    n += c.block_bytes * c.blocks;
  }
  return round_up(n, kPage);
}

SlabPool::SlabPool(uint8_t* region, uint64_t offset, const Geometry& g) : region_(region) {
  count_ = static_cast<int>(g.class_count);
  uint64_t at = offset;
  for (int i = 0; i < count_; ++i) {
    Class& c = classes_[i];
    c.block_bytes = g.classes[i].block_bytes;
    c.blocks = g.classes[i].blocks;
    c.ring_at = at;
    at += ShmRing::bytes_for(free_ring_slots(c.blocks), ShmRing::cell_bytes_for(4));
    c.state_at = at;
    at += round_up(4ull * c.blocks, kCacheLine);
    c.blocks_at = at;
    at += c.block_bytes * c.blocks;
  }
}

void SlabPool::format() {
  for (int i = 0; i < count_; ++i) {
    const Class& c = classes_[i];
    ShmRing::format(region_ + c.ring_at, free_ring_slots(c.blocks), ShmRing::cell_bytes_for(4));
    ShmRing ring = free_ring(c);
    for (uint32_t b = 0; b < c.blocks; ++b) {
      new (state(c, b)) std::atomic<uint32_t>(0);
      ring.push_bytes(&b, 4);
    }
  }
}

ShmRing SlabPool::free_ring(const Class& c) const {
  return ShmRing(region_ + c.ring_at, free_ring_slots(c.blocks), ShmRing::cell_bytes_for(4));
}

uint64_t SlabPool::alloc(uint64_t nbytes) {
  for (int i = 0; i < count_; ++i) {
    const Class& c = classes_[i];
    if (c.block_bytes < nbytes) continue;
    uint32_t b = UINT32_MAX;
    // A larger class serves when this one is exhausted: a slower path, never a failure.
    if (!free_ring(c).pop([&](const uint8_t* p, uint32_t) { std::memcpy(&b, p, 4); })) continue;
    if (b >= c.blocks) continue;  // only a corrupted ring holds such an index: drop it
    state(c, b)->store(1, std::memory_order_relaxed);
    return c.blocks_at + uint64_t(b) * c.block_bytes;
  }
  return 0;
}

const SlabPool::Class* SlabPool::class_of(uint64_t offset, uint32_t* index) const {
  for (int i = 0; i < count_; ++i) {
    const Class& c = classes_[i];
    if (offset >= c.blocks_at && offset < c.blocks_at + c.block_bytes * c.blocks) {
      *index = static_cast<uint32_t>((offset - c.blocks_at) / c.block_bytes);
      return &c;
    }
  }
  return nullptr;
}

bool SlabPool::free(uint64_t offset) {
  uint32_t b = 0;
  const Class* c = class_of(offset, &b);
  if (c == nullptr || offset != c->blocks_at + uint64_t(b) * c->block_bytes) return false;
  uint32_t expected = 1;
  // A second free of the same block fails here rather than putting it on the list twice.
  if (!state(*c, b)->compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return false;
  ShmRing ring = free_ring(*c);
  while (!ring.push_bytes(&b, 4)) sched_yield();  // never truly full: see free_ring_slots
  return true;
}

bool SlabPool::holds(uint64_t offset, uint64_t nbytes) const {
  uint32_t b = 0;
  const Class* c = class_of(offset, &b);
  if (c == nullptr) return false;
  const uint64_t in_block = offset - (c->blocks_at + uint64_t(b) * c->block_bytes);
  return nbytes <= c->block_bytes - in_block && state(*c, b)->load(std::memory_order_acquire) == 1;
}

uint64_t SlabPool::free_blocks() const {
  uint64_t n = 0;
  for (int i = 0; i < count_; ++i) n += free_ring(classes_[i]).size();
  return n;
}

// ---- Region

void Region::lay_out() {
  const Geometry& g = geometry_;
  header_bytes_ = round_up(sizeof(RegionHeader), kPage);
  uint64_t at = round_up(sizeof(WorkerHeader), kCacheLine);
  request_ring_at_ = at;
  at += ShmRing::bytes_for(g.request_slots, ShmRing::cell_bytes_for(g.request_record_bytes));
  reply_ring_at_ = at;
  at += ShmRing::bytes_for(g.reply_slots, ShmRing::cell_bytes_for(g.reply_record_bytes));
  at = round_up(at, kPage);
  to_engine_at_ = at;
  at += SlabPool::bytes_for(g);
  to_worker_at_ = at;
  at += SlabPool::bytes_for(g);
  worker_bytes_ = round_up(at, kPage);
  bytes_ = header_bytes_ + worker_bytes_ * g.workers;
}

SlabPool Region::pool(int w, Direction d) const {
  const uint64_t at = worker_at(w) + (d == Direction::kToEngine ? to_engine_at_ : to_worker_at_);
  return SlabPool(base_, at, geometry_);
}

std::unique_ptr<Region> Region::create(const Geometry& g) {
  const std::string why = check_geometry(g);
  if (!why.empty()) throw std::invalid_argument(why);
#ifndef SEQSERVE_HAS_RINGS
  throw std::runtime_error("the worker rings need Linux (memfd, eventfd)");
#else
  std::unique_ptr<Region> r(new Region());
  r->geometry_ = g;
  r->lay_out();
  r->memfd_ = ::memfd_create("seqserve-rings", MFD_CLOEXEC);
  if (r->memfd_ < 0) throw_errno("memfd_create");
  if (::ftruncate(r->memfd_, static_cast<off_t>(r->bytes_)) != 0) throw_errno("ftruncate");
  void* p = ::mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd_, 0);
  if (p == MAP_FAILED) throw_errno("mmap");
  r->base_ = static_cast<uint8_t*>(p);
  r->engine_efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->engine_efd_ < 0) throw_errno("eventfd");
  for (uint32_t w = 0; w < g.workers; ++w) {
    const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) throw_errno("eventfd");
    r->worker_efds_.push_back(efd);
  }
  // A new memfd reads as zeros: the doorbells start awake, only the rings and pools need laying out.
  auto* h = new (r->base_) RegionHeader();
  h->magic = kRegionMagic;
  h->version = kRegionVersion;
  h->header_bytes = static_cast<uint32_t>(r->header_bytes_);
  h->total_bytes = r->bytes_;
  h->worker_bytes = r->worker_bytes_;
  h->geometry = g;
  for (uint32_t w = 0; w < g.workers; ++w) r->format_worker(static_cast<int>(w));
  return r;
#endif
}

void Region::format_worker(int w) {
  const Geometry& g = geometry_;
  const uint64_t at = worker_at(w);
  new (base_ + at) WorkerHeader();
  ShmRing::format(base_ + at + request_ring_at_, g.request_slots, ShmRing::cell_bytes_for(g.request_record_bytes));
  ShmRing::format(base_ + at + reply_ring_at_, g.reply_slots, ShmRing::cell_bytes_for(g.reply_record_bytes));
  pool(w, Direction::kToEngine).format();
  pool(w, Direction::kToWorker).format();
}

void Region::reset_worker(int w) {
  format_worker(w);
  // A wake-up the dead worker's eventfd still holds would only be spurious: drop it.
  uint64_t count;
  if (w < static_cast<int>(worker_efds_.size())) (void)!::read(worker_efds_[w], &count, sizeof count);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

std::unique_ptr<Region> Region::attach(int memfd, int engine_eventfd, const std::vector<int>& worker_eventfds) {
  std::unique_ptr<Region> r(new Region());
  // Owned from here: the destructor closes them whatever goes wrong below.
  r->memfd_ = memfd;
  r->engine_efd_ = engine_eventfd;
  r->worker_efds_ = worker_eventfds;
  struct stat st;
  if (::fstat(memfd, &st) != 0) throw_errno("fstat");
  if (static_cast<uint64_t>(st.st_size) < sizeof(RegionHeader)) throw std::runtime_error("not a seqserve ring region (too small)");
  RegionHeader copy;
  if (::pread(memfd, &copy, sizeof copy, 0) != static_cast<ssize_t>(sizeof copy)) throw_errno("pread");
  if (copy.magic != kRegionMagic) throw std::runtime_error("not a seqserve ring region (bad magic)");
  if (copy.version != kRegionVersion)
    throw std::runtime_error("ring region version " + std::to_string(copy.version) + ", this core reads " +
                             std::to_string(kRegionVersion));
  const std::string why = check_geometry(copy.geometry);
  if (!why.empty()) throw std::runtime_error("ring region with a bad geometry: " + why);
  r->geometry_ = copy.geometry;
  r->lay_out();
  if (copy.total_bytes != r->bytes_ || static_cast<uint64_t>(st.st_size) != r->bytes_ ||
      copy.header_bytes != r->header_bytes_ || copy.worker_bytes != r->worker_bytes_)
    throw std::runtime_error("ring region whose sizes do not match its geometry");
  if (worker_eventfds.size() != copy.geometry.workers)
    throw std::runtime_error("a ring region of " + std::to_string(copy.geometry.workers) + " workers needs as many worker eventfds");
  void* p = ::mmap(nullptr, r->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) throw_errno("mmap");
  r->base_ = static_cast<uint8_t*>(p);
  return r;
}

Region::~Region() {
  if (base_) ::munmap(base_, bytes_);
  for (int fd : worker_efds_)
    if (fd >= 0) ::close(fd);
  if (engine_efd_ >= 0) ::close(engine_efd_);
  if (memfd_ >= 0) ::close(memfd_);
}

// ---- records

uint32_t request_record_size(const RequestRecord& r) {
  const uint64_t n = kRequestPrefixBytes + sizeof(RequestHeader) + pad8(r.string_id.size()) + tensors_size(r.inputs);
  return static_cast<uint32_t>(n > UINT32_MAX ? UINT32_MAX : n);
}

uint32_t reply_record_size(const ReplyRecord& r) {
  const uint64_t n = kReplyHeadBytes + pad8(r.error.size()) + tensors_size(r.outputs);
  return static_cast<uint32_t>(n > UINT32_MAX ? UINT32_MAX : n);
}

bool Region::push_request(int w, const RequestRecord& r, bool wake) {
  ShmRing ring = request_ring(w);
  for (const SlabTensor& t : r.inputs)
    if (t.ndim < 0 || t.ndim > kMaxRank) throw std::invalid_argument("a tensor has at most " + std::to_string(kMaxRank) + " dims");
  const uint32_t size = request_record_size(r);
  if (size > ring.max_payload())
    throw std::invalid_argument("request record of " + std::to_string(size) + " bytes; the ring's cells hold " +
                                std::to_string(ring.max_payload()));
  RequestHeader h = r.header;
  h.string_id_bytes = static_cast<uint32_t>(r.string_id.size());
  h.input_count = static_cast<uint32_t>(r.inputs.size());
  const uint32_t kind = r.kind | (r.slow ? kSlowBit : 0u);
  const bool pushed = ring.push(size, [&](uint8_t* p) {
    p = put(p, &r.target, 4);
    p = put(p, &kind, 4);
    p = put(p, &r.client, 8);
    p = put(p, &h, sizeof h);
    std::memcpy(p, r.string_id.data(), r.string_id.size());
    p += pad8(r.string_id.size());
    put_tensors(p, r.inputs);
  });
  if (pushed && wake) notify(engine_doorbell(), engine_efd_);
  return pushed;
}

bool Region::push_reply(int w, const ReplyRecord& r, bool wake) {
  ShmRing ring = reply_ring(w);
  for (const SlabTensor& t : r.outputs)
    if (t.ndim < 0 || t.ndim > kMaxRank) throw std::invalid_argument("a tensor has at most " + std::to_string(kMaxRank) + " dims");
  const uint32_t fixed = kReplyHeadBytes + tensors_size(r.outputs);
  if (fixed > ring.max_payload())
    throw std::invalid_argument("reply record of " + std::to_string(fixed) + " bytes; the ring's cells hold " +
                                std::to_string(ring.max_payload()));
  // An error message is cut to what fits: a reply is never refused for its message's length.
  const uint32_t room = (ring.max_payload() - fixed) & ~7u;
  const uint32_t error_bytes = static_cast<uint32_t>(r.error.size() < room ? r.error.size() : room);
  const uint32_t size = fixed + pad8(error_bytes);
  const uint32_t count = static_cast<uint32_t>(r.outputs.size());
  const bool pushed = ring.push(size, [&](uint8_t* p) {
    p = put(p, &r.handle, 8);
    p = put(p, &r.flags, 4);
    p = put(p, &r.code, 4);
    p = put(p, &count, 4);
    p = put(p, &error_bytes, 4);
    std::memcpy(p, r.error.data(), error_bytes);
    p += pad8(error_bytes);
    put_tensors(p, r.outputs);
  });
  if (pushed && wake) notify(worker_doorbell(w), worker_efds_[w]);
  return pushed;
}

// Reads `count` tensor descriptors from [p, end), each checked against `pool`'s blocks.
bool Region::decode_tensors(const uint8_t* p, const uint8_t* end, uint32_t count, std::vector<SlabTensor>& out,
                            const SlabPool& pool) const {
  out.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    SlabTensor& t = out[i];
    if (end - p < kTensorHeadBytes) return false;
    uint32_t ndim = 0;
    std::memcpy(&t.offset, p, 8);
    std::memcpy(&t.nbytes, p + 8, 8);
    std::memcpy(&t.index, p + 16, 4);
    std::memcpy(&ndim, p + 20, 4);
    p += kTensorHeadBytes;
    if (ndim > static_cast<uint32_t>(kMaxRank) || static_cast<uint64_t>(end - p) < 8ull * ndim) return false;
    t.ndim = static_cast<int>(ndim);
    std::memcpy(t.shape, p, 8ull * ndim);
    p += 8ull * ndim;
    if (!pool.holds(t.offset, t.nbytes)) return false;
  }
  return p == end;
}

bool Region::decode_request(int w, const uint8_t* p, uint32_t len, RequestRecord& out) const {
  const uint8_t* end = p + len;
  if (len < kRequestPrefixBytes + sizeof(RequestHeader)) return false;
  std::memcpy(&out.target, p, 4);
  std::memcpy(&out.kind, p + 4, 4);
  out.slow = (out.kind & kSlowBit) != 0;
  out.kind &= ~kSlowBit;
  std::memcpy(&out.client, p + 8, 8);
  std::memcpy(&out.header, p + kRequestPrefixBytes, sizeof(RequestHeader));
  p += kRequestPrefixBytes + sizeof(RequestHeader);
  const RequestHeader& h = out.header;
  if (out.kind != kSubmit && out.kind != kCancel) return false;
  if (h.string_id_bytes > static_cast<uint64_t>(end - p)) return false;
  if (!h.has(kFlagStringId) && h.string_id_bytes > 0) return false;
  out.string_id = std::string_view(reinterpret_cast<const char*>(p), h.string_id_bytes);
  p += pad8(h.string_id_bytes);
  if (p > end || h.input_count > static_cast<uint32_t>(kMaxRecordBytes / kTensorHeadBytes)) return false;
  return decode_tensors(p, end, h.input_count, out.inputs, pool(w, Direction::kToEngine));
}

bool Region::decode_reply(int w, const uint8_t* p, uint32_t len, ReplyRecord& out) const {
  const uint8_t* end = p + len;
  if (len < kReplyHeadBytes) return false;
  uint32_t count = 0, error_bytes = 0;
  std::memcpy(&out.handle, p, 8);
  std::memcpy(&out.flags, p + 8, 4);
  std::memcpy(&out.code, p + 12, 4);
  std::memcpy(&count, p + 16, 4);
  std::memcpy(&error_bytes, p + 20, 4);
  p += kReplyHeadBytes;
  if (error_bytes > static_cast<uint64_t>(end - p)) return false;
  out.error = std::string_view(reinterpret_cast<const char*>(p), error_bytes);
  p += pad8(error_bytes);
  if (p > end || count > static_cast<uint32_t>(kMaxRecordBytes / kTensorHeadBytes)) return false;
  return decode_tensors(p, end, count, out.outputs, pool(w, Direction::kToWorker));
}

size_t Region::drain_replies(int w, const std::function<void(const ReplyRecord&)>& fn, size_t max) {
  ShmRing ring = reply_ring(w);
  size_t n = 0;
  while (n < max) {
    bool ok = false;
    const bool popped = ring.pop([&](const uint8_t* p, uint32_t len) {
      ok = decode_reply(w, p, len, scratch_reply_);
      if (ok) fn(scratch_reply_);
    });
    if (!popped) break;
    if (ok)
      ++n;
    else
      ++malformed_;
  }
  return n;
}

bool Region::has_requests() const {
  for (int w = 0; w < workers(); ++w)
    if (request_ring(w).has_record()) return true;
  return false;
}

Wake Region::wait_requests(int timeout_ms) {
  return sleep_until(engine_doorbell(), engine_efd_, timeout_ms, [&] { return has_requests(); });
}

Wake Region::wait_replies(int w, int timeout_ms) {
  ShmRing ring = reply_ring(w);
  return sleep_until(worker_doorbell(w), worker_efds_[w], timeout_ms, [&] { return ring.has_record(); });
}

bool Region::arm_replies(int w) {
  ShmRing ring = reply_ring(w);
  return arm(worker_doorbell(w), [&] { return ring.has_record(); });
}

}  // namespace seqserve::shm
