#include "state_store.h"

#include <algorithm>
#include <stdexcept>

namespace seqserve {

void StateStore::init(const std::vector<StateSpec>& specs, int slots, bool gather_fixed) {
  specs_ = &specs;
  const size_t n = specs.size();
  has_variable_ = std::any_of(specs.begin(), specs.end(), [](const StateSpec& s) { return is_var_state(s); });
  slots_.resize(slots);
  for (SlotState& sl : slots_) {
    sl.shape.resize(n);
    sl.data.resize(n);
    sl.bytes.resize(n);
  }
  store_.resize(n);
  gather_.resize(n);
  shapes_.resize(n);
  nbytes_.resize(n);
  gathered_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const StateSpec& st = specs[k];
    gathered_[k] = is_var_state(st) || gather_fixed;
    if (!is_var_state(st)) store_[k].reserve(std::max(1, slots) * product(st.dims) * st.type.itemsize);
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
        const size_t rb = st.initial.size();
        std::memcpy(store_[k].data() + row.slot * rb, init, rb);
      }
    }
    sl.ready = true;
  }
}

void StateStore::gather(const std::vector<Row>& rows, int64_t B, bool batched) {
  const std::vector<StateSpec>& specs = *specs_;
  for (size_t k = 0; k < specs.size(); ++k) {
    const StateSpec& st = specs[k];
    auto& shape = shapes_[k];
    if (!is_var_state(st)) {
      shape.clear();
      if (batched) shape.push_back(B);
      shape.insert(shape.end(), st.dims.begin(), st.dims.end());
      const size_t rb = st.initial.size();
      nbytes_[k] = B * rb;
      if (gathered_[k]) {  // Oldest: rows come from arbitrary slots
        Buffer& buf = gather_[k];
        buf.reserve(B * rb);
        for (size_t i = 0; i < rows.size(); ++i)
          std::memcpy(buf.data() + i * rb, store_[k].data() + rows[i].slot * rb, rb);
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
    uint8_t* store = store_[k].data();
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      if (row.req) std::memmove(store + row.slot * rb, data + i * rb, rb);
    }
    return;
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    if (row.req) set_slot(slots_[row.slot], k, item, data + i * rb, rb);
  }
}

uint64_t StateStore::slot_bytes(int slot) const {
  const SlotState& sl = slots_[slot];
  uint64_t n = 0;
  for (size_t k = 0; k < specs_->size(); ++k)
    n += is_var_state((*specs_)[k]) ? __atomic_load_n(&sl.bytes[k], __ATOMIC_RELAXED) : (*specs_)[k].initial.size();
  return n;
}

}  // namespace seqserve
