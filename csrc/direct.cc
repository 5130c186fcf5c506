// Direct strategy: a sequence keeps its slot, and batch row == slot index. Each batch takes the
// front request of every slot of the instance that has one; holes and requests whose shapes
// differ from the batch's become padding rows (READY=0). Fixed-shape state is read in place.
#include "sequence_scheduler.h"

namespace seqserve {

namespace {

class DirectScheduler final : public SequenceScheduler {
 public:
  DirectScheduler(ModelSpec spec, Hooks hooks) : SequenceScheduler(std::move(spec), std::move(hooks), false) {}
  ~DirectScheduler() override { close(true); }

 private:
  Next form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) override;
};

Scheduler::Next DirectScheduler::form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) {
  if (flush_cancelled(lk)) return {Next::kAgain};
  if (!released_locked()) return {closing_ ? Next::kExit : Next::kBlocked};
  const int mbs1 = std::max(1, spec_.max_batch_size);
  const bool has_var_state = inst.state.has_variable();
  int& max_active = table_.max_active(inst.index);
  auto slot = [&](int s) -> Slot& { return table_.slot(inst.index, s); };
  int ready = 0, max_slot = -1, rep = -1;
  int64_t earliest = INT64_MAX;
  for (int s = 0; s <= max_active; ++s) {
    Slot& sl = slot(s);
    // A force-end marker at the front frees the slot; a backlogged sequence may refill it. A
    // cancelled request at the front ends its sequence (as in Triton), leaving a marker.
    while (!sl.queue.empty()) {
      Request* front = sl.queue.front();
      if (front->kind == kForceEnd) {
        recycle_locked(sl.queue.pop());
        table_.release(inst.index, s);
      } else if (front->cancelled) {
        const CorrId id = front->id;
        end_slot_locked(inst, s, id, cancelled_message(id), Tombstone::kCancelled);
      } else {
        break;
      }
    }
    if (sl.queue.empty()) continue;
    ++ready;
    max_slot = s;
    // The representative fixes shapes; a final END step (kNotify) adapts to it.
    if (rep < 0 && sl.queue.front()->kind == kNormal) rep = s;
    earliest = std::min(earliest, sl.queue.front()->arrival_ns);
  }
  while (max_active >= 0 && !slot(max_active).occupied && slot(max_active).queue.empty()) --max_active;
  if (ready == 0) return {closing_ ? Next::kExit : Next::kIdle};
  if (spec_.max_queue_delay_ns > 0 && spec_.min_slot_utilization > 0 && !closing_) {
    const int64_t now = now_ns();
    const bool waited = now - earliest > spec_.max_queue_delay_ns;
    const bool full = static_cast<double>(ready) / mbs1 >= spec_.min_slot_utilization;
    if (!waited && !full) return Next::until(earliest + spec_.max_queue_delay_ns + 1);
  }
  if (hold.acquire()) return {Next::kAgain};  // what arrived while we waited joins this batch
  // Batch position == slot index; holes and shape mismatches become padding rows.
  const Request* rep_req = rep >= 0 ? slot(rep).queue.front() : nullptr;
  if (has_var_state && rep_req) inst.state.shapes_of(rep, rep_req, rep_state_shapes_);
  std::vector<Row>& rows = inst.batch.rows;
  rows.clear();
  for (int s = 0; s <= max_slot; ++s) {
    rows.push_back(Row{nullptr, s});
    Slot& sl = slot(s);
    if (sl.queue.empty()) continue;
    Request* front = sl.queue.front();
    if (rep_req && s != rep && front->kind == kNormal &&
        (!shapes_match(front, rep_req) ||
         (has_var_state && !inst.state.shapes_match(s, front, rep_state_shapes_))))
      continue;
    Request* r = sl.queue.pop();
    if (r->kind == kNormal) {
      --counts_.queued;
      if (r->start) {
        sl.steps = 0;
        sl.start_ns = r->arrival_ns;
        sl.begun = true;
      }
      ++sl.steps;
    }
    rows.back().req = r;
    if (r->end) table_.release(inst.index, s);  // the backlog gets the slot before END runs
  }
  inst.batch.size = max_slot + 1;
  return Next::batch(false);
}

}  // namespace

std::unique_ptr<Scheduler> make_direct_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<DirectScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
