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
#include <algorithm>
#include <stdexcept>

#include "sequence_scheduler.h"

namespace seqserve {

// ------------------------------------------------------------------------- StateStore

namespace {

bool mul_ok(size_t a, size_t b, size_t* out) { return !__builtin_mul_overflow(a, b, out); }

// How many bytes `count` serialized BYTES elements take at the front of [p, p+n), or npos.
size_t bytes_elements(const uint8_t* p, size_t n, size_t count) {
  size_t off = 0;
  for (size_t e = 0; e < count; ++e) {
    if (n - off < 4) return std::string::npos;
    uint32_t len;
    std::memcpy(&len, p + off, 4);
    off += 4;
    if (n - off < len) return std::string::npos;
    off += len;
  }
  return off;
}

}  // namespace

std::string StateStore::check(const std::vector<StateValue>& values) const {
  const std::vector<StateSpec>& specs = *specs_;
  if (values.size() != specs.size())
    return "the checkpoint has " + std::to_string(values.size()) + " states, the model " +
           std::to_string(specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& st = specs[k];
    const StateValue& v = values[k];
    const std::string what = "state '" + st.input_name + "': ";
    if (v.shape.size() != st.dims.size() || v.shape.size() > static_cast<size_t>(kMaxRank))
      return what + "the checkpoint's shape has " + std::to_string(v.shape.size()) + " dims, the model's " +
             std::to_string(st.dims.size());
    size_t elems = 1;
    for (size_t d = 0; d < v.shape.size(); ++d) {
      const int64_t got = v.shape[d];
      if (got < 0 || (st.dims[d] >= 0 && got != st.dims[d]))
        return what + "dim " + std::to_string(d) + " is " + std::to_string(got) + ", the model's " +
               std::to_string(st.dims[d]);
      if (!mul_ok(elems, static_cast<size_t>(got), &elems)) return what + "its shape is too large";
    }
    if (st.type.is_bytes) {
      if (bytes_elements(v.data, v.nbytes, elems) != v.nbytes)
        return what + "its " + std::to_string(v.nbytes) + " bytes are not " + std::to_string(elems) +
               " serialized BYTES elements";
      continue;
    }
    size_t need;
    if (!mul_ok(elems, st.type.itemsize, &need) || need != v.nbytes)
      return what + "it has " + std::to_string(v.nbytes) + " bytes, its shape needs " +
             std::to_string(elems * st.type.itemsize);
  }
  return {};
}

void StateStore::read(int slot,
                      const std::function<void(size_t, const std::vector<int64_t>&, const uint8_t*, size_t)>& sink,
                      const std::vector<Row>* running) const {
  const std::vector<StateSpec>& specs = *specs_;
  for (const Staged& sg : staged_) {
    if (sg.slot != slot) continue;
    for (size_t k = 0; k < specs.size(); ++k)
      sink(k, sg.shapes[k], reinterpret_cast<const uint8_t*>(sg.data[k].data()), sg.data[k].size());
    return;
  }
  const SlotState& sl = slots_[slot];
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& st = specs[k];
    const auto* init = reinterpret_cast<const uint8_t*>(st.initial.data());
    if (!sl.ready) {  // never written (cannot happen to a sequence that ran a step): its initial value
      sink(k, is_var_state(st) ? st.initial_dims : st.dims, init, st.initial.size());
    } else if (is_var_state(st)) {
      sink(k, sl.shape[k], sl.data[k].data(), sl.bytes[k]);
    } else {
      std::string tmp;
      sink(k, st.dims, fixed_value(k, slot, running, tmp), st.initial.size());
    }
  }
}

const uint8_t* StateStore::fixed_value(size_t k, int slot, const std::vector<Row>* running,
                                       std::string& tmp) const {
  const uint8_t* row = current_[k].load(std::memory_order_acquire) + slot * row_bytes_[k];
  if (!running || !same_buffer_[k]) return row;
  // A same_buffer batch may write its padding rows in place until finish() puts them back, and
  // an idle sequence's slot can be one of them (Direct): gather() saved it in pad_ first. The
  // batch runs without the scheduler lock, so whether the model may be writing is told by gen_
  // (odd from the save to the restore): a copy of the store row is kept only if no model call
  // began or ended while it was made, else the saved row is read (pad_ is this batch's until
  // the next batch is formed, under the lock this caller holds).
  size_t j = 0;
  bool padding = false;
  for (const Row& r : *running) {
    if (r.req) continue;
    if (r.slot == slot) { padding = true; break; }
    ++j;
  }
  if (!padding) return row;
  const uint32_t g1 = gen_.load(std::memory_order_acquire);
  if (!(g1 & 1)) {
    tmp.assign(reinterpret_cast<const char*>(row), row_bytes_[k]);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (gen_.load(std::memory_order_relaxed) == g1) return reinterpret_cast<const uint8_t*>(tmp.data());
  }
  return pad_[k].data() + j * row_bytes_[k];
}

void StateStore::write(int slot, const std::vector<StateValue>& values) {
  const std::vector<StateSpec>& specs = *specs_;
  SlotState& sl = slots_[slot];
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateValue& v = values[k];
    if (is_var_state(specs[k])) {
      set_slot(sl, k, v.shape, v.data, v.nbytes);
    } else {
      std::memcpy(store_[k].data() + slot * v.nbytes, v.data, v.nbytes);
    }
  }
  if (!sl.ready) {  // a slot that holds a state: a later swap of the stores carries it over
    ++ready_count_;
    ready_end_ = std::max(ready_end_, static_cast<size_t>(slot) + 1);
  }
  sl.ready = true;  // the next non-START step reads this, not the initial state
}

void StateStore::stage(int slot, const std::vector<StateValue>& values) {
  discard_staged(slot);
  Staged sg;
  sg.slot = slot;
  for (const StateValue& v : values) {
    sg.shapes.push_back(v.shape);
    sg.data.emplace_back(reinterpret_cast<const char*>(v.data), v.nbytes);
  }
  staged_.push_back(std::move(sg));
}

void StateStore::apply_staged() {
  if (staged_.empty()) return;
  std::vector<StateValue> values;
  for (const Staged& sg : staged_) {
    values.clear();
    for (size_t k = 0; k < sg.data.size(); ++k)
      values.push_back(StateValue{sg.shapes[k], reinterpret_cast<const uint8_t*>(sg.data[k].data()), sg.data[k].size()});
    write(sg.slot, values);
  }
  staged_.clear();
}

void StateStore::discard_staged(int slot) {
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (staged_[i].slot != slot) continue;
    staged_.erase(staged_.begin() + i);
    return;
  }
}

// ---------------------------------------------------------------------- SequenceTable

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

// ---------------------------------------------------------------------- Scheduler

SubmitResult Scheduler::checkpoint_sequence(const CorrId& id, bool release, const StateSink& sink, SequenceInfo& info,
                                            bool& found) {
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

SubmitResult Scheduler::restore_sequence(const CorrId& id, bool session, uint64_t steps,
                                         const std::vector<StateValue>& states) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_ || !accepting_) return refuse(kUnavailable, kStopping);
  return restore_locked(id, session, steps, states);
}

SubmitResult Scheduler::checkpoint_locked(const CorrId&, bool, const StateSink&, SequenceInfo&, bool&,
                                          std::vector<Instance*>&) {
  return refuse(kUnsupported, "model '" + spec_.name + "' is not a sequence model: it has no sequences to checkpoint");
}

SubmitResult Scheduler::restore_locked(const CorrId&, bool, uint64_t, const std::vector<StateValue>&) {
  return refuse(kUnsupported, "model '" + spec_.name + "' is not a sequence model: it cannot restore a sequence");
}

// -------------------------------------------------------------- SequenceScheduler

namespace {

// Whether a request of slot `index` is in the batch `inst` runs now.
bool in_running_batch(const Instance& inst, int index) {
  if (!inst.executing) return false;
  for (const Row& row : inst.batch.rows)
    if (row.req && row.slot == index) return true;
  return false;
}

}  // namespace

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
  released_ids_.record(id, Tombstone::kEnded, 0, now);
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
