#include "scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace seqserve {

namespace {

constexpr int64_t kBacklogRecheckNs = 50'000'000;  // grace before reaping a sequence that expired in the backlog

bool is_var_state(const StateSpec& s) {
  return s.variable || s.dtype == kString;
}

int64_t product(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (auto v : d) n *= v;
  return n;
}

// Writes a control value in the tensor's data type.
void write_value(uint8_t* dst, int dtype, double v, uint64_t corrid, bool is_corrid) {
  switch (dtype) {
    case kBool: *dst = v != 0; break;
    case kInt32: {
      int32_t x = is_corrid ? static_cast<int32_t>(static_cast<uint32_t>(corrid)) : static_cast<int32_t>(v);
      std::memcpy(dst, &x, 4);
      break;
    }
    case kUint32: {
      uint32_t x = is_corrid ? static_cast<uint32_t>(corrid) : static_cast<uint32_t>(v);
      std::memcpy(dst, &x, 4);
      break;
    }
    case kFp32: { float x = static_cast<float>(v); std::memcpy(dst, &x, 4); break; }
    case kUint64: case kInt64: {  // INT64 is the same bits read as signed
      uint64_t x = is_corrid ? corrid : static_cast<uint64_t>(v);
      std::memcpy(dst, &x, 8);
      break;
    }
    default: break;
  }
}

// Holds the Python runtime (via Hooks::enter/leave) around forming and running one batch.
// Both transitions drop the scheduler lock first, so the lock order is always runtime -> lock.
class RuntimeHold {
 public:
  RuntimeHold(const Hooks& h, std::unique_lock<std::mutex>& lk) : h_(h), lk_(lk) {}
  ~RuntimeHold() { release(); }
  bool held() const { return held_; }
  // True when it had to wait for the runtime: the caller re-examines its queues.
  bool acquire() {
    if (held_ || !h_.enter) return false;
    lk_.unlock();
    h_.enter();
    lk_.lock();
    held_ = true;
    return true;
  }
  void release() {
    if (!held_) return;
    lk_.unlock();
    h_.leave();
    lk_.lock();
    held_ = false;
  }
  // Same, for a caller that does not hold the lock right now.
  void release_unlocked() {
    if (!held_) return;
    h_.leave();
    held_ = false;
  }

 private:
  const Hooks& h_;
  std::unique_lock<std::mutex>& lk_;
  bool held_ = false;
};

}  // namespace

Scheduler::Scheduler(ModelSpec spec, Hooks hooks) : spec_(std::move(spec)), hooks_(std::move(hooks)) {
  if (spec_.instance_count < 1) throw std::invalid_argument("instance_count must be >= 1");
  const bool seq = spec_.strategy == kDirect || spec_.strategy == kOldest;
  if (seq && spec_.slots_per_instance < 1) throw std::invalid_argument("slots_per_instance must be >= 1");
  if (spec_.priority_levels < 1) spec_.priority_levels = 1;
  if (spec_.default_priority < 1 || spec_.default_priority > spec_.priority_levels) spec_.default_priority = 1;
  spec_.policies.resize(spec_.priority_levels);
  std::sort(spec_.preferred_batch_sizes.begin(), spec_.preferred_batch_sizes.end());
  if (spec_.strategy == kDynamic) {
    levels_.resize(spec_.priority_levels);
    delayed_.resize(spec_.priority_levels);
  }
  const int slots = seq ? spec_.slots_per_instance : 0;
  const size_t nstate = spec_.states.size();
  for (int i = 0; i < spec_.instance_count; ++i) {
    auto inst = std::make_unique<Instance>();
    inst->index = i;
    inst->slots.resize(slots);
    for (int s = 0; s < slots; ++s) {
      Slot& sl = inst->slots[s];
      sl.instance = i;
      sl.index = s;
      sl.var_shape.resize(nstate);
      sl.var_data.resize(nstate);
      sl.var_bytes.resize(nstate);
      free_slots_.insert({s, i});
    }
    const int rows = std::max(1, std::max(slots, spec_.max_batch_size));
    inst->rows.reserve(rows);
    inst->input_bufs.resize(spec_.inputs.size());
    inst->input_nbytes.resize(spec_.inputs.size());
    inst->input_shapes.resize(spec_.inputs.size());
    inst->control_bufs.resize(spec_.controls.size());
    inst->control_bytes.resize(spec_.controls.size());
    for (size_t c = 0; c < spec_.controls.size(); ++c) inst->control_bufs[c].reserve(rows * 8);
    inst->state_store.resize(nstate);
    inst->state_gather.resize(nstate);
    inst->state_shapes.resize(nstate);
    inst->state_nbytes.resize(nstate);
    inst->state_gathered.resize(nstate);
    for (size_t k = 0; k < nstate; ++k) {
      const StateSpec& st = spec_.states[k];
      // Direct reads fixed-shape state in place (batch row == slot); Oldest gathers by slot.
      inst->state_gathered[k] = is_var_state(st) || spec_.strategy == kOldest;
      if (!is_var_state(st)) inst->state_store[k].reserve(std::max(1, slots) * product(st.dims) * dtype_size(st.dtype));
    }
    inst->flag_start.resize(rows);
    inst->flag_end.resize(rows);
    inst->flag_ready.resize(rows);
    inst->corrid_num.resize(rows);
    inst->corrid_str.resize(rows);
    instances_.push_back(std::move(inst));
  }
  rep_state_shapes_.resize(nstate);
}

Scheduler::~Scheduler() {
  close(true);
  for (Request* r : pool_) (void)r;  // owned_ frees them
}

void Scheduler::start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (started_) return;
  started_ = true;
  auto wrap = [this](auto body) {
    return std::thread([this, body] {
      if (hooks_.thread_start) hooks_.thread_start();
      body();
      if (hooks_.thread_stop) hooks_.thread_stop();
    });
  };
  for (auto& inst : instances_) {
    Instance* ip = inst.get();
    switch (spec_.strategy) {
      case kStateless: inst->thread = wrap([this, ip] { stateless_loop(*ip); }); break;
      case kDynamic: inst->thread = wrap([this, ip] { dynamic_loop(*ip); }); break;
      case kOldest: inst->thread = wrap([this, ip] { oldest_loop(*ip); }); break;
      default: inst->thread = wrap([this, ip] { direct_loop(*ip); }); break;
    }
  }
  if (spec_.strategy == kDirect || spec_.strategy == kOldest) reaper_ = wrap([this] { reaper_loop(); });
}

Request* Scheduler::new_request() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pool_.empty()) {
    owned_.push_back(std::make_unique<Request>());
    return owned_.back().get();
  }
  Request* r = pool_.back();
  pool_.pop_back();
  return r;
}

void Scheduler::recycle_locked(Request* r) {
  r->kind = kNormal;
  r->start = r->end = false;
  r->timeout_ns = 0;
  r->rows = 1;
  r->level = 0;
  r->deadline_ns = 0;
  r->expired = false;
  r->slot = -1;
  r->inputs.clear();
  pool_.push_back(r);
}

void Scheduler::recycle(Request* r) {
  std::lock_guard<std::mutex> lk(mu_);
  recycle_locked(r);
}

bool Scheduler::hooks_released_locked() {
  if (delay_released_) return true;
  if (slot_queued_ >= spec_.delay_requests && backlog_queued_ >= spec_.delay_backlog_requests) {
    delay_released_ = true;
    for (auto& inst : instances_) inst->cv.notify_one();
    return true;
  }
  return false;
}

void Scheduler::push_idle(const CorrId& id, SeqEntry& e) {
  e.armed = true;
  const int64_t deadline = e.last_arrival_ns + spec_.idle_ns;
  idle_heap_.push({deadline, e.serial, id});
  if (deadline < reaper_target_) reaper_cv_.notify_one();
}

SubmitResult Scheduler::submit(Request* r, int priority) {
  std::string warning;
  SubmitResult res;
  // Woken after the lock is dropped: a thread woken while we hold it would only block on it.
  Instance* wake = nullptr;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto fail = [&](int code, std::string msg) {
      recycle_locked(r);
      res.code = code;
      res.message = std::move(msg);
      return res;
    };
    if (closing_) {
      return fail(kUnavailable, "Server is stopping, scheduler for model has stopped accepting new inference requests");
    }
    r->kind = kNormal;
    r->arrival_ns = now_ns();

    if (spec_.strategy == kStateless || spec_.strategy == kDynamic) {
      if (!accepting_)
        return fail(kUnavailable, "Server is stopping, scheduler for model has stopped accepting new inference requests");
      if (spec_.strategy == kDynamic) {
        const int level = (priority >= 1 && priority <= spec_.priority_levels) ? priority : spec_.default_priority;
        const int L = level - 1;
        const QueuePolicy& qp = spec_.policies[L];
        if (qp.max_queue_size && levels_[L].size() + delayed_[L].size() >= qp.max_queue_size)
          return fail(kUnavailable, "Exceeds maximum queue size");
        // A request's own timeout applies only when allowed and shorter than the default.
        int64_t t = qp.default_timeout_ns;
        if (qp.allow_override && r->timeout_ns > 0 && r->timeout_ns < t) t = r->timeout_ns;
        r->level = L;
        r->expired = false;
        r->deadline_ns = t ? r->arrival_ns + t : 0;
        if (t) ++timed_requests_;
        levels_[L].push(r);
      } else {
        fifo_.push(r);
      }
      ++slot_queued_;
      if (hooks_released_locked())
        for (auto& inst : instances_)
          if (!inst->executing) {
            wake = inst.get();
            break;
          }
    } else {

    if (r->id.none()) {
      return fail(kInvalidArg, "inference request to model '" + spec_.name +
                                   "' must specify a non-zero or non-empty correlation ID");
    }
    auto it = seqs_.find(r->id);
    if (r->start && !accepting_) {
      return fail(kUnavailable, "Server is stopping, scheduler for model has stopped accepting new inference requests");
    }
    if (!r->start && it == seqs_.end()) {
      return fail(kInvalidArg, "inference request for sequence " + r->id.repr() + " to model '" + spec_.name +
                                   "' must specify the START flag on the first request of the sequence");
    }
    const CorrId id = r->id;
    const bool end = r->end;
    const int64_t now = r->arrival_ns;
    int notify_gslot = -1;
    if (it == seqs_.end()) {
      // A new sequence: the lowest free slot, else the back of the backlog.
      if (!free_slots_.empty()) {
        auto [s, i] = *free_slots_.begin();
        free_slots_.erase(free_slots_.begin());
        Instance& inst = *instances_[i];
        Slot& sl = inst.slots[s];
        sl.occupied = true;
        sl.queue.push(r);
        ++slot_queued_;
        inst.max_active = std::max(inst.max_active, s);
        notify_gslot = i * spec_.slots_per_instance + s;
        if (spec_.strategy == kOldest) handoff_locked(inst, s);
        if (!end) {
          SeqEntry e;
          e.gslot = notify_gslot;
          e.last_arrival_ns = now;
          e.serial = next_serial_++;
          push_idle(id, seqs_.emplace(id, e).first->second);
        }
      } else {
        backlog_.emplace_back();
        auto bit = std::prev(backlog_.end());
        bit->serial = next_serial_++;
        bit->id = id;
        bit->reqs.push(r);
        ++backlog_queued_;
        backlog_index_[bit->serial] = bit;
        if (r->timeout_ns > 0) {
          bit->expiry_ns = now + r->timeout_ns;
          backlog_heap_.push({bit->expiry_ns, bit->serial});
          if (bit->expiry_ns < reaper_target_) reaper_cv_.notify_one();
        }
        if (!end) {
          SeqEntry e;
          e.bq = bit;
          e.last_arrival_ns = now;
          e.serial = next_serial_++;
          push_idle(id, seqs_.emplace(id, e).first->second);
        }
      }
    } else {
      SeqEntry& e = it->second;
      if (r->start) {
        warning = "sequence " + id.repr() + " for model '" + spec_.name +
                  "' has a conflict. The previous sequence did not end before this sequence start. "
                  "Previous sequence will be terminated early.";
      }
      if (e.gslot >= 0) {
        Slot& sl = gslot_ref(e.gslot);
        sl.queue.push(r);
        ++slot_queued_;
        Instance& inst = *instances_[sl.instance];
        inst.max_active = std::max(inst.max_active, sl.index);
        notify_gslot = e.gslot;
        if (spec_.strategy == kOldest) handoff_locked(inst, sl.index);
      } else {
        e.bq->reqs.push(r);
        ++backlog_queued_;
        if (r->timeout_ns > 0 && now + r->timeout_ns < e.bq->expiry_ns) {
          e.bq->expiry_ns = now + r->timeout_ns;
          backlog_heap_.push({e.bq->expiry_ns, e.bq->serial});
          if (e.bq->expiry_ns < reaper_target_) reaper_cv_.notify_one();
        }
      }
      if (end) seqs_.erase(it);
      else e.last_arrival_ns = now;
    }
    if (hooks_released_locked() && notify_gslot >= 0) {
      Instance& inst = *instances_[notify_gslot / spec_.slots_per_instance];
      if (!inst.executing) wake = &inst;
    }
    }
  }
  if (wake) wake->cv.notify_one();
  if (!warning.empty() && hooks_.log_warning) hooks_.log_warning(warning);
  return res;
}

void Scheduler::release_slot(Instance& inst, int s) {
  Slot& sl = inst.slots[s];
  sl.occupied = false;
  if (!backlog_.empty()) {
    // The oldest backlogged sequence takes the slot with all its queued requests.
    BacklogQueue& bq = backlog_.front();
    while (!bq.reqs.empty()) {
      sl.queue.push(bq.reqs.pop());
      --backlog_queued_;
      ++slot_queued_;
    }
    sl.occupied = true;
    auto it = seqs_.find(bq.id);
    if (it != seqs_.end() && it->second.gslot < 0 && it->second.bq == backlog_.begin()) {
      SeqEntry& e = it->second;
      e.gslot = inst.index * spec_.slots_per_instance + s;
      if (!e.armed) {
        // Idle past the limit while backlogged: reaped soon after getting the slot (as in
        // Triton, whose backlog re-check runs every 50 ms), unless a request arrives first.
        e.armed = true;
        const int64_t deadline = std::max(e.last_arrival_ns + spec_.idle_ns, now_ns() + kBacklogRecheckNs);
        idle_heap_.push({deadline, e.serial, it->first});
        if (deadline < reaper_target_) reaper_cv_.notify_one();
      }
    }
    backlog_index_.erase(bq.serial);
    backlog_.pop_front();
    inst.max_active = std::max(inst.max_active, s);
    return;
  }
  free_slots_.insert({s, inst.index});
}

void Scheduler::effective_state_shapes(Slot& sl, const Request* r, std::vector<std::vector<int64_t>>& out) {
  for (size_t k = 0; k < spec_.states.size(); ++k) {
    const StateSpec& st = spec_.states[k];
    if (!is_var_state(st)) continue;
    if (r->start || !sl.state_ready) out[k] = st.initial_dims;
    else out[k] = sl.var_shape[k];
  }
}

bool Scheduler::state_shape_matches(Instance& inst, int slot, const Request* r,
                                    const std::vector<std::vector<int64_t>>& rep) {
  Slot& sl = inst.slots[slot];
  for (size_t k = 0; k < spec_.states.size(); ++k) {
    const StateSpec& st = spec_.states[k];
    if (!is_var_state(st)) continue;
    const auto& shape = (r->start || !sl.state_ready) ? st.initial_dims : sl.var_shape[k];
    if (shape != rep[k]) return false;
  }
  return true;
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

template <class Hold>
void Scheduler::run_formed_batch(Instance& inst, std::unique_lock<std::mutex>& lk, Hold& hold, bool more_work) {
  inst.executing = true;
  inst.t_form = now_ns();
  Instance* idle = nullptr;  // a shared queue with more work: wake an idle instance for it
  if (more_work)
    for (auto& other : instances_)
      if (!other->executing) {
        idle = other.get();
        break;
      }
  lk.unlock();
  if (idle) idle->cv.notify_one();
  execute(inst);
  hold.release_unlocked();  // the event loop is waiting for the runtime to deliver replies
  lk.lock();
  finish_batch_locked(inst);
}

void Scheduler::direct_loop(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  const int mbs1 = std::max(1, spec_.max_batch_size);
  const bool has_var_state =
      std::any_of(spec_.states.begin(), spec_.states.end(), [](const StateSpec& s) { return is_var_state(s); });
  for (;;) {
    if (force_) break;
    if (!hooks_released_locked()) {
      if (closing_) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    int ready = 0, max_slot = -1, rep = -1;
    int64_t earliest = INT64_MAX;
    for (int s = 0; s <= inst.max_active; ++s) {
      Slot& sl = inst.slots[s];
      // A force-end marker at the front frees the slot; a backlogged sequence may refill it.
      while (!sl.queue.empty() && sl.queue.front()->kind == kForceEnd) {
        recycle_locked(sl.queue.pop());
        release_slot(inst, s);
      }
      if (sl.queue.empty()) continue;
      ++ready;
      max_slot = s;
      // The representative fixes shapes; a final END step (kNotify) adapts to it.
      if (rep < 0 && sl.queue.front()->kind == kNormal) rep = s;
      earliest = std::min(earliest, sl.queue.front()->arrival_ns);
    }
    while (inst.max_active >= 0 && !inst.slots[inst.max_active].occupied &&
           inst.slots[inst.max_active].queue.empty())
      --inst.max_active;
    if (ready == 0) {
      if (closing_) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    if (spec_.max_queue_delay_ns > 0 && spec_.min_slot_utilization > 0 && !closing_) {
      const int64_t now = now_ns();
      const bool waited = now - earliest > spec_.max_queue_delay_ns;
      const bool full = static_cast<double>(ready) / mbs1 >= spec_.min_slot_utilization;
      if (!waited && !full) {
        if (hold.held()) { hold.release(); continue; }
        inst.cv.wait_for(lk, std::chrono::nanoseconds(earliest + spec_.max_queue_delay_ns - now + 1));
        continue;
      }
    }
    if (hold.acquire()) continue;  // what arrived while we waited joins this batch
    // Batch position == slot index; holes and shape mismatches become padding rows.
    const Request* rep_req = rep >= 0 ? inst.slots[rep].queue.front() : nullptr;
    if (has_var_state && rep_req) effective_state_shapes(inst.slots[rep], rep_req, rep_state_shapes_);
    inst.rows.clear();
    for (int s = 0; s <= max_slot; ++s) {
      inst.rows.push_back(Row{nullptr, s});
      Slot& sl = inst.slots[s];
      if (sl.queue.empty()) continue;
      Request* front = sl.queue.front();
      if (rep_req && s != rep && front->kind == kNormal &&
          (!shapes_match(front, rep_req) ||
           (has_var_state && !state_shape_matches(inst, s, front, rep_state_shapes_))))
        continue;
      Request* r = sl.queue.pop();
      if (r->kind == kNormal) {
        --slot_queued_;
        if (r->start) {
          sl.steps = 0;
          sl.start_ns = r->arrival_ns;
        }
        ++sl.steps;
      }
      inst.rows.back().req = r;
      if (r->end) release_slot(inst, s);  // the backlog gets the slot before END runs
    }
    inst.batch_size = max_slot + 1;
    run_formed_batch(inst, lk, hold, false);
  }
}

void Scheduler::handoff_locked(Instance& inst, int s) {
  // Oldest: a slot passes its next request to the instance's batcher only when nothing of it
  // is in flight, so a batch never holds two requests of one sequence.
  Slot& sl = inst.slots[s];
  while (!sl.in_flight && !sl.queue.empty()) {
    Request* r = sl.queue.pop();
    if (r->kind == kForceEnd) {
      recycle_locked(r);
      release_slot(inst, s);  // a backlogged sequence may refill the queue
      continue;
    }
    r->slot = s;
    r->handoff_ns = now_ns();
    sl.in_flight = true;
    if (r->kind == kNormal) {
      if (r->start) {
        sl.steps = 0;
        sl.start_ns = r->arrival_ns;
      }
      ++sl.steps;
    }
    inst.ready.push(r);
    if (r->end) release_slot(inst, s);  // its successor waits for in_flight to clear
  }
}

template <class RowsOf, class Matches>
size_t Scheduler::pick_batch(size_t n, RowsOf rows_of, Matches matches, int64_t oldest_ns,
                             int64_t* wake_ns) const {
  // Triton's dynamic-batcher rule: grow in queue order up to max_batch_size, stopping at a
  // shape mismatch, and remember the largest prefix that is a preferred size (or that stops
  // just short of passing the largest preferred size). Before the delay has passed, send that
  // prefix; send everything once the batch is full, cannot grow, or the delay has passed.
  if (n == 0) return 0;
  const int64_t cap = std::max(1, spec_.max_batch_size);
  const auto& pref = spec_.preferred_batch_sizes;
  const int64_t max_pref = pref.empty() ? cap : std::min(cap, pref.back());
  int64_t total = 0;
  size_t count = 0, best = 0;
  bool cannot_grow = false;
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = rows_of(i);
    if (count > 0 && total + rows > max_pref && best == 0) best = count;
    if ((count > 0 && total + rows > cap) || (i > 0 && !matches(i))) {
      cannot_grow = true;
      break;
    }
    total += rows;
    ++count;
    if (std::binary_search(pref.begin(), pref.end(), total)) best = count;
    if (total >= cap) break;
  }
  // As in Triton, a zero delay never counts as "exceeded": a preferred prefix still goes first.
  const int64_t now = now_ns();
  const bool no_delay = spec_.batch_delay_ns == 0;
  const bool exceeded = closing_ || (!no_delay && now - oldest_ns >= spec_.batch_delay_ns);
  if (best > 0 && !exceeded) return best;
  if (exceeded || no_delay || cannot_grow || total >= max_pref) return count;
  *wake_ns = oldest_ns + spec_.batch_delay_ns;
  return 0;
}

void Scheduler::oldest_loop(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  const bool has_var_state =
      std::any_of(spec_.states.begin(), spec_.states.end(), [](const StateSpec& s) { return is_var_state(s); });
  std::vector<int> done;
  for (;;) {
    if (force_) break;
    if (!hooks_released_locked() || inst.ready.empty()) {
      if (closing_ && (inst.ready.empty() || !delay_released_)) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    const Request* rep = nullptr;
    for (size_t i = 0; i < inst.ready.size() && !rep; ++i)
      if (inst.ready.at(i)->kind == kNormal) rep = inst.ready.at(i);
    if (has_var_state && rep) effective_state_shapes(inst.slots[rep->slot], rep, rep_state_shapes_);
    int64_t wake = 0;
    const size_t n = pick_batch(
        inst.ready.size(), [](size_t) { return int64_t{1}; },
        [&](size_t i) {
          const Request* r = inst.ready.at(i);
          if (!rep || r->kind != kNormal || r == rep) return true;
          return shapes_match(r, rep) &&
                 (!has_var_state || state_shape_matches(inst, r->slot, r, rep_state_shapes_));
        },
        inst.ready.front()->handoff_ns, &wake);
    if (n == 0) {
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait_for(lk, std::chrono::nanoseconds(wake - now_ns() + 1));
      continue;
    }
    if (hold.acquire()) continue;  // what arrived while we waited joins this batch
    inst.rows.clear();
    for (size_t i = 0; i < n; ++i) {
      Request* r = inst.ready.pop();
      if (r->kind == kNormal) --slot_queued_;
      inst.rows.push_back(Row{r, r->slot});
    }
    inst.batch_size = spec_.max_batch_size > 0 ? static_cast<int64_t>(n) : 1;
    done.clear();
    for (const Row& row : inst.rows) done.push_back(row.slot);
    run_formed_batch(inst, lk, hold, false);
    for (int s : done) {
      inst.slots[s].in_flight = false;
      handoff_locked(inst, s);
    }
  }
}

bool Scheduler::expire_queued_locked(int64_t now, Fails& fails, int64_t* next_deadline) {
  // Queue-policy timeouts: REJECT answers the request, DELAY moves it behind its level.
  std::vector<uint64_t> rejected;
  for (size_t L = 0; L < levels_.size(); ++L) {
    Ring<Request*>& q = levels_[L];
    const size_t n = q.size();
    for (size_t i = 0; i < n; ++i) {
      Request* r = q.pop();
      if (r->deadline_ns && r->deadline_ns <= now) {
        --timed_requests_;
        if (spec_.policies[L].delay_on_timeout) {
          r->deadline_ns = 0;
          r->expired = true;
          delayed_[L].push(r);
        } else {
          --slot_queued_;
          rejected.push_back(r->handle);
          stats_.fail.add(1, now - r->arrival_ns);
          recycle_locked(r);
        }
        continue;
      }
      if (r->deadline_ns) *next_deadline = std::min(*next_deadline, r->deadline_ns);
      q.push(r);
    }
  }
  if (rejected.empty()) return false;
  fails.emplace_back(std::move(rejected), "Request timeout expired");
  return true;
}

void Scheduler::dynamic_loop(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  Fails fails;
  std::vector<Request*> cand;
  const size_t cap = static_cast<size_t>(std::max(1, spec_.max_batch_size));
  for (;;) {
    if (force_) break;
    if (!hooks_released_locked()) {
      if (closing_) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    const int64_t now = now_ns();
    int64_t next_deadline = INT64_MAX;
    if (timed_requests_ > 0 && expire_queued_locked(now, fails, &next_deadline)) {
      lk.unlock();
      report(fails, kUnavailable);
      lk.lock();
      continue;
    }
    // Candidates in priority order, FIFO within a level (delayed requests last); a batch never
    // needs more than max_batch_size + 1 of them to decide.
    cand.clear();
    for (size_t L = 0; L < levels_.size() && cand.size() <= cap; ++L) {
      for (size_t i = 0; i < levels_[L].size() && cand.size() <= cap; ++i) cand.push_back(levels_[L].at(i));
      for (size_t i = 0; i < delayed_[L].size() && cand.size() <= cap; ++i) cand.push_back(delayed_[L].at(i));
    }
    if (cand.empty()) {
      if (closing_) break;
      if (hold.held()) {
        hold.release();
        continue;
      }
      if (next_deadline == INT64_MAX) inst.cv.wait(lk);
      else inst.cv.wait_for(lk, std::chrono::nanoseconds(next_deadline - now + 1));
      continue;
    }
    int64_t oldest = INT64_MAX;
    for (const Request* r : cand) oldest = std::min(oldest, r->arrival_ns);
    int64_t wake = 0;
    const size_t n = pick_batch(
        cand.size(), [&](size_t i) { return std::max<int64_t>(1, cand[i]->rows); },
        [&](size_t i) { return shapes_match(cand[i], cand[0]); }, oldest, &wake);
    if (n == 0) {
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait_for(lk, std::chrono::nanoseconds(std::min(wake, next_deadline) - now + 1));
      continue;
    }
    if (hold.acquire()) continue;  // what arrived while we waited joins this batch
    inst.rows.clear();
    int64_t rows = 0;
    size_t left = n;
    for (size_t L = 0; L < levels_.size() && left; ++L) {
      for (Ring<Request*>* q : {&levels_[L], &delayed_[L]}) {
        while (left && !q->empty()) {
          Request* r = q->pop();
          if (r->deadline_ns) --timed_requests_;
          --slot_queued_;
          rows += r->rows;
          inst.rows.push_back(Row{r, 0});
          --left;
        }
      }
    }
    inst.batch_size = spec_.max_batch_size > 0 ? rows : 1;
    run_formed_batch(inst, lk, hold, slot_queued_ > 0);
  }
}

void Scheduler::stateless_loop(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  for (;;) {
    if (force_) break;
    if (!hooks_released_locked() || fifo_.empty()) {
      if (closing_) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    if (hold.acquire()) continue;
    Request* r = fifo_.pop();
    --slot_queued_;
    inst.rows.clear();
    inst.rows.push_back(Row{r, 0});
    inst.batch_size = spec_.max_batch_size > 0 ? r->rows : 1;
    run_formed_batch(inst, lk, hold, !fifo_.empty());
  }
}

void Scheduler::record_batch(Instance& inst, bool ok) {
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
  for (Row& row : inst.rows) {
    Request* r = row.req;
    if (!r || r->kind != kNormal) continue;
    ++real;
    if (!ok) {
      stats_.fail.add(1, t_end - r->arrival_ns);
      continue;
    }
    stats_.success.add(1, t_end - r->arrival_ns);
    stats_.queue.add(1, inst.t_form - r->arrival_ns);
    stats_.compute_input.add(1, in_ns);
    stats_.compute_infer.add(1, infer_ns);
    stats_.compute_output.add(1, out_ns);
  }
  if (ok) {
    const bool stateless = spec_.strategy == kStateless || spec_.strategy == kDynamic;
    stats_.inference_count += stateless ? inst.batch_size : real;
    stats_.execution_count += 1;
    BatchStat& b = stats_.batches[inst.batch_size];
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
  for (Row& row : inst.rows) {
    if (row.req) recycle_locked(row.req);
    row.req = nullptr;
  }
  inst.executing = false;
  inst.t_executed = 0;
}

void Scheduler::execute(Instance& inst) {
  reset_state_rows(inst);
  gather(inst);
  inst.t_gathered = now_ns();
  inst.t_executed = 0;
  inst.recorded = false;
  bool ok = hooks_.run(inst);
  if (ok && !inst.t_executed) inst.t_executed = now_ns();
  if (!ok) inst.t_executed = 0;
}

void Scheduler::reset_state_rows(Instance& inst) {
  if (spec_.states.empty()) return;
  for (Row& row : inst.rows) {
    if (!row.req) continue;
    Slot& sl = inst.slots[row.slot];
    if (!row.req->start && sl.state_ready) continue;
    for (size_t k = 0; k < spec_.states.size(); ++k) {
      const StateSpec& st = spec_.states[k];
      if (is_var_state(st)) {
        sl.var_shape[k] = st.initial_dims;
        sl.var_data[k].reserve(st.initial.size());
        std::memcpy(sl.var_data[k].data(), st.initial.data(), st.initial.size());
        __atomic_store_n(&sl.var_bytes[k], st.initial.size(), __ATOMIC_RELAXED);
      } else {
        const size_t rb = st.initial.size();
        std::memcpy(inst.state_store[k].data() + row.slot * rb, st.initial.data(), rb);
      }
    }
    sl.state_ready = true;
  }
}

void Scheduler::gather(Instance& inst) {
  const bool batched = spec_.max_batch_size > 0;
  // The first real request fixes item shapes; a final END step (kNotify) gets zeros of that
  // shape, or of the configured dims when the batch holds no real request.
  const Request* rep = nullptr;
  for (const Row& row : inst.rows)
    if (row.req && row.req->kind == kNormal) { rep = row.req; break; }
  const int64_t B = inst.batch_size;
  std::vector<int64_t>& item = inst.item_shape;
  for (size_t k = 0; k < spec_.inputs.size(); ++k) {
    if (rep) {
      const TensorRef& rt = rep->inputs[k];
      item.assign(rt.shape + (batched ? 1 : 0), rt.shape + rt.ndim);
    } else {
      item = spec_.inputs[k].default_shape;
    }
    auto& shape = inst.input_shapes[k];
    shape.clear();
    if (batched) shape.push_back(B);
    shape.insert(shape.end(), item.begin(), item.end());
    const int64_t per_row = product(item);
    Buffer& buf = inst.input_bufs[k];
    const bool is_str = spec_.inputs[k].dtype == kString;
    const size_t row_bytes = is_str ? per_row * 4 : per_row * dtype_size(spec_.inputs[k].dtype);
    size_t total = 0;
    for (const Row& row : inst.rows) {
      const Request* r = row.req;
      total += (r && r->kind == kNormal) ? r->inputs[k].nbytes : row_bytes;
    }
    buf.reserve(total);
    size_t off = 0;
    for (const Row& row : inst.rows) {
      const Request* r = row.req;
      if (r && r->kind == kNormal) {
        std::memcpy(buf.data() + off, r->inputs[k].data, r->inputs[k].nbytes);
        off += r->inputs[k].nbytes;
        continue;
      }
      // Padding data is not meaningful (strings are empty); a final END step gets zeros.
      if (r || is_str) std::memset(buf.data() + off, 0, row_bytes);
      off += row_bytes;
    }
    inst.input_nbytes[k] = total;
  }
  // Stateless batches: every row is a real one, with no sequence flags.
  if (spec_.strategy == kStateless || spec_.strategy == kDynamic) {
    const size_t n = static_cast<size_t>(B);
    if (inst.flag_ready.size() < n) {
      inst.flag_start.resize(n);
      inst.flag_end.resize(n);
      inst.flag_ready.resize(n);
      inst.corrid_num.resize(n);
    }
    std::fill_n(inst.flag_start.begin(), n, 0);
    std::fill_n(inst.flag_end.begin(), n, 0);
    std::fill_n(inst.flag_ready.begin(), n, 1);
    std::fill_n(inst.corrid_num.begin(), n, 0);
    return;
  }
  // Sequence flags and control tensors.
  for (size_t i = 0; i < inst.rows.size(); ++i) {
    const Request* r = inst.rows[i].req;
    inst.flag_start[i] = r && r->start;
    inst.flag_end[i] = r && r->end;
    inst.flag_ready[i] = r != nullptr;
    if (r && r->id.is_str) {
      inst.corrid_num[i] = 0;
      inst.corrid_str[i] = r->id.str;
    } else {
      inst.corrid_num[i] = r ? r->id.num : 0;
      inst.corrid_str[i].clear();
    }
  }
  for (size_t c = 0; c < spec_.controls.size(); ++c) {
    const ControlSpec& cs = spec_.controls[c];
    Buffer& buf = inst.control_bufs[c];
    if (cs.kind == kCtlCorrid && cs.dtype == kString) {
      size_t total = 0;
      for (size_t i = 0; i < inst.rows.size(); ++i) total += 4 + inst.corrid_str[i].size();
      buf.reserve(total);
      size_t off = 0;
      for (size_t i = 0; i < inst.rows.size(); ++i) {
        const uint32_t n = static_cast<uint32_t>(inst.corrid_str[i].size());
        std::memcpy(buf.data() + off, &n, 4);
        std::memcpy(buf.data() + off + 4, inst.corrid_str[i].data(), n);
        off += 4 + n;
      }
      inst.control_bytes[c] = total;
      continue;
    }
    const size_t es = dtype_size(cs.dtype);
    buf.reserve(B * es);
    for (size_t i = 0; i < inst.rows.size(); ++i) {
      uint8_t* dst = buf.data() + i * es;
      bool flag = false;
      switch (cs.kind) {
        case kCtlStart: flag = inst.flag_start[i]; break;
        case kCtlEnd: flag = inst.flag_end[i]; break;
        case kCtlReady: flag = inst.flag_ready[i]; break;
        default: break;
      }
      if (cs.kind == kCtlCorrid) write_value(dst, cs.dtype, 0, inst.corrid_num[i], true);
      else write_value(dst, cs.dtype, flag ? cs.true_value : cs.false_value, 0, false);
    }
    inst.control_bytes[c] = B * es;
  }
  // State: fixed shapes are read in place from the [slots, ...] store (batch position == slot);
  // variable shapes are gathered from the slots.
  for (size_t k = 0; k < spec_.states.size(); ++k) {
    const StateSpec& st = spec_.states[k];
    auto& shape = inst.state_shapes[k];
    if (!is_var_state(st)) {
      shape.clear();
      if (batched) shape.push_back(B);
      shape.insert(shape.end(), st.dims.begin(), st.dims.end());
      const size_t rb = st.initial.size();
      inst.state_nbytes[k] = B * rb;
      if (inst.state_gathered[k]) {  // Oldest: rows come from arbitrary slots
        Buffer& buf = inst.state_gather[k];
        buf.reserve(B * rb);
        for (size_t i = 0; i < inst.rows.size(); ++i)
          std::memcpy(buf.data() + i * rb, inst.state_store[k].data() + inst.rows[i].slot * rb, rb);
      }
      continue;
    }
    const Slot* rep_slot = &inst.slots[inst.rows[0].slot];
    for (const Row& row : inst.rows)
      if (row.req) { rep_slot = &inst.slots[row.slot]; break; }
    const auto& item = rep_slot->var_shape[k];
    shape.clear();
    if (batched) shape.push_back(B);
    shape.insert(shape.end(), item.begin(), item.end());
    const size_t es = dtype_size(st.dtype);
    const size_t fixed_row = es ? product(item) * es : 0;
    size_t total = 0;
    for (const Row& row : inst.rows)
      total += row.req ? inst.slots[row.slot].var_bytes[k] : (es ? fixed_row : product(item) * 4);
    Buffer& buf = inst.state_gather[k];
    buf.reserve(total);
    size_t off = 0;
    for (const Row& row : inst.rows) {
      if (row.req) {
        const Slot& sl = inst.slots[row.slot];
        std::memcpy(buf.data() + off, sl.var_data[k].data(), sl.var_bytes[k]);
        off += sl.var_bytes[k];
      } else {
        const size_t n = es ? fixed_row : product(item) * 4;
        std::memset(buf.data() + off, 0, n);
        off += n;
      }
    }
    inst.state_nbytes[k] = total;
  }
}

void Scheduler::set_output_state(Instance& inst, size_t k, const uint8_t* data, size_t nbytes,
                                 const int64_t* shape, int ndim) {
  // Rows are written back only for real requests: padding never touches a sequence's state.
  if (k >= spec_.states.size()) throw std::out_of_range("state index");
  const StateSpec& st = spec_.states[k];
  const bool batched = spec_.max_batch_size > 0;
  const int64_t B = inst.batch_size;
  if (batched && (ndim < 1 || shape[0] != B))
    throw std::invalid_argument("output state '" + st.output_name + "' must have batch dimension " +
                                std::to_string(B));
  const std::vector<int64_t> item(shape + (batched ? 1 : 0), shape + ndim);
  if (st.dtype == kString) {
    // Serialized elements: split per row by walking the length prefixes.
    const int64_t per_row = product(item);
    size_t off = 0;
    for (const Row& row : inst.rows) {
      size_t start = off;
      for (int64_t e = 0; e < per_row; ++e) {
        if (off + 4 > nbytes) throw std::invalid_argument("truncated string state");
        uint32_t n;
        std::memcpy(&n, data + off, 4);
        off += 4 + n;
      }
      if (off > nbytes) throw std::invalid_argument("truncated string state");
      if (!row.req) continue;
      Slot& sl = inst.slots[row.slot];
      sl.var_shape[k] = item;
      sl.var_data[k].reserve(off - start);
      std::memcpy(sl.var_data[k].data(), data + start, off - start);
      __atomic_store_n(&sl.var_bytes[k], off - start, __ATOMIC_RELAXED);
    }
    return;
  }
  const size_t rb = batched ? nbytes / B : nbytes;
  if (!is_var_state(st)) {
    if (rb != st.initial.size())
      throw std::invalid_argument("output state '" + st.output_name + "' has " + std::to_string(rb) +
                                  " bytes per sequence, expected " + std::to_string(st.initial.size()));
    uint8_t* store = inst.state_store[k].data();
    for (size_t i = 0; i < inst.rows.size(); ++i) {
      const Row& row = inst.rows[i];
      if (row.req) std::memmove(store + row.slot * rb, data + i * rb, rb);
    }
    return;
  }
  for (size_t i = 0; i < inst.rows.size(); ++i) {
    const Row& row = inst.rows[i];
    if (!row.req) continue;
    Slot& sl = inst.slots[row.slot];
    sl.var_shape[k] = item;
    sl.var_data[k].reserve(rb);
    std::memmove(sl.var_data[k].data(), data + i * rb, rb);
    __atomic_store_n(&sl.var_bytes[k], rb, __ATOMIC_RELAXED);
  }
}

void Scheduler::report(Fails& fails, int code) {
  if (!hooks_.fail) return;
  for (auto& f : fails) hooks_.fail(f.first, code, f.second);
  fails.clear();
}

Request* Scheduler::take_marker_locked(uint8_t kind, const CorrId& id, int64_t now) {
  Request* m;
  if (pool_.empty()) {
    owned_.push_back(std::make_unique<Request>());
    m = owned_.back().get();
  } else {
    m = pool_.back();
    pool_.pop_back();
  }
  m->kind = kind;
  m->handle = 0;
  m->start = false;
  m->end = kind == kNotify;
  m->arrival_ns = now;
  m->id = id;
  return m;
}

void Scheduler::reaper_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  Fails fails;
  std::vector<ExpiredSequence> expired;
  while (!reaper_stop_) {
    const int64_t now = now_ns();
    while (!idle_heap_.empty() && idle_heap_.top().deadline <= now) {
      IdleTimer t = idle_heap_.top();
      idle_heap_.pop();
      auto it = seqs_.find(t.id);
      if (it == seqs_.end() || it->second.serial != t.serial) continue;  // ended or restarted
      SeqEntry& e = it->second;
      const int64_t due = e.last_arrival_ns + spec_.idle_ns;
      if (e.gslot < 0) {
        // Backlogged sequences are not reaped. Rather than re-checking them (a cost that would
        // grow with the backlog), the timer is re-armed when the sequence gets a slot.
        if (due > now) idle_heap_.push({due, t.serial, t.id});
        else e.armed = false;
        continue;
      }
      if (due > now) {
        idle_heap_.push({due, t.serial, t.id});
        continue;
      }
      // Expired: forget the id now; the slot frees when the marker reaches the queue front
      // (after the requests queued before it). TIMEOUT_COMPLETE makes the marker one final
      // END step for the model; otherwise the model is not told.
      Slot& sl = gslot_ref(e.gslot);
      if (spec_.describe_on_expiry) {
        ExpiredSequence x;
        x.id = t.id;
        x.age_s = (now - (sl.start_ns ? sl.start_ns : e.last_arrival_ns)) / 1e9;
        x.idle_s = (now - e.last_arrival_ns) / 1e9;
        x.steps = sl.steps;
        for (size_t k = 0; k < spec_.states.size(); ++k)
          x.state_bytes += is_var_state(spec_.states[k]) ? __atomic_load_n(&sl.var_bytes[k], __ATOMIC_RELAXED)
                                                         : spec_.states[k].initial.size();
        x.instance = sl.instance;
        x.slot = sl.index;
        expired.push_back(std::move(x));
      }
      seqs_.erase(it);
      sl.queue.push(take_marker_locked(spec_.timeout_complete ? kNotify : kForceEnd, t.id, now));
      Instance& inst = *instances_[sl.instance];
      inst.max_active = std::max(inst.max_active, sl.index);
      if (spec_.strategy == kOldest) handoff_locked(inst, sl.index);
      if (!inst.executing) inst.cv.notify_one();
    }
    while (!backlog_heap_.empty() && backlog_heap_.top().deadline <= now) {
      BacklogTimer t = backlog_heap_.top();
      backlog_heap_.pop();
      auto bi = backlog_index_.find(t.serial);
      if (bi == backlog_index_.end()) continue;
      auto bit = bi->second;
      if (bit->expiry_ns > now) continue;
      // The whole backlogged sequence expires.
      auto it = seqs_.find(bit->id);
      if (it != seqs_.end() && it->second.gslot < 0 && it->second.bq == bit) seqs_.erase(it);
      std::vector<uint64_t> handles;
      while (!bit->reqs.empty()) {
        Request* r = bit->reqs.pop();
        --backlog_queued_;
        handles.push_back(r->handle);
        stats_.fail.add(1, now - r->arrival_ns);
        recycle_locked(r);
      }
      backlog_index_.erase(bi);
      backlog_.erase(bit);
      fails.emplace_back(std::move(handles), "timeout of the corresponding sequence has been expired");
    }
    if (!fails.empty() || !expired.empty()) {
      lk.unlock();
      report(fails, kUnavailable);
      if (hooks_.describe)
        for (const ExpiredSequence& x : expired) hooks_.describe(x);
      expired.clear();
      lk.lock();
      continue;
    }
    int64_t target = INT64_MAX;
    if (!idle_heap_.empty()) target = idle_heap_.top().deadline;
    if (!backlog_heap_.empty()) target = std::min(target, backlog_heap_.top().deadline);
    reaper_target_ = target;
    if (target == INT64_MAX) reaper_cv_.wait(lk);
    else reaper_cv_.wait_for(lk, std::chrono::nanoseconds(target - now_ns() + 1000));
    reaper_target_ = INT64_MAX;
  }
}

void Scheduler::stop_accepting() {
  std::lock_guard<std::mutex> lk(mu_);
  accepting_ = false;
}

int64_t Scheduler::inflight_sequences() {
  std::lock_guard<std::mutex> lk(mu_);
  if (spec_.strategy == kStateless || spec_.strategy == kDynamic) {
    int64_t busy = 0;
    for (auto& inst : instances_) busy += inst->executing;
    return slot_queued_ + busy;
  }
  int64_t n = 0;
  for (auto& kv : seqs_) n += kv.second.gslot >= 0;
  return n;
}

int64_t Scheduler::pending_requests() {
  std::lock_guard<std::mutex> lk(mu_);
  return slot_queued_ + backlog_queued_;
}

int64_t Scheduler::free_slots() {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(free_slots_.size());
}

int64_t Scheduler::backlog_sequences() {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int64_t>(backlog_.size());
}

void Scheduler::describe_slots(std::vector<std::pair<std::string, int>>& out) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& kv : seqs_) out.emplace_back(kv.first.repr(), kv.second.gslot);
}

Stats Scheduler::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Scheduler::close(bool force) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closing_ = true;
    accepting_ = false;
    if (force) force_ = true;
    delay_released_ = true;  // test hooks must not hold a shutdown
    for (auto& inst : instances_) inst->cv.notify_all();
  }
  for (auto& inst : instances_)
    if (inst->thread.joinable()) inst->thread.join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    reaper_stop_ = true;
    reaper_cv_.notify_all();
  }
  if (reaper_.joinable()) reaper_.join();
  // Whatever never ran is answered, so no client waits forever.
  Fails fails;
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    std::vector<uint64_t> handles;
    const int64_t now = now_ns();
    auto take = [&](Request* r) {
      if (r->kind == kNormal) {
        handles.push_back(r->handle);
        stats_.fail.add(1, now - r->arrival_ns);
      }
      recycle_locked(r);
    };
    for (auto& inst : instances_) {
      for (Slot& sl : inst->slots)
        while (!sl.queue.empty()) take(sl.queue.pop());
      while (!inst->ready.empty()) take(inst->ready.pop());
    }
    for (auto& q : levels_)
      while (!q.empty()) take(q.pop());
    for (auto& q : delayed_)
      while (!q.empty()) take(q.pop());
    for (auto& bq : backlog_)
      while (!bq.reqs.empty()) take(bq.reqs.pop());
    backlog_.clear();
    backlog_index_.clear();
    while (!fifo_.empty()) take(fifo_.pop());
    slot_queued_ = backlog_queued_ = 0;
    seqs_.clear();
    if (!handles.empty())
      fails.emplace_back(std::move(handles), "model '" + spec_.name + "' was unloaded before the request ran");
  }
  report(fails, kUnavailable);
}

}  // namespace seqserve
