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
  // How long and how many released sequences are remembered (released_ids_).
  static constexpr int64_t kReleasedTtlNs = 3600LL * 1000000000LL;
  static constexpr size_t kMaxReleased = 65536;

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
  bool end_owned_sequence_locked(const CorrId& id, uint64_t owner, const std::string& why) override;
  int slot_of_locked(const CorrId& id) override;
  void batch_done_locked(Instance& inst) override;
  void sequence_gauges_locked(Stats& s) override;
  int64_t list_sequences_locked(std::vector<SequenceInfo>& out, size_t limit) override;
  bool find_sequence_locked(const CorrId& id, SequenceInfo& out) override;
  bool end_sequence_locked(const CorrId& id, SequenceInfo& out, Fails& fails) override;
  std::string session_gone_locked(const CorrId& id) override;
  // Checkpoints (checkpoint.cc).
  SubmitResult checkpoint_locked(const CorrId& id, bool release, const StateSink& sink, SequenceInfo& info,
                                 bool& found, std::vector<Instance*>& wake) override;
  SubmitResult restore_locked(const CorrId& id, bool session, uint64_t steps,
                              const std::vector<StateValue>& states) override;
  // Whether the sequence in global slot `g` has a request queued or in a batch being formed or run.
  bool slot_busy_locked(int g);

  // Ends the sequence `id` that holds slot `s` of `inst` before its END: its id is forgotten
  // (a session's remembered for `reason`), its queued requests are answered CANCELLED with
  // `why`, and a marker takes their place: the slot is freed when it reaches batch forming,
  // after one final END step for the model under TIMEOUT_COMPLETE (if the model was handed
  // the sequence's START).
  void end_slot_locked(Instance& inst, int s, const CorrId& id, const std::string& why, Tombstone::Reason reason);
  // Drops the backlogged sequence queue `serial` (of sequence `id`) whole: its requests are
  // answered CANCELLED with `why`; the sequence, if still live, ends for `reason`.
  void drop_backlog_queue_locked(uint64_t serial, const CorrId& id, const std::string& why, Tombstone::Reason reason);
  // Forgets the live sequence `it` before its END (counted as ended; a session's remembered).
  void forget_locked(SequenceTable::Seqs::iterator it, Tombstone::Reason reason, int64_t now);
  // The message for the requests of a sequence cancelled because one of them was.
  std::string cancelled_message(const CorrId& id) const;
  Request* take_marker_locked(uint8_t kind, const CorrId& id, int64_t now);

  SequenceTable table_;
  Shapes rep_state_shapes_;  // batch forming's scratch (lock held)
  // Sequences checkpointed and released from here (they moved, they did not end): a later
  // non-START request for one is refused with the START error (released set), a session's
  // too (no implied START on fresh state), until it is restored or started again. Bounded.
  Tombstones released_ids_;

 private:
  void reaper_loop();
  void info_locked(const CorrId& id, const SeqEntry& e, int64_t now, SequenceInfo& out);
  // Forgets the live sequence `it`, which holds a slot, and queues the marker that frees the
  // slot (TIMEOUT_COMPLETE: one final END step) behind the requests already queued there.
  void end_in_slot_locked(SequenceTable::Seqs::iterator it, int64_t now);

  std::thread reaper_;
  bool reaper_stop_ = false;
};

}  // namespace seqserve
