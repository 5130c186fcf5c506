// What the two sequence strategies (Direct, Oldest) share: a request is routed through the
// sequence table (its slot, a free slot, or the backlog), and a reaper thread expires idle
// sequences and timed-out backlogged ones.
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
  void sequence_gauges_locked(Stats& s) override;
  int64_t list_sequences_locked(std::vector<SequenceInfo>& out, size_t limit) override;
  bool find_sequence_locked(const CorrId& id, SequenceInfo& out) override;
  bool end_sequence_locked(const CorrId& id, SequenceInfo& out, Fails& fails) override;
  std::string session_gone_locked(const CorrId& id) override;

  SequenceTable table_;
  Shapes rep_state_shapes_;  // batch forming's scratch (lock held)

 private:
  void reaper_loop();
  Request* take_marker_locked(uint8_t kind, const CorrId& id, int64_t now);
  void info_locked(const CorrId& id, const SeqEntry& e, int64_t now, SequenceInfo& out);
  // Forgets the live sequence `it`, which holds a slot, and queues the marker that frees the
  // slot (TIMEOUT_COMPLETE: one final END step) behind the requests already queued there.
  void end_in_slot_locked(SequenceTable::Seqs::iterator it, int64_t now);

  std::thread reaper_;
  bool reaper_stop_ = false;
};

}  // namespace seqserve
