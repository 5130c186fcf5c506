#include "slot_state.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <stdexcept>

namespace seqserve {

void SlotState::init(const std::vector<StateSpec>& specs, int slots, bool gather_fixed) {
  specs_ = &specs;
  const size_t n = specs.size();
  has_variable_ = std::any_of(specs.begin(), specs.end(), [](const StateSpec& s) { return is_var_state(s); });
  has_fixed_ = std::any_of(specs.begin(), specs.end(), [](const StateSpec& s) { return !is_var_state(s); });
  gather_fixed_ = gather_fixed;
  slots_.resize(slots);
  for (PerSlot& sl : slots_) {
    sl.shape.resize(n);
    sl.data.resize(n);
    sl.bytes.resize(n);
  }
  in_batch_.assign(std::max(1, slots), 0);
  store_.resize(n);
  alt_.resize(n);
  gather_.resize(n);
  scratch_.resize(n);
  pad_.resize(n);
  row_bytes_.assign(n, 0);
  gathered_.resize(n);
  same_buffer_.assign(n, 0);
  base_.assign(n, -1);
  current_.reset(new std::atomic<const uint8_t*>[n]);
  pending_.assign(n, 0);
  handed_.assign(n, 0);
  set_.assign(n, 0);
  shapes_.resize(n);
  nbytes_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const StateSpec& st = specs[k];
    gathered_[k] = is_var_state(st);
    if (is_var_state(st)) continue;
    same_buffer_[k] = st.same_buffer;
    row_bytes_[k] = st.initial.size();
    store_[k].reserve(std::max(1, slots) * row_bytes_[k]);
    current_[k].store(store_[k].data(), std::memory_order_relaxed);
  }
}

void SlotState::shapes_of(int slot, const Request* r, Shapes& out) const {
  const PerSlot& sl = slots_[slot];
  for (size_t k = 0; k < specs_->size(); ++k) {
    const StateSpec& st = (*specs_)[k];
    if (!is_var_state(st)) continue;
    if (r->start || !sl.ready) out[k] = st.initial_dims;
    else out[k] = sl.shape[k];
  }
}

bool SlotState::shapes_match(int slot, const Request* r, const Shapes& rep) const {
  const PerSlot& sl = slots_[slot];
  for (size_t k = 0; k < specs_->size(); ++k) {
    const StateSpec& st = (*specs_)[k];
    if (!is_var_state(st)) continue;
    const auto& shape = (r->start || !sl.ready) ? st.initial_dims : sl.shape[k];
    if (shape != rep[k]) return false;
  }
  return true;
}

void SlotState::set_slot(PerSlot& sl, size_t k, const std::vector<int64_t>& shape, const uint8_t* data,
                          size_t n) {
  sl.shape[k] = shape;
  sl.data[k].reserve(n);
  std::memmove(sl.data[k].data(), data, n);
  __atomic_store_n(&sl.bytes[k], n, __ATOMIC_RELAXED);
}

void SlotState::reset(const std::vector<Row>& rows) {
  const std::vector<StateSpec>& specs = *specs_;
  if (specs.empty()) return;
  for (const Row& row : rows) {
    if (!row.req) continue;
    PerSlot& sl = slots_[row.slot];
    if (!row.req->start && sl.ready) continue;
    for (size_t k = 0; k < specs.size(); ++k) {
      const StateSpec& st = specs[k];
      const auto* init = reinterpret_cast<const uint8_t*>(st.initial.data());
      if (is_var_state(st)) {
        set_slot(sl, k, st.initial_dims, init, st.initial.size());
      } else {
        std::memcpy(fixed_row(k, row.slot), init, row_bytes_[k]);
      }
    }
    if (!sl.ready) {
      ++ready_count_;
      ready_end_ = std::max(ready_end_, static_cast<size_t>(row.slot) + 1);
    }
    sl.ready = true;
  }
}

void SlotState::gather(const std::vector<Row>& rows, int64_t B, bool batched) {
  const std::vector<StateSpec>& specs = *specs_;
  rows_ = &rows;
  open_ = true;
  // Where the batch's fixed-shape states are a view of the store: Direct (row i is slot i), or
  // Oldest when its rows hold consecutive slots in order.
  int64_t base = 0;
  size_t pads = 0;
  for (const Row& row : rows) pads += row.req ? 0 : 1;
  if (gather_fixed_ && has_fixed_) {
    for (size_t i = 0; i < rows.size() && base >= 0; ++i)
      if (!rows[i].req || rows[i].slot != rows[0].slot + static_cast<int>(i)) base = -1;
    if (base == 0 && !rows.empty()) base = rows[0].slot;
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& st = specs[k];
    auto& shape = shapes_[k];
    handed_[k] = 0;
    set_[k] = 0;
    pending_[k] = 0;
    if (!is_var_state(st)) {
      shape.clear();
      if (batched) shape.push_back(B);
      shape.insert(shape.end(), st.dims.begin(), st.dims.end());
      const size_t rb = row_bytes_[k];
      nbytes_[k] = B * rb;
      base_[k] = base;
      if (base < 0) {  // Oldest, slots out of order: gathered when the model first reads it
        pending_[k] = 1;
      } else if (same_buffer_[k] && pads) {  // the model may write padding rows: keep them
        Buffer& buf = pad_[k];
        buf.reserve(pads * rb);
        size_t j = 0;
        for (const Row& row : rows)
          if (!row.req) std::memcpy(buf.data() + rb * j++, store_[k].data() + row.slot * rb, rb);
      }
      continue;
    }
    // The first real row's slot fixes the shape; padding rows are zeros (empty strings) of it.
    const PerSlot* rep = &slots_[rows[0].slot];
    for (const Row& row : rows)
      if (row.req) { rep = &slots_[row.slot]; break; }
    const auto& item = rep->shape[k];
    shape.clear();
    if (batched) shape.push_back(B);
    shape.insert(shape.end(), item.begin(), item.end());
    const size_t es = st.type.itemsize;
    const size_t pad_row = es ? product(item) * es : product(item) * 4;
    size_t total = 0;
    for (const Row& row : rows) total += row.req ? slots_[row.slot].bytes[k] : pad_row;
    Buffer& buf = gather_[k];
    buf.reserve(total);
    size_t off = 0;
    for (const Row& row : rows) {
      if (row.req) {
        const PerSlot& sl = slots_[row.slot];
        std::memcpy(buf.data() + off, sl.data[k].data(), sl.bytes[k]);
        off += sl.bytes[k];
      } else {
        std::memset(buf.data() + off, 0, pad_row);
        off += pad_row;
      }
    }
    nbytes_[k] = total;
  }
  gen_.fetch_add(1, std::memory_order_release);  // odd: padding rows saved, the model may write them
}

void SlotState::scatter(size_t k, const std::vector<Row>& rows, int64_t B, bool batched, const uint8_t* data,
                         size_t nbytes, const int64_t* shape, int ndim) {
  // Rows are written back only for real requests: padding never touches a sequence's state.
  if (k >= specs_->size()) throw std::out_of_range("state index");
  const StateSpec& st = (*specs_)[k];
  if (batched && (ndim < 1 || shape[0] != B))
    throw std::invalid_argument("output state '" + st.output_name + "' must have batch dimension " +
                                std::to_string(B));
  const std::vector<int64_t> item(shape + (batched ? 1 : 0), shape + ndim);
  if (st.type.is_bytes) {
    // Serialized elements: split per row by walking the length prefixes.
    const int64_t per_row = product(item);
    size_t off = 0;
    for (const Row& row : rows) {
      size_t start = off;
      for (int64_t e = 0; e < per_row; ++e) {
        if (off + 4 > nbytes) throw std::invalid_argument("truncated string state");
        uint32_t n;
        std::memcpy(&n, data + off, 4);
        off += 4 + n;
      }
      if (off > nbytes) throw std::invalid_argument("truncated string state");
      if (row.req) set_slot(slots_[row.slot], k, item, data + start, off - start);
    }
    return;
  }
  const size_t rb = batched ? nbytes / B : nbytes;
  if (!is_var_state(st)) {
    if (rb != st.initial.size())
      throw std::invalid_argument("output state '" + st.output_name + "' has " + std::to_string(rb) +
                                  " bytes per sequence, expected " + std::to_string(st.initial.size()));
    set_[k] = 1;
    if (base_[k] >= 0) {
      const uint8_t* view = store_[k].data() + base_[k] * rb;
      if (data == view) return;  // written in place (same_buffer), or the input handed back
      if (handed_[k] && !same_buffer_[k] && data == alt_[k].data() + base_[k] * rb) {
        commit_alt(k, rows);
        return;
      }
    }
    copy_rows(k, rows, data, rb);
    return;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (row.req) set_slot(slots_[row.slot], k, item, data + i * rb, rb);
  }
}

void SlotState::copy_rows(size_t k, const std::vector<Row>& rows, const uint8_t* data, size_t rb) {
  uint8_t* store = store_[k].data();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (row.req) std::memmove(store + row.slot * rb, data + i * rb, rb);
  }
}

void SlotState::commit_alt(size_t k, const std::vector<Row>& rows) {
  // The model wrote the batch's next state into the second store, at the rows' own slots. Either
  // the stores trade places, after the rows the batch did not update (padding, other slots that
  // hold a state) are carried over, or the real rows are copied: whichever copies fewer rows.
  const size_t rb = row_bytes_[k];
  const uint8_t* alt = alt_[k].data() + base_[k] * rb;
  size_t real = 0;
  for (const Row& row : rows) real += row.req ? 1 : 0;
  // Every real row's slot holds a state (reset() ran), so the others that do number:
  const size_t keep = ready_count_ - real;
  if (keep < real) {
    for (const Row& row : rows)
      if (row.req) in_batch_[row.slot] = 1;
    for (size_t s = 0; s < ready_end_; ++s)  // slots are taken lowest first: ready ones sit low
      if (slots_[s].ready && !in_batch_[s]) std::memcpy(alt_[k].data() + s * rb, store_[k].data() + s * rb, rb);
    for (const Row& row : rows) in_batch_[row.slot] = 0;
    swap(store_[k], alt_[k]);
    current_[k].store(store_[k].data(), std::memory_order_release);  // checkpoints find it there
  } else {
    copy_rows(k, rows, alt, rb);
  }
}

uint8_t* SlotState::data(size_t k) {
  if (base_[k] >= 0) return store_[k].data() + base_[k] * row_bytes_[k];
  if (pending_[k]) {  // a fixed-shape state out of slot order: its rows are copied now
    pending_[k] = 0;
    const size_t rb = row_bytes_[k];
    const std::vector<Row>& rows = *rows_;
    Buffer& buf = gather_[k];
    buf.reserve(rows.size() * rb);
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(buf.data() + i * rb, store_[k].data() + rows[i].slot * rb, rb);
  }
  return gather_[k].data();
}

uint8_t* SlotState::next_buffer(size_t k) {
  if (gathered_[k]) return nullptr;  // variable-shape or BYTES: the model returns a new array
  handed_[k] = 1;
  if (same_buffer_[k]) return data(k);
  if (base_[k] >= 0) {
    alt_[k].reserve(store_[k].capacity());
    return alt_[k].data() + base_[k] * row_bytes_[k];
  }
  scratch_[k].reserve(nbytes_[k]);
  return scratch_[k].data();
}

void SlotState::finish(const std::vector<Row>& rows) {
  // Runs when the batch is recorded (before its replies go out: a client that has its reply
  // may checkpoint the sequence at once) and again after the model call; the first one counts.
  if (!open_) return;
  open_ = false;
  for (size_t k = 0; k < same_buffer_.size(); ++k) {
    if (!same_buffer_[k]) continue;
    const size_t rb = row_bytes_[k];
    if (base_[k] < 0) {
      // Gathered rows the model may have written in place: they are the state now (unless it
      // never asked for them: then they were never gathered).
      if (!set_[k] && !pending_[k]) copy_rows(k, rows, gather_[k].data(), rb);
      pending_[k] = 0;
      continue;
    }
    size_t j = 0;  // whatever the model wrote to padding rows is undone
    for (const Row& row : rows)
      if (!row.req) std::memcpy(store_[k].data() + row.slot * rb, pad_[k].data() + rb * j++, rb);
  }
  gen_.fetch_add(1, std::memory_order_release);  // even: the store is the state again
}

uint64_t SlotState::slot_bytes(int slot) const {
  const PerSlot& sl = slots_[slot];
  uint64_t n = 0;
  for (size_t k = 0; k < specs_->size(); ++k)
    n += is_var_state((*specs_)[k]) ? __atomic_load_n(&sl.bytes[k], __ATOMIC_RELAXED) : (*specs_)[k].initial.size();
  return n;
}

// ------------------------------------------------------------- checkpoints and restores

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

std::string SlotState::check(const std::vector<StateValue>& values) const {
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

void SlotState::read(int slot,
                      const std::function<void(size_t, const std::vector<int64_t>&, const uint8_t*, size_t)>& sink,
                      const std::vector<Row>* running) const {
  const std::vector<StateSpec>& specs = *specs_;
  for (const Staged& sg : staged_) {
    if (sg.slot != slot) continue;
    for (size_t k = 0; k < specs.size(); ++k)
      sink(k, sg.shapes[k], reinterpret_cast<const uint8_t*>(sg.data[k].data()), sg.data[k].size());
    return;
  }
  const PerSlot& sl = slots_[slot];
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

const uint8_t* SlotState::fixed_value(size_t k, int slot, const std::vector<Row>* running,
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

void SlotState::write(int slot, const std::vector<StateValue>& values) {
  const std::vector<StateSpec>& specs = *specs_;
  PerSlot& sl = slots_[slot];
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

void SlotState::stage(int slot, const std::vector<StateValue>& values) {
  discard_staged(slot);
  Staged sg;
  sg.slot = slot;
  for (const StateValue& v : values) {
    sg.shapes.push_back(v.shape);
    sg.data.emplace_back(reinterpret_cast<const char*>(v.data), v.nbytes);
  }
  staged_.push_back(std::move(sg));
}

void SlotState::apply_staged() {
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

void SlotState::discard_staged(int slot) {
  for (size_t i = 0; i < staged_.size(); ++i) {
    if (staged_[i].slot != slot) continue;
    staged_.erase(staged_.begin() + i);
    return;
  }
}

}  // namespace seqserve
