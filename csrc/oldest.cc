// Oldest strategy (also Triton's reusable_batch): each instance batches the oldest requests
// handed over by its slots, one per sequence at a time, under the dynamic batcher's rules
// (preferred sizes, queue delay). Rows come from arbitrary slots, so state is gathered (when
// the model reads it) unless the batch's slots happen to be consecutive and in order.
#include "sequence_scheduler.h"

namespace seqserve {

namespace {

class OldestScheduler final : public SequenceScheduler {
 public:
  OldestScheduler(ModelSpec spec, Hooks hooks)
      : SequenceScheduler(std::move(spec), std::move(hooks), true), ready_(spec_.instance_count) {}
  ~OldestScheduler() override { close(true); }

 private:
  void run(Instance& inst) override;
  void slot_queued_locked(Instance& inst, int index) override { handoff_locked(inst, index); }
  void drain_instance_locked(Instance& inst, const std::function<void(Request*)>& take) override {
    Ring<Request*>& q = ready_[inst.index];
    while (!q.empty()) take(q.pop());
  }
  void handoff_locked(Instance& inst, int s);
  void drop_cancelled_ready_locked(Instance& inst);

  std::vector<Ring<Request*>> ready_;  // per instance: requests handed to its batcher
  std::vector<std::pair<int, Request*>> dropped_;  // drop_cancelled_ready_locked's scratch
};

void OldestScheduler::handoff_locked(Instance& inst, int s) {
  // A slot passes its next request to the instance's batcher only when nothing of it is in
  // flight, so a batch never holds two requests of one sequence.
  Slot& sl = table_.slot(inst.index, s);
  while (!sl.in_flight && !sl.queue.empty()) {
    if (sl.queue.front()->cancelled) {  // its sequence ends here (as in Triton), leaving a marker
      const CorrId id = sl.queue.front()->id;
      end_slot_locked(inst, s, id, cancelled_message(id), Tombstone::kCancelled);
      continue;
    }
    Request* r = sl.queue.pop();
    if (r->kind == kForceEnd) {
      recycle_locked(r);
      table_.release(inst.index, s);  // a backlogged sequence may refill the queue
      continue;
    }
    r->slot = s;
    r->handoff_ns = now_ns();
    sl.in_flight = true;
    if (r->kind == kNormal) {
      if (r->start) {
        sl.steps = 0;
        sl.start_ns = r->arrival_ns;
        sl.begun = true;
      }
      ++sl.steps;
    }
    ready_[inst.index].push(r);
    if (r->end) table_.release(inst.index, s);  // its successor waits for in_flight to clear
  }
}

void OldestScheduler::drop_cancelled_ready_locked(Instance& inst) {
  // Cancelled requests handed to the batcher leave it; the sequence of each (unless the request
  // was its END, which already ended it) ends as in the slot queue.
  inst.cancels = false;
  Ring<Request*>& ready = ready_[inst.index];
  const size_t n = ready.size();
  dropped_.clear();
  for (size_t i = 0; i < n; ++i) {
    Request* r = ready.pop();
    if (r->kind == kNormal && r->cancelled) dropped_.emplace_back(r->slot, r);
    else ready.push(r);
  }
  const int64_t now = now_ns();
  for (auto& [s, r] : dropped_) {
    Slot& sl = table_.slot(inst.index, s);
    sl.in_flight = false;
    --counts_.queued;
    const CorrId id = r->id;
    const bool was_end = r->end;
    if (r->start) sl.begun = false;  // the model never saw it
    std::vector<uint64_t> handles;
    cancelled_locked(r, handles, now);
    cancelled_.emplace_back(std::move(handles), cancelled_message(id));
    if (!was_end) end_slot_locked(inst, s, id, cancelled_message(id), Tombstone::kCancelled);
    handoff_locked(inst, s);
  }
  dropped_.clear();
}

void OldestScheduler::run(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  const bool has_var_state = inst.state.has_variable();
  Ring<Request*>& ready = ready_[inst.index];
  std::vector<int> done;
  for (;;) {
    if (force_) break;
    if (flush_cancelled(lk)) continue;
    if (inst.cancels) drop_cancelled_ready_locked(inst);
    if (!released_locked() || ready.empty()) {
      if (closing_ && (ready.empty() || !delay_released_)) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    const Request* rep = nullptr;
    for (size_t i = 0; i < ready.size() && !rep; ++i)
      if (ready.at(i)->kind == kNormal) rep = ready.at(i);
    if (has_var_state && rep) inst.state.shapes_of(rep->slot, rep, rep_state_shapes_);
    int64_t wake = 0;
    const size_t n = pick_batch(
        ready.size(), [](size_t) { return int64_t{1}; },
        [&](size_t i) {
          const Request* r = ready.at(i);
          if (!rep || r->kind != kNormal || r == rep) return true;
          return shapes_match(r, rep) &&
                 (!has_var_state || inst.state.shapes_match(r->slot, r, rep_state_shapes_));
        },
        ready.front()->handoff_ns, &wake);
    if (n == 0) {
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait_for(lk, std::chrono::nanoseconds(wake - now_ns() + 1));
      continue;
    }
    if (hold.acquire()) continue;  // what arrived while we waited joins this batch
    std::vector<Row>& rows = inst.batch.rows;
    rows.clear();
    for (size_t i = 0; i < n; ++i) {
      Request* r = ready.pop();
      if (r->kind == kNormal) --counts_.queued;
      rows.push_back(Row{r, r->slot});
    }
    inst.batch.size = spec_.max_batch_size > 0 ? static_cast<int64_t>(n) : 1;
    done.clear();
    for (const Row& row : rows) done.push_back(row.slot);
    run_formed_batch(inst, lk, hold, false);
    for (int s : done) {
      table_.slot(inst.index, s).in_flight = false;
      handoff_locked(inst, s);
    }
  }
}

}  // namespace

std::unique_ptr<Scheduler> make_oldest_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<OldestScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
