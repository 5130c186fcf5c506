// What the two sequence strategies (Direct, Oldest) share: a request is routed through the
// sequence table (its slot, a free slot, or the backlog, which admission control bounds), a
// reaper thread expires idle sequences and timed-out backlogged ones, and sequences end early
// when a request of theirs is cancelled or their owner ends them. The sequence API (list, find,
// end, checkpoint, restore) is theirs alone: the binding finds it with a dynamic_cast, and
// answers for a model without sequences itself.
#pragma once

#include "scheduler.h"
#include "sequence_table.h"

namespace seqserve {

// One live sequence as the sequence API shows it.
struct SequenceInfo {
  CorrId id;
  bool backlogged = false;  // waiting for a slot
  bool session = false;     // named by a session (START may be implied; ends are remembered)
  int instance = -1, slot = -1;
  double age_s = 0, idle_s = 0;  // since its START arrived; since its last request arrived
  uint64_t steps = 0;            // steps handed to the model
  uint64_t state_bytes = 0;      // implicit state it holds
  int64_t queued = 0;            // requests waiting in its slot's queue or in the backlog
};

// Receives a checkpoint's state k (called under the scheduler lock; it must not call back into
// the scheduler).
using StateSink = std::function<void(size_t k, const std::vector<int64_t>& shape, const uint8_t* data, size_t nbytes)>;

class SequenceScheduler : public Scheduler {
 public:
  // Ends sequence `id` now, as idle expiry does (a final END step under TIMEOUT_COMPLETE), if
  // its latest START had handle `owner` (0: whoever started it). Its queued requests are
  // answered CANCELLED with `why`. False when no such sequence is live.
  bool end_owned_sequence(const CorrId& id, uint64_t owner, const std::string& why);
  // Where sequence `id` is: its global slot, -1 in the backlog, -2 unknown (or ended).
  int slot_of(const CorrId& id);
  int64_t free_slots();
  int64_t backlog_sequences();
  void describe_slots(std::vector<std::pair<std::string, int>>& out);
  // list: up to `limit` live sequences (in no particular order); returns how many there are.
  // find: one sequence, false when it is not live. end: ends a live sequence as idle expiry
  // does (a final END step with TIMEOUT_COMPLETE), or drops a backlogged one and fails its
  // requests (CANCELLED); false when it is not live. gone: why a session id that is not live
  // is refused, or "" (sessions it does not remember).
  int64_t list_sequences(std::vector<SequenceInfo>& out, size_t limit);
  bool find_sequence(const CorrId& id, SequenceInfo& out);
  bool end_sequence(const CorrId& id, SequenceInfo& out);
  std::string session_gone(const CorrId& id);
  // Checkpoints. checkpoint: copies the live sequence `id`'s implicit state to `sink` (state by
  // state) and fills `info`; with `release` the sequence then leaves its slot without an END
  // step or a tombstone (it moved). Accepted with *found false when `id` is not live; refused
  // UNAVAILABLE+busy while it has a request queued or running (or waits in the backlog),
  // UNSUPPORTED for a model without implicit state. restore: claims a free slot for `id`
  // holding `states` and `steps`, so its next non-START request continues from there; refused
  // ALREADY_EXISTS when `id` is live, UNAVAILABLE when no slot is free, INVALID_ARG when the
  // states do not fit the spec. The states are copied: the caller keeps its buffers.
  SubmitResult checkpoint_sequence(const CorrId& id, bool release, const StateSink& sink, SequenceInfo& info,
                                   bool& found);
  SubmitResult restore_sequence(const CorrId& id, bool session, uint64_t steps, const std::vector<StateValue>& states);
  // Iterative sequences: `r` (neither START nor END) is a request of sequence r->id that the
  // model released with RESCHEDULE; it goes to the front of the sequence's slot queue, ahead
  // of the sequence's later steps, so it is the sequence's next step (the slot, its state and
  // the START processing stay as they are). Refused with the START error when the sequence is
  // no longer live (ended, expired); a sequence waiting in the backlog takes it the usual way.
  SubmitResult requeue_front(Request* r);

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
  void cancel_locked(Request* r) override;
  void batch_done_locked(Instance& inst) override;
  void gauges_locked(Stats& s) override;
  // The locked halves of the public sequence API.
  bool end_owned_sequence_locked(const CorrId& id, uint64_t owner, const std::string& why);
  bool end_sequence_locked(const CorrId& id, SequenceInfo& out, Fails& fails);
  SubmitResult checkpoint_locked(const CorrId& id, bool release, const StateSink& sink, SequenceInfo& info,
                                 bool& found, std::vector<Instance*>& wake);
  SubmitResult restore_locked(const CorrId& id, bool session, uint64_t steps, const std::vector<StateValue>& states);
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
  // The refusal of a non-START request for a sequence that is not live.
  SubmitResult start_error(const CorrId& id) const;
  // The message for the requests of a sequence cancelled because one of them was.
  std::string cancelled_message(const CorrId& id) const;
  // A marker request (kForceEnd, kNotify) lent by the pool; it goes back like any request.
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
