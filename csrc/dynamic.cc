// Dynamic batcher: one queue per priority level shared by every instance; a free instance forms
// the next batch from the queues in priority order under preferred sizes and the queue delay.
// Queue policies time requests out: REJECT answers them, DELAY moves them behind their level.
#include "scheduler.h"

namespace seqserve {

namespace {

class DynamicScheduler final : public Scheduler {
 public:
  DynamicScheduler(ModelSpec spec, Hooks hooks) : Scheduler(std::move(spec), std::move(hooks), false, false) {
    levels_.resize(spec_.priority_levels);
    delayed_.resize(spec_.priority_levels);
  }
  ~DynamicScheduler() override { close(true); }

 private:
  SubmitResult enqueue_locked(Request* r, int priority, Instance*& wake, std::string& warning) override;
  void drain_locked(const std::function<void(Request*)>& take) override {
    for (auto& q : levels_)
      while (!q.empty()) take(q.pop());
    for (auto& q : delayed_)
      while (!q.empty()) take(q.pop());
  }
  Next form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) override;
  void cancel_locked(Request*) override { cancels_ = true; }
  bool expire_queued_locked(int64_t now, Fails& fails, int64_t* next_deadline);
  void drop_cancelled_locked();

  // Per priority level; `delayed_` holds requests whose DELAY timeout expired, served after
  // their level's other requests.
  std::vector<Ring<Request*>> levels_, delayed_;
  int64_t timed_requests_ = 0;
  bool cancels_ = false;  // a queued request may have been cancelled
  std::vector<Request*> cand_;  // form_locked's scratch (lock held)
};

void DynamicScheduler::drop_cancelled_locked() {
  cancels_ = false;
  std::vector<uint64_t> handles;
  const int64_t now = now_ns();
  for (auto* queues : {&levels_, &delayed_}) {
    for (Ring<Request*>& q : *queues) {
      const size_t n = q.size();
      for (size_t i = 0; i < n; ++i) {
        Request* r = q.pop();
        if (!r->cancelled) {
          q.push(r);
          continue;
        }
        if (r->deadline_ns) --timed_requests_;
        --counts_.queued;
        cancelled_locked(r, handles, now);
      }
    }
  }
  if (!handles.empty()) cancelled_.emplace_back(std::move(handles), "request was cancelled before it ran");
}

SubmitResult DynamicScheduler::enqueue_locked(Request* r, int priority, Instance*& wake, std::string&) {
  if (!accepting_) return refuse(kUnavailable, kStopping);
  const int level = (priority >= 1 && priority <= spec_.priority_levels) ? priority : spec_.default_priority;
  const int L = level - 1;
  const QueuePolicy& qp = spec_.queue_policies[L];
  if (qp.max_queue_size && levels_[L].size() + delayed_[L].size() >= qp.max_queue_size && cancels_)
    drop_cancelled_locked();  // cancelled requests do not count against the queue's size
  if (qp.max_queue_size && levels_[L].size() + delayed_[L].size() >= qp.max_queue_size)
    return refuse(kUnavailable, "Exceeds maximum queue size");
  // A request's own timeout applies only when allowed and shorter than the default.
  int64_t t = qp.default_timeout_ns;
  if (qp.allow_override && r->timeout_ns > 0 && r->timeout_ns < t) t = r->timeout_ns;
  r->level = L;
  r->expired = false;
  r->deadline_ns = t ? r->arrival_ns + t : 0;
  if (t) ++timed_requests_;
  levels_[L].push(r);
  ++counts_.queued;
  if (released_locked()) wake = idle_instance_locked();
  return {};
}

bool DynamicScheduler::expire_queued_locked(int64_t now, Fails& fails, int64_t* next_deadline) {
  // Queue-policy timeouts: REJECT answers the request, DELAY moves it behind its level.
  std::vector<uint64_t> rejected;
  for (size_t L = 0; L < levels_.size(); ++L) {
    Ring<Request*>& q = levels_[L];
    const size_t n = q.size();
    for (size_t i = 0; i < n; ++i) {
      Request* r = q.pop();
      if (r->deadline_ns && r->deadline_ns <= now) {
        --timed_requests_;
        if (spec_.queue_policies[L].delay_on_timeout) {
          r->deadline_ns = 0;
          r->expired = true;
          delayed_[L].push(r);
        } else {
          --counts_.queued;
          rejected.push_back(r->handle);
          stats_.fail.add(1, now - r->arrival_ns);
          ++stats_.fail_rejected;
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

Scheduler::Next DynamicScheduler::form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) {
  if (cancels_) drop_cancelled_locked();
  if (flush_cancelled(lk)) return {Next::kAgain};
  if (!released_locked()) return {closing_ ? Next::kExit : Next::kBlocked};
  const size_t cap = static_cast<size_t>(std::max(1, spec_.max_batch_size));
  const int64_t now = now_ns();
  int64_t next_deadline = INT64_MAX;
  Fails fails;
  if (timed_requests_ > 0 && expire_queued_locked(now, fails, &next_deadline)) {
    lk.unlock();
    report(fails, kUnavailable);
    lk.lock();
    return {Next::kAgain};
  }
  // Candidates in priority order, FIFO within a level (delayed requests last); a batch never
  // needs more than max_batch_size + 1 of them to decide.
  std::vector<Request*>& cand = cand_;
  cand.clear();
  for (size_t L = 0; L < levels_.size() && cand.size() <= cap; ++L) {
    for (size_t i = 0; i < levels_[L].size() && cand.size() <= cap; ++i) cand.push_back(levels_[L].at(i));
    for (size_t i = 0; i < delayed_[L].size() && cand.size() <= cap; ++i) cand.push_back(delayed_[L].at(i));
  }
  if (cand.empty()) {
    if (closing_) return {Next::kExit};
    return next_deadline == INT64_MAX ? Next{Next::kIdle} : Next::until(next_deadline + 1);
  }
  int64_t oldest = INT64_MAX;
  for (const Request* r : cand) oldest = std::min(oldest, r->arrival_ns);
  int64_t wake = 0;
  const size_t n = pick_batch(
      cand.size(), [&](size_t i) { return std::max<int64_t>(1, cand[i]->rows); },
      [&](size_t i) { return shapes_match(cand[i], cand[0]); }, oldest, &wake);
  if (n == 0) return Next::until(std::min(wake, next_deadline) + 1);
  if (hold.acquire()) return {Next::kAgain};  // what arrived while we waited joins this batch
  std::vector<Row>& batch_rows = inst.batch.rows;
  batch_rows.clear();
  int64_t rows = 0;
  size_t left = n;
  for (size_t L = 0; L < levels_.size() && left; ++L) {
    for (Ring<Request*>* q : {&levels_[L], &delayed_[L]}) {
      while (left && !q->empty()) {
        Request* r = q->pop();
        if (r->deadline_ns) --timed_requests_;
        --counts_.queued;
        rows += r->rows;
        batch_rows.push_back(Row{r, 0});
        --left;
      }
    }
  }
  inst.batch.size = spec_.max_batch_size > 0 ? rows : 1;
  return Next::batch(counts_.queued > 0);
}

}  // namespace

std::unique_ptr<Scheduler> make_dynamic_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<DynamicScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
