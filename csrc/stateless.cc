// No batching configured: one request per batch, FIFO, on whichever instance is free.
#include "scheduler.h"

namespace seqserve {

namespace {

class StatelessScheduler final : public Scheduler {
 public:
  StatelessScheduler(ModelSpec spec, Hooks hooks) : Scheduler(std::move(spec), std::move(hooks), false, false) {}
  ~StatelessScheduler() override { close(true); }

 private:
  SubmitResult enqueue_locked(Request* r, int, Instance*& wake, std::string&) override {
    if (!accepting_) return refuse(kUnavailable, kStopping);
    fifo_.push(r);
    ++counts_.queued;
    if (released_locked()) wake = idle_instance_locked();
    return {};
  }
  void drain_locked(const std::function<void(Request*)>& take) override {
    while (!fifo_.empty()) take(fifo_.pop());
  }
  Next form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) override;
  void cancel_locked(Request*) override { cancels_ = true; }
  void drop_cancelled_locked() {
    cancels_ = false;
    std::vector<uint64_t> handles;
    const int64_t now = now_ns();
    const size_t n = fifo_.size();
    for (size_t i = 0; i < n; ++i) {
      Request* r = fifo_.pop();
      if (!r->cancelled) {
        fifo_.push(r);
        continue;
      }
      --counts_.queued;
      cancelled_locked(r, handles, now);
    }
    if (!handles.empty()) cancelled_.emplace_back(std::move(handles), "request was cancelled before it ran");
  }

  Ring<Request*> fifo_;
  bool cancels_ = false;  // a queued request may have been cancelled
};

Scheduler::Next StatelessScheduler::form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) {
  if (cancels_) drop_cancelled_locked();
  if (flush_cancelled(lk)) return {Next::kAgain};
  const bool released = released_locked();
  if (!released || fifo_.empty()) {
    if (closing_) return {Next::kExit};
    return {released ? Next::kIdle : Next::kBlocked};
  }
  if (hold.acquire()) return {Next::kAgain};
  Request* r = fifo_.pop();
  --counts_.queued;
  std::vector<Row>& rows = inst.batch.rows;
  rows.clear();
  rows.push_back(Row{r, 0});
  inst.batch.size = spec_.max_batch_size > 0 ? r->rows : 1;
  return Next::batch(!fifo_.empty());
}

}  // namespace

std::unique_ptr<Scheduler> make_stateless_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<StatelessScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
