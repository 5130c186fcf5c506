// A stress test of the worker <-> engine transport (csrc/shm_region.h) for the sanitizers: the
// Python tests run producers in separate processes, which ThreadSanitizer cannot watch; here
// threads share the one mapping instead (the same atomics, the same bytes). Producers allocate
// a slab block, write their record's handle into it and push; the consumer drains in C++,
// checks per-producer order and the block's bytes, frees the block, and sleeps on the doorbell
// whenever the rings are empty (producers pause now and then, so it does).
//
//   g++ -std=c++17 -O1 -g -fsanitize=thread -Icsrc tools/ring_stress.cc csrc/shm_region.cc \
//       -o /tmp/ring_stress -pthread && /tmp/ring_stress
//
// (ThreadSanitizer does not model std::atomic_thread_fence, so it checks the rings and the
// slabs, not the doorbell's fences; the lost-wake-up count below checks those.)
#include <chrono>
#include <cstdio>
#include <thread>

#include "shm_region.h"

using namespace seqserve::shm;

int main() {
  Geometry g;
  g.workers = 2;
  g.request_slots = 16;
  g.class_count = 1;
  g.classes[0] = SlabClass{64, 8, 0};
  auto region = Region::create(g);
  constexpr int kProducers = 4;
  constexpr uint64_t kRecords = 100000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      const int w = p % 2;
      RequestRecord rec;
      rec.inputs.resize(1);
      SlabPool pool = region->pool(w, Direction::kToEngine);
      for (uint64_t i = 1; i <= kRecords; ++i) {
        uint64_t off;
        while ((off = pool.alloc(64)) == 0) std::this_thread::yield();
        const uint64_t handle = (uint64_t(p) << 32) | i;
        std::memcpy(region->at(off, 8), &handle, 8);
        rec.header.handle = handle;
        rec.inputs[0].offset = off;
        rec.inputs[0].nbytes = 64;
        rec.inputs[0].ndim = 1;
        rec.inputs[0].shape[0] = 64;
        while (!region->push_request(w, rec)) std::this_thread::yield();
        if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  std::vector<uint64_t> last(kProducers, 0);
  uint64_t records = 0, bad = 0, lost = 0;
  while (records < kProducers * kRecords) {
    const size_t n = region->drain_requests([&](int w, const RequestRecord& rec) {
      const uint64_t handle = rec.header.handle;
      uint64_t data;
      std::memcpy(&data, region->at(rec.inputs[0].offset, 8), 8);
      if (data != handle || (handle & 0xffffffff) != last[handle >> 32] + 1) ++bad;
      last[handle >> 32] = handle & 0xffffffff;
      if (!region->pool(w, Direction::kToEngine).free(rec.inputs[0].offset)) ++bad;
      ++records;
    });
    if (n == 0 && region->wait_requests(2000) == Wake::kTimedOut && region->has_requests()) ++lost;
  }
  for (auto& t : producers) t.join();
  std::printf("records %llu, bad %llu, lost wake-ups %llu, malformed %llu\n", (unsigned long long)records,
              (unsigned long long)bad, (unsigned long long)lost, (unsigned long long)region->malformed());
  return bad || lost || region->malformed() ? 1 : 0;
}
