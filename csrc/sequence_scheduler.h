// What the two sequence strategies (Direct, Oldest) share: a request is routed through the
// sequence table (its slot, a free slot, or the backlog, which admission control bounds), a
// reaper thread expires idle sequences and timed-out backlogged ones, and sequences end early
// when a request of theirs is cancelled or their owner ends them.
#pragma once

#include "scheduler.h"
#include "sequence_table.h"

namespace seqserve {

class SequenceScheduler : public Scheduler {
 protected:
  SequenceScheduler(ModelSpec spec, Hooks hooks, bool gather_state);

  // A request (or an expiry marker) was queued in a slot of `inst` (lock held).
  virtual void slot_queued_locked(Instance&, int) {}
  // Close: requests an instance holds outside its slot queues.
  virtual void drain_instance_locked(Instance&, const std::function<void(Request*)>&) {}

  SubmitResult enqueue_locked(Request* r, int priority, Instance*& wake, std::string& warning) override;
  void start_helpers() override;
  void stop_helpers() override;
  void drain_locked(const std::function<void(Request*)>& take) override;
  int64_t inflight_locked() override { return table_.active_sequences(); }
  int64_t free_slots_locked() override { return table_.free_slots(); }
  int64_t backlog_sequences_locked() override { return table_.backlog_sequences(); }
  void describe_locked(std::vector<std::pair<std::string, int>>& out) override { table_.describe(out); }
  void cancel_locked(Request* r) override;
  bool end_sequence_locked(const CorrId& id, uint64_t owner, const std::string& why) override;
  int slot_of_locked(const CorrId& id) override;
  void batch_done_locked(Instance& inst) override;

  // Ends the sequence `id` that holds slot `s` of `inst` before its END: its id is forgotten,
  // its queued requests are answered CANCELLED with `why`, and a marker takes their place: the
  // slot is freed when it reaches batch forming, after one final END step for the model under
  // TIMEOUT_COMPLETE (if the model was handed the sequence's START).
  void end_slot_locked(Instance& inst, int s, const CorrId& id, const std::string& why);
  // The message for the requests of a sequence cancelled because one of them was.
  std::string cancelled_message(const CorrId& id) const;
  Request* take_marker_locked(uint8_t kind, const CorrId& id, int64_t now);

  SequenceTable table_;
  Shapes rep_state_shapes_;  // batch forming's scratch (lock held)

 private:
  void reaper_loop();

  std::thread reaper_;
  bool reaper_stop_ = false;
};

}  // namespace seqserve
