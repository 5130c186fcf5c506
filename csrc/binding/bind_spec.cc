// The typed values that cross the boundary: enums, the model spec the scheduler is built from,
// its statistics, a refused submit and an expired sequence.
#include <pybind11/native_enum.h>
#include <pybind11/stl.h>

#include "binding.h"

namespace seqserve::binding {

namespace {

// Element types come from Python's dtype table (engine/tensors.py) as numpy dtypes.
ElemType elem_type(const py::dtype& dt) {
  const char kind = dt.kind();
  if (std::string("biufO").find(kind) == std::string::npos)
    throw py::value_error("the core takes numeric dtypes and object (BYTES), not " + py::repr(dt).cast<std::string>());
  if (dt.attr("byteorder").cast<std::string>() == ">")
    throw py::value_error("the core takes native byte order dtypes, not " + py::repr(dt).cast<std::string>());
  ElemType t;
  t.numpy = dt.attr("str").cast<std::string>();
  t.is_bytes = kind == 'O';
  t.itemsize = t.is_bytes ? 0 : static_cast<size_t>(dt.itemsize());
  return t;
}

int64_t us_to_ns(uint64_t us) { return static_cast<int64_t>(us) * 1000; }
uint64_t ns_to_us(int64_t ns) { return static_cast<uint64_t>(ns / 1000); }

// __repr__ as "Name(field=value, ...)" from the object's own attributes.
template <class T>
void add_repr(py::class_<T>& cls, std::initializer_list<const char*> fields) {
  std::vector<const char*> names(fields);
  cls.def("__repr__", [names](py::handle self) {
    std::string out = py::type::of(self).attr("__name__").cast<std::string>() + "(";
    const char* sep = "";
    for (const char* f : names) {
      out += sep;
      out += f;
      out += "=";
      out += py::repr(self.attr(f)).cast<std::string>();
      sep = ", ";
    }
    return out + ")";
  });
}

void bind_enums(py::module_& m) {
  py::native_enum<Strategy>(m, "Strategy", "enum.IntEnum", "How a model's requests are batched.")
      .value("STATELESS", kStateless, "one request per batch (no batching configured)")
      .value("DIRECT", kDirect, "sequences; batch row == slot")
      .value("OLDEST", kOldest, "sequences; the oldest requests across slots")
      .value("DYNAMIC", kDynamic, "dynamic batcher with priority queues")
      .finalize();
  py::native_enum<ControlKind>(m, "ControlKind", "enum.IntEnum", "What a sequence control tensor carries.")
      .value("START", kCtlStart)
      .value("READY", kCtlReady)
      .value("END", kCtlEnd)
      .value("CORRID", kCtlCorrid)
      .finalize();
  py::native_enum<Code>(m, "Code", "enum.IntEnum", "Why a request failed or was refused: the one status vocabulary (engine.errors re-exports it).")
      .value("UNKNOWN", kUnknown)
      .value("INTERNAL", kInternal)
      .value("NOT_FOUND", kNotFound)
      .value("INVALID_ARG", kInvalidArg)
      .value("UNAVAILABLE", kUnavailable)
      .value("UNSUPPORTED", kUnsupported)
      .value("ALREADY_EXISTS", kAlreadyExists)
      .value("CANCELLED", kCancelled)
      .finalize();
}

void bind_tensor_specs(py::module_& m) {
  py::class_<InputSpec> input(m, "InputSpec", "A model input as the core gathers it into batches.");
  input
      .def(py::init([](std::string name, const py::dtype& dtype, bool must_match, std::vector<int64_t> default_shape,
                       bool ragged) {
             return InputSpec{std::move(name), elem_type(dtype), must_match, std::move(default_shape), ragged};
           }),
           py::kw_only(), py::arg("name"), py::arg("dtype"), py::arg("must_match") = false,
           py::arg("default_shape") = std::vector<int64_t>{}, py::arg("ragged") = false)
      .def_readonly("name", &InputSpec::name)
      .def_property_readonly("dtype", [](const InputSpec& s) { return numpy_dtype(s.type); })
      .def_readonly("must_match", &InputSpec::must_match)
      .def_readonly("default_shape", &InputSpec::default_shape)
      .def_readonly("ragged", &InputSpec::ragged);
  add_repr(input, {"name", "dtype", "must_match", "default_shape", "ragged"});

  py::class_<ControlSpec> control(m, "ControlSpec", "A sequence control tensor the core fills per batch row.");
  control
      .def(py::init([](std::string name, ControlKind kind, const py::dtype& dtype, double false_value,
                       double true_value) {
             ControlSpec c{std::move(name), kind, elem_type(dtype), false_value, true_value, {}, {}};
             const char k = dtype.kind();
             if (kind == kCtlCorrid) {
               if (!c.type.is_bytes && !((k == 'i' || k == 'u') && c.type.itemsize <= 8))
                 throw py::value_error("a CORRID control's dtype is an integer or object (BYTES)");
               return c;
             }
             if (c.type.is_bytes) throw py::value_error("a START, END or READY control's dtype is numeric");
             // The two values as elements of the dtype, encoded by numpy once.
             py::array values = py::module_::import("numpy").attr("array")(py::make_tuple(false_value, true_value), dtype);
             const auto* p = static_cast<const char*>(values.data());
             c.false_bytes.assign(p, c.type.itemsize);
             c.true_bytes.assign(p + c.type.itemsize, c.type.itemsize);
             return c;
           }),
           py::kw_only(), py::arg("name"), py::arg("kind"), py::arg("dtype"), py::arg("false_value") = 0.0,
           py::arg("true_value") = 1.0)
      .def_readonly("name", &ControlSpec::name)
      .def_readonly("kind", &ControlSpec::kind)
      .def_property_readonly("dtype", [](const ControlSpec& s) { return numpy_dtype(s.type); })
      .def_readonly("false_value", &ControlSpec::false_value)
      .def_readonly("true_value", &ControlSpec::true_value);
  add_repr(control, {"name", "kind", "dtype", "false_value", "true_value"});

  py::class_<StateSpec> state(m, "StateSpec", "An implicit state the core keeps per sequence slot.");
  state
      .def(py::init([](std::string input_name, std::string output_name, const py::dtype& dtype,
                       std::vector<int64_t> dims, py::bytes initial, std::vector<int64_t> initial_dims,
                       bool same_buffer) {
             StateSpec s;
             s.input_name = std::move(input_name);
             s.output_name = std::move(output_name);
             s.type = elem_type(dtype);
             s.variable = std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d < 0; });
             s.dims = std::move(dims);
             s.initial = std::string(initial);
             s.initial_dims = std::move(initial_dims);
             s.same_buffer = same_buffer;
             // A fixed-shape state's rows are as long as its initial value: they must agree.
             const auto& shape = s.variable ? s.initial_dims : s.dims;
             if (!s.type.is_bytes && s.initial.size() != product(shape) * s.type.itemsize)
               throw py::value_error("state '" + s.input_name + "': initial value has " +
                                     std::to_string(s.initial.size()) + " bytes, its shape needs " +
                                     std::to_string(product(shape) * s.type.itemsize));
             return s;
           }),
           py::kw_only(), py::arg("input_name"), py::arg("output_name"), py::arg("dtype"), py::arg("dims"),
           py::arg("initial"), py::arg("initial_dims"), py::arg("same_buffer") = false)
      .def_readonly("input_name", &StateSpec::input_name)
      .def_readonly("output_name", &StateSpec::output_name)
      .def_property_readonly("dtype", [](const StateSpec& s) { return numpy_dtype(s.type); })
      .def_readonly("dims", &StateSpec::dims)
      .def_property_readonly("initial", [](const StateSpec& s) { return py::bytes(s.initial); })
      .def_readonly("initial_dims", &StateSpec::initial_dims)
      .def_readonly("same_buffer", &StateSpec::same_buffer);
  add_repr(state, {"input_name", "output_name", "dtype", "dims", "initial_dims", "same_buffer"});
}

void bind_model_spec(py::module_& m) {
  py::class_<QueuePolicy> policy(m, "QueuePolicy", "The dynamic batcher's policy for one priority level.");
  policy
      .def(py::init([](bool delay_on_timeout, uint64_t default_timeout_us, bool allow_override,
                       uint32_t max_queue_size) {
             return QueuePolicy{delay_on_timeout, us_to_ns(default_timeout_us), allow_override, max_queue_size};
           }),
           py::kw_only(), py::arg("delay_on_timeout") = false, py::arg("default_timeout_us") = 0,
           py::arg("allow_override") = false, py::arg("max_queue_size") = 0)
      .def_readonly("delay_on_timeout", &QueuePolicy::delay_on_timeout)
      .def_property_readonly("default_timeout_us", [](const QueuePolicy& p) { return ns_to_us(p.default_timeout_ns); })
      .def_readonly("allow_override", &QueuePolicy::allow_override)
      .def_readonly("max_queue_size", &QueuePolicy::max_queue_size);
  add_repr(policy, {"delay_on_timeout", "default_timeout_us", "allow_override", "max_queue_size"});

  py::class_<ModelSpec> model(m, "ModelSpec", "Everything the core needs to schedule one model.");
  model
      .def(py::init([](std::string name, Strategy strategy, int max_batch_size, int instance_count,
                       int slots_per_instance, uint64_t idle_us, uint64_t max_queue_delay_us,
                       double min_slot_utilization, std::vector<InputSpec> inputs, std::vector<ControlSpec> controls,
                       std::vector<StateSpec> states, int64_t delay_requests, int64_t delay_backlog_requests,
                       std::vector<int64_t> preferred_batch_sizes, uint64_t batch_delay_us, int priority_levels,
                       int default_priority, std::vector<QueuePolicy> queue_policies, bool timeout_complete,
                       uint64_t tombstone_us, int64_t max_tombstones, std::vector<double> latency_buckets_ms,
                       int64_t max_backlog_sequences, int64_t max_tombstones_per_client) {
             if (max_backlog_sequences < 0) throw py::value_error("max_backlog_sequences must be >= 0 (0: no bound)");
             ModelSpec s;
             s.name = std::move(name);
             s.strategy = strategy;
             s.max_batch_size = max_batch_size;
             s.instance_count = instance_count;
             s.slots_per_instance = slots_per_instance;
             s.idle_ns = us_to_ns(idle_us);
             s.max_queue_delay_ns = us_to_ns(max_queue_delay_us);
             s.min_slot_utilization = min_slot_utilization;
             s.inputs = std::move(inputs);
             s.controls = std::move(controls);
             s.states = std::move(states);
             s.delay_requests = delay_requests;
             s.delay_backlog_requests = delay_backlog_requests;
             s.preferred_batch_sizes = std::move(preferred_batch_sizes);
             s.batch_delay_ns = us_to_ns(batch_delay_us);
             s.priority_levels = priority_levels;
             s.default_priority = default_priority;
             s.queue_policies = std::move(queue_policies);
             s.timeout_complete = timeout_complete;
             s.tombstone_ns = us_to_ns(tombstone_us);
             s.max_tombstones = max_tombstones;
             s.max_tombstones_per_client = max_tombstones_per_client;
             s.latency_buckets_ms = std::move(latency_buckets_ms);
             s.max_backlog_sequences = max_backlog_sequences;
             return s;
           }),
           py::kw_only(), py::arg("name"), py::arg("strategy") = kStateless, py::arg("max_batch_size") = 0,
           py::arg("instance_count") = 1, py::arg("slots_per_instance") = 1, py::arg("idle_us") = 1000000,
           py::arg("max_queue_delay_us") = 0, py::arg("min_slot_utilization") = 0.0,
           py::arg("inputs") = std::vector<InputSpec>{}, py::arg("controls") = std::vector<ControlSpec>{},
           py::arg("states") = std::vector<StateSpec>{}, py::arg("delay_requests") = 0,
           py::arg("delay_backlog_requests") = 0, py::arg("preferred_batch_sizes") = std::vector<int64_t>{},
           py::arg("batch_delay_us") = 0, py::arg("priority_levels") = 1, py::arg("default_priority") = 1,
           py::arg("queue_policies") = std::vector<QueuePolicy>{}, py::arg("timeout_complete") = false,
           py::arg("tombstone_us") = 3600ULL * 1000000ULL, py::arg("max_tombstones") = 10000,
           py::arg("latency_buckets_ms") = std::vector<double>{100, 500, 2000, 5000},
           py::arg("max_backlog_sequences") = 0, py::arg("max_tombstones_per_client") = 0)
      .def_readonly("name", &ModelSpec::name)
      .def_readonly("strategy", &ModelSpec::strategy)
      .def_readonly("max_batch_size", &ModelSpec::max_batch_size)
      .def_readonly("instance_count", &ModelSpec::instance_count)
      .def_readonly("slots_per_instance", &ModelSpec::slots_per_instance)
      .def_property_readonly("idle_us", [](const ModelSpec& s) { return ns_to_us(s.idle_ns); })
      .def_property_readonly("max_queue_delay_us", [](const ModelSpec& s) { return ns_to_us(s.max_queue_delay_ns); })
      .def_readonly("min_slot_utilization", &ModelSpec::min_slot_utilization)
      .def_readonly("inputs", &ModelSpec::inputs)
      .def_readonly("controls", &ModelSpec::controls)
      .def_readonly("states", &ModelSpec::states)
      .def_readonly("delay_requests", &ModelSpec::delay_requests)
      .def_readonly("delay_backlog_requests", &ModelSpec::delay_backlog_requests)
      .def_readonly("preferred_batch_sizes", &ModelSpec::preferred_batch_sizes)
      .def_property_readonly("batch_delay_us", [](const ModelSpec& s) { return ns_to_us(s.batch_delay_ns); })
      .def_readonly("priority_levels", &ModelSpec::priority_levels)
      .def_readonly("default_priority", &ModelSpec::default_priority)
      .def_readonly("queue_policies", &ModelSpec::queue_policies)
      .def_readonly("timeout_complete", &ModelSpec::timeout_complete)
      .def_property_readonly("tombstone_us", [](const ModelSpec& s) { return ns_to_us(s.tombstone_ns); })
      .def_readonly("max_tombstones", &ModelSpec::max_tombstones)
      .def_readonly("max_tombstones_per_client", &ModelSpec::max_tombstones_per_client)
      .def_readonly("latency_buckets_ms", &ModelSpec::latency_buckets_ms)
      .def_readonly("max_backlog_sequences", &ModelSpec::max_backlog_sequences);
  add_repr(model, {"name", "strategy", "max_batch_size", "instance_count", "slots_per_instance", "idle_us",
                   "max_queue_delay_us", "min_slot_utilization", "inputs", "controls", "states", "delay_requests",
                   "delay_backlog_requests", "preferred_batch_sizes", "batch_delay_us", "priority_levels",
                   "default_priority", "queue_policies", "timeout_complete", "tombstone_us", "max_tombstones",
                   "latency_buckets_ms", "max_backlog_sequences", "max_tombstones_per_client"});
}

void bind_results(py::module_& m) {
  py::class_<SubmitResult> refusal(m, "Refusal", "Why submit() did not queue a request.");
  refusal.def_readonly("code", &SubmitResult::code)
      .def_readonly("message", &SubmitResult::message)
      .def_readonly("backlog_full", &SubmitResult::backlog_full)
      .def_readonly("retry_after_ms", &SubmitResult::retry_after_ms)
      .def_readonly("busy", &SubmitResult::busy)
      .def_readonly("released", &SubmitResult::released);
  add_repr(refusal, {"code", "message", "backlog_full", "busy", "released"});

  py::class_<ExpiredSequence> expired(m, "ExpiredSequence", "A sequence the idle reaper expired (DESCRIBE).");
  expired
      .def_property_readonly("sequence_id", [](const ExpiredSequence& x) { return corrid_object(x.id); })
      .def_readonly("age_s", &ExpiredSequence::age_s)
      .def_readonly("idle_s", &ExpiredSequence::idle_s)
      .def_readonly("steps", &ExpiredSequence::steps)
      .def_readonly("state_bytes", &ExpiredSequence::state_bytes)
      .def_readonly("instance", &ExpiredSequence::instance)
      .def_readonly("slot", &ExpiredSequence::slot);
  add_repr(expired, {"sequence_id", "age_s", "idle_s", "steps", "state_bytes", "instance", "slot"});

  py::class_<DurationStat> duration(m, "Duration", "How many, and how long in total (ns).");
  duration.def_readonly("count", &DurationStat::count).def_readonly("ns", &DurationStat::ns);
  add_repr(duration, {"count", "ns"});

  py::class_<BatchStat> batch(m, "BatchStats", "Compute times of the batches of one size.");
  batch.def_readonly("compute_input", &BatchStat::compute_input)
      .def_readonly("compute_infer", &BatchStat::compute_infer)
      .def_readonly("compute_output", &BatchStat::compute_output);
  add_repr(batch, {"compute_input", "compute_infer", "compute_output"});

  py::class_<Stats> stats(m, "Stats", "A model's statistics, as Triton counts them.");
  stats.def_readonly("inference_count", &Stats::inference_count)
      .def_readonly("execution_count", &Stats::execution_count)
      .def_readonly("last_inference_ms", &Stats::last_inference_ms)
      .def_readonly("success", &Stats::success)
      .def_readonly("fail", &Stats::fail)
      .def_readonly("queue", &Stats::queue)
      .def_readonly("compute_input", &Stats::compute_input)
      .def_readonly("compute_infer", &Stats::compute_infer)
      .def_readonly("compute_output", &Stats::compute_output)
      .def_readonly("batches", &Stats::batches)
      .def_readonly("fail_rejected", &Stats::fail_rejected)
      .def_readonly("fail_backend", &Stats::fail_backend)
      .def_readonly("fail_canceled", &Stats::fail_canceled)
      .def_readonly("sequences_started", &Stats::sequences_started)
      .def_readonly("sequences_ended", &Stats::sequences_ended)
      .def_readonly("sequences_expired", &Stats::sequences_expired)
      .def_readonly("sequences_released", &Stats::sequences_released)
      .def_readonly("sequences_restored", &Stats::sequences_restored)
      .def_readonly("latency_counts", &Stats::latency_counts)
      .def_readonly("latency_sum_ms", &Stats::latency_sum_ms)
      .def_readonly("pending_requests", &Stats::pending_requests)
      .def_readonly("sequence_slots", &Stats::sequence_slots)
      .def_readonly("sequences_active", &Stats::sequences_active)
      .def_readonly("sequences_backlogged", &Stats::sequences_backlogged)
      .def_readonly("state_bytes", &Stats::state_bytes)
      .def_readonly("backlog_full", &Stats::backlog_full)
      .def_readonly("tombstones_evicted", &Stats::tombstones_evicted)
      .def_readonly("tombstones_evicted_client_cap", &Stats::tombstones_evicted_client_cap)
      .def_readonly("tombstones_evicted_global_cap", &Stats::tombstones_evicted_global_cap)
      .def_readonly("session_starts_refused", &Stats::session_starts_refused);
  add_repr(stats, {"inference_count", "execution_count", "last_inference_ms", "success", "fail", "queue",
                   "compute_input", "compute_infer", "compute_output", "batches", "fail_rejected", "fail_backend",
                   "fail_canceled", "sequences_started", "sequences_ended", "sequences_expired", "sequences_released",
                   "sequences_restored", "latency_counts",
                   "latency_sum_ms", "pending_requests", "sequence_slots", "sequences_active",
                   "sequences_backlogged", "state_bytes", "backlog_full", "tombstones_evicted",
                   "tombstones_evicted_client_cap", "tombstones_evicted_global_cap", "session_starts_refused"});

  py::class_<SequenceInfo> seq(m, "SequenceInfo", "One live sequence, as the sequence API shows it.");
  seq.def_property_readonly("sequence_id", [](const SequenceInfo& x) { return corrid_object(x.id); })
      .def_readonly("backlogged", &SequenceInfo::backlogged)
      .def_readonly("session", &SequenceInfo::session)
      .def_readonly("instance", &SequenceInfo::instance)
      .def_readonly("slot", &SequenceInfo::slot)
      .def_readonly("age_s", &SequenceInfo::age_s)
      .def_readonly("idle_s", &SequenceInfo::idle_s)
      .def_readonly("steps", &SequenceInfo::steps)
      .def_readonly("state_bytes", &SequenceInfo::state_bytes)
      .def_readonly("queued", &SequenceInfo::queued);
  add_repr(seq, {"sequence_id", "backlogged", "session", "instance", "slot", "age_s", "idle_s", "steps",
                 "state_bytes", "queued"});
}

}  // namespace

py::dtype numpy_dtype(const ElemType& t) { return py::dtype(t.numpy); }

py::object corrid_object(const CorrId& id) {
  if (id.is_str) return py::str(id.str);
  return py::int_(id.num);
}

CorrId corrid_from(py::handle obj) {
  CorrId id;
  if (py::isinstance<py::str>(obj)) {
    id.is_str = true;
    id.str = obj.cast<std::string>();
  } else {
    id.num = obj.cast<uint64_t>();
  }
  return id;
}

Dtypes::Dtypes(const ModelSpec& spec) {
  for (const auto& s : spec.inputs) inputs.push_back(numpy_dtype(s.type));
  for (const auto& s : spec.controls) controls.push_back(numpy_dtype(s.type));
  for (const auto& s : spec.states) states.push_back(numpy_dtype(s.type));
}

void bind_spec(py::module_& m) {
  bind_enums(m);
  bind_tensor_specs(m);
  bind_model_spec(m);
  bind_results(m);
}

}  // namespace seqserve::binding
