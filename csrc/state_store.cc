#include "state_store.h"

#include <algorithm>
#include <stdexcept>

namespace seqserve {

void StateStore::init(const std::vector<StateSpec>& specs, int slots, bool gather_fixed) {
  specs_ = &specs;
  const size_t n = specs.size();
  has_variable_ = std::any_of(specs.begin(), specs.end(), [](const StateSpec& s) { return is_var_state(s); });
  has_fixed_ = std::any_of(specs.begin(), specs.end(), [](const StateSpec& s) { return !is_var_state(s); });
  gather_fixed_ = gather_fixed;
  slots_.resize(slots);
  for (SlotState& sl : slots_) {
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

void StateStore::shapes_of(int slot, const Request* r, Shapes& out) const {
  const SlotState& sl = slots_[slot];
  for (size_t k = 0; k < specs_->size(); ++k) {
    const StateSpec& st = (*specs_)[k];
    if (!is_var_state(st)) continue;
    if (r->start || !sl.ready) out[k] = st.initial_dims;
    else out[k] = sl.shape[k];
  }
}

bool StateStore::shapes_match(int slot, const Request* r, const Shapes& rep) const {
  const SlotState& sl = slots_[slot];
  for (size_t k = 0; k < specs_->size(); ++k) {
    const StateSpec& st = (*specs_)[k];
    if (!is_var_state(st)) continue;
    const auto& shape = (r->start || !sl.ready) ? st.initial_dims : sl.shape[k];
    if (shape != rep[k]) return false;
  }
  return true;
}

void StateStore::set_slot(SlotState& sl, size_t k, const std::vector<int64_t>& shape, const uint8_t* data,
                          size_t n) {
  sl.shape[k] = shape;
  sl.data[k].reserve(n);
  std::memmove(sl.data[k].data(), data, n);
  __atomic_store_n(&sl.bytes[k], n, __ATOMIC_RELAXED);
}

void StateStore::reset(const std::vector<Row>& rows) {
  const std::vector<StateSpec>& specs = *specs_;
  if (specs.empty()) return;
  for (const Row& row : rows) {
    if (!row.req) continue;
    SlotState& sl = slots_[row.slot];
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

void StateStore::gather(const std::vector<Row>& rows, int64_t B, bool batched) {
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
    const SlotState* rep = &slots_[rows[0].slot];
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
        const SlotState& sl = slots_[row.slot];
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

void StateStore::scatter(size_t k, const std::vector<Row>& rows, int64_t B, bool batched, const uint8_t* data,
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

void StateStore::copy_rows(size_t k, const std::vector<Row>& rows, const uint8_t* data, size_t rb) {
  uint8_t* store = store_[k].data();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (row.req) std::memmove(store + row.slot * rb, data + i * rb, rb);
  }
}

void StateStore::commit_alt(size_t k, const std::vector<Row>& rows) {
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

uint8_t* StateStore::data(size_t k) {
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

uint8_t* StateStore::next_buffer(size_t k) {
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

void StateStore::finish(const std::vector<Row>& rows) {
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

uint64_t StateStore::slot_bytes(int slot) const {
  const SlotState& sl = slots_[slot];
  uint64_t n = 0;
  for (size_t k = 0; k < specs_->size(); ++k)
    n += is_var_state((*specs_)[k]) ? __atomic_load_n(&sl.bytes[k], __ATOMIC_RELAXED) : (*specs_)[k].initial.size();
  return n;
}

}  // namespace seqserve
