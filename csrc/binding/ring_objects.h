// Python objects made from ring records (bind_rings.cc), shared by ShmRegion.pop_request and
// RingFeeder.take_slow so that both hand Python the same tuples.
#pragma once

#include "binding.h"
#include "shm_region.h"

namespace seqserve::binding {

// [(index, offset, nbytes, shape), ...]
py::list slab_tensors_to(const std::vector<shm::SlabTensor>& ts);
// The record's RequestHeader (its client key included). GIL held.
py::object request_header_from(const shm::RequestRecord& rec);

}  // namespace seqserve::binding
