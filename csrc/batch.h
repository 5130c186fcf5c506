// One instance's batch assembly area: the rows of the batch being executed, its inputs gathered
// into contiguous [B, ...] buffers, the sequence flags and the configured control tensors.
// Allocated once and reused, so a steady-state step allocates nothing. Used by the instance's
// executor thread only.
#pragma once

#include <string>
#include <vector>

#include "common.h"
#include "request.h"
#include "spec.h"

namespace seqserve {

struct Batch {
  int64_t size = 0;  // B: rows the model sees, padding included
  std::vector<Row> rows;
  std::vector<Buffer> inputs;
  std::vector<size_t> input_nbytes;
  std::vector<std::vector<int64_t>> input_shapes;
  // Ragged inputs: every request's shape (batch dim included), each written as its rank followed
  // by its dims, in request order. Empty for the other inputs.
  std::vector<std::vector<int64_t>> ragged_shapes;
  std::vector<Buffer> controls;
  std::vector<size_t> control_nbytes;
  std::vector<uint8_t> start, end, ready;
  std::vector<uint64_t> corrid_num;
  std::vector<std::string> corrid_str;
  std::vector<int64_t> item_shape;  // gather's scratch

  // Sizes everything for batches of up to `max_rows` rows.
  void init(const ModelSpec& spec, int max_rows);
  // The first real request fixes item shapes; padding rows are zeros of that shape.
  void gather_inputs(const ModelSpec& spec);
  // Stateless batches: every row is a real one, with no sequence flags.
  void fill_stateless_flags();
  // Sequence batches: START/END/READY/CORRID per row and the control tensors built from them.
  void fill_controls(const ModelSpec& spec);
};

}  // namespace seqserve
