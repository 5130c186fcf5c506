// Binding of the Scheduler: its Python hooks (runner, on_fail, on_warning, on_expire), submit,
// and the sequence API, which only the sequence strategies have (a model without sequences
// answers here: nothing live, nothing to checkpoint).
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <optional>

#include "binding.h"
#include "ring_feeder.h"

namespace seqserve::binding {

namespace {

// One Python thread state per core thread, kept for the thread's life: acquiring the GIL then
// costs ~0.1 us instead of creating and destroying a thread state (~7 us) per batch.
thread_local PyGILState_STATE t_gil_state;
thread_local PyThreadState* t_saved = nullptr;

void enter_runtime() { PyEval_RestoreThread(t_saved); }

void leave_runtime() { t_saved = PyEval_SaveThread(); }

}  // namespace

void attach_core_thread() {
  t_gil_state = PyGILState_Ensure();
  t_saved = PyEval_SaveThread();
}

void detach_core_thread() {
  PyEval_RestoreThread(t_saved);
  PyGILState_Release(t_gil_state);
  t_saved = nullptr;
}

namespace {

class PyScheduler {
 public:
  PyScheduler(ModelSpec spec, py::function runner, py::function on_fail, py::function on_warning,
              py::object on_expire)
      : dtypes_(spec),
        runner_(std::move(runner)),
        on_fail_(std::move(on_fail)),
        on_warning_(std::move(on_warning)),
        on_expire_(std::move(on_expire)) {
    Hooks h;
    h.thread_start = attach_core_thread;
    h.thread_stop = detach_core_thread;
    h.enter = enter_runtime;
    h.leave = leave_runtime;
    h.run = [this](Instance& inst) { return run(inst); };
    h.fail = [this](const std::vector<uint64_t>& handles, Code code, const std::string& msg) {
      // Requests from the workers' rings are answered in C++ (RingFeeder), without Python.
      std::vector<uint64_t> local;
      bool from_rings = false;
      for (uint64_t x : handles) {
        if (is_ring_handle(x))
          from_rings = true;
        else
          local.push_back(x);
      }
      if (from_rings) {
        std::shared_ptr<RingSink> sink;
        {
          std::lock_guard<std::mutex> lk(sink_mu_);
          sink = sink_.lock();
        }
        if (sink) sink->fail(handles, code, msg);
      }
      if (local.empty()) return;
      py::gil_scoped_acquire g;
      try {
        on_fail_(local, code, msg);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("seqserve scheduler on_fail hook");
      }
    };
    h.log_warning = [this](const std::string& msg) {
      py::gil_scoped_acquire g;  // submit may come from the RingFeeder's thread
      try {
        on_warning_(msg);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("seqserve scheduler on_warning hook");
      }
    };
    spec.describe_on_expiry = !on_expire_.is_none();
    if (spec.describe_on_expiry) {
      h.describe = [this](const ExpiredSequence& x) {
        py::gil_scoped_acquire g;
        try {
          on_expire_(x);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("seqserve scheduler on_expire hook");
        }
      };
    }
    sched_ = Scheduler::create(std::move(spec), std::move(h));
    sequences_ = dynamic_cast<SequenceScheduler*>(sched_.get());
  }

  ~PyScheduler() { close(true); }

  // timeout_s < 0: wait for the executors without limit. Returns the instances whose executor
  // did not finish in time (detached; see Scheduler::close).
  std::vector<int> close(bool force, double timeout_s = -1) {
    if (!sched_) return {};
    const int64_t timeout_ns = timeout_s < 0 ? -1 : static_cast<int64_t>(timeout_s * 1e9);
    if (PyGILState_Check()) {
      py::gil_scoped_release r;
      return sched_->close(force, timeout_ns);
    }
    return sched_->close(force, timeout_ns);
  }

  bool run(Instance& inst) {
    py::gil_scoped_acquire g;
    auto view_obj = py::cast(BatchView{sched_.get(), &dtypes_, &inst, true});
    bool ok = false;
    try {
      ok = runner_(view_obj).cast<bool>();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("seqserve batch runner");
    }
    view_obj.cast<BatchView&>().valid = false;
    return ok;
  }

  // Hot path (event loop, GIL held): raw pointers to the input buffers go to the core; the
  // caller keeps the arrays alive until the handle completes. The header is copied; `inputs`
  // is borrowed for this call only.
  py::object submit(py::handle header_obj, py::tuple inputs) {
    const RequestHeaderObject* header = header_of(header_obj);
    Request* r = lend_request(header, inputs);
    const uint32_t token = r->index;  // r may be answered and reused once the lock is dropped
    SubmitResult res = sched_->submit(r, header->fixed.priority);
    if (res.accepted) return py::int_(token);
    return py::cast(std::move(res));
  }

  // An iterative sequence's rescheduled request, queued again as its sequence's next step
  // (SequenceScheduler::requeue_front); executor thread or event loop, GIL held.
  py::object requeue_front(py::handle header_obj, py::tuple inputs) {
    if (sequences_ == nullptr) return not_a_sequence_model_refusal("requests are rescheduled in sequences only");
    Request* r = lend_request(header_of(header_obj), inputs);
    const uint32_t token = r->index;
    SubmitResult res = sequences_->requeue_front(r);
    if (res.accepted) return py::int_(token);
    return py::cast(std::move(res));
  }

 private:
  // A request lent by the pool and filled from a header and the input buffers; it goes back
  // through submit, requeue_front or (on error, here) recycle.
  static const RequestHeaderObject* header_of(py::handle header_obj) {
    const RequestHeaderObject* header = as_request_header(header_obj);
    if (header == nullptr) throw py::type_error("submit() takes a RequestHeader");
    return header;
  }

  Request* lend_request(const RequestHeaderObject* header, py::tuple inputs) {
    std::string_view string_id;
    if (header->string_id) {
      Py_ssize_t n = 0;
      const char* s = PyUnicode_AsUTF8AndSize(header->string_id, &n);  // cached by the str
      if (s == nullptr) throw py::error_already_set();
      string_id = std::string_view(s, static_cast<size_t>(n));
    }
    const ModelSpec& spec = sched_->spec();
    if (static_cast<size_t>(inputs.size()) != spec.inputs.size())
      throw py::value_error("expected " + std::to_string(spec.inputs.size()) + " inputs, got " +
                            std::to_string(inputs.size()));
    Request* r = sched_->new_request();  // lent by the pool: back through submit() or recycle()
    try {
      r->take_header(header->fixed, string_id);
      r->client = header->client;
      r->inputs.resize(spec.inputs.size());
      for (size_t k = 0; k < spec.inputs.size(); ++k) fill_input(r->inputs[k], inputs[k]);
    } catch (...) {
      sched_->recycle(r);
      throw;
    }
    return r;
  }

  py::object not_a_sequence_model_refusal(const std::string& what) {
    return py::cast(
        SubmitResult{false, kUnsupported, "model '" + sched_->spec().name + "' is not a sequence model: " + what});
  }

 public:

  // Called on the event loop with the GIL: the scheduler lock is taken under it (the lock
  // order), and cancelled requests are reported from here.
  bool cancel(uint32_t token, uint64_t handle) { return sched_->cancel(token, handle); }

  Scheduler& sched() { return *sched_; }
  void set_ring_sink(std::weak_ptr<RingSink> sink) {
    std::lock_guard<std::mutex> lk(sink_mu_);
    sink_ = std::move(sink);
  }
  // The sequence API's owner, or nullptr for a strategy without sequences.
  SequenceScheduler* sequences() { return sequences_; }

 private:
  static void fill_input(TensorRef& t, py::handle item) {
    if (py::isinstance<py::array>(item)) {
      auto arr = py::reinterpret_borrow<py::array>(item);
      if (!(arr.flags() & py::array::c_style)) throw py::value_error("input arrays must be C-contiguous");
      if (arr.ndim() > kMaxRank) throw py::value_error("input rank is above the supported maximum of 16");
      t.data = static_cast<const uint8_t*>(arr.data());
      t.nbytes = static_cast<size_t>(arr.nbytes());
      t.ndim = static_cast<int>(arr.ndim());
      for (int d = 0; d < t.ndim; ++d) t.shape[d] = arr.shape(d);
      return;
    }
    // BYTES: (serialized buffer, shape)
    auto pair = py::reinterpret_borrow<py::tuple>(item);
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(pair[0]).request();
    py::handle shape = pair[1];
    if (py::len(shape) > kMaxRank) throw py::value_error("input rank is above the supported maximum of 16");
    t.data = static_cast<const uint8_t*>(info.ptr);
    t.nbytes = static_cast<size_t>(info.size * info.itemsize);
    t.ndim = 0;
    for (auto d : shape) t.shape[t.ndim++] = d.cast<int64_t>();
  }

  Dtypes dtypes_;
  std::unique_ptr<Scheduler> sched_;
  SequenceScheduler* sequences_ = nullptr;  // sched_ itself when it has sequences
  py::function runner_, on_fail_, on_warning_;
  py::object on_expire_;
  std::mutex sink_mu_;
  std::weak_ptr<RingSink> sink_;  // where its fail hook sends ring handles
};

// The Refusal a checkpoint or restore gets from a model without sequences.
py::object not_a_sequence_model(Scheduler& sched, const std::string& what) {
  return py::cast(SubmitResult{false, kUnsupported, "model '" + sched.spec().name + "' is not a sequence model: " + what});
}

}  // namespace

Scheduler* core_scheduler(py::handle obj) {
  if (!py::isinstance<PyScheduler>(obj)) return nullptr;
  return &obj.cast<PyScheduler&>().sched();
}

void set_ring_sink(py::handle obj, std::weak_ptr<RingSink> sink) {
  obj.cast<PyScheduler&>().set_ring_sink(std::move(sink));
}

void bind_scheduler(py::module_& m) {
  py::class_<InlineStats>(m, "InlineStats", "Inline execution of one model: its policy and counters.")
      .def_property_readonly("max_batch_us", [](const InlineStats& s) { return s.max_batch_ns / 1000.0; })
      .def_readonly("promote_after", &InlineStats::promote_after)
      .def_readonly("active", &InlineStats::active)
      .def_readonly("inline_batches", &InlineStats::inline_batches)
      .def_readonly("thread_batches", &InlineStats::thread_batches)
      .def_readonly("promotions", &InlineStats::promotions)
      .def_readonly("demotions", &InlineStats::demotions)
      .def_readonly("slow_batches", &InlineStats::slow_batches)
      .def_property_readonly("last_batch_us", [](const InlineStats& s) { return s.last_batch_ns / 1000.0; });

  py::class_<PyScheduler>(m, "Scheduler", "Scheduler and executor threads of one model.")
      .def(py::init<ModelSpec, py::function, py::function, py::function, py::object>(), py::arg("spec"),
           py::kw_only(), py::arg("runner"), py::arg("on_fail"), py::arg("on_warning"),
           py::arg("on_expire") = py::none())
      .def("start", [](PyScheduler& s) { s.sched().start(); })
      .def("submit", &PyScheduler::submit, py::arg("header"), py::arg("inputs"),
           "Queue a request: its header and one buffer per configured input. Returns its cancel() token\n"
           "(an int) when accepted, else the Refusal.")
      .def("requeue_front", &PyScheduler::requeue_front, py::arg("header"), py::arg("inputs"),
           "Queue an iterative sequence's rescheduled request as its sequence's next step, at the front of\n"
           "its slot queue. Returns its cancel() token (an int) when accepted, else the Refusal (the START\n"
           "error when the sequence is no longer live).")
      .def("cancel", &PyScheduler::cancel, py::arg("token"), py::arg("handle"),
           "Drop a queued request whose client is gone (a sequence's takes its sequence); it is answered "
           "CANCELLED. False when it is no longer queued or running.")
      .def(
          "end_owned_sequence",
          [](PyScheduler& s, py::handle corrid, uint64_t owner, const std::string& why) {
            SequenceScheduler* q = s.sequences();
            return q != nullptr && q->end_owned_sequence(corrid_from(corrid), owner, why);
          },
          py::arg("corrid"), py::arg("owner") = 0, py::arg("reason") = "",
           "End a live sequence now, as idle expiry does, if its latest START had handle `owner` (0: any); "
           "its queued requests are answered CANCELLED with `reason`.")
      .def(
          "slot_of",
          [](PyScheduler& s, py::handle corrid) {
            SequenceScheduler* q = s.sequences();
            return q ? q->slot_of(corrid_from(corrid)) : -2;
          },
          py::arg("corrid"),
           "The global slot of a live sequence, -1 while it is backlogged, -2 when it is unknown.")
      .def(
          "configure_inline",
          [](PyScheduler& s, double max_batch_us, int promote_after) {
            if (!(max_batch_us >= 0)) throw py::value_error("max_batch_us must be >= 0");
            if (promote_after < 1) throw py::value_error("promote_after must be >= 1");
            s.sched().configure_inline(static_cast<int64_t>(max_batch_us * 1000), promote_after);
          },
          py::arg("max_batch_us"), py::arg("promote_after") = 8,
          "Inline execution: once promote_after batches in a row each cost at most max_batch_us (0: never), "
          "run_ready_inline runs batches on its caller's thread and submit wakes no executor; a batch over "
          "the bound ends that at once.")
      .def(
          "run_ready_inline",
          [](PyScheduler& s) {
            bool more = false;
            const int ran = s.sched().run_ready_inline(&more);
            return std::make_pair(ran, more);
          },
          "Event loop, GIL held: run on this thread the batches idle instances can form now (inline mode "
          "only). Returns (how many ran, whether it stopped at its time budget with work left: call again "
          "soon).")
      .def(
          "inline_stats", [](PyScheduler& s) { return s.sched().inline_stats(); },
          "Inline execution's policy and counters.")
      .def("stop_accepting", [](PyScheduler& s) { s.sched().stop_accepting(); })
      .def("inflight_sequences", [](PyScheduler& s) { return s.sched().inflight_sequences(); })
      .def("pending_requests", [](PyScheduler& s) { return s.sched().pending_requests(); })
      .def("free_slots",
           [](PyScheduler& s) { return s.sequences() ? s.sequences()->free_slots() : int64_t{0}; })
      .def("backlog_sequences",
           [](PyScheduler& s) { return s.sequences() ? s.sequences()->backlog_sequences() : int64_t{0}; })
      .def("sequences",
           [](PyScheduler& s) {
             std::vector<std::pair<std::string, int>> out;
             if (s.sequences()) s.sequences()->describe_slots(out);
             return out;
           })
      .def("stats", [](PyScheduler& s) { return s.sched().stats(); })
      .def(
          "list_sequences",
          [](PyScheduler& s, size_t limit) {
            std::vector<SequenceInfo> out;
            const int64_t total = s.sequences() ? s.sequences()->list_sequences(out, limit) : 0;
            return py::make_tuple(total, py::cast(std::move(out)));
          },
          py::arg("limit"), "(how many live sequences, up to `limit` of them in no particular order).")
      .def(
          "find_sequence",
          [](PyScheduler& s, py::object corrid) -> py::object {
            SequenceInfo info;
            SequenceScheduler* q = s.sequences();
            if (!q || !q->find_sequence(corrid_from(corrid), info)) return py::none();
            return py::cast(std::move(info));
          },
          py::arg("corrid"), "The live sequence `corrid`, or None.")
      .def(
          "end_sequence",
          [](PyScheduler& s, py::object corrid) -> py::object {
            SequenceInfo info;
            SequenceScheduler* q = s.sequences();
            if (!q || !q->end_sequence(corrid_from(corrid), info)) return py::none();
            return py::cast(std::move(info));
          },
          py::arg("corrid"),
          "End the live sequence `corrid` as idle expiry does; None when it is not live. Returns it as it was.")
      .def(
          "session_gone",
          [](PyScheduler& s, py::object corrid) -> py::object {
            if (!s.sequences()) return py::none();
            std::string why = s.sequences()->session_gone(corrid_from(corrid));
            if (why.empty()) return py::none();
            return py::str(why);
          },
          py::arg("corrid"), "Why a session that is not live would be refused, or None.")
      .def(
          "checkpoint_sequence",
          [](PyScheduler& s, py::object corrid, bool release) -> py::object {
            if (!s.sequences()) return not_a_sequence_model(s.sched(), "it has no sequences to checkpoint");
            return checkpoint_sequence(*s.sequences(), corrid, release);
          },
          py::arg("corrid"), py::kw_only(), py::arg("release"),
          "Copy the live sequence's implicit state out: (steps, session, [(bytes, shape) per state]); None\n"
          "when it is not live; a Refusal while it is busy (UNAVAILABLE, busy) or for a model without\n"
          "implicit state (UNSUPPORTED). release: it then leaves its slot without an END step (it moved).")
      .def(
          "restore_sequence",
          [](PyScheduler& s, py::object corrid, bool session, uint64_t steps, py::list states) -> py::object {
            if (!s.sequences()) return not_a_sequence_model(s.sched(), "it cannot restore a sequence");
            return restore_sequence(*s.sequences(), corrid, session, steps, states);
          },
          py::arg("corrid"), py::kw_only(), py::arg("session"), py::arg("steps"), py::arg("states"),
          "Claim a free slot for the sequence, holding `states` ([(data, shape)] in spec order) and `steps`;\n"
          "its next non-START request continues from there. None, or the Refusal.")
      .def(
          "close",
          [](py::object self, bool force, std::optional<double> timeout_s) {
            std::vector<int> hung = self.cast<PyScheduler&>().close(force, timeout_s.value_or(-1));
            // A detached executor may still come back to this scheduler (and its hooks): it must
            // never be destroyed, so the Python object keeps one reference for good.
            if (!hung.empty()) self.inc_ref();
            return hung;
          },
          py::arg("force") = false, py::kw_only(), py::arg("timeout_s") = py::none(),
          "Stop the executors once queues drain (force: now); unanswered requests fail UNAVAILABLE.\n"
          "Waits up to timeout_s (None: without limit) for the executor threads; returns the indices\n"
          "of the instances whose executor was still running then (left behind, never joined).");
}

}  // namespace seqserve::binding
