#include "sequence_scheduler.h"

namespace seqserve {

SequenceScheduler::SequenceScheduler(ModelSpec spec, Hooks hooks, bool gather_state)
    : Scheduler(std::move(spec), std::move(hooks), true, gather_state),
      table_(spec_.instance_count, spec_.slots_per_instance, spec_.idle_ns, spec_.max_backlog_sequences, counts_) {
  rep_state_shapes_.resize(spec_.states.size());
  table_.tombstones().configure(spec_.tombstone_ns, static_cast<size_t>(std::max<int64_t>(0, spec_.max_tombstones)),
                                static_cast<size_t>(std::max<int64_t>(0, spec_.max_tombstones_per_client)));
  released_ids_.configure(kReleasedTtlNs, kMaxReleased);
}

SubmitResult SequenceScheduler::enqueue_locked(Request* r, int, Instance*& wake, std::string& warning) {
  if (r->id.none()) {
    return refuse(kInvalidArg, "inference request to model '" + spec_.name +
                                   "' must specify a non-zero or non-empty correlation ID");
  }
  auto it = table_.find(r->id);
  if (r->start && !accepting_) return refuse(kUnavailable, kStopping);
  const bool known = table_.found(it);
  // Checkpointed and released from here: it lives on elsewhere, so never an implied START.
  const bool moved = !known && !r->start && !released_ids_.empty() && released_ids_.find(r->id, r->arrival_ns);
  if (r->start && !known && !released_ids_.empty()) released_ids_.erase(r->id);  // a new sequence here
  if (r->session && !r->start && !known && !moved) {
    // A session's first request starts it, unless the session ended or expired: its next
    // request must not carry on from fresh state as if nothing was lost.
    if (const Tombstone* t = table_.tombstones().find(r->id, r->arrival_ns))
      return refuse(kNotFound, session_gone_message(r->id, *t));
    if (table_.tombstones().maybe_evicted(r->id, r->arrival_ns))
      return refuse(kNotFound, evicted_session_message(r->id));
    if (!accepting_) return refuse(kUnavailable, kStopping);
    r->start = true;
  }
  if (r->session && r->start && !known) {
    // A new session of a client whose evicted tombstones fill its share of the filter: only
    // this client is refused, until those ids age out of the filter.
    if (const int64_t wait_ns = table_.tombstones().start_refused_for(r->client, r->arrival_ns)) {
      ++stats_.session_starts_refused;
      SubmitResult res = refuse(kUnavailable, session_share_full_message(wait_ns));
      res.retry_after_ms = std::max<int64_t>(1000, wait_ns / 1000000);
      return res;
    }
  }
  if (!r->start && !known) {
    SubmitResult res = start_error(r->id);
    res.released = moved;
    return res;
  }
  if (known && r->start) {
    warning = "sequence " + r->id.repr() + " for model '" + spec_.name +
              "' has a conflict. The previous sequence did not end before this sequence start. "
              "Previous sequence will be terminated early.";
  }
  if (!known && table_.backlog_full()) {
    // Admission control: refused at once rather than queued behind a backlog that long.
    ++stats_.backlog_full;
    SubmitResult full = refuse(kUnavailable, "the backlog of model '" + spec_.name + "' is full: " +
                                                 std::to_string(table_.backlog_sequences()) +
                                                 " sequences are waiting for a slot (max_backlog_sequences " +
                                                 std::to_string(table_.max_backlog()) + "); retry later");
    full.backlog_full = true;
    return full;
  }
  auto queued = [this](int i, int s) { slot_queued_locked(*instances_[i], s); };
  stats_.sequences_started += r->start;
  stats_.sequences_ended += r->end;
  const int g = known ? table_.queue_known(it, r, queued) : table_.queue_new(r, queued);
  if (released_locked() && g >= 0) {
    Instance& inst = *instances_[g / spec_.slots_per_instance];
    if (worth_waking_locked(inst)) wake = &inst;
  }
  return {};
}

SubmitResult SequenceScheduler::start_error(const CorrId& id) const {
  return refuse(kInvalidArg, "inference request for sequence " + id.repr() + " to model '" + spec_.name +
                                 "' must specify the START flag on the first request of the sequence");
}

SubmitResult SequenceScheduler::requeue_front(Request* r) {
  SubmitResult res;
  std::string warning;
  Instance* wake = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    r->kind = kNormal;
    r->start = r->end = false;
    r->arrival_ns = now_ns();
    auto it = table_.find(r->id);
    if (closing_) {
      res = refuse(kUnavailable, kStopping);
    } else if (!table_.found(it)) {
      res = start_error(r->id);
    } else if (it->second.gslot < 0) {
      res = enqueue_locked(r, 0, wake, warning);  // backlogged (restarted meanwhile): in turn
    } else {
      SeqEntry& e = it->second;
      e.last_arrival_ns = r->arrival_ns;
      Slot& sl = table_.slot(e.gslot);
      Instance& inst = *instances_[sl.instance];
      sl.queue.push_front(r);
      ++counts_.queued;
      int& max_active = table_.max_active(sl.instance);
      max_active = std::max(max_active, sl.index);
      slot_queued_locked(inst, sl.index);
      if (released_locked() && worth_waking_locked(inst)) wake = &inst;
    }
    if (!res.accepted) recycle_locked(r);
  }
  if (res.accepted && wake) wake->cv.notify_one();
  return res;
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

std::string SequenceScheduler::cancelled_message(const CorrId& id) const {
  return "sequence " + id.repr() + " of model '" + spec_.name +
         "' was cancelled: a request of the sequence was cancelled before it ran";
}

void SequenceScheduler::drop_backlog_queue_locked(uint64_t serial, const CorrId& id, const std::string& why,
                                                  Tombstone::Reason reason) {
  const int64_t now = now_ns();
  auto it = table_.find(id);
  if (table_.found(it) && it->second.gslot < 0 && it->second.bq->serial == serial) {
    forget_locked(it, reason, now);  // still live (its END has not come): it ends here
  }
  std::vector<Request*> dropped;
  table_.drop_backlog_queue(serial, dropped);
  std::vector<uint64_t> handles;
  for (Request* d : dropped) cancelled_locked(d, handles, now);
  if (!handles.empty()) cancelled_.emplace_back(std::move(handles), why);
}

void SequenceScheduler::forget_locked(SequenceTable::Seqs::iterator it, Tombstone::Reason reason, int64_t now) {
  if (it->second.session) table_.tombstones().record(it->first, it->second.client, reason, 0, now);
  ++stats_.sequences_ended;
  table_.erase(it);
}

void SequenceScheduler::cancel_locked(Request* r) {
  if (r->backlog != 0) {
    // A backlogged sequence goes at once, whole (so it no longer counts against the bound).
    const CorrId id = r->id;
    drop_backlog_queue_locked(r->backlog, id, cancelled_message(id), Tombstone::kCancelled);
    return;
  }
  for (auto& inst : instances_) inst->cancels = true;  // batch forming meets it in a slot
}

void SequenceScheduler::end_slot_locked(Instance& inst, int s, const CorrId& id, const std::string& why,
                                        Tombstone::Reason reason) {
  Slot& sl = table_.slot(inst.index, s);
  const int64_t now = now_ns();
  auto it = table_.find(id);
  if (table_.found(it) && it->second.gslot == table_.gslot(inst.index, s)) forget_locked(it, reason, now);
  std::vector<uint64_t> handles;
  while (!sl.queue.empty()) {
    Request* r = sl.queue.pop();
    if (r->kind == kNormal) {
      --counts_.queued;
      cancelled_locked(r, handles, now);
    } else {
      recycle_locked(r);  // an expiry marker: the one below replaces it
    }
  }
  if (!handles.empty()) cancelled_.emplace_back(std::move(handles), why);
  const bool final_step = spec_.timeout_complete && sl.begun;
  sl.queue.push(take_marker_locked(final_step ? kNotify : kForceEnd, id, now));
  int& max_active = table_.max_active(inst.index);
  max_active = std::max(max_active, s);
}

bool SequenceScheduler::end_owned_sequence_locked(const CorrId& id, uint64_t owner, const std::string& reason) {
  auto it = table_.find(id);
  if (!table_.found(it) || (owner != 0 && it->second.owner != owner)) return false;
  const std::string why =
      reason.empty() ? "sequence " + id.repr() + " of model '" + spec_.name + "' was ended before its END" : reason;
  if (it->second.gslot < 0) {  // backlogged: the model never saw it
    drop_backlog_queue_locked(it->second.bq->serial, id, why, Tombstone::kScopeEnded);
    return true;
  }
  Slot& sl = table_.slot(it->second.gslot);
  Instance& inst = *instances_[sl.instance];
  const int s = sl.index;
  end_slot_locked(inst, s, id, why, Tombstone::kScopeEnded);
  slot_queued_locked(inst, s);
  if (!inst.executing) inst.cv.notify_one();
  return true;
}


void SequenceScheduler::batch_done_locked(Instance& inst) {
  inst.state.apply_staged();  // restores that waited for this batch (restore_locked)
  // A START has been answered: its sequence's idle clock starts now.
  int64_t now = 0;
  for (const Row& row : inst.batch.rows) {
    const Request* r = row.req;
    if (r == nullptr || r->kind != kNormal || !r->start || r->end) continue;
    if (now == 0) now = now_ns();
    table_.start_answered(r->id, table_.gslot(inst.index, row.slot), now);
  }
}

void SequenceScheduler::start_helpers() {
  reaper_ = spawn("seqserve-reaper", [this] { reaper_loop(); });
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
      const SeqEntry& e = it->second;
      const double idle_s = (now - e.last_arrival_ns) / 1e9;
      if (spec_.describe_on_expiry) {
        const Slot& sl = table_.slot(e.gslot);
        ExpiredSequence x;
        x.id = it->first;
        x.age_s = (now - e.start_ns) / 1e9;
        x.idle_s = idle_s;
        x.steps = sl.steps;
        x.state_bytes = instances_[sl.instance]->state.slot_bytes(sl.index);
        x.instance = sl.instance;
        x.slot = sl.index;
        expired.push_back(std::move(x));
      }
      if (e.session) table_.tombstones().record(it->first, e.client, Tombstone::kExpired, idle_s, now);
      ++stats_.sequences_expired;
      end_in_slot_locked(it, now);
    }
    while (table_.pop_expired_backlog(now, dropped)) {
      // The whole backlogged sequence expires.
      std::vector<uint64_t> handles;
      for (Request* r : dropped) {
        handles.push_back(r->handle);
        stats_.fail.add(1, now - r->arrival_ns);
        ++stats_.fail_rejected;
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
    if (flush_cancelled(lk)) continue;
    table_.wait_for_timers(lk);
  }
}

void SequenceScheduler::end_in_slot_locked(SequenceTable::Seqs::iterator it, int64_t now) {
  const CorrId id = it->first;
  Slot& sl = table_.slot(it->second.gslot);
  Instance& inst = *instances_[sl.instance];
  table_.erase(it);
  sl.queue.push(take_marker_locked(spec_.timeout_complete ? kNotify : kForceEnd, id, now));
  int& max_active = table_.max_active(sl.instance);
  max_active = std::max(max_active, sl.index);
  slot_queued_locked(inst, sl.index);
  if (!inst.executing) inst.cv.notify_one();
}

// ------------------------------------------------------------------------- sequence API

bool SequenceScheduler::end_owned_sequence(const CorrId& id, uint64_t owner, const std::string& why) {
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_ || force_) return false;  // during the drain it may still free a slot
  const bool ended = end_owned_sequence_locked(id, owner, why);
  flush_cancelled(lk);
  return ended;
}

int SequenceScheduler::slot_of(const CorrId& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = table_.find(id);
  return table_.found(it) ? it->second.gslot : -2;
}

int64_t SequenceScheduler::free_slots() {
  std::lock_guard<std::mutex> lk(mu_);
  return table_.free_slots();
}

int64_t SequenceScheduler::backlog_sequences() {
  std::lock_guard<std::mutex> lk(mu_);
  return table_.backlog_sequences();
}

void SequenceScheduler::describe_slots(std::vector<std::pair<std::string, int>>& out) {
  std::lock_guard<std::mutex> lk(mu_);
  table_.describe(out);
}

bool SequenceScheduler::end_sequence(const CorrId& id, SequenceInfo& out) {
  Fails fails;
  bool ended;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ended = !closing_ && end_sequence_locked(id, out, fails);
  }
  report(fails, kCancelled);
  return ended;
}

void SequenceScheduler::gauges_locked(Stats& s) {
  const int64_t slots = static_cast<int64_t>(spec_.instance_count) * spec_.slots_per_instance;
  s.sequence_slots = slots;
  s.sequences_active = slots - table_.free_slots();
  s.sequences_backlogged = table_.backlog_sequences();
  s.tombstones_evicted = table_.tombstones().evictions();
  s.tombstones_evicted_client_cap = table_.tombstones().evictions(Tombstones::kClientCap);
  s.tombstones_evicted_global_cap = table_.tombstones().evictions(Tombstones::kGlobalCap);
  uint64_t bytes = 0;
  for (int g = 0; g < slots; ++g) {
    const Slot& sl = table_.slot(g);
    if (sl.occupied) bytes += instances_[sl.instance]->state.slot_bytes(sl.index);
  }
  s.state_bytes = bytes;
}

void SequenceScheduler::info_locked(const CorrId& id, const SeqEntry& e, int64_t now, SequenceInfo& out) {
  out.id = id;
  out.session = e.session;
  out.age_s = (now - e.start_ns) / 1e9;
  out.idle_s = (now - e.last_arrival_ns) / 1e9;
  out.backlogged = e.gslot < 0;
  if (out.backlogged) {
    out.instance = out.slot = -1;
    out.steps = out.state_bytes = 0;
    out.queued = static_cast<int64_t>(e.bq->reqs.size());
    return;
  }
  const Slot& sl = table_.slot(e.gslot);
  out.instance = sl.instance;
  out.slot = sl.index;
  out.steps = sl.steps;
  out.state_bytes = instances_[sl.instance]->state.slot_bytes(sl.index);
  out.queued = static_cast<int64_t>(sl.queue.size());
}

int64_t SequenceScheduler::list_sequences(std::vector<SequenceInfo>& out, size_t limit) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = now_ns();
  for (const auto& kv : table_.seqs()) {
    if (out.size() >= limit) break;
    out.emplace_back();
    info_locked(kv.first, kv.second, now, out.back());
  }
  return static_cast<int64_t>(table_.seqs().size());
}

bool SequenceScheduler::find_sequence(const CorrId& id, SequenceInfo& out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = table_.find(id);
  if (!table_.found(it)) return false;
  info_locked(id, it->second, now_ns(), out);
  return true;
}

bool SequenceScheduler::end_sequence_locked(const CorrId& id, SequenceInfo& out, Fails& fails) {
  auto it = table_.find(id);
  if (!table_.found(it)) return false;
  const int64_t now = now_ns();
  info_locked(id, it->second, now, out);
  table_.tombstones().record(id, it->second.client, Tombstone::kEndedByApi, 0, now);
  ++stats_.sequences_ended;
  if (it->second.gslot >= 0) {
    end_in_slot_locked(it, now);
    return true;
  }
  // Backlogged: it never had a slot (nor state). Its requests are cancelled.
  std::vector<Request*> dropped;
  table_.drop_backlogged(it, dropped);
  std::vector<uint64_t> handles;
  for (Request* r : dropped) {
    handles.push_back(r->handle);
    stats_.fail.add(1, now - r->arrival_ns);
    ++stats_.fail_canceled;
    recycle_locked(r);
  }
  if (!handles.empty())
    fails.emplace_back(std::move(handles),
                       "sequence " + id.repr() + " was ended through the sequence API before it got a slot");
  return true;
}

std::string SequenceScheduler::session_gone(const CorrId& id) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = now_ns();
  if (released_ids_.find(id, now)) return "it was checkpointed and released from this server (it moved)";
  const Tombstone* t = table_.tombstones().find(id, now);
  return t ? session_gone_message(id, *t) : std::string();
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

// ------------------------------------------------------------------------- checkpoints
//
// Checkpoints: a live sequence's implicit state copied out of its slot (and, on release, the
// slot freed without an END step: the sequence moved, it did not end), and a sequence restored
// into a free slot from such a copy, so that its next non-START request continues there.
//
// Who touches a slot's state: the instance's executor while it runs a batch (inst.executing),
// everyone else only under the scheduler lock. A checkpoint reads a slot that is in no batch
// (the sequence is not busy), so it may read while the instance runs another batch. A restore
// writes a free slot at once when the instance is idle, else stages the value until the
// running batch is done (the batch may read the slot as a padding row, or write it as the END
// row of the slot's previous sequence), which is before any batch of the restored sequence.

namespace {

// Whether a request of slot `index` is in the batch `inst` runs now.
bool in_running_batch(const Instance& inst, int index) {
  if (!inst.executing) return false;
  for (const Row& row : inst.batch.rows)
    if (row.req && row.slot == index) return true;
  return false;
}

}  // namespace

SubmitResult SequenceScheduler::checkpoint_sequence(const CorrId& id, bool release, const StateSink& sink,
                                                    SequenceInfo& info, bool& found) {
  std::vector<Instance*> wake;
  SubmitResult res;
  {
    std::lock_guard<std::mutex> lk(mu_);
    found = false;
    if (closed_) return refuse(kUnavailable, kStopping);
    res = checkpoint_locked(id, release, sink, info, found, wake);
  }
  for (Instance* inst : wake) inst->cv.notify_one();
  return res;
}

SubmitResult SequenceScheduler::restore_sequence(const CorrId& id, bool session, uint64_t steps,
                                                 const std::vector<StateValue>& states) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_ || !accepting_) return refuse(kUnavailable, kStopping);
  return restore_locked(id, session, steps, states);
}

bool SequenceScheduler::slot_busy_locked(int g) {
  const Slot& sl = table_.slot(g);
  if (!sl.queue.empty()) return true;
  // A step of the batch the instance runs is done once the batch is recorded: its state is
  // written and its reply is on its way, so a client that has its reply can move the sequence
  // at once (the executor has yet to tidy up). Oldest: in flight is also a request handed to the
  // batcher that has not run yet.
  if (in_running_batch(*instances_[sl.instance], sl.index)) return !instances_[sl.instance]->recorded;
  return sl.in_flight;
}

SubmitResult SequenceScheduler::checkpoint_locked(const CorrId& id, bool release, const StateSink& sink,
                                                  SequenceInfo& info, bool& found, std::vector<Instance*>& wake) {
  if (spec_.states.empty())
    return refuse(kUnsupported, "model '" + spec_.name +
                                    "' keeps its sequences' state itself (its config has no implicit state): its "
                                    "sequences cannot be checkpointed, only finished where they run");
  auto it = table_.find(id);
  if (!table_.found(it)) return {};
  found = true;
  const int g = it->second.gslot;
  if (g < 0 || slot_busy_locked(g)) {
    SubmitResult busy = refuse(kUnavailable, "sequence " + id.repr() + " of model '" + spec_.name + "' " +
                                                 (g < 0 ? "is waiting for a slot" : "has a request queued or running") +
                                                 ": checkpoint it after its step");
    busy.busy = true;
    return busy;
  }
  const int64_t now = now_ns();
  Slot& sl = table_.slot(g);
  Instance& inst = *instances_[sl.instance];
  info_locked(id, it->second, now, info);
  // The batch the instance runs may hold this slot as a padding row (read() keeps clear of it).
  inst.state.read(sl.index, sink, inst.executing && !inst.recorded ? &inst.batch.rows : nullptr);
  if (!release) return {};
  // It moved: no END step, no tombstone, not counted as ended; remembered as released so that
  // a request for it here is not taken for a new sequence.
  ++stats_.sequences_released;
  released_ids_.record(id, 0, Tombstone::kEnded, 0, now);
  table_.erase(it);
  inst.state.discard_staged(sl.index);
  table_.release(sl.instance, sl.index);  // a backlogged sequence may take the slot at once
  if (!sl.queue.empty()) {
    slot_queued_locked(inst, sl.index);
    if (!inst.executing) wake.push_back(&inst);
  }
  return {};
}

SubmitResult SequenceScheduler::restore_locked(const CorrId& id, bool session, uint64_t steps,
                                               const std::vector<StateValue>& states) {
  const std::string name = "sequence " + id.repr() + " of model '" + spec_.name + "'";
  if (spec_.states.empty())
    return refuse(kUnsupported, "model '" + spec_.name +
                                    "' keeps its sequences' state itself (its config has no implicit state): it "
                                    "cannot restore a sequence from a checkpoint");
  if (id.none())
    return refuse(kInvalidArg, "a checkpoint's sequence id must be a non-zero integer or a non-empty string");
  if (table_.found(table_.find(id))) return refuse(kAlreadyExists, name + " is already live here: not restored");
  // Every instance has the same specs: instance 0's store checks them.
  const std::string bad = instances_[0]->state.check(states);
  if (!bad.empty()) return refuse(kInvalidArg, "the checkpoint of " + name + " does not fit the model: " + bad);
  const int64_t now = now_ns();
  // Oldest: a free slot whose previous sequence's END is still with the batcher waits for it,
  // unless that END is in the batch running now and recorded (its state written): the value is
  // then staged until the batch is done, as for any slot of a running instance.
  const int g = table_.claim_restored(id, session, steps, now, [this](int i, int s) {
    return !table_.slot(i, s).in_flight || (in_running_batch(*instances_[i], s) && instances_[i]->recorded);
  });
  if (g < 0) {
    SubmitResult full = refuse(kUnavailable, "no sequence slot of model '" + spec_.name + "' is free to restore " +
                                                 name + " (" + std::to_string(table_.backlog_sequences()) +
                                                 " sequences wait in the backlog); retry later");
    full.backlog_full = true;  // worth retrying later
    return full;
  }
  Slot& sl = table_.slot(g);
  Instance& inst = *instances_[sl.instance];
  if (inst.executing) inst.state.stage(sl.index, states);
  else inst.state.write(sl.index, states);
  if (!released_ids_.empty()) released_ids_.erase(id);
  ++stats_.sequences_restored;
  return {};
}

}  // namespace seqserve
