// The engine's drain thread and reply writer for the workers' rings: see ring_feeder.h.
#include "ring_feeder.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

#if defined(__linux__)
#include <sys/eventfd.h>
#endif

namespace seqserve {

namespace {

constexpr size_t kBurstPerWorker = 64;  // records taken from one ring before looking at the next
constexpr int kSleepMs = 100;           // the drain thread's longest sleep (stop() rings it anyway)
constexpr int kRetrySleepMs = 1;        // ... while replies wait for room

void ring_eventfd(int fd) {
  const uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void reset_eventfd(int fd) {
  uint64_t count;
  (void)!::read(fd, &count, sizeof count);  // non-blocking
}

std::string shape_text(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace

RingFeeder::RingFeeder(shm::Region& region, int64_t spin_us)
    : region_(region),
      spin_ns_(spin_us * 1000),
      inflight_per_worker_(region.workers(), 0),
      queued_(region.workers()),
      forgotten_(region.workers(), false) {
#if defined(__linux__)
  slow_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
#endif
  if (slow_fd_ < 0) throw std::runtime_error("RingFeeder: eventfd failed");
}

RingFeeder::~RingFeeder() {
  stop();
  ::close(slow_fd_);
}

void RingFeeder::set_runtime(std::function<void()> attach, std::function<void()> detach) {
  attach_ = std::move(attach);
  detach_ = std::move(detach);
}

void RingFeeder::start() {
  if (thread_.joinable()) return;
  stopping_.store(false);
  thread_ = std::thread([this] {
    name_this_thread("seqserve-drain");
    loop();
  });
}

void RingFeeder::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  if (std::this_thread::get_id() == thread_.get_id()) {  // its last owner let go on the thread itself
    thread_.detach();
    return;
  }
  ring_eventfd(region_.engine_eventfd());  // a sleeping drain thread wakes and sees stopping_
  thread_.join();
}

void RingFeeder::add_target(uint32_t target, Scheduler* sched, std::vector<std::vector<int64_t>> dims, bool fast) {
  if (fast && sched == nullptr) throw std::invalid_argument("a fast target needs its scheduler");
  if (fast && dims.size() != sched->spec().inputs.size())
    throw std::invalid_argument("a fast target needs the dims of each of its inputs");
  auto t = std::make_shared<const Target>(Target{sched, fast, std::move(dims)});
  std::lock_guard<std::mutex> lk(mu_);
  targets_[target] = std::move(t);
}

void RingFeeder::remove_target(uint32_t target) {
  std::lock_guard<std::mutex> drain(drain_mu_);  // the drain thread is out of its scheduler
  std::lock_guard<std::mutex> lk(mu_);
  auto it = targets_.find(target);
  if (it == targets_.end()) return;
  // It may close once this returns: the drain thread must not come back for its batches.
  inline_.erase(std::remove(inline_.begin(), inline_.end(), it->second->sched), inline_.end());
  targets_.erase(it);
}

std::vector<SlowRecord> RingFeeder::take_slow() {
  std::vector<SlowRecord> out;
  std::lock_guard<std::mutex> lk(mu_);
  reset_eventfd(slow_fd_);  // under the lock: a record added after this signals again
  out.swap(slow_);
  slow_signalled_ = false;
  return out;
}

// ---- the drain thread

void RingFeeder::loop() {
  int64_t idle_since = 0;
  while (!stopping_.load(std::memory_order_relaxed)) {
    size_t n;
    {
      std::lock_guard<std::mutex> drain(drain_mu_);
      n = region_.drain_requests([this](int w, const shm::RequestRecord& r) { on_record(w, r); }, kBurstPerWorker);
      // Executors wake once per burst, and form their batches from all of it.
      if (!wakes_.empty()) {
        std::sort(wakes_.begin(), wakes_.end());
        wakes_.erase(std::unique(wakes_.begin(), wakes_.end()), wakes_.end());
        for (Instance* inst : wakes_) inst->cv.notify_one();
        wakes_.clear();
      }
      if (!inline_.empty() && run_inline()) n = std::max<size_t>(n, 1);  // come back at once
    }
    if (signal_slow_) {  // one wake-up per burst for Python's hand-off
      signal_slow_ = false;
      ring_eventfd(slow_fd_);
    }
    if (queued_total_.load(std::memory_order_relaxed) > 0) flush_queued();
    if (n > 0) {
      idle_since = 0;
      continue;
    }
    const int64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < spin_ns_) {
      sched_yield();
      continue;
    }
    idle_since = 0;
    region_.wait_requests(queued_total_.load(std::memory_order_relaxed) > 0 ? kRetrySleepMs : kSleepMs);
  }
  if (attached_) detach_();
}

bool RingFeeder::run_inline() {
  std::sort(inline_.begin(), inline_.end());
  inline_.erase(std::unique(inline_.begin(), inline_.end()), inline_.end());
  if (!attached_) {
    attach_();
    attached_ = true;
  }
  // Under drain_mu_: remove_target waits for this thread to be out of the scheduler.
  size_t left_over = 0;  // those that stopped at their time budget stay, in place
  for (Scheduler* s : inline_) {
    bool left = false;
    s->run_ready_inline(&left, false);
    if (left) inline_[left_over++] = s;
  }
  inline_.resize(left_over);
  return left_over > 0;
}

void RingFeeder::on_record(int w, const shm::RequestRecord& r) {
  const uint64_t handle = r.header.handle;
  std::shared_ptr<const Target> target;
  bool cancel = false;
  uint32_t cancel_token = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = targets_.find(r.target);
    if (it != targets_.end()) target = it->second;
    const bool fast = target && target->fast;
    // A cancel the compiled path does not know (a request it answered already, or one its worker
    // sent the slow way) goes to Python, which ignores what it does not know either.
    auto f = fast && r.kind == shm::kCancel && worker_handle(handle) == handle ? inflight_.find(ring_handle(w, handle))
                                                                               : inflight_.end();
    if (f != inflight_.end()) {
      ++counters_.cancels;
      cancel_token = f->second.token;
      cancel = true;
    } else if (!fast || r.slow || r.kind == shm::kCancel) {
      SlowRecord s;
      s.worker = w;
      s.target = r.target;
      s.cancel = r.kind == shm::kCancel;
      s.client = r.client;
      s.record = r;
      s.string_id.assign(r.string_id);
      s.record.string_id = std::string_view();
      ++counters_.slow;
      if (!slow_signalled_) {
        slow_signalled_ = true;
        signal_slow_ = true;
      }
      slow_.push_back(std::move(s));
      return;
    }
  }
  // Scheduler calls run without mu_: its fail hook comes back here (fail()).
  if (cancel)
    target->sched->cancel(cancel_token, ring_handle(w, handle));
  else
    submit_fast(w, *target, r);
}

std::string RingFeeder::check_inputs(const Target& t, const shm::RequestRecord& r) const {
  const ModelSpec& spec = t.sched->spec();
  const bool batched = spec.max_batch_size > 0;
  const int64_t rows = r.header.rows;
  if (rows < 1 || (batched && rows > spec.max_batch_size) || (!batched && rows != 1))
    return "a request of " + std::to_string(rows) + " rows";
  if (r.inputs.size() != spec.inputs.size())
    return std::to_string(r.inputs.size()) + " inputs for " + std::to_string(spec.inputs.size());
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const shm::SlabTensor& x = r.inputs[k];
    const InputSpec& in = spec.inputs[k];
    if (x.index != k) return "inputs out of config order";
    if (in.type.is_bytes || in.ragged) return "input '" + in.name + "' needs the engine's Python path";
    const std::vector<int64_t>& dims = t.dims[k];
    const size_t lead = batched ? 1 : 0;
    // Only a refusal builds its words: this runs for every record.
    auto what = [&] { return "input '" + in.name + "' of shape " + shape_text(x.shape, x.ndim); };
    if (static_cast<size_t>(x.ndim) != dims.size() + lead) return what();
    if (batched && x.shape[0] != rows) return what();
    uint64_t bytes = in.type.itemsize;
    for (int d = 0; d < x.ndim; ++d) {
      if (x.shape[d] < 0) return what();
      if (d >= static_cast<int>(lead) && dims[d - lead] >= 0 && x.shape[d] != dims[d - lead]) return what();
      // Exact, or refused: a product that wrapped around could match nbytes by chance.
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(x.shape[d]), &bytes)) return what();
    }
    if (bytes != x.nbytes) return what() + " in " + std::to_string(x.nbytes) + " bytes";
  }
  return "";
}

void RingFeeder::submit_fast(int w, const Target& t, const shm::RequestRecord& r) {
  const uint64_t handle = r.header.handle;
  if (handle == 0 || worker_handle(handle) != handle) {  // no name to answer under: dropped
    free_inputs(w, r);
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.bad;
    return;
  }
  const std::string bad = check_inputs(t, r);
  if (!bad.empty()) {
    free_inputs(w, r);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++counters_.bad;
      ++refused_by_target_[r.target].refused;
    }
    send_error(w, handle, kInvalidArg,
               "request for model '" + t.sched->spec().name + "' does not match its config: " + bad);
    return;
  }
  const uint64_t key = ring_handle(w, handle);
  Scheduler& sched = *t.sched;
  Request* req = sched.new_request();
  req->take_header(r.header, r.string_id);
  req->handle = key;
  req->client = r.client;
  req->inputs.resize(r.inputs.size());
  Inflight entry;
  entry.target = r.target;
  entry.token = req->index;
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const shm::SlabTensor& x = r.inputs[k];
    TensorRef& ref = req->inputs[k];
    ref.data = region_.at(x.offset, x.nbytes);
    ref.nbytes = x.nbytes;
    ref.ndim = x.ndim;
    std::copy(x.shape, x.shape + x.ndim, ref.shape);
    entry.blocks.push_back(x.offset);
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!inflight_.emplace(key, std::move(entry)).second) {  // the worker reused a live handle: dropped
      ++counters_.bad;
      lk.unlock();
      sched.recycle(req);
      free_inputs(w, r);
      return;
    }
    ++inflight_per_worker_[w];
    ++counters_.fast;
  }
  // Registered before the submit: its batch may run and answer before submit returns.
  SubmitResult res = sched.submit(req, r.header.priority, wakes_);
  // In inline mode submit woke no executor: this thread runs the batch once the burst is in.
  if (res.accepted && attach_ && sched.inline_active() && (inline_.empty() || inline_.back() != &sched))
    inline_.push_back(&sched);
  if (res.accepted) return;
  Inflight gone;
  if (!finish(key, &gone)) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++counters_.refused;
    Refusals& counts = refused_by_target_[r.target];
    ++counts.refused;
    if (res.code == kUnavailable) ++counts.rejected;
  }
  free_blocks(w, gone.blocks);
  uint32_t flags = (res.backlog_full ? shm::kReplyBacklogFull : 0u) | (res.released ? shm::kReplyReleased : 0u);
  const uint64_t retry = res.retry_after_ms > 0 ? static_cast<uint64_t>(res.retry_after_ms) : 0;
  flags |= static_cast<uint32_t>(retry < shm::kReplyRetryMaxMs ? retry : shm::kReplyRetryMaxMs) << shm::kReplyRetryShift;
  send_error(w, handle, res.code, res.message, flags);
}

void RingFeeder::free_inputs(int w, const shm::RequestRecord& r) {
  shm::SlabPool pool = region_.pool(w, shm::Direction::kToEngine);
  for (const shm::SlabTensor& x : r.inputs) pool.free(x.offset);
}

void RingFeeder::free_blocks(int w, const std::vector<uint64_t>& blocks) {
  shm::SlabPool pool = region_.pool(w, shm::Direction::kToEngine);
  for (uint64_t b : blocks) pool.free(b);
}

bool RingFeeder::finish(uint64_t handle, Inflight* out) {
  std::lock_guard<std::mutex> lk(mu_);
  return finish_locked(handle, out);
}

bool RingFeeder::finish_locked(uint64_t handle, Inflight* out) {
  auto it = inflight_.find(handle);
  if (it == inflight_.end()) return false;
  *out = std::move(it->second);
  inflight_.erase(it);
  --inflight_per_worker_[ring_worker(handle)];
  return true;
}

// ---- replies (executor threads, the fail hook's threads, the drain thread)

void RingFeeder::reply_rows(const std::vector<uint64_t>& handles, const std::vector<int64_t>& first,
                            const std::vector<int64_t>& rows, const std::vector<BatchOutput>& outputs, bool batched) {
  const shm::Geometry& g = region_.geometry();
  const uint64_t largest = g.classes[g.class_count - 1].block_bytes;
  // One batch takes its in-flight entries, and later sends its replies, under one lock each.
  std::vector<Inflight> done(handles.size());
  std::vector<uint8_t> live(handles.size(), 0);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < handles.size(); ++i)
      live[i] = is_ring_handle(handles[i]) && finish_locked(handles[i], &done[i]);
  }
  std::vector<std::pair<int, QueuedReply>> replies;
  replies.reserve(handles.size());
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!live[i]) continue;
    const int w = ring_worker(handles[i]);
    free_blocks(w, done[i].blocks);
    QueuedReply& q = replies.emplace_back(w, QueuedReply()).second;
    q.record.handle = worker_handle(handles[i]);
    const std::string too_large = oversized(outputs, batched ? rows[i] : 1, largest);
    if (!too_large.empty()) {  // it would never find a block: answered, not queued for good
      q.record.flags = shm::kReplyFinal | shm::kReplyError;
      q.record.code = static_cast<int32_t>(kInternal);
      q.error = too_large;
      continue;
    }
    q.record.flags = shm::kReplyFinal;
    q.record.outputs.reserve(outputs.size());
    q.bytes.reserve(outputs.size());
    shm::SlabPool pool = region_.pool(w, shm::Direction::kToWorker);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const BatchOutput& o = outputs[k];
      if (o.data == nullptr) continue;
      const int64_t n = batched ? rows[i] : o.rows;
      const uint8_t* src = o.data + (batched ? static_cast<size_t>(first[i]) * o.row_bytes : 0);
      shm::SlabTensor t;
      t.index = static_cast<uint32_t>(k);
      t.nbytes = static_cast<uint64_t>(n) * o.row_bytes;
      t.ndim = 0;
      if (batched) t.shape[t.ndim++] = n;
      for (int64_t d : o.item_shape) t.shape[t.ndim++] = d;
      t.offset = pool.alloc(t.nbytes == 0 ? 1 : t.nbytes);
      std::vector<uint8_t> held;
      if (t.offset != 0)
        std::memcpy(region_.at(t.offset, t.nbytes), src, t.nbytes);
      else
        held.assign(src, src + t.nbytes);  // no free block now: kept until the retry finds one
      q.record.outputs.push_back(t);
      q.bytes.push_back(std::move(held));
    }
  }
  if (replies.empty()) return;
  // Each worker is woken once, after the batch's replies are all on its ring: woken at the
  // first, it could run (on this CPU, before this thread) and sleep again for every one.
  Tally tally;
  {
    std::lock_guard<std::mutex> lk(replies_mu_);
    std::vector<uint8_t> wake(region_.workers(), 0);
    for (auto& [w, q] : replies) {
      send_locked(w, std::move(q), tally, false);
      wake[w] = 1;
    }
    for (int w = 0; w < region_.workers(); ++w)
      if (wake[w]) region_.wake_worker(w);
  }
  count(tally);
}

void RingFeeder::fail(const std::vector<uint64_t>& handles, Code code, const std::string& message) {
  for (uint64_t h : handles) {
    Inflight done;
    if (!is_ring_handle(h) || !finish(h, &done)) continue;
    const int w = ring_worker(h);
    free_blocks(w, done.blocks);
    send_error(w, worker_handle(h), code, message);
  }
}

void RingFeeder::send_error(int w, uint64_t handle, Code code, const std::string& message, uint32_t extra_flags) {
  QueuedReply q;
  q.record.handle = handle;
  q.record.flags = shm::kReplyFinal | shm::kReplyError | extra_flags;
  q.record.code = static_cast<int32_t>(code);
  q.error = message;
  send(w, std::move(q));
}

void RingFeeder::send(int w, QueuedReply&& q) {
  Tally tally;
  {
    std::lock_guard<std::mutex> lk(replies_mu_);
    send_locked(w, std::move(q), tally);
  }
  count(tally);
}

void RingFeeder::count(const Tally& t) {
  std::lock_guard<std::mutex> lk(mu_);
  counters_.dropped += t.dropped;
  counters_.replies += t.replies;
  counters_.errors += t.errors;
  counters_.deferred += t.deferred;
}

void RingFeeder::send_locked(int w, QueuedReply&& q, Tally& tally, bool wake) {
  const bool error = (q.record.flags & shm::kReplyError) != 0;
  if (forgotten_[w]) {
    shm::SlabPool pool = region_.pool(w, shm::Direction::kToWorker);
    for (const shm::SlabTensor& t : q.record.outputs)
      if (t.offset) pool.free(t.offset);
    ++tally.dropped;
    return;
  }
  ++(error ? tally.errors : tally.replies);
  // Behind queued replies of the same worker, so that replies keep their order.
  if (queued_[w].empty() && try_push(w, q, wake)) return;
  ++tally.deferred;
  // A waiting reply holds no block: blocks go to replies in their order, so the oldest always
  // gets one once the worker frees what it read (replies holding blocks while the oldest waits
  // for one could take them all).
  shm::SlabPool pool = region_.pool(w, shm::Direction::kToWorker);
  for (size_t k = 0; k < q.record.outputs.size(); ++k) {
    shm::SlabTensor& t = q.record.outputs[k];
    if (t.offset == 0) continue;
    const uint8_t* p = region_.at(t.offset, t.nbytes);
    q.bytes[k].assign(p, p + t.nbytes);
    pool.free(t.offset);
    t.offset = 0;
  }
  queued_[w].push_back(std::move(q));
  queued_total_.fetch_add(1, std::memory_order_relaxed);
  ring_eventfd(region_.engine_eventfd());  // the drain thread retries, even if it sleeps
}

std::string RingFeeder::oversized(const std::vector<BatchOutput>& outputs, int64_t rows, uint64_t largest) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const uint64_t n = outputs[k].row_bytes * static_cast<uint64_t>(rows);
    if (outputs[k].data != nullptr && n > largest)
      return "output " + std::to_string(k) + " of " + std::to_string(n) + " bytes is larger than the rings' largest block (" +
             std::to_string(largest) + " bytes)";
  }
  return "";
}

bool RingFeeder::try_push(int w, QueuedReply& q, bool wake) {
  shm::SlabPool pool = region_.pool(w, shm::Direction::kToWorker);
  for (size_t k = 0; k < q.record.outputs.size(); ++k) {
    shm::SlabTensor& t = q.record.outputs[k];
    if (t.offset != 0) continue;
    t.offset = pool.alloc(t.nbytes == 0 ? 1 : t.nbytes);
    if (t.offset == 0) return false;
    std::memcpy(region_.at(t.offset, t.nbytes), q.bytes[k].data(), t.nbytes);
    std::vector<uint8_t>().swap(q.bytes[k]);
  }
  q.record.error = q.error;
  try {
    return region_.push_reply(w, q.record, wake);
  } catch (const std::invalid_argument& e) {  // more outputs than a ring cell holds: said instead
    for (const shm::SlabTensor& t : q.record.outputs) pool.free(t.offset);
    q.record.outputs.clear();
    q.bytes.clear();
    q.record.flags = shm::kReplyFinal | shm::kReplyError;
    q.record.code = kInternal;
    q.error = std::string("the reply does not fit a ring record: ") + e.what();
    q.record.error = q.error;
    return region_.push_reply(w, q.record);
  }
}

void RingFeeder::flush_queued() {
  std::lock_guard<std::mutex> lk(replies_mu_);
  for (int w = 0; w < static_cast<int>(queued_.size()); ++w) {
    auto& queue = queued_[w];
    while (!queue.empty() && try_push(w, queue.front())) {
      queue.pop_front();
      queued_total_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

// ---- workers that die

void RingFeeder::forget_worker(int w) {
  if (w < 0 || w >= region_.workers()) throw std::out_of_range("no worker " + std::to_string(w));
  std::lock_guard<std::mutex> lk(replies_mu_);
  forgotten_[w] = true;
  shm::SlabPool pool = region_.pool(w, shm::Direction::kToWorker);
  for (const QueuedReply& q : queued_[w])
    for (const shm::SlabTensor& t : q.record.outputs)
      if (t.offset) pool.free(t.offset);
  queued_total_.fetch_sub(queued_[w].size(), std::memory_order_relaxed);
  queued_[w].clear();
}

void RingFeeder::reset_worker(int w) {
  if (w < 0 || w >= region_.workers()) throw std::out_of_range("no worker " + std::to_string(w));
  std::lock_guard<std::mutex> drain(drain_mu_);
  std::lock_guard<std::mutex> lk(replies_mu_);
  region_.reset_worker(w);
  forgotten_[w] = false;
}

int64_t RingFeeder::inflight(int w) {
  if (w < 0 || w >= region_.workers()) throw std::out_of_range("no worker " + std::to_string(w));
  std::lock_guard<std::mutex> lk(mu_);
  return inflight_per_worker_[w];
}

size_t RingFeeder::queued_replies(int w) {
  if (w < 0 || w >= region_.workers()) throw std::out_of_range("no worker " + std::to_string(w));
  std::lock_guard<std::mutex> lk(replies_mu_);
  return queued_[w].size();
}

RingFeeder::Refusals RingFeeder::refusals(uint32_t target) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = refused_by_target_.find(target);
  return it == refused_by_target_.end() ? Refusals{} : it->second;
}

uint64_t RingFeeder::refused(uint32_t target) { return refusals(target).refused; }

uint64_t RingFeeder::rejected(uint32_t target) { return refusals(target).rejected; }

FeederCounters RingFeeder::counters() {
  std::lock_guard<std::mutex> lk(mu_);
  return counters_;
}

}  // namespace seqserve
