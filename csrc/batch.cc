#include "batch.h"

#include <algorithm>

namespace seqserve {

void Batch::init(const ModelSpec& spec, int max_rows) {
  rows.reserve(max_rows);
  inputs.resize(spec.inputs.size());
  input_nbytes.resize(spec.inputs.size());
  input_shapes.resize(spec.inputs.size());
  ragged_shapes.resize(spec.inputs.size());
  controls.resize(spec.controls.size());
  control_nbytes.resize(spec.controls.size());
  for (Buffer& b : controls) b.reserve(max_rows * 8);
  start.resize(max_rows);
  end.resize(max_rows);
  ready.resize(max_rows);
  corrid_num.resize(max_rows);
  corrid_str.resize(max_rows);
}

void Batch::gather_inputs(const ModelSpec& spec) {
  const bool batched = spec.max_batch_size > 0;
  // The first real request fixes item shapes; a final END step (kNotify) gets zeros of that
  // shape, or of the configured dims when the batch holds no real request.
  const Request* rep = nullptr;
  for (const Row& row : rows)
    if (row.req && row.req->kind == kNormal) { rep = row.req; break; }
  const int64_t B = size;
  std::vector<int64_t>& item = item_shape;
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    const InputSpec& in = spec.inputs[k];
    if (rep) {
      const TensorRef& rt = rep->inputs[k];
      item.assign(rt.shape + (batched ? 1 : 0), rt.shape + rt.ndim);
    } else {
      item = in.default_shape;
    }
    auto& shape = input_shapes[k];
    shape.clear();
    const int64_t per_row = product(item);
    if (in.ragged && batched) {
      // Every request keeps its own extent: the elements end to end, and each request's shape.
      std::vector<int64_t>& shapes = ragged_shapes[k];
      shapes.clear();
      int64_t elements = 0;
      for (const Row& row : rows) {
        const Request* r = row.req;
        if (r && r->kind == kNormal) {
          const TensorRef& t = r->inputs[k];
          shapes.push_back(t.ndim);
          shapes.insert(shapes.end(), t.shape, t.shape + t.ndim);
          int64_t n = 1;
          for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
          elements += n;
        } else {  // padding or a final END step: one row of the representative's item shape
          shapes.push_back(static_cast<int64_t>(item.size()) + 1);
          shapes.push_back(1);
          shapes.insert(shapes.end(), item.begin(), item.end());
          elements += per_row;
        }
      }
      shape.push_back(elements);
    } else {
      if (batched) shape.push_back(B);
      shape.insert(shape.end(), item.begin(), item.end());
    }
    Buffer& buf = inputs[k];
    const bool is_bytes = in.type.is_bytes;
    const size_t row_bytes = is_bytes ? per_row * 4 : per_row * in.type.itemsize;
    size_t total = 0;
    for (const Row& row : rows) {
      const Request* r = row.req;
      total += (r && r->kind == kNormal) ? r->inputs[k].nbytes : row_bytes;
    }
    buf.reserve(total);
    size_t off = 0;
    for (const Row& row : rows) {
      const Request* r = row.req;
      if (r && r->kind == kNormal) {
        std::memcpy(buf.data() + off, r->inputs[k].data, r->inputs[k].nbytes);
        off += r->inputs[k].nbytes;
        continue;
      }
      // Padding data is not meaningful (strings are empty); a final END step gets zeros.
      if (r || is_bytes) std::memset(buf.data() + off, 0, row_bytes);
      off += row_bytes;
    }
    input_nbytes[k] = total;
  }
}

void Batch::fill_stateless_flags() {
  const size_t n = static_cast<size_t>(size);
  if (ready.size() < n) {
    start.resize(n);
    end.resize(n);
    ready.resize(n);
    corrid_num.resize(n);
  }
  std::fill_n(start.begin(), n, 0);
  std::fill_n(end.begin(), n, 0);
  std::fill_n(ready.begin(), n, 1);
  std::fill_n(corrid_num.begin(), n, 0);
}

void Batch::fill_controls(const ModelSpec& spec) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Request* r = rows[i].req;
    start[i] = r && r->start;
    end[i] = r && r->end;
    ready[i] = r != nullptr;
    if (r && r->id.is_str) {
      corrid_num[i] = 0;
      corrid_str[i] = r->id.str;
    } else {
      corrid_num[i] = r ? r->id.num : 0;
      corrid_str[i].clear();
    }
  }
  const int64_t B = size;
  for (size_t c = 0; c < spec.controls.size(); ++c) {
    const ControlSpec& cs = spec.controls[c];
    Buffer& buf = controls[c];
    if (cs.kind == kCtlCorrid && cs.type.is_bytes) {
      size_t total = 0;
      for (size_t i = 0; i < rows.size(); ++i) total += 4 + corrid_str[i].size();
      buf.reserve(total);
      size_t off = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint32_t n = static_cast<uint32_t>(corrid_str[i].size());
        std::memcpy(buf.data() + off, &n, 4);
        std::memcpy(buf.data() + off + 4, corrid_str[i].data(), n);
        off += 4 + n;
      }
      control_nbytes[c] = total;
      continue;
    }
    const size_t es = cs.type.itemsize;
    buf.reserve(B * es);
    for (size_t i = 0; i < rows.size(); ++i) {
      uint8_t* dst = buf.data() + i * es;
      if (cs.kind == kCtlCorrid) {
        // The id's low bytes: INT32/UINT32 get the low 32 bits, INT64 is a bit-cast of the uint64.
        std::memcpy(dst, &corrid_num[i], es);
        continue;
      }
      bool flag = false;
      switch (cs.kind) {
        case kCtlStart: flag = start[i]; break;
        case kCtlEnd: flag = end[i]; break;
        case kCtlReady: flag = ready[i]; break;
        default: break;
      }
      std::memcpy(dst, (flag ? cs.true_bytes : cs.false_bytes).data(), es);
    }
    control_nbytes[c] = B * es;
  }
}

}  // namespace seqserve
