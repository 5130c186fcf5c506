// The sequence table of one model: its slots (each with a FIFO of queued requests), the
// free-slot min-heap across instances, the id -> sequence map, the backlog of sequences waiting
// for a slot (bounded: admission control), and the timer heaps of the idle reaper. Plain data
// and bookkeeping: every method runs under the scheduler lock, and what to do with expired
// work is the caller's business.
//
// Requests: the table holds Request pointers it does not own (the scheduler's pool does). A
// request queued here stays until batch forming takes it or a method hands it back through an
// `out` vector, after which the caller recycles it.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <queue>
#include <set>
#include <unordered_map>

#include "common.h"
#include "request.h"
#include "tombstones.h"

namespace seqserve {

struct Slot {
  int instance = 0, index = 0;
  Ring<Request*> queue;
  bool occupied = false;
  bool in_flight = false;  // kOldest: a request of this slot is being batched or executed
  uint64_t steps = 0;      // steps of the current sequence handed to the model
  int64_t start_ns = 0;    // when the current sequence started
  bool begun = false;      // the model has been handed the current sequence's START (and no END yet)
};

// A backlogged sequence: its requests move into a slot as a whole, FIFO across sequences.
struct BacklogQueue {
  uint64_t serial = 0;
  CorrId id;
  Ring<Request*> reqs;
  int64_t expiry_ns = INT64_MAX;  // earliest request timeout among its requests
};

struct SeqEntry {
  int gslot = -1;  // global slot index, -1 while in the backlog
  std::list<BacklogQueue>::iterator bq;
  int64_t last_arrival_ns = 0;
  int64_t start_ns = 0;  // arrival of its (latest) START
  uint64_t serial = 0;
  uint64_t owner = 0;    // handle of its latest START (end_owned_sequence() names the sequence by it)
  bool armed = false;    // has a live idle timer
  bool started = false;  // its START has been answered: only then does the idle clock run
  bool session = false;  // a session request named it: its end or expiry is remembered
  uint64_t client = 0;   // whom its tombstone counts against (its latest session request's client)
};

class SequenceTable {
 public:
  using Seqs = std::unordered_map<CorrId, SeqEntry, CorrIdHash>;

  SequenceTable(int instances, int slots_per_instance, int64_t idle_ns, int64_t max_backlog, QueueCounts& counts);

  Slot& slot(int gslot) { return slots_[gslot]; }
  Slot& slot(int instance, int index) { return slots_[instance * per_instance_ + index]; }
  int gslot(int instance, int index) const { return instance * per_instance_ + index; }
  // The highest slot index of an instance that may hold work.
  int& max_active(int instance) { return max_active_[instance]; }

  Seqs::iterator find(const CorrId& id) { return seqs_.find(id); }
  bool found(Seqs::iterator it) const { return it != seqs_.end(); }

  // Queues `r`, the first request of a sequence not in the table: into the lowest free slot,
  // else at the back of the backlog. `queued(instance, slot)` runs once r is in a slot's queue.
  // Returns the global slot, or -1 when backlogged.
  template <class Queued>
  int queue_new(Request* r, Queued queued);
  // Queues `r` behind its live sequence `it` (in its slot or in the backlog); END forgets the id.
  template <class Queued>
  int queue_known(Seqs::iterator it, Request* r, Queued queued);

  // Frees a slot, or hands it with all its queued requests to the oldest backlogged sequence.
  void release(int instance, int index);

  // Admission control: every slot is taken and the backlog holds its bound of sequences.
  bool backlog_full() const {
    return max_backlog_ > 0 && free_.empty() && static_cast<int64_t>(backlog_.size()) >= max_backlog_;
  }
  int64_t max_backlog() const { return max_backlog_; }
  // Drops the backlogged sequence queue `serial` (Request::backlog) whole, its id forgotten if
  // it still names it; its requests are appended to `out`. False when no such queue waits.
  bool drop_backlog_queue(uint64_t serial, std::vector<Request*>& out);
  // The START of the sequence `id` in global slot `gslot` has been answered: its idle clock
  // starts now (waiting in the backlog or in a slot queue before that does not count).
  void start_answered(const CorrId& id, int gslot, int64_t now);

  // The reaper. Pops due idle timers until one belongs to a sequence that is idle past the limit;
  // timers of ended, restarted, active or not yet started sequences are dropped or re-armed on
  // the way. The caller forgets the sequence with erase().
  bool pop_idle(int64_t now, Seqs::iterator* out);
  void erase(Seqs::iterator it) { seqs_.erase(it); }
  // A backlogged sequence whose earliest request timeout has passed is dropped whole; its
  // requests are appended to `out`.
  bool pop_expired_backlog(int64_t now, std::vector<Request*>& out);
  // Sleeps until the earliest timer is due, an earlier one is armed, or wake_reaper().
  void wait_for_timers(std::unique_lock<std::mutex>& lk);
  void wake_reaper() { reaper_cv_.notify_all(); }

  // Drops the backlogged sequence `it` with all its queued requests (appended to `out`).
  void drop_backlogged(Seqs::iterator it, std::vector<Request*>& out);
  // Ended and expired sessions (see tombstones.h).
  Tombstones& tombstones() { return tomb_; }
  const Seqs& seqs() const { return seqs_; }

  // Restore (sequence_scheduler.cc): the lowest free slot that `usable(instance, index)` accepts
  // becomes sequence `id`'s, its START handed to the model elsewhere `steps` steps ago, its
  // idle clock running from `now`. Returns the global slot, or -1 when no free slot is usable.
  int claim_restored(const CorrId& id, bool session, uint64_t steps, int64_t now,
                     const std::function<bool(int, int)>& usable);

  // Close: hands every backlogged request to `take` and forgets every sequence.
  template <class Take>
  void clear(Take take);

  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }
  int64_t backlog_sequences() const { return static_cast<int64_t>(backlog_.size()); }
  int64_t active_sequences() const;
  void describe(std::vector<std::pair<std::string, int>>& out) const;

 private:
  void push_idle(const CorrId& id, SeqEntry& e);
  void arm(int64_t deadline);
  void backlog_timer(BacklogQueue& bq, int64_t expiry_ns);
  void drop_queue_at(std::unordered_map<uint64_t, std::list<BacklogQueue>::iterator>::iterator bi,
                     std::vector<Request*>& out);

  int per_instance_;
  int64_t idle_ns_;
  int64_t max_backlog_;  // 0: no bound
  QueueCounts& counts_;
  std::vector<Slot> slots_;
  std::vector<int> max_active_;
  std::set<std::pair<int, int>> free_;  // (slot index, instance): lowest slot first
  Seqs seqs_;
  Tombstones tomb_;
  std::list<BacklogQueue> backlog_;
  std::unordered_map<uint64_t, std::list<BacklogQueue>::iterator> backlog_index_;
  uint64_t next_serial_ = 1;

  // Lazy timer heaps: at most one live idle timer per sequence.
  struct IdleTimer {
    int64_t deadline;
    uint64_t serial;
    CorrId id;
    bool operator>(const IdleTimer& o) const { return deadline > o.deadline; }
  };
  struct BacklogTimer {
    int64_t deadline;
    uint64_t serial;
    bool operator>(const BacklogTimer& o) const { return deadline > o.deadline; }
  };
  std::priority_queue<IdleTimer, std::vector<IdleTimer>, std::greater<IdleTimer>> idle_heap_;
  std::priority_queue<BacklogTimer, std::vector<BacklogTimer>, std::greater<BacklogTimer>> backlog_heap_;
  std::condition_variable reaper_cv_;
  int64_t reaper_target_ = INT64_MAX;  // what the reaper sleeps until
};

template <class Queued>
int SequenceTable::queue_new(Request* r, Queued queued) {
  const CorrId id = r->id;
  const bool end = r->end;
  const int64_t now = r->arrival_ns;
  tomb_.erase(id);  // a new sequence under this id
  if (end && r->session) tomb_.record(id, r->client, Tombstone::kEnded, 0, now);
  if (!free_.empty()) {
    auto [s, i] = *free_.begin();
    free_.erase(free_.begin());
    Slot& sl = slot(i, s);
    sl.occupied = true;
    sl.steps = 0;
    sl.start_ns = now;
    sl.queue.push(r);
    ++counts_.queued;
    max_active_[i] = std::max(max_active_[i], s);
    const int g = gslot(i, s);
    queued(i, s);
    if (!end) {
      // No idle timer yet: the clock starts when this START has been answered.
      SeqEntry e;
      e.gslot = g;
      e.last_arrival_ns = now;
      e.start_ns = now;
      e.session = r->session;
      e.client = r->client;
      e.serial = next_serial_++;
      e.owner = r->handle;
      seqs_.emplace(id, e);
    }
    return g;
  }
  backlog_.emplace_back();
  auto bit = std::prev(backlog_.end());
  bit->serial = next_serial_++;
  bit->id = id;
  bit->reqs.push(r);
  r->backlog = bit->serial;
  ++counts_.backlogged;
  backlog_index_[bit->serial] = bit;
  if (r->timeout_ns > 0) backlog_timer(*bit, now + r->timeout_ns);
  if (!end) {
    SeqEntry e;
    e.bq = bit;
    e.last_arrival_ns = now;
    e.start_ns = now;
    e.session = r->session;
    e.client = r->client;
    e.serial = next_serial_++;
    e.owner = r->handle;
    seqs_.emplace(id, e);
  }
  return -1;
}

template <class Queued>
int SequenceTable::queue_known(Seqs::iterator it, Request* r, Queued queued) {
  SeqEntry& e = it->second;
  const bool end = r->end;
  const int64_t now = r->arrival_ns;
  int g = -1;
  if (e.gslot >= 0) {
    Slot& sl = slots_[e.gslot];
    sl.queue.push(r);
    ++counts_.queued;
    max_active_[sl.instance] = std::max(max_active_[sl.instance], sl.index);
    g = e.gslot;
    queued(sl.instance, sl.index);
  } else {
    e.bq->reqs.push(r);
    r->backlog = e.bq->serial;
    ++counts_.backlogged;
    if (r->timeout_ns > 0 && now + r->timeout_ns < e.bq->expiry_ns) backlog_timer(*e.bq, now + r->timeout_ns);
  }
  e.session |= r->session;
  if (r->session) e.client = r->client;
  if (r->start) e.start_ns = now;
  if (end) {
    if (e.session) tomb_.record(it->first, e.client, Tombstone::kEnded, 0, now);
    seqs_.erase(it);
  } else {
    e.last_arrival_ns = now;
    if (r->start) {  // a restart: the clock starts again once this START is answered
      e.owner = r->handle;
      e.started = false;
    }
  }
  return g;
}

template <class Take>
void SequenceTable::clear(Take take) {
  for (auto& bq : backlog_)
    while (!bq.reqs.empty()) take(bq.reqs.pop());
  backlog_.clear();
  backlog_index_.clear();
  seqs_.clear();
}

}  // namespace seqserve
