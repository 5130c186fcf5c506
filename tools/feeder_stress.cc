// A stress test of the engine's compiled ring path (csrc/ring_feeder.h) for the sanitizers, with
// threads in place of worker processes (ThreadSanitizer cannot watch several processes): per
// worker a producer pushes records into a dynamic-batching scheduler through a RingFeeder and a
// consumer checks every reply (each request's value comes back in its own row) and frees its
// block. The reply rings are tiny, so replies queue and are retried; the batch runner is a C++
// hook that hands each batch to RingFeeder::reply_rows from the executor threads, as the Python
// runner does once per batch. Its first run found replies waiting for a block while later
// waiting replies held every block (now a waiting reply holds none). An argument: records per
// worker (20000 by default).
//
//   g++ -std=c++17 -O1 -g -fsanitize=thread -Icsrc tools/feeder_stress.cc csrc/ring_feeder.cc \
//       csrc/shm_region.cc csrc/scheduler.cc csrc/executor.cc csrc/inline_policy.cc csrc/batch.cc \
//       csrc/slot_state.cc csrc/sequence_scheduler.cc csrc/sequence_table.cc csrc/direct.cc \
//       csrc/oldest.cc csrc/dynamic.cc csrc/stateless.cc -o /tmp/feeder_stress -pthread && /tmp/feeder_stress
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "ring_feeder.h"

using namespace seqserve;

int main(int argc, char** argv) {
  shm::Geometry g;
  g.workers = 2;
  g.request_slots = 16;
  g.reply_slots = 4;
  g.class_count = 1;
  g.classes[0] = shm::SlabClass{64, 32, 0};
  auto region = shm::Region::create(g);
  RingFeeder feeder(*region, 10);

  ModelSpec spec;
  spec.name = "stress";
  spec.strategy = kDynamic;
  spec.max_batch_size = 8;
  spec.instance_count = 2;
  InputSpec in;
  in.name = "X";
  in.type = ElemType{"<u8", 8, false};
  in.default_shape = {1};
  spec.inputs = {in};
  spec.queue_policies = {QueuePolicy{}};
  Hooks hooks;
  Scheduler* sched_ptr = nullptr;
  hooks.run = [&](Instance& inst) {
    Batch& b = inst.batch;
    std::vector<uint64_t> handles;
    std::vector<int64_t> first, rows;
    int64_t row = 0;
    for (const Row& r : b.rows) {
      handles.push_back(r.req ? r.req->handle : 0);
      first.push_back(row);
      rows.push_back(r.req ? r.req->rows : 1);
      row += rows.back();
    }
    BatchOutput out;
    out.data = b.inputs[0].data();
    out.row_bytes = 8;
    out.rows = b.size;
    out.item_shape = {1};
    sched_ptr->record_batch(inst, true);
    feeder.reply_rows(handles, first, rows, {out}, true);
    return true;
  };
  hooks.fail = [&](const std::vector<uint64_t>& h, Code c, const std::string& m) { feeder.fail(h, c, m); };
  std::unique_ptr<Scheduler> sched = Scheduler::create(spec, hooks);
  sched_ptr = sched.get();
  sched->start();
  feeder.add_target(1, sched.get(), {{1}}, true);
  feeder.start();

  const uint64_t kRecords = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20000;
  std::atomic<uint64_t> bad{0}, answered{0};
  std::vector<std::thread> threads;
  std::mutex consumers;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {  // the worker's producer
      shm::SlabPool pool = region->pool(w, shm::Direction::kToEngine);
      shm::RequestRecord rec;
      rec.target = 1;
      rec.inputs.resize(1);
      for (uint64_t i = 1; i <= kRecords; ++i) {
        uint64_t off;
        while ((off = pool.alloc(8)) == 0) std::this_thread::yield();
        const uint64_t value = i * 3 + w;
        std::memcpy(region->at(off, 8), &value, 8);
        rec.header.handle = i;
        rec.inputs[0] = shm::SlabTensor{off, 8, 0, 2, {1, 1}};
        while (!region->push_request(w, rec)) std::this_thread::yield();
      }
    });
    threads.emplace_back([&, w] {  // the worker's consumer
      // One mapping for every thread (ThreadSanitizer knows atomics by address), and a Region
      // decodes replies into one scratch record: the consumers take turns (each worker process
      // has its own Region).
      shm::Region* mine = region.get();
      shm::SlabPool pool = mine->pool(w, shm::Direction::kToWorker);
      uint64_t got = 0;
      while (got < kRecords) {
        std::unique_lock<std::mutex> turn(consumers);
        const size_t n = mine->drain_replies(w, [&](const shm::ReplyRecord& r) {
          uint64_t value = 0;
          if (r.flags & shm::kReplyError || r.outputs.size() != 1) {
            ++bad;
          } else {
            std::memcpy(&value, mine->at(r.outputs[0].offset, 8), 8);
            if (value != r.handle * 3 + w) ++bad;
            if (!pool.free(r.outputs[0].offset)) ++bad;
          }
          ++got;
          ++answered;
        });
        turn.unlock();
        if (n == 0) mine->wait_replies(w, 100);
      }
    });
  }
  for (uint64_t last = 0, same = 0; answered.load() < 2 * kRecords && same < 30; ++same) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (answered.load() != last) same = 0;
    last = answered.load();
  }
  if (answered.load() < 2 * kRecords) {  // stuck: say where things are
    for (int w = 0; w < 2; ++w)
      std::printf("worker %d: queued replies %zu, reply ring %llu, request ring %llu, free blocks to engine %llu, "
                  "to worker %llu, in flight %lld\n",
                  w, feeder.queued_replies(w), (unsigned long long)region->reply_ring(w).size(),
                  (unsigned long long)region->request_ring(w).size(),
                  (unsigned long long)region->pool(w, shm::Direction::kToEngine).free_blocks(),
                  (unsigned long long)region->pool(w, shm::Direction::kToWorker).free_blocks(),
                  (long long)feeder.inflight(w));
    std::printf("answered %llu\n", (unsigned long long)answered.load());
    std::fflush(stdout);
    std::_Exit(2);
  }
  for (auto& t : threads) t.join();
  feeder.stop();
  sched->close(false);
  const FeederCounters c = feeder.counters();
  std::printf("answered %llu, bad %llu, deferred replies %llu, in flight %lld/%lld\n",
              static_cast<unsigned long long>(answered.load()), static_cast<unsigned long long>(bad.load()),
              static_cast<unsigned long long>(c.deferred), static_cast<long long>(feeder.inflight(0)),
              static_cast<long long>(feeder.inflight(1)));
  return bad.load() == 0 && answered.load() == 2 * kRecords ? 0 : 1;
}
