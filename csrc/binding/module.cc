// The pybind11 module of the seqserve core: seqserve.engine._core. The API is deliberately
// small; its typed description is src/seqserve/engine/_core.pyi. Each bind_*.cc beside this
// file binds one part: bind_spec.cc the values that cross the boundary (enums, the model spec,
// statistics, refusals), bind_request.cc a request's header, bind_batch.cc the batch a runner
// is handed, bind_scheduler.cc the scheduler and its hooks, bind_checkpoint.cc the checkpoints,
// bind_dlpack.cc the DLPack view of engine-owned (device) memory,
// bind_rings.cc the worker <-> engine shared-memory transport, bind_feeder.cc the engine's
// compiled path for its records.
#include "binding.h"

PYBIND11_MODULE(_core, m) {
  using namespace seqserve::binding;
  m.doc() = "seqserve compiled core: sequence slots, backlog, idle reaper, batch assembly, state.";
  bind_spec(m);
  bind_request(m);
  bind_batch(m);
  bind_scheduler(m);
  bind_dlpack(m);
  bind_rings(m);
  bind_feeder(m);
}
