#include "scheduler.h"

#include <stdexcept>

namespace seqserve {

std::unique_ptr<Scheduler> Scheduler::create(ModelSpec spec, Hooks hooks) {
  switch (spec.strategy) {
    case kStateless: return make_stateless_scheduler(std::move(spec), std::move(hooks));
    case kDirect: return make_direct_scheduler(std::move(spec), std::move(hooks));
    case kOldest: return make_oldest_scheduler(std::move(spec), std::move(hooks));
    case kDynamic: return make_dynamic_scheduler(std::move(spec), std::move(hooks));
  }
  throw std::invalid_argument("unknown strategy");
}

Scheduler::Scheduler(ModelSpec spec, Hooks hooks, bool sequences, bool gather_state)
    : spec_(std::move(spec)), hooks_(std::move(hooks)), sequences_(sequences) {
  if (spec_.instance_count < 1) throw std::invalid_argument("instance_count must be >= 1");
  if (sequences && spec_.slots_per_instance < 1) throw std::invalid_argument("slots_per_instance must be >= 1");
  if (spec_.priority_levels < 1) spec_.priority_levels = 1;
  if (spec_.default_priority < 1 || spec_.default_priority > spec_.priority_levels) spec_.default_priority = 1;
  spec_.queue_policies.resize(spec_.priority_levels);
  std::sort(spec_.preferred_batch_sizes.begin(), spec_.preferred_batch_sizes.end());
  std::sort(spec_.latency_buckets_ms.begin(), spec_.latency_buckets_ms.end());
  stats_.latency_counts.assign(spec_.latency_buckets_ms.size() + 1, 0);
  const int slots = sequences ? spec_.slots_per_instance : 0;
  for (int i = 0; i < spec_.instance_count; ++i) {
    auto inst = std::make_unique<Instance>();
    inst->index = i;
    inst->batch.init(spec_, std::max(1, std::max(slots, spec_.max_batch_size)));
    inst->state.init(spec_.states, slots, gather_state);
    instances_.push_back(std::move(inst));
  }
}

std::thread Scheduler::spawn(const char* name, std::function<void()> body, bool* exited) {
  return std::thread([this, name, body = std::move(body), exited] {
    name_this_thread(name);
    if (hooks_.thread_start) hooks_.thread_start();
    body();
    if (hooks_.thread_stop) hooks_.thread_stop();
    if (exited) {
      std::lock_guard<std::mutex> lk(mu_);
      *exited = true;
      exited_cv_.notify_all();
    }
  });
}

void Scheduler::start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (started_) return;
  started_ = true;
  for (auto& inst : instances_) {
    Instance* ip = inst.get();
    inst->thread = spawn("seqserve-exec", [this, ip] { executor_loop(*ip); }, &ip->exited);
  }
  start_helpers();
}

Request* Scheduler::new_request() {
  std::lock_guard<std::mutex> lk(mu_);
  return pool_.take();
}

void Scheduler::recycle(Request* r) {
  std::lock_guard<std::mutex> lk(mu_);
  recycle_locked(r);
}

bool Scheduler::released_locked() {
  if (delay_released_) return true;
  if (counts_.queued >= spec_.delay_requests && counts_.backlogged >= spec_.delay_backlog_requests) {
    delay_released_ = true;
    for (auto& inst : instances_) inst->cv.notify_one();
    return true;
  }
  return false;
}

Instance* Scheduler::idle_instance_locked() {
  for (auto& inst : instances_)
    if (!inst->executing) return inst.get();
  return nullptr;
}

SubmitResult Scheduler::submit(Request* r, int priority) { return submit_waking(r, priority, nullptr); }

SubmitResult Scheduler::submit(Request* r, int priority, std::vector<Instance*>& wakes) {
  return submit_waking(r, priority, &wakes);
}

SubmitResult Scheduler::submit_waking(Request* r, int priority, std::vector<Instance*>* wakes) {
  std::string warning;
  SubmitResult res;
  Fails cancelled;
  // Woken after the lock is dropped: a thread woken while we hold it would only block on it.
  Instance* wake = nullptr;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (closing_) {
      res = refuse(kUnavailable, kStopping);
    } else {
      r->kind = kNormal;
      r->arrival_ns = now_ns();
      const int64_t now = r->arrival_ns;
      res = enqueue_locked(r, priority, wake, warning);
      // Inline mode: the event loop runs the work (run_ready_inline); waking the executor is
      // the hand-off inline execution saves.
      if (wake && res.accepted && inline_.active()) {
        inline_queued_locked(*wake, now);
        wake = nullptr;
      }
    }
    if (!res.accepted) recycle_locked(r);
    if (!cancelled_.empty()) cancelled.swap(cancelled_);  // queueing met cancelled requests
  }
  if (!cancelled.empty()) report(cancelled, kCancelled);
  if (!res.accepted) return res;
  if (wake && wakes)
    wakes->push_back(wake);
  else if (wake)
    wake->cv.notify_one();
  if (!warning.empty() && hooks_.log_warning) hooks_.log_warning(warning);
  return res;
}

bool Scheduler::shapes_match(const Request* a, const Request* b) const {
  for (size_t k = 0; k < spec_.inputs.size(); ++k) {
    if (!spec_.inputs[k].must_match) continue;
    const TensorRef& x = a->inputs[k];
    const TensorRef& y = b->inputs[k];
    if (x.ndim != y.ndim) return false;
    for (int d = 0; d < x.ndim; ++d)
      if (x.shape[d] != y.shape[d]) return false;
  }
  return true;
}

void Scheduler::run_formed_batch(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold,
                                 bool more_work, bool in_line) {
  inst.executing = true;
  inst.inline_batch = in_line;
  inst.recorded = false;  // under the lock: a checkpoint reads it (sequence_scheduler.cc)
  inst.t_form = now_ns();
  Instance* idle = more_work ? idle_instance_locked() : nullptr;  // more work in a shared queue
  const int64_t bound = inline_.bound();  // 0: nobody asks what batches cost
  const ThreadUsage usage = bound ? ThreadUsage::now() : ThreadUsage{};
  lk.unlock();
  if (idle) idle->cv.notify_one();
  execute(inst);
  int64_t cost = now_ns() - inst.t_form;  // gather, runner, replies: what inline would cost
  if (bound && cost > bound) cost = ThreadUsage::cost(usage, cost);
  hold.release_unlocked();  // the event loop is waiting for the runtime to deliver replies
  lk.lock();
  finish_batch_locked(inst);
  note_batch_cost_locked(in_line, cost);
}

void Scheduler::execute(Instance& inst) {
  Batch& b = inst.batch;
  inst.state.reset(b.rows);
  b.gather_inputs(spec_);
  if (sequences_) {
    b.fill_controls(spec_);
    inst.state.gather(b.rows, b.size, spec_.max_batch_size > 0);
  } else {
    b.fill_stateless_flags();
  }
  inst.t_gathered = now_ns();
  inst.t_executed = 0;
  bool ok = hooks_.run(inst);
  if (sequences_) inst.state.finish(b.rows);  // same_buffer states: in-place writes, padding rows
  if (ok && !inst.t_executed) inst.t_executed = now_ns();
  if (!ok) inst.t_executed = 0;
}

void Scheduler::set_output_state(Instance& inst, size_t k, const uint8_t* data, size_t nbytes, const int64_t* shape,
                                 int ndim) {
  inst.state.scatter(k, inst.batch.rows, inst.batch.size, spec_.max_batch_size > 0, data, nbytes, shape, ndim);
}

void Scheduler::record_batch(Instance& inst, bool ok) {
  // The state is final before the batch is recorded: its replies go out next, and a client
  // that has one may checkpoint its sequence at once (and read its slot's state then).
  if (sequences_) inst.state.finish(inst.batch.rows);
  std::lock_guard<std::mutex> lk(mu_);
  record_batch_locked(inst, ok);
}

void Scheduler::record_batch_locked(Instance& inst, bool ok) {
  // Triton's accounting: padding counts in the batch size, not in inference_count.
  if (inst.recorded) return;
  inst.recorded = true;
  const int64_t t_end = now_ns();
  if (ok && !inst.t_executed) inst.t_executed = t_end;
  const int64_t t_exec = inst.t_executed ? inst.t_executed : t_end;
  const uint64_t in_ns = inst.t_gathered - inst.t_form;
  const uint64_t infer_ns = t_exec - inst.t_gathered;
  const uint64_t out_ns = t_end - t_exec;
  uint64_t real = 0;
  for (Row& row : inst.batch.rows) {
    Request* r = row.req;
    if (!r || r->kind != kNormal) continue;
    ++real;
    if (!ok) {
      stats_.fail.add(1, t_end - r->arrival_ns);
      ++stats_.fail_backend;
      continue;
    }
    stats_.success.add(1, t_end - r->arrival_ns);
    observe_latency_locked(t_end - r->arrival_ns);
    stats_.queue.add(1, inst.t_form - r->arrival_ns);
    stats_.compute_input.add(1, in_ns);
    stats_.compute_infer.add(1, infer_ns);
    stats_.compute_output.add(1, out_ns);
  }
  if (ok) {
    stats_.inference_count += sequences_ ? real : inst.batch.size;
    stats_.execution_count += 1;
    BatchStat& b = stats_.batches[inst.batch.size];
    b.compute_input.add(1, in_ns);
    b.compute_infer.add(1, infer_ns);
    b.compute_output.add(1, out_ns);
  }
  stats_.last_inference_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

void Scheduler::finish_batch_locked(Instance& inst) {
  record_batch_locked(inst, inst.t_executed != 0);
  batch_done_locked(inst);
  for (Row& row : inst.batch.rows) {
    if (row.req) recycle_locked(row.req);
    row.req = nullptr;
  }
  inst.executing = false;
  inst.t_executed = 0;
  if (inst.inline_batch) {
    inst.inline_batch = false;
    // Its executor waited for this batch (woken meanwhile), or close() waits for it.
    if (inst.waits_for_inline) inst.cv.notify_one();
    if (closing_) exited_cv_.notify_all();
  }
}

void Scheduler::report(Fails& fails, Code code) {
  if (!hooks_.fail) return;
  for (auto& f : fails) hooks_.fail(f.first, code, f.second);
  fails.clear();
}

void Scheduler::cancelled_locked(Request* r, std::vector<uint64_t>& handles, int64_t now) {
  handles.push_back(r->handle);
  stats_.fail.add(1, now - r->arrival_ns);
  ++stats_.fail_canceled;
  recycle_locked(r);
}

bool Scheduler::flush_cancelled(std::unique_lock<std::mutex>& lk) {
  if (cancelled_.empty()) return false;
  Fails fails;
  fails.swap(cancelled_);
  lk.unlock();
  report(fails, kCancelled);
  lk.lock();
  return true;
}

bool Scheduler::cancel(uint32_t token, uint64_t handle) {
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) return false;
  Request* r = pool_.find(token, handle);
  if (r == nullptr || r->kind != kNormal) return false;
  if (!r->cancelled) {
    r->cancelled = true;
    cancel_locked(r);
  }
  lk.unlock();
  for (auto& inst : instances_) inst->cv.notify_one();  // batch forming drops what it meets
  lk.lock();
  flush_cancelled(lk);
  return true;
}

void Scheduler::stop_accepting() {
  std::lock_guard<std::mutex> lk(mu_);
  accepting_ = false;
}

int64_t Scheduler::inflight_locked() {
  int64_t busy = 0;
  for (auto& inst : instances_) busy += inst->executing;
  return counts_.queued + busy;
}

int64_t Scheduler::inflight_sequences() {
  std::lock_guard<std::mutex> lk(mu_);
  return inflight_locked();
}

int64_t Scheduler::pending_requests() {
  std::lock_guard<std::mutex> lk(mu_);
  return counts_.queued + counts_.backlogged;
}

void Scheduler::observe_latency_locked(int64_t ns) {
  const double ms = static_cast<double>(ns) / 1e6;
  const auto& bounds = spec_.latency_buckets_ms;
  size_t b = 0;
  while (b < bounds.size() && ms > bounds[b]) ++b;
  ++stats_.latency_counts[b];
  stats_.latency_sum_ms += ms;
}

Stats Scheduler::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.pending_requests = counts_.queued + counts_.backlogged;
  gauges_locked(s);
  return s;
}

std::vector<int> Scheduler::close(bool force, int64_t timeout_ns) {
  std::vector<int> hung;
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (closed_) return hung;
    closing_ = true;
    accepting_ = false;
    if (force) force_ = true;
    delay_released_ = true;  // test hooks must not hold a shutdown
    for (auto& inst : instances_) inst->cv.notify_all();
    // Bounded: an executor stuck in a model's execute must not hold the process forever.
    // An inline batch (on the event loop's thread) counts as a running executor: its
    // instance is not finalized under it.
    auto all_exited = [this] {
      for (auto& inst : instances_)
        if ((inst->thread.joinable() && !inst->exited) || inst->inline_batch) return false;
      return true;
    };
    if (timeout_ns < 0)
      exited_cv_.wait(lk, all_exited);
    else
      exited_cv_.wait_for(lk, std::chrono::nanoseconds(timeout_ns), all_exited);
    for (auto& inst : instances_)
      if ((inst->thread.joinable() && !inst->exited) || inst->inline_batch) hung.push_back(inst->index);
  }
  for (auto& inst : instances_) {
    if (!inst->thread.joinable()) continue;
    if (std::find(hung.begin(), hung.end(), inst->index) != hung.end())
      inst->thread.detach();  // it finishes its batch (if ever) and exits: closing_ is set
    else
      inst->thread.join();  // it has finished: returns at once
  }
  stop_helpers();
  // Whatever never ran is answered, so no client waits forever. (A detached executor's own
  // batch is not in any queue: the caller answers its requests.)
  Fails fails;
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    std::vector<uint64_t> handles;
    const int64_t now = now_ns();
    drain_locked([&](Request* r) {
      if (r->kind == kNormal) {
        handles.push_back(r->handle);
        stats_.fail.add(1, now - r->arrival_ns);
      }
      recycle_locked(r);
    });
    counts_ = QueueCounts{};
    if (!handles.empty())
      fails.emplace_back(std::move(handles), "model '" + spec_.name + "' was unloaded before the request ran");
  }
  report(fails, kUnavailable);
  return hung;
}

}  // namespace seqserve
