// Sessions that ended or expired, remembered for a bounded time and count: a session's next
// request is refused with the reason ("expired after N s idle", "was ended") instead of
// silently starting over on fresh state. Least recently recorded or looked-up entries are
// dropped first once `max` is reached, and an entry older than `ttl` counts as absent. A
// dropped entry's id goes into `EvictedIds` (a Bloom filter of bounded size) until its
// tombstone would have expired, so that a cap hit never turns a 410 into a fresh start. Plain
// bookkeeping: every method runs under the scheduler lock.
#pragma once

#include <algorithm>
#include <cstdio>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

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

// Ids whose tombstone the count cap dropped before its time: "maybe" answers true for every
// such id until its tombstone would have expired, and for a few others (false positives, about
// 0.2% at capacity: those new sessions are asked to use another id). Two generations of
// kBits bits, each covering `ttl`; past kCapacity ids in one generation, every id is "maybe"
// until that generation is dropped (always safe). Allocated at the first eviction only.
class EvictedIds {
 public:
  static constexpr size_t kBits = size_t{1} << 22;  // 512 KiB per generation
  static constexpr size_t kCapacity = kBits / 8;
  static constexpr int kHashes = 4;

  void add(const CorrId& id, int64_t now, int64_t ttl_ns) {
    if (bits_[0].empty()) {
      bits_[0].assign(kBits / 64, 0);
      bits_[1].assign(kBits / 64, 0);
      gen_start_ = now;
    }
    rotate(now, ttl_ns);
    if (++added_[0] > kCapacity) full_until_ = std::max(full_until_, gen_start_ + 2 * ttl_ns);
    uint64_t h1, h2;
    hashes(id, h1, h2);
    for (int i = 0; i < kHashes; ++i) {
      const uint64_t b = (h1 + static_cast<uint64_t>(i) * h2) % kBits;
      bits_[0][b / 64] |= uint64_t{1} << (b % 64);
    }
  }
  bool maybe(const CorrId& id, int64_t now, int64_t ttl_ns) {
    if (bits_[0].empty()) return false;
    rotate(now, ttl_ns);
    if (now < full_until_) return true;
    uint64_t h1, h2;
    hashes(id, h1, h2);
    for (const auto& gen : bits_) {
      bool all = true;
      for (int i = 0; i < kHashes && all; ++i) {
        const uint64_t b = (h1 + static_cast<uint64_t>(i) * h2) % kBits;
        all = (gen[b / 64] >> (b % 64)) & 1u;
      }
      if (all) return true;
    }
    return false;
  }

 private:
  // Generation 0 takes ids evicted in [gen_start, gen_start + ttl); their tombstones would have
  // expired by gen_start + 2 ttl, when the generation (by then number 1) is dropped.
  void rotate(int64_t now, int64_t ttl_ns) {
    while (now >= gen_start_ + ttl_ns) {
      std::swap(bits_[0], bits_[1]);
      std::fill(bits_[0].begin(), bits_[0].end(), 0);
      added_[1] = added_[0];
      added_[0] = 0;
      gen_start_ = now - gen_start_ >= 2 * ttl_ns ? now : gen_start_ + ttl_ns;
    }
  }
  static void hashes(const CorrId& id, uint64_t& h1, uint64_t& h2) {
    uint64_t z = static_cast<uint64_t>(CorrIdHash{}(id)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h1 = z ^ (z >> 31);
    h2 = ((h1 >> 17) | (h1 << 47)) * 0x9e3779b97f4a7c15ull | 1u;
  }

  std::vector<uint64_t> bits_[2];
  size_t added_[2] = {0, 0};
  int64_t gen_start_ = 0;
  int64_t full_until_ = 0;
};

class Tombstones {
 public:
  void configure(int64_t ttl_ns, size_t max) {
    ttl_ns_ = ttl_ns;
    max_ = ttl_ns > 0 ? max : 0;
    trim(0);
  }
  // Dropped by the count cap before their time (a metric for operators).
  uint64_t evictions() const { return evictions_; }
  // `id` may be a session whose tombstone the cap dropped: never start it implicitly.
  bool maybe_evicted(const CorrId& id, int64_t now) {
    return evictions_ && evicted_.maybe(id, now, ttl_ns_);
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
  // Over the count: drop the least recently used (remembered as evicted while its tombstone
  // would have lived). Past the time limit at the cold end: drop.
  void trim(int64_t now) {
    while (!lru_.empty() && (lru_.size() > max_ || (now && now - lru_.back().t.at_ns > ttl_ns_))) {
      const Entry& cold = lru_.back();
      if (now && now - cold.t.at_ns <= ttl_ns_) {
        ++evictions_;
        evicted_.add(cold.id, now, ttl_ns_);
      }
      index_.erase(cold.id);
      lru_.pop_back();
    }
  }

  int64_t ttl_ns_ = 0;
  size_t max_ = 0;
  uint64_t evictions_ = 0;
  EvictedIds evicted_;
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

// The refusal of an implied START for an id whose tombstone the count cap may have dropped.
inline std::string evicted_session_message(const CorrId& id) {
  return "session '" + id.repr() +
         "' may have ended here: more ended sessions than the server remembers (--session-tombstone-max) "
         "ended lately, and its record may be one that was dropped; start a new session with a new id, "
         "or send START (sequence_start) to begin this one afresh";
}

}  // namespace seqserve
