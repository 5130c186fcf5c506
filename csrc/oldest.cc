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
  Next form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) override;
  void batch_done_locked(Instance& inst) override;
  void slot_queued_locked(Instance& inst, int index) override { handoff_locked(inst, index); }
  void drain_instance_locked(Instance& inst, const std::function<void(Request*)>& take) override {
    Ring<Request*>& q = ready_[inst.index];
    while (!q.empty()) take(q.pop());
  }
  bool batch_ready_locked(Instance& inst) override {
    int64_t wake = 0;
    return !ready_[inst.index].empty() && pick_locked(inst, &wake) > 0;
  }
  // How many of the instance's ready requests make its next batch now (0: wait until *wake).
  size_t pick_locked(Instance& inst, int64_t* wake);
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

size_t OldestScheduler::pick_locked(Instance& inst, int64_t* wake) {
  Ring<Request*>& ready = ready_[inst.index];
  const bool has_var_state = inst.state.has_variable();
  const Request* rep = nullptr;
  for (size_t i = 0; i < ready.size() && !rep; ++i)
    if (ready.at(i)->kind == kNormal) rep = ready.at(i);
  if (has_var_state && rep) inst.state.shapes_of(rep->slot, rep, rep_state_shapes_);
  return pick_batch(
      ready.size(), [](size_t) { return int64_t{1}; },
      [&](size_t i) {
        const Request* r = ready.at(i);
        if (!rep || r->kind != kNormal || r == rep) return true;
        return shapes_match(r, rep) &&
               (!has_var_state || inst.state.shapes_match(r->slot, r, rep_state_shapes_));
      },
      ready.front()->handoff_ns, wake);
}

Scheduler::Next OldestScheduler::form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) {
  if (flush_cancelled(lk)) return {Next::kAgain};
  if (inst.cancels) drop_cancelled_ready_locked(inst);
  Ring<Request*>& ready = ready_[inst.index];
  const bool released = released_locked();
  if (!released || ready.empty()) {
    if (closing_ && (ready.empty() || !delay_released_)) return {Next::kExit};
    return {released ? Next::kIdle : Next::kBlocked};
  }
  int64_t wake = 0;
  const size_t n = pick_locked(inst, &wake);
  if (n == 0) return Next::until(wake + 1);
  if (hold.acquire()) return {Next::kAgain};  // what arrived while we waited joins this batch
  std::vector<Row>& rows = inst.batch.rows;
  rows.clear();
  for (size_t i = 0; i < n; ++i) {
    Request* r = ready.pop();
    if (r->kind == kNormal) --counts_.queued;
    rows.push_back(Row{r, r->slot});
  }
  inst.batch.size = spec_.max_batch_size > 0 ? static_cast<int64_t>(n) : 1;
  return Next::batch(false);
}

void OldestScheduler::batch_done_locked(Instance& inst) {
  SequenceScheduler::batch_done_locked(inst);
  // Each sequence of the batch may hand its next request to the batcher now.
  for (const Row& row : inst.batch.rows) {
    table_.slot(inst.index, row.slot).in_flight = false;
    handoff_locked(inst, row.slot);
  }
}

}  // namespace

std::unique_ptr<Scheduler> make_oldest_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<OldestScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
