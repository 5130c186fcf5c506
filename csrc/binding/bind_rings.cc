// Binding of the worker <-> engine shared-memory transport (shm_region.h): ShmRegion. Python
// creates a region and attaches to one, moves tensor bytes in and out of slab blocks, and
// pushes and pops records one at a time; that is for tests and for the worker's event loop.
// The engine side drains its rings in C++ (Region::drain_requests) straight into the
// scheduler. stress_produce / stress_consume are C++ loops for the multi-process tests and the
// benchmark: millions of records, each checked, without Python per record.
#include <cstring>
#include <fcntl.h>
#include <sched.h>

#include <pybind11/stl.h>

#include <thread>

#include "binding.h"
#include "ring_objects.h"
#include "shm_region.h"

namespace seqserve::binding {

// RequestHeader's type (bind_request.cc made it): pop_request builds one per record. A borrowed
// handle: the module holds the type for as long as anything can call pop_request.
static py::handle g_request_header_type;

py::list slab_tensors_to(const std::vector<shm::SlabTensor>& ts) {
  py::list out;
  for (const shm::SlabTensor& t : ts) {
    py::tuple shape(t.ndim);
    for (int d = 0; d < t.ndim; ++d) shape[d] = py::int_(t.shape[d]);
    out.append(py::make_tuple(t.index, t.offset, t.nbytes, shape));
  }
  return out;
}

py::object request_header_from(const shm::RequestRecord& rec) {
  const RequestHeader& h = rec.header;
  py::object id = h.has(kFlagStringId) ? py::object(py::str(rec.string_id.data(), rec.string_id.size()))
                                       : py::object(py::int_(h.sequence_id));
  return g_request_header_type(py::arg("handle") = h.handle, py::arg("sequence_id") = id,
                               py::arg("start") = h.has(kFlagStart), py::arg("end") = h.has(kFlagEnd),
                               py::arg("session") = h.has(kFlagSession), py::arg("timeout_us") = h.timeout_us,
                               py::arg("rows") = h.rows, py::arg("priority") = h.priority,
                               py::arg("client") = rec.client);
}

namespace {

using shm::Direction;
using shm::Region;
using shm::ReplyRecord;
using shm::RequestRecord;
using shm::SlabTensor;

// (index, offset, nbytes, shape) in Python.
using TensorTuple = std::tuple<uint32_t, uint64_t, uint64_t, std::vector<int64_t>>;

std::vector<SlabTensor> tensors_from(const std::vector<TensorTuple>& in) {
  std::vector<SlabTensor> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& [index, offset, nbytes, shape] = in[i];
    if (shape.size() > static_cast<size_t>(kMaxRank))
      throw py::value_error("a tensor has at most " + std::to_string(kMaxRank) + " dims");
    out[i].index = index;
    out[i].offset = offset;
    out[i].nbytes = nbytes;
    out[i].ndim = static_cast<int>(shape.size());
    std::copy(shape.begin(), shape.end(), out[i].shape);
  }
  return out;
}


// Per worker and direction: many small blocks, and a few large ones up to the servers' default
// max body (64 MiB). A memfd's pages cost nothing until written, so the large classes reserve
// address space, not memory, until a large tensor uses them.
std::vector<std::pair<uint64_t, uint32_t>> default_slab_classes() {
  return {{4096, 256}, {65536, 64}, {1 << 20, 16}, {16ull << 20, 4}, {64ull << 20, 2}};
}

Direction direction(bool to_engine) { return to_engine ? Direction::kToEngine : Direction::kToWorker; }

int checked_worker(const Region& r, int w) {
  if (w < 0 || w >= r.workers()) throw py::index_error("no worker " + std::to_string(w));
  return w;
}

int timeout_ms(double seconds) { return seconds < 0 ? -1 : static_cast<int>(seconds * 1000.0 + 0.5); }

// Stress records name their producer and their place in its stream: every loss, duplicate or
// reordering shows as a gap in some producer's sequence.
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// One producer thread: `count` records onto worker w's ring, spinning (yielding) while the ring
// or the slab is full. Returns the sum of the sequence ids it sent.
uint64_t produce(Region& region, int w, uint32_t producer, uint64_t count, uint64_t tensor_bytes, uint64_t burst,
                 int pause_us) {
  RequestRecord rec;
  rec.target = 7;
  if (tensor_bytes) rec.inputs.resize(1);
  shm::SlabPool pool = region.pool(w, Direction::kToEngine);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t handle = (uint64_t(producer) << 32) | (i + 1);
    rec.header.handle = handle;
    rec.header.sequence_id = mix(handle);
    if (tensor_bytes) {
      uint64_t off;
      while ((off = pool.alloc(tensor_bytes)) == 0) sched_yield();
      uint8_t* data = region.at(off, tensor_bytes);
      std::memcpy(data, &handle, 8);  // written once, here; the consumer reads it in place
      std::memcpy(data + tensor_bytes - 8, &rec.header.sequence_id, 8);
      SlabTensor& t = rec.inputs[0];
      t.offset = off;
      t.nbytes = tensor_bytes;
      t.ndim = 1;
      t.shape[0] = static_cast<int64_t>(tensor_bytes);
    }
    while (!region.push_request(w, rec)) sched_yield();
    sum += rec.header.sequence_id;
    if (burst && pause_us > 0 && (i + 1) % burst == 0) std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
  }
  return sum;
}

struct ConsumeResult {
  uint64_t records = 0, checksum = 0, misordered = 0, bad = 0, sleeps = 0, rang = 0, timed_out_with_work = 0;
  double seconds = 0;
};

// The engine's drain loop as the integration will run it: drain, and when the rings are empty
// keep looking for spin_us before sleeping on the doorbell (a short spin saves the producers'
// eventfd writes and this side's wake-ups while records keep coming).
ConsumeResult consume(Region& region, uint32_t producers, uint64_t expected, bool sleep, int sleep_ms,
                      double limit_s, int64_t spin_us) {
  ConsumeResult res;
  std::vector<uint64_t> last(producers, 0);
  const int64_t start = now_ns();
  const int64_t limit = start + static_cast<int64_t>(limit_s * 1e9);
  auto check = [&](int w, const RequestRecord& r) {
    const uint64_t handle = r.header.handle;
    const uint32_t p = static_cast<uint32_t>(handle >> 32);
    const uint64_t seq = handle & 0xffffffffull;
    if (p >= producers || seq != last[p] + 1)
      ++res.misordered;
    else
      last[p] = seq;
    if (r.header.sequence_id != mix(handle) || r.target != 7) ++res.bad;
    for (const SlabTensor& t : r.inputs) {
      const uint8_t* data = region.at(t.offset, t.nbytes);
      uint64_t head = 0, tail = 0;
      std::memcpy(&head, data, 8);
      std::memcpy(&tail, data + t.nbytes - 8, 8);
      if (head != handle || tail != r.header.sequence_id) ++res.bad;
      if (!region.pool(w, Direction::kToEngine).free(t.offset)) ++res.bad;
    }
    res.checksum += r.header.sequence_id;
    ++res.records;
  };
  int64_t idle_since = 0;
  while (res.records < expected && now_ns() < limit) {
    if (region.drain_requests(check, 256) > 0) {
      idle_since = 0;
      continue;
    }
    if (idle_since == 0) idle_since = now_ns();
    if (!sleep || now_ns() - idle_since < spin_us * 1000) {
      sched_yield();
      continue;
    }
    idle_since = 0;
    ++res.sleeps;
    const shm::Wake wake = region.wait_requests(sleep_ms);
    if (wake == shm::Wake::kRang) ++res.rang;
    // A record that was already there when the wait ran out is a wake-up that got lost.
    if (wake == shm::Wake::kTimedOut && region.has_requests()) ++res.timed_out_with_work;
  }
  res.seconds = (now_ns() - start) / 1e9;
  return res;
}

}  // namespace

void bind_rings(py::module_& m) {
  g_request_header_type = m.attr("RequestHeader");
  m.attr("REPLY_ERROR") = py::int_(static_cast<uint32_t>(shm::kReplyError));
  m.attr("REPLY_FINAL") = py::int_(static_cast<uint32_t>(shm::kReplyFinal));
  m.attr("REPLY_BACKLOG_FULL") = py::int_(static_cast<uint32_t>(shm::kReplyBacklogFull));
  m.attr("REPLY_RELEASED") = py::int_(static_cast<uint32_t>(shm::kReplyReleased));
  m.attr("REPLY_RETRY_SHIFT") = py::int_(shm::kReplyRetryShift);
  py::class_<Region>(m, "ShmRegion",
                     "The shared-memory transport between front-end workers and the engine: per worker a request\n"
                     "ring, a reply ring and two slab pools, in one memfd; eventfds wake a sleeping side.")
      .def(py::init([](int workers, uint32_t request_slots, uint32_t request_record_bytes, uint32_t reply_slots,
                       uint32_t reply_record_bytes, const std::vector<std::pair<uint64_t, uint32_t>>& slab_classes) {
             shm::Geometry g;
             if (workers < 1) throw py::value_error("workers must be at least 1");
             if (slab_classes.size() > static_cast<size_t>(shm::kMaxSlabClasses))
               throw py::value_error("at most " + std::to_string(shm::kMaxSlabClasses) + " slab classes");
             g.workers = static_cast<uint32_t>(workers);
             g.request_slots = request_slots;
             g.request_record_bytes = request_record_bytes;
             g.reply_slots = reply_slots;
             g.reply_record_bytes = reply_record_bytes;
             g.class_count = static_cast<uint32_t>(slab_classes.size());
             for (size_t i = 0; i < slab_classes.size(); ++i)
               g.classes[i] = shm::SlabClass{slab_classes[i].first, slab_classes[i].second, 0};
             const std::string why = shm::check_geometry(g);
             if (!why.empty()) throw py::value_error(why);
             return Region::create(g);
           }),
           py::kw_only(), py::arg("workers"), py::arg("request_slots") = 1024, py::arg("request_record_bytes") = 1008,
           py::arg("reply_slots") = 1024, py::arg("reply_record_bytes") = 1008,
           py::arg("slab_classes") = default_slab_classes())
      .def_static(
          "attach",
          [](int fd, int engine_eventfd, const std::vector<int>& worker_eventfds) {
            // The region owns and closes its descriptors: it takes duplicates, the caller keeps its own.
            std::vector<int> dups;
            auto dup_or_throw = [&](int f) {
              const int d = ::fcntl(f, F_DUPFD_CLOEXEC, 0);
              if (d < 0) {
                for (int x : dups) ::close(x);
                throw py::value_error("not an open descriptor: " + std::to_string(f));
              }
              return d;
            };
            const int memfd = dup_or_throw(fd);
            dups.push_back(memfd);
            const int efd = dup_or_throw(engine_eventfd);
            dups.push_back(efd);
            std::vector<int> wefds;
            for (int f : worker_eventfds) {
              wefds.push_back(dup_or_throw(f));
              dups.push_back(wefds.back());
            }
            try {
              return Region::attach(memfd, efd, wefds);
            } catch (const std::runtime_error& e) {
              throw py::value_error(e.what());  // the failed Region closed the duplicates
            }
          },
          py::arg("fd"), py::arg("engine_eventfd"), py::arg("worker_eventfds"),
          "Maps a region another process created, from its descriptors (inherited, or received with SCM_RIGHTS).")
      .def_property_readonly("fd", &Region::fd, "The region's memfd, to hand to a worker process.")
      .def_property_readonly("engine_eventfd", &Region::engine_eventfd)
      .def_property_readonly("worker_eventfds",
                             [](const Region& r) {
                               std::vector<int> out;
                               for (int w = 0; w < r.workers(); ++w) out.push_back(r.worker_eventfd(w));
                               return out;
                             })
      .def_property_readonly("workers", &Region::workers)
      .def_property_readonly("size", &Region::bytes, "Bytes mapped.")
      .def(
          "alloc",
          [](Region& r, int w, bool to_engine, uint64_t nbytes) {
            return r.pool(checked_worker(r, w), direction(to_engine)).alloc(nbytes);
          },
          py::arg("worker"), py::arg("to_engine"), py::arg("nbytes"),
          "A slab block of at least nbytes, by its offset; 0 when none is free.")
      .def(
          "free",
          [](Region& r, int w, bool to_engine, uint64_t offset) {
            return r.pool(checked_worker(r, w), direction(to_engine)).free(offset);
          },
          py::arg("worker"), py::arg("to_engine"), py::arg("offset"),
          "Returns a block; False when offset is not an allocated block of that pool.")
      .def(
          "free_blocks",
          [](Region& r, int w, bool to_engine) { return r.pool(checked_worker(r, w), direction(to_engine)).free_blocks(); },
          py::arg("worker"), py::arg("to_engine"))
      .def(
          "buffer",
          [](Region& r, uint64_t offset, uint64_t nbytes) {
            uint8_t* p = r.at(offset, nbytes);
            if (p == nullptr) throw py::value_error("bytes outside the region");
            return py::memoryview::from_memory(p, static_cast<py::ssize_t>(nbytes));
          },
          py::arg("offset"), py::arg("nbytes"), py::keep_alive<0, 1>(),
          "A writable view of region bytes (a slab block's).")
      // write and read copy without a view: a view's keep_alive ties it to the region through a
      // weak reference, 2-2.5 us per tensor against 0.3-1.7 (bench/docs/workers.md, round 6).
      .def(
          "write",
          [](Region& r, uint64_t offset, py::handle data) {
            Py_buffer view;
            if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
            const uint64_t nbytes = static_cast<uint64_t>(view.len);
            uint8_t* p = nbytes ? r.at(offset, nbytes) : nullptr;
            if (p != nullptr) std::memcpy(p, view.buf, nbytes);
            PyBuffer_Release(&view);
            if (nbytes && p == nullptr) throw py::value_error("bytes outside the region");
          },
          py::arg("offset"), py::arg("data"),
          "Copies a C-contiguous buffer (bytes, an array) into region bytes at offset (a slab "
          "block's); a buffer that is not C-contiguous is refused (BufferError; numpy's ValueError).")
      .def(
          "read",
          [](Region& r, uint64_t offset, uint64_t nbytes) {
            uint8_t* p = r.at(offset, nbytes);
            if (p == nullptr) throw py::value_error("bytes outside the region");
            PyObject* out = PyByteArray_FromStringAndSize(reinterpret_cast<const char*>(p), static_cast<Py_ssize_t>(nbytes));
            if (out == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::bytearray>(out);
          },
          py::arg("offset"), py::arg("nbytes"), "A copy of region bytes (a slab block's), as a bytearray.")
      .def(
          "push_request",
          [](Region& r, int w, uint32_t target, py::handle header, const std::vector<TensorTuple>& inputs, bool cancel,
             uint64_t client, bool slow, bool wake) {
            const RequestHeaderObject* h = as_request_header(header);
            if (h == nullptr) throw py::type_error("header must be a RequestHeader");
            RequestRecord rec;
            rec.target = target;
            rec.kind = cancel ? shm::kCancel : shm::kSubmit;
            rec.client = client != 0 ? client : h->client;
            rec.slow = slow;
            rec.header = h->fixed;
            if (h->string_id) {
              Py_ssize_t n = 0;
              const char* s = PyUnicode_AsUTF8AndSize(h->string_id, &n);
              rec.string_id = std::string_view(s, static_cast<size_t>(n));
            }
            rec.inputs = tensors_from(inputs);
            try {
              return r.push_request(checked_worker(r, w), rec, wake);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("worker"), py::arg("target"), py::arg("header"), py::arg("inputs") = std::vector<TensorTuple>{},
          py::kw_only(), py::arg("cancel") = false, py::arg("client") = 0, py::arg("slow") = false,
          py::arg("wake") = true,
          "Worker side: publish a request; False when the ring is full (back-pressure). client: the key its\n"
          "session's tombstones count against (0: the header's); slow: the engine must take it through its\n"
          "Python path (RingFeeder.take_slow) even when the model's target is on the compiled path; wake:\n"
          "False leaves the engine asleep until wake_engine() (one wake-up for a burst of requests).")
      .def("wake_engine", &Region::wake_engine,
           "Worker side: ring the engine if it sleeps (after requests pushed with wake=False).")
      .def(
          "pop_request",
          [](Region& r, int w) -> py::object {
            py::object out = py::none();
            r.pop_request(checked_worker(r, w), [&](int, const RequestRecord& rec) {
              out = py::make_tuple(rec.target, rec.kind == shm::kCancel, request_header_from(rec), slab_tensors_to(rec.inputs));
            });
            return out;
          },
          py::arg("worker"),
          "Engine side, for tests: the oldest request of one worker as (target, cancel, header, inputs), or None.")
      .def(
          "push_reply",
          [](Region& r, int w, uint64_t handle, const std::vector<TensorTuple>& outputs, int code, std::string error,
             bool final) {
            ReplyRecord rec;
            rec.handle = handle;
            rec.flags = (final ? shm::kReplyFinal : 0) | (error.empty() && code == 0 ? 0 : shm::kReplyError);
            rec.code = code;
            rec.error = error;
            rec.outputs = tensors_from(outputs);
            try {
              return r.push_reply(checked_worker(r, w), rec);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("worker"), py::arg("handle"), py::arg("outputs") = std::vector<TensorTuple>{}, py::kw_only(),
          py::arg("code") = 0, py::arg("error") = "", py::arg("final") = true,
          "Engine side: publish a reply (an error when code or error is set); False when the ring is full.")
      .def(
          "pop_reply",
          [](Region& r, int w) -> py::object {
            py::object out = py::none();
            r.drain_replies(
                checked_worker(r, w),
                [&](const ReplyRecord& rec) {
                  py::object error = py::none();
                  if (rec.flags & shm::kReplyError) {
                    error = py::reinterpret_steal<py::object>(
                        PyUnicode_DecodeUTF8(rec.error.data(), static_cast<Py_ssize_t>(rec.error.size()), "replace"));
                    if (!error) throw py::error_already_set();
                  }
                  out = py::make_tuple(rec.handle, (rec.flags & shm::kReplyFinal) != 0, rec.code, error, slab_tensors_to(rec.outputs));
                },
                1);
            return out;
          },
          py::arg("worker"), "Worker side: the oldest reply as (handle, final, code, error or None, outputs), or None.")
      .def(
          "pop_replies",
          [](Region& r, int w, size_t max) {
            py::list out;
            r.drain_replies(
                checked_worker(r, w),
                [&](const ReplyRecord& rec) {
                  py::object error = py::none();
                  if (rec.flags & shm::kReplyError) {
                    error = py::reinterpret_steal<py::object>(
                        PyUnicode_DecodeUTF8(rec.error.data(), static_cast<Py_ssize_t>(rec.error.size()), "replace"));
                    if (!error) throw py::error_already_set();
                  }
                  out.append(py::make_tuple(rec.handle, rec.flags, rec.code, error, slab_tensors_to(rec.outputs)));
                },
                max);
            return out;
          },
          py::arg("worker"), py::arg("max") = 64,
          "Worker side: up to max replies, oldest first, as (handle, flags, code, error or None, outputs).\n"
          "flags: REPLY_FINAL, REPLY_ERROR, and for refusals REPLY_BACKLOG_FULL, REPLY_RELEASED and in bits\n"
          "8..31 how long the refusal lasts in ms (flags >> REPLY_RETRY_SHIFT; 0: not said).")
      .def(
          "wait_requests",
          [](Region& r, double timeout) {
            py::gil_scoped_release unlocked;
            return r.wait_requests(timeout_ms(timeout)) != shm::Wake::kTimedOut;
          },
          py::arg("timeout"),
          "Engine side: sleep until a worker publishes a request (at once if one is there); False on timeout.")
      .def(
          "wait_replies",
          [](Region& r, int w, double timeout) {
            checked_worker(r, w);
            py::gil_scoped_release unlocked;
            return r.wait_replies(w, timeout_ms(timeout)) != shm::Wake::kTimedOut;
          },
          py::arg("worker"), py::arg("timeout"), "Worker side: sleep until the engine publishes a reply; False on timeout.")
      .def(
          "arm_reply_wakeup", [](Region& r, int w) { return r.arm_replies(checked_worker(r, w)); }, py::arg("worker"),
          "Worker side, for an event loop watching worker_eventfds[worker]: True when replies are already\n"
          "there (drain them); False when the eventfd will become readable at the next reply (read it to reset\n"
          "it, drain, arm again).")
      .def(
          "reset_worker", [](Region& r, int w) { r.reset_worker(checked_worker(r, w)); }, py::arg("worker"),
          "Lay worker w's rings, doorbell and both slab pools out afresh (a dead worker's, before its\n"
          "replacement attaches). Only once nothing uses them: the worker process is gone, the engine holds\n"
          "none of its requests, and no thread drains its ring (with a RingFeeder, call its reset_worker).")
      .def(
          "pending",
          [](Region& r, int w, bool requests) {
            return (requests ? r.request_ring(checked_worker(r, w)) : r.reply_ring(checked_worker(r, w))).size();
          },
          py::arg("worker"), py::arg("requests"), "Records waiting on a worker's request (or reply) ring.")
      .def("counters",
           [](Region& r) {
             py::dict d;
             d["engine_sleeps"] = r.engine_doorbell().sleeps.load();
             d["engine_wakes"] = r.engine_doorbell().wakes.load();
             uint64_t ws = 0, ww = 0;
             for (int w = 0; w < r.workers(); ++w) {
               ws += r.worker_doorbell(w).sleeps.load();
               ww += r.worker_doorbell(w).wakes.load();
             }
             d["worker_sleeps"] = ws;
             d["worker_wakes"] = ww;
             d["malformed"] = r.malformed();
             return d;
           })
      .def(
          "stress_produce",
          [](Region& r, int w, uint32_t producer, uint64_t count, int threads, uint64_t tensor_bytes, uint64_t burst,
             int pause_us) {
            checked_worker(r, w);
            if (threads < 1) throw py::value_error("threads must be at least 1");
            if (tensor_bytes != 0 && tensor_bytes < 16) throw py::value_error("tensor_bytes must be 0 or at least 16");
            py::gil_scoped_release unlocked;
            std::vector<uint64_t> sums(threads, 0);
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t)
              pool.emplace_back([&, t] { sums[t] = produce(r, w, producer + t, count, tensor_bytes, burst, pause_us); });
            uint64_t sum = 0;
            for (int t = 0; t < threads; ++t) {
              pool[t].join();
              sum += sums[t];
            }
            return sum;
          },
          py::arg("worker"), py::arg("producer"), py::arg("count"), py::kw_only(), py::arg("threads") = 1,
          py::arg("tensor_bytes") = 0, py::arg("burst") = 0, py::arg("pause_us") = 0,
          "Test/bench: `threads` producers (ids producer..) each push `count` checked records; the sum of their ids.")
      .def(
          "stress_consume",
          [](Region& r, uint32_t producers, uint64_t expected, bool sleep, double sleep_timeout, double limit,
             double spin_us) {
            ConsumeResult res;
            {
              py::gil_scoped_release unlocked;
              res = consume(r, producers, expected, sleep, timeout_ms(sleep_timeout), limit, static_cast<int64_t>(spin_us));
            }
            py::dict d;
            d["records"] = res.records;
            d["checksum"] = res.checksum;
            d["misordered"] = res.misordered;
            d["bad"] = res.bad;
            d["sleeps"] = res.sleeps;
            d["rang"] = res.rang;
            d["timed_out_with_work"] = res.timed_out_with_work;
            d["seconds"] = res.seconds;
            return d;
          },
          py::arg("producers"), py::arg("expected"), py::kw_only(), py::arg("sleep") = true,
          py::arg("sleep_timeout") = 1.0, py::arg("limit") = 60.0, py::arg("spin_us") = 0.0,
          "Test/bench: drain every worker's ring in C++ until `expected` records, checking each; with sleep,\n"
          "look for spin_us microseconds after the last record before sleeping on the doorbell.");
}

}  // namespace seqserve::binding
