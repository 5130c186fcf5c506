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
  void run(Instance& inst) override;

  Ring<Request*> fifo_;
};

void StatelessScheduler::run(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  for (;;) {
    if (force_) break;
    if (!released_locked() || fifo_.empty()) {
      if (closing_) break;
      if (hold.held()) { hold.release(); continue; }
      inst.cv.wait(lk);
      continue;
    }
    if (hold.acquire()) continue;
    Request* r = fifo_.pop();
    --counts_.queued;
    std::vector<Row>& rows = inst.batch.rows;
    rows.clear();
    rows.push_back(Row{r, 0});
    inst.batch.size = spec_.max_batch_size > 0 ? r->rows : 1;
    run_formed_batch(inst, lk, hold, !fifo_.empty());
  }
}

}  // namespace

std::unique_ptr<Scheduler> make_stateless_scheduler(ModelSpec spec, Hooks hooks) {
  return std::make_unique<StatelessScheduler>(std::move(spec), std::move(hooks));
}

}  // namespace seqserve
