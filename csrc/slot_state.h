// The implicit state of one instance's sequence slots. A fixed-shape state lives in one
// [slots, ...] store: Direct hands the model its rows in place (batch row == slot), Oldest
// hands them in place when the batch's slots are consecutive and in order, and otherwise
// gathers them by slot when the model first reads them. Variable-shape and BYTES states live per slot and are always gathered. Padding rows
// never change a sequence's state.
//
// How a fixed-shape state's next value gets back (docs/behaviour.md, "Implicit state buffers"):
//  * the model returns a fresh array: its real rows are copied into the store (scatter);
//  * the model returns the next-state buffer (next_buffer()): where the batch's state is a view
//    of the store, that buffer is the same rows of a second store (alt_), and the two stores
//    trade places, so nothing is copied but the rows of ready slots the batch did not update
//    (or, when those are more, the batch's real rows are copied instead: the cheaper of two
//    exact ways). Otherwise it is a scratch [B, ...] buffer and its real rows are copied;
//  * same_buffer states (use_same_buffer_for_input_output): the input view is writable and is
//    also the next-state buffer; writes land in the store itself (or in the gathered rows, which
//    finish() writes back), and padding rows are restored by finish().
// A failed batch changes nothing it did not hand back through scatter(), except same_buffer
// states, whose in-place writes are kept (as in Triton, where that buffer is the state).
//
// Threads: everything but slot_bytes() runs on the instance's executor thread (batch forming
// under the scheduler lock, reset/gather/scatter/finish without it); the reaper reads
// slot_bytes().
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "request.h"
#include "spec.h"

namespace seqserve {

using Shapes = std::vector<std::vector<int64_t>>;

// One implicit state's value for one sequence, in spec order: a view of bytes (BYTES states:
// serialized) and the shape without the batch dim.
struct StateValue {
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class SlotState {
 public:
  // `gather_fixed`: batch rows are not slot indices (Oldest), so fixed states are gathered
  // unless the batch's slots are consecutive and in order.
  void init(const std::vector<StateSpec>& specs, int slots, bool gather_fixed);

  bool has_variable() const { return has_variable_; }
  bool has_fixed() const { return has_fixed_; }
  // Batch forming: the variable state shapes `r` would present from `slot` (START and a slot's
  // first use present the initial shape), and whether they equal `rep`.
  void shapes_of(int slot, const Request* r, Shapes& out) const;
  bool shapes_match(int slot, const Request* r, const Shapes& rep) const;

  // Gives START rows (and a slot's first use) the initial state.
  void reset(const std::vector<Row>& rows);
  // Presents the state of `rows` as [B, ...] tensors (batched) or one item.
  void gather(const std::vector<Row>& rows, int64_t B, bool batched);
  // Writes output state k of the batch back to the real rows' slots (no copy where `data` is
  // the batch's own next-state buffer and the layout allows).
  void scatter(size_t k, const std::vector<Row>& rows, int64_t B, bool batched, const uint8_t* data,
               size_t nbytes, const int64_t* shape, int ndim);
  // After the model call, whether it succeeded or not: keeps same_buffer states' in-place
  // writes to gathered rows and undoes any write to padding rows. Once per gather(): later
  // calls do nothing (the batch is finished when it is recorded, and again after the call).
  void finish(const std::vector<Row>& rows);
  // Bytes of state one slot holds now (any thread).
  uint64_t slot_bytes(int slot) const;

  // The batch's state k after gather(). A fixed-shape state that is not a view of the store is
  // gathered on the first call, so a model that never reads it costs no copy.
  uint8_t* data(size_t k);
  size_t nbytes(size_t k) const { return nbytes_[k]; }
  const std::vector<int64_t>& shape(size_t k) const { return shapes_[k]; }
  // Whether the model may write into data(k) (a same_buffer fixed-shape state).
  bool writable(size_t k) const { return same_buffer_[k] != 0; }
  // A writable buffer of data(k)'s shape for the batch's next state k (after gather()), or
  // nullptr for variable-shape and BYTES states (the model returns a fresh array for those).
  uint8_t* next_buffer(size_t k);

  // Slot `slot`'s current row of fixed-shape state k (initial.size() bytes). Valid until the
  // next scatter() or finish(): the two stores of a state trade places.
  uint8_t* fixed_row(size_t k, int slot) const { return store_[k].data() + slot * row_bytes_[k]; }

  // Checkpoints (SequenceScheduler), under the scheduler lock, for a slot no running batch of
  // this instance reads or writes as a real row. check: why `values` do not fit the specs ("" when
  // they do). read: the slot's state (a staged value when one waits) to `sink`. write: the
  // slot holds `values` now (the instance is not executing); stage: it will, once the batch
  // this instance runs now is done (apply_staged(), from batch_done_locked): the batch may read
  // the slot as a padding row, or write it as the END row of the slot's previous sequence.
  std::string check(const std::vector<StateValue>& values) const;
  // `running`: the rows of the batch this instance runs and has not recorded yet, or nullptr.
  void read(int slot, const std::function<void(size_t, const std::vector<int64_t>&, const uint8_t*, size_t)>& sink,
            const std::vector<Row>* running) const;
  void write(int slot, const std::vector<StateValue>& values);
  void stage(int slot, const std::vector<StateValue>& values);
  void apply_staged();
  void discard_staged(int slot);

 private:
  struct PerSlot {
    bool ready = false;  // has had a state created at least once
    Shapes shape;        // per variable state
    std::vector<Buffer> data;
    std::vector<size_t> bytes;  // written with relaxed atomics: slot_bytes() reads them
  };
  // Slot `slot`'s value of fixed-shape state k for a checkpoint (read()); `tmp` may hold it.
  const uint8_t* fixed_value(size_t k, int slot, const std::vector<Row>* running, std::string& tmp) const;
  void set_slot(PerSlot& sl, size_t k, const std::vector<int64_t>& shape, const uint8_t* data, size_t n);
  void commit_alt(size_t k, const std::vector<Row>& rows);
  void copy_rows(size_t k, const std::vector<Row>& rows, const uint8_t* data, size_t rb);

  const std::vector<StateSpec>* specs_ = nullptr;
  bool has_variable_ = false, has_fixed_ = false, gather_fixed_ = false;
  std::vector<PerSlot> slots_;
  std::vector<Buffer> store_;      // fixed states: [slots, row bytes]
  std::vector<Buffer> alt_;        // fixed states: the second store (allocated on first use)
  std::vector<Buffer> gather_;     // states gathered per batch ([B, ...])
  std::vector<Buffer> scratch_;    // next-state buffers of gathered batches
  std::vector<Buffer> pad_;        // same_buffer states: padding rows saved by gather()
  std::vector<size_t> row_bytes_;  // fixed states: bytes per slot
  std::vector<uint8_t> gathered_;  // per state: always gathered (variable-shape, BYTES)
  std::vector<uint8_t> same_buffer_;
  std::vector<uint8_t> in_batch_;  // per slot: a real row of the current batch (commit_alt)
  size_t ready_count_ = 0;         // slots that hold a state (PerSlot::ready)
  size_t ready_end_ = 0;           // 1 + the highest such slot
  // Per batch: the slot of row 0 where state k is a view of the store, else -1 (gathered).
  std::vector<int64_t> base_;
  std::vector<uint8_t> pending_;   // per state: gathered on first data() (rows_ of this batch)
  const std::vector<Row>* rows_ = nullptr;
  bool open_ = false;              // between gather() and finish() (executor thread only)
  // Per fixed state: store_[k].data(), for a checkpoint that reads an idle slot while the
  // executor may swap the stores (both hold that slot's value; only the pointer moves).
  std::unique_ptr<std::atomic<const uint8_t*>[]> current_;
  std::atomic<uint32_t> gen_{0};   // odd while the model may write padding rows (fixed_value())
  std::vector<uint8_t> handed_;    // per state: next_buffer() was called in this batch
  std::vector<uint8_t> set_;       // per state: scatter() ran in this batch
  Shapes shapes_;                  // per state, the batch shape presented
  std::vector<size_t> nbytes_;
  struct Staged {
    int slot = -1;
    Shapes shapes;
    std::vector<std::string> data;
  };
  std::vector<Staged> staged_;  // restores waiting for the running batch to finish
};

}  // namespace seqserve
