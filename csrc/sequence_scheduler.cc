#include "sequence_scheduler.h"

namespace seqserve {

SequenceScheduler::SequenceScheduler(ModelSpec spec, Hooks hooks, bool gather_state)
    : Scheduler(std::move(spec), std::move(hooks), true, gather_state),
      table_(spec_.instance_count, spec_.slots_per_instance, spec_.idle_ns, counts_) {
  rep_state_shapes_.resize(spec_.states.size());
}

SubmitResult SequenceScheduler::enqueue_locked(Request* r, int, Instance*& wake, std::string& warning) {
  if (r->id.none()) {
    return refuse(kInvalidArg, "inference request to model '" + spec_.name +
                                   "' must specify a non-zero or non-empty correlation ID");
  }
  auto it = table_.find(r->id);
  if (r->start && !accepting_) return refuse(kUnavailable, kStopping);
  const bool known = table_.found(it);
  if (!r->start && !known) {
    return refuse(kInvalidArg, "inference request for sequence " + r->id.repr() + " to model '" + spec_.name +
                                   "' must specify the START flag on the first request of the sequence");
  }
  if (known && r->start) {
    warning = "sequence " + r->id.repr() + " for model '" + spec_.name +
              "' has a conflict. The previous sequence did not end before this sequence start. "
              "Previous sequence will be terminated early.";
  }
  auto queued = [this](int i, int s) { slot_queued_locked(*instances_[i], s); };
  const int g = known ? table_.queue_known(it, r, queued) : table_.queue_new(r, queued);
  if (released_locked() && g >= 0) {
    Instance& inst = *instances_[g / spec_.slots_per_instance];
    if (!inst.executing) wake = &inst;
  }
  return {};
}

Request* SequenceScheduler::take_marker_locked(uint8_t kind, const CorrId& id, int64_t now) {
  Request* m = pool_.take();
  m->kind = kind;
  m->handle = 0;
  m->start = false;
  m->end = kind == kNotify;
  m->arrival_ns = now;
  m->id = id;
  return m;
}

void SequenceScheduler::start_helpers() {
  reaper_ = spawn([this] { reaper_loop(); });
}

void SequenceScheduler::stop_helpers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    reaper_stop_ = true;
    table_.wake_reaper();
  }
  if (reaper_.joinable()) reaper_.join();
}

void SequenceScheduler::reaper_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  Fails fails;
  std::vector<ExpiredSequence> expired;
  std::vector<Request*> dropped;
  while (!reaper_stop_) {
    const int64_t now = now_ns();
    SequenceTable::Seqs::iterator it;
    while (table_.pop_idle(now, &it)) {
      // Expired: forget the id now; the slot frees when the marker reaches the queue front
      // (after the requests queued before it). TIMEOUT_COMPLETE makes the marker one final
      // END step for the model; otherwise the model is not told.
      const CorrId id = it->first;
      const int64_t last = it->second.last_arrival_ns;
      Slot& sl = table_.slot(it->second.gslot);
      Instance& inst = *instances_[sl.instance];
      if (spec_.describe_on_expiry) {
        ExpiredSequence x;
        x.id = id;
        x.age_s = (now - (sl.start_ns ? sl.start_ns : last)) / 1e9;
        x.idle_s = (now - last) / 1e9;
        x.steps = sl.steps;
        x.state_bytes = inst.state.slot_bytes(sl.index);
        x.instance = sl.instance;
        x.slot = sl.index;
        expired.push_back(std::move(x));
      }
      table_.erase(it);
      sl.queue.push(take_marker_locked(spec_.timeout_complete ? kNotify : kForceEnd, id, now));
      int& max_active = table_.max_active(sl.instance);
      max_active = std::max(max_active, sl.index);
      slot_queued_locked(inst, sl.index);
      if (!inst.executing) inst.cv.notify_one();
    }
    while (table_.pop_expired_backlog(now, dropped)) {
      // The whole backlogged sequence expires.
      std::vector<uint64_t> handles;
      for (Request* r : dropped) {
        handles.push_back(r->handle);
        stats_.fail.add(1, now - r->arrival_ns);
        recycle_locked(r);
      }
      dropped.clear();
      fails.emplace_back(std::move(handles), "timeout of the corresponding sequence has been expired");
    }
    if (!fails.empty() || !expired.empty()) {
      lk.unlock();
      report(fails, kUnavailable);
      if (hooks_.describe)
        for (const ExpiredSequence& x : expired) hooks_.describe(x);
      expired.clear();
      lk.lock();
      continue;
    }
    table_.wait_for_timers(lk);
  }
}

void SequenceScheduler::drain_locked(const std::function<void(Request*)>& take) {
  for (auto& inst : instances_) {
    for (int s = 0; s < spec_.slots_per_instance; ++s) {
      Slot& sl = table_.slot(inst->index, s);
      while (!sl.queue.empty()) take(sl.queue.pop());
    }
    drain_instance_locked(*inst, take);
  }
  table_.clear(take);
}

}  // namespace seqserve
