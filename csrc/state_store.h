// The implicit state of one instance's sequence slots. A fixed-shape state lives in one
// [slots, ...] store: Direct hands the model its rows in place (batch row == slot), Oldest
// gathers them by slot. Variable-shape and BYTES states live per slot and are always gathered.
// Padding rows never change a sequence's state.
//
// Threads: everything but slot_bytes() runs on the instance's executor thread (batch forming
// under the scheduler lock, reset/gather/scatter without it); the reaper reads slot_bytes().
#pragma once

#include <functional>
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

class StateStore {
 public:
  // `gather_fixed`: batch rows are not slot indices (Oldest), so fixed states are gathered too.
  void init(const std::vector<StateSpec>& specs, int slots, bool gather_fixed);

  bool has_variable() const { return has_variable_; }
  // Batch forming: the variable state shapes `r` would present from `slot` (START and a slot's
  // first use present the initial shape), and whether they equal `rep`.
  void shapes_of(int slot, const Request* r, Shapes& out) const;
  bool shapes_match(int slot, const Request* r, const Shapes& rep) const;

  // Gives START rows (and a slot's first use) the initial state.
  void reset(const std::vector<Row>& rows);
  // Presents the state of `rows` as [B, ...] tensors (batched) or one item.
  void gather(const std::vector<Row>& rows, int64_t B, bool batched);
  // Writes output state k of the batch back to the real rows' slots.
  void scatter(size_t k, const std::vector<Row>& rows, int64_t B, bool batched, const uint8_t* data,
               size_t nbytes, const int64_t* shape, int ndim);
  // Bytes of state one slot holds now (any thread).
  uint64_t slot_bytes(int slot) const;

  // The batch's state k after gather().
  uint8_t* data(size_t k) const { return gathered_[k] ? gather_[k].data() : store_[k].data(); }
  size_t nbytes(size_t k) const { return nbytes_[k]; }
  const std::vector<int64_t>& shape(size_t k) const { return shapes_[k]; }

  // Checkpoints (checkpoint.cc), under the scheduler lock, for a slot no running batch of this
  // instance reads or writes as a real row. check: why `values` do not fit the specs ("" when
  // they do). read: the slot's state (a staged value when one waits) to `sink`. write: the
  // slot holds `values` now (the instance is not executing); stage: it will, once the batch
  // this instance runs now is done (apply_staged(), from batch_done_locked): the batch may read
  // the slot as a padding row, or write it as the END row of the slot's previous sequence.
  std::string check(const std::vector<StateValue>& values) const;
  void read(int slot, const std::function<void(size_t, const std::vector<int64_t>&, const uint8_t*, size_t)>& sink) const;
  void write(int slot, const std::vector<StateValue>& values);
  void stage(int slot, const std::vector<StateValue>& values);
  void apply_staged();
  void discard_staged(int slot);

 private:
  struct SlotState {
    bool ready = false;  // has had a state created at least once
    Shapes shape;        // per variable state
    std::vector<Buffer> data;
    std::vector<size_t> bytes;  // written with relaxed atomics: slot_bytes() reads them
  };
  void set_slot(SlotState& sl, size_t k, const std::vector<int64_t>& shape, const uint8_t* data, size_t n);

  const std::vector<StateSpec>* specs_ = nullptr;
  bool has_variable_ = false;
  std::vector<SlotState> slots_;
  std::vector<Buffer> store_;     // fixed states: [slots, row bytes]
  std::vector<Buffer> gather_;    // states gathered per batch ([B, ...])
  std::vector<uint8_t> gathered_;  // per state: the batch reads gather_, not store_
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
