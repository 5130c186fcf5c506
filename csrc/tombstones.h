// Sessions that ended or expired, remembered for a bounded time and count: a session's next
// request is refused with the reason ("expired after N s idle", "was ended") instead of
// silently starting over on fresh state. Least recently recorded or looked-up entries are
// dropped first once `max` is reached, and an entry older than `ttl` counts as absent. Plain
// bookkeeping: every method runs under the scheduler lock.
#pragma once

#include <cstdio>
#include <list>
#include <string>
#include <unordered_map>

#include "common.h"

namespace seqserve {

struct Tombstone {
  // kCancelled: a request of it was cancelled; kScopeEnded: its owner (the gRPC stream that
  // started it) closed.
  enum Reason : uint8_t { kEnded = 0, kExpired = 1, kEndedByApi = 2, kCancelled = 3, kScopeEnded = 4 };
  Reason reason = kEnded;
  int64_t at_ns = 0;   // when it ended or expired
  double idle_s = 0;   // kExpired: how long it had been idle
};

class Tombstones {
 public:
  void configure(int64_t ttl_ns, size_t max) {
    ttl_ns_ = ttl_ns;
    max_ = ttl_ns > 0 ? max : 0;
    trim(0);
  }
  bool enabled() const { return max_ > 0; }
  bool empty() const { return index_.empty(); }
  size_t size() const { return index_.size(); }

  void record(const CorrId& id, Tombstone::Reason reason, double idle_s, int64_t now) {
    if (!max_) return;
    auto it = index_.find(id);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      lru_.push_front(Entry{id, {}});
      index_.emplace(id, lru_.begin());
    }
    Tombstone& t = lru_.front().t;
    t.reason = reason;
    t.at_ns = now;
    t.idle_s = idle_s;
    trim(now);
  }

  // The live tombstone of `id` (refreshed as recently used), or nullptr.
  const Tombstone* find(const CorrId& id, int64_t now) {
    if (index_.empty()) return nullptr;
    auto it = index_.find(id);
    if (it == index_.end()) return nullptr;
    if (now - it->second->t.at_ns > ttl_ns_) {
      lru_.erase(it->second);
      index_.erase(it);
      return nullptr;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    return &lru_.front().t;
  }

  void erase(const CorrId& id) {
    if (index_.empty()) return;
    auto it = index_.find(id);
    if (it == index_.end()) return;
    lru_.erase(it->second);
    index_.erase(it);
  }

 private:
  struct Entry {
    CorrId id;
    Tombstone t;
  };
  // Over the count: drop the least recently used. Past the time limit at the cold end: drop.
  void trim(int64_t now) {
    while (!lru_.empty() && (lru_.size() > max_ || (now && now - lru_.back().t.at_ns > ttl_ns_))) {
      index_.erase(lru_.back().id);
      lru_.pop_back();
    }
  }

  int64_t ttl_ns_ = 0;
  size_t max_ = 0;
  std::list<Entry> lru_;  // front: most recently recorded or looked up
  std::unordered_map<CorrId, std::list<Entry>::iterator, CorrIdHash> index_;
};

// The refusal a session's request gets when its session is gone.
inline std::string session_gone_message(const CorrId& id, const Tombstone& t) {
  std::string m = "session '" + id.repr() + "' ";
  if (t.reason == Tombstone::kExpired) {
    char idle[32];
    std::snprintf(idle, sizeof idle, "%.3g", t.idle_s);
    m += "expired after " + std::string(idle) + " s idle";
  } else if (t.reason == Tombstone::kEndedByApi) {
    m += "was ended through the sequence API";
  } else if (t.reason == Tombstone::kCancelled) {
    m += "was cancelled (a request of it was cancelled)";
  } else if (t.reason == Tombstone::kScopeEnded) {
    m += "was ended when the stream that started it closed";
  } else {
    m += "was ended by its END request";
  }
  return m + "; start a new session with a new id";
}

}  // namespace seqserve
