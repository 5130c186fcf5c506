#include "sequence_table.h"

namespace seqserve {

SequenceTable::SequenceTable(int instances, int slots_per_instance, int64_t idle_ns, int64_t max_backlog,
                             QueueCounts& counts)
    : per_instance_(slots_per_instance), idle_ns_(idle_ns), max_backlog_(max_backlog), counts_(counts) {
  slots_.resize(static_cast<size_t>(instances) * slots_per_instance);
  max_active_.assign(instances, -1);
  for (int i = 0; i < instances; ++i)
    for (int s = 0; s < slots_per_instance; ++s) {
      Slot& sl = slot(i, s);
      sl.instance = i;
      sl.index = s;
      free_.insert({s, i});
    }
}

void SequenceTable::arm(int64_t deadline) {
  if (deadline < reaper_target_) reaper_cv_.notify_one();
}

void SequenceTable::push_idle(const CorrId& id, SeqEntry& e) {
  e.armed = true;
  const int64_t deadline = e.last_arrival_ns + idle_ns_;
  idle_heap_.push({deadline, e.serial, id});
  arm(deadline);
}

void SequenceTable::backlog_timer(BacklogQueue& bq, int64_t expiry_ns) {
  bq.expiry_ns = expiry_ns;
  backlog_heap_.push({expiry_ns, bq.serial});
  arm(expiry_ns);
}

void SequenceTable::release(int instance, int index) {
  Slot& sl = slot(instance, index);
  sl.occupied = false;
  sl.begun = false;
  if (!backlog_.empty()) {
    // The oldest backlogged sequence takes the slot with all its queued requests. Its idle
    // clock has not started (Triton's has, so a sequence that waited longer than the idle
    // limit in the backlog is reaped ~50 ms after it gets a slot): it starts once the START
    // has been answered.
    BacklogQueue& bq = backlog_.front();
    while (!bq.reqs.empty()) {
      Request* r = bq.reqs.pop();
      r->backlog = 0;
      sl.queue.push(r);
      --counts_.backlogged;
      ++counts_.queued;
    }
    sl.occupied = true;
    sl.steps = 0;
    sl.start_ns = now_ns();
    auto it = seqs_.find(bq.id);
    if (it != seqs_.end() && it->second.gslot < 0 && it->second.bq == backlog_.begin())
      it->second.gslot = gslot(instance, index);
    backlog_index_.erase(bq.serial);
    backlog_.pop_front();
    max_active_[instance] = std::max(max_active_[instance], index);
    return;
  }
  free_.insert({index, instance});
}

void SequenceTable::start_answered(const CorrId& id, int g, int64_t now) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.gslot != g) return;  // ended, expired or moved meanwhile
  SeqEntry& e = it->second;
  e.started = true;
  e.last_arrival_ns = std::max(e.last_arrival_ns, now);
  if (!e.armed) push_idle(id, e);
}

bool SequenceTable::drop_backlog_queue(uint64_t serial, std::vector<Request*>& out) {
  auto bi = backlog_index_.find(serial);
  if (bi == backlog_index_.end()) return false;
  drop_queue_at(bi, out);
  return true;
}

void SequenceTable::drop_queue_at(std::unordered_map<uint64_t, std::list<BacklogQueue>::iterator>::iterator bi,
                                  std::vector<Request*>& out) {
  auto bit = bi->second;
  auto it = seqs_.find(bit->id);
  if (it != seqs_.end() && it->second.gslot < 0 && it->second.bq == bit) seqs_.erase(it);
  while (!bit->reqs.empty()) {
    Request* r = bit->reqs.pop();
    r->backlog = 0;
    out.push_back(r);
    --counts_.backlogged;
  }
  backlog_index_.erase(bi);
  backlog_.erase(bit);
}

bool SequenceTable::pop_idle(int64_t now, Seqs::iterator* out) {
  while (!idle_heap_.empty() && idle_heap_.top().deadline <= now) {
    IdleTimer t = idle_heap_.top();
    idle_heap_.pop();
    auto it = seqs_.find(t.id);
    if (it == seqs_.end() || it->second.serial != t.serial) continue;  // ended or restarted
    SeqEntry& e = it->second;
    const int64_t due = e.last_arrival_ns + idle_ns_;
    if (!e.started) {
      // Not reaped before its START has been answered (in the backlog or a slot queue); the
      // timer is armed again then, rather than re-checked (a cost that would grow with them).
      e.armed = false;
      continue;
    }
    if (due > now) {
      idle_heap_.push({due, t.serial, t.id});
      continue;
    }
    *out = it;
    return true;
  }
  return false;
}

bool SequenceTable::pop_expired_backlog(int64_t now, std::vector<Request*>& out) {
  while (!backlog_heap_.empty() && backlog_heap_.top().deadline <= now) {
    BacklogTimer t = backlog_heap_.top();
    backlog_heap_.pop();
    auto bi = backlog_index_.find(t.serial);
    if (bi == backlog_index_.end()) continue;
    if (bi->second->expiry_ns > now) continue;
    drop_queue_at(bi, out);
    return true;
  }
  return false;
}

void SequenceTable::drop_backlogged(Seqs::iterator it, std::vector<Request*>& out) {
  auto bit = it->second.bq;
  seqs_.erase(it);
  while (!bit->reqs.empty()) {
    out.push_back(bit->reqs.pop());
    --counts_.backlogged;
  }
  backlog_index_.erase(bit->serial);
  backlog_.erase(bit);
}

void SequenceTable::wait_for_timers(std::unique_lock<std::mutex>& lk) {
  int64_t target = INT64_MAX;
  if (!idle_heap_.empty()) target = idle_heap_.top().deadline;
  if (!backlog_heap_.empty()) target = std::min(target, backlog_heap_.top().deadline);
  reaper_target_ = target;
  if (target == INT64_MAX) reaper_cv_.wait(lk);
  else reaper_cv_.wait_for(lk, std::chrono::nanoseconds(target - now_ns() + 1000));
  reaper_target_ = INT64_MAX;
}

int64_t SequenceTable::active_sequences() const {
  int64_t n = 0;
  for (auto& kv : seqs_) n += kv.second.gslot >= 0;
  return n;
}

void SequenceTable::describe(std::vector<std::pair<std::string, int>>& out) const {
  for (auto& kv : seqs_) out.emplace_back(kv.first.repr(), kv.second.gslot);
}

int SequenceTable::claim_restored(const CorrId& id, bool session, uint64_t steps, int64_t now,
                                  const std::function<bool(int, int)>& usable) {
  // The slot a START would get (the lowest free index across instances), unless it is unusable.
  for (auto f = free_.begin(); f != free_.end(); ++f) {
    const auto [s, i] = *f;
    if (!usable(i, s)) continue;
    free_.erase(f);
    Slot& sl = slot(i, s);
    sl.occupied = true;
    sl.steps = steps;
    sl.start_ns = now;
    sl.begun = true;  // its START ran elsewhere: an expiry under TIMEOUT_COMPLETE gives it a final END step
    max_active_[i] = std::max(max_active_[i], s);
    tomb_.erase(id);
    SeqEntry e;
    e.gslot = gslot(i, s);
    e.last_arrival_ns = now;
    e.start_ns = now;
    e.session = session;
    e.serial = next_serial_++;
    e.owner = 0;  // no request of this server started it: no scope owns it
    e.started = true;  // the idle clock runs from the restore
    auto it = seqs_.emplace(id, e).first;
    push_idle(id, it->second);
    return e.gslot;
  }
  return -1;
}

}  // namespace seqserve
