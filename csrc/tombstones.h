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
#include <set>
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

// Tombstones are accounted per client (the peer's address, hashed; 0 for in-process callers):
// a client holds at most `per_client` of them (its own oldest is evicted past that), and when
// the total reaches `max` the client holding the most loses its oldest. Evicted ids go into the
// shared EvictedIds filter (still refused, never a fresh start); each client may add at most
// its share of the filter's capacity per tombstone lifetime, after which only that client's
// new session starts are refused (start_refused_for) until its additions age out.
class Tombstones {
 public:
  enum Eviction { kClientCap = 0, kGlobalCap = 1 };

  void configure(int64_t ttl_ns, size_t max, size_t per_client = 0) {
    ttl_ns_ = ttl_ns;
    max_ = ttl_ns > 0 ? max : 0;
    per_client_ = per_client > 0 && per_client < max_ ? per_client : 0;
    // A client's share of the filter is its share of the tombstones (all of it when unbounded).
    filter_share_ = EvictedIds::kCapacity;
    if (per_client_)
      filter_share_ =
          std::max<size_t>(1, static_cast<size_t>(static_cast<double>(EvictedIds::kCapacity) * per_client_ / max_));
    trim(0);
  }
  // Dropped by a count cap before their time (a metric for operators), in all and by cap.
  uint64_t evictions() const { return evictions_[kClientCap] + evictions_[kGlobalCap]; }
  uint64_t evictions(Eviction why) const { return evictions_[why]; }
  // `id` may be a session whose tombstone a cap dropped: never start it implicitly.
  bool maybe_evicted(const CorrId& id, int64_t now) { return evictions() && evicted_.maybe(id, now, ttl_ns_); }
  // `client` has added its share of ids to the filter lately: its new sessions are refused for
  // the returned nanoseconds (0: not refused).
  int64_t start_refused_for(uint64_t client, int64_t now) {
    if (!max_) return 0;
    auto it = clients_.find(client);
    if (it == clients_.end()) return 0;
    Client& c = it->second;
    age(c, now);
    if (c.filtered[0] + c.filtered[1] < filter_share_) return 0;
    return c.window_start + (c.filtered[0] >= filter_share_ ? 2 : 1) * ttl_ns_ - now;
  }
  bool enabled() const { return max_ > 0; }
  bool empty() const { return index_.empty(); }
  size_t size() const { return index_.size(); }
  size_t held_by(uint64_t client) const {
    auto it = clients_.find(client);
    return it == clients_.end() ? 0 : it->second.lru.size();
  }

  void record(const CorrId& id, uint64_t client, Tombstone::Reason reason, double idle_s, int64_t now) {
    if (!max_) return;
    auto it = index_.find(id);
    if (it != index_.end() && it->second.client != client) {
      unlink(it);  // the id ended again for another client: it counts against that one now
      it = index_.end();
    }
    if (it == index_.end()) {
      it = index_.emplace(id, Entry{}).first;
      Entry& e = it->second;
      e.client = client;
      lru_.push_front(&it->first);
      e.pos = lru_.begin();
      Client& c = clients_[client];
      counted(client, c, +1);
      c.lru.push_front(&it->first);
      e.client_pos = c.lru.begin();
    } else {
      touch(it->second);
    }
    Tombstone& t = it->second.t;
    t.reason = reason;
    t.at_ns = now;
    t.idle_s = idle_s;
    if (per_client_) {
      Client& c = clients_[client];
      while (c.lru.size() > per_client_) evict(index_.find(*c.lru.back()), kClientCap, now);
    }
    trim(now);
  }

  // The live tombstone of `id` (refreshed as recently used), or nullptr.
  const Tombstone* find(const CorrId& id, int64_t now) {
    if (index_.empty()) return nullptr;
    auto it = index_.find(id);
    if (it == index_.end()) return nullptr;
    if (now - it->second.t.at_ns > ttl_ns_) {
      unlink(it);
      return nullptr;
    }
    touch(it->second);
    return &it->second.t;
  }

  void erase(const CorrId& id) {
    if (index_.empty()) return;
    auto it = index_.find(id);
    if (it != index_.end()) unlink(it);
  }

 private:
  using Order = std::list<const CorrId*>;  // front: most recently recorded or looked up
  struct Entry {
    Tombstone t;
    uint64_t client = 0;
    Order::iterator pos, client_pos;
  };
  using Index = std::unordered_map<CorrId, Entry, CorrIdHash>;
  struct Client {
    Order lru;
    // Ids added to the filter in this window of `ttl` and the one before; a window's additions
    // have aged out of the filter once the next window ends.
    size_t filtered[2] = {0, 0};
    int64_t window_start = 0;
  };

  void touch(Entry& e) {
    lru_.splice(lru_.begin(), lru_, e.pos);
    Order& own = clients_[e.client].lru;
    own.splice(own.begin(), own, e.client_pos);
  }
  void counted(uint64_t client, const Client& c, int delta) {
    if (!c.lru.empty()) by_count_.erase({c.lru.size(), client});
    const size_t n = c.lru.size() + delta;
    if (n) by_count_.insert({n, client});
  }
  void unlink(Index::iterator it) {
    Entry& e = it->second;
    auto ci = clients_.find(e.client);
    Client& c = ci->second;
    counted(e.client, c, -1);
    c.lru.erase(e.client_pos);
    if (c.lru.empty() && c.filtered[0] + c.filtered[1] == 0) clients_.erase(ci);
    lru_.erase(e.pos);
    index_.erase(it);
  }
  void age(Client& c, int64_t now) {
    while (now >= c.window_start + ttl_ns_) {
      c.filtered[1] = c.filtered[0];
      c.filtered[0] = 0;
      c.window_start = now - c.window_start >= 2 * ttl_ns_ ? now : c.window_start + ttl_ns_;
    }
  }
  // Drops `it` before its time: its id is remembered as evicted while its tombstone would have lived.
  void evict(Index::iterator it, Eviction why, int64_t now) {
    if (now && now - it->second.t.at_ns <= ttl_ns_) {
      ++evictions_[why];
      evicted_.add(it->first, now, ttl_ns_);
      Client& c = clients_[it->second.client];
      if (c.window_start == 0) c.window_start = now;
      age(c, now);
      ++c.filtered[0];
    }
    unlink(it);
    if (clients_.size() > 2 * max_ + kClientSlack) prune();
  }
  // Clients that hold no tombstone but were evicted from lately stay to be refused; so many
  // addresses (IPv6) cannot grow memory without bound, past twice the cap those are forgotten
  // (their evicted ids stay in the shared filter: only the refusal by client is lost for them).
  void prune() {
    for (auto it = clients_.begin(); it != clients_.end();)
      it = it->second.lru.empty() ? clients_.erase(it) : std::next(it);
  }
  // Past the time limit at the cold end: drop. Over the count: the client holding the most
  // loses its least recently used.
  void trim(int64_t now) {
    while (!lru_.empty() && (now && now - index_.find(*lru_.back())->second.t.at_ns > ttl_ns_))
      unlink(index_.find(*lru_.back()));
    while (index_.size() > max_) {
      // Among the clients holding the most, the one with the least recently used entry of all.
      auto coldest = index_.find(*lru_.back());
      const uint64_t cold_client = coldest->second.client;
      if (held_by(cold_client) == by_count_.rbegin()->first) {
        evict(coldest, kGlobalCap, now);
        continue;
      }
      Client& top = clients_[by_count_.rbegin()->second];
      evict(index_.find(*top.lru.back()), kGlobalCap, now);
    }
  }

  static constexpr size_t kClientSlack = 1024;
  int64_t ttl_ns_ = 0;
  size_t max_ = 0;
  size_t per_client_ = 0;  // 0: no bound but max_
  size_t filter_share_ = EvictedIds::kCapacity;
  uint64_t evictions_[2] = {0, 0};
  EvictedIds evicted_;
  Index index_;
  Order lru_;
  std::unordered_map<uint64_t, Client> clients_;
  std::set<std::pair<size_t, uint64_t>> by_count_;  // (tombstones held, client)
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
         "' may have ended here: more ended sessions than the server remembers (--session-tombstone-max, "
         "--session-tombstone-max-per-client) ended lately, and its record may be one that was dropped; "
         "start a new session with a new id, or send START (sequence_start) to begin this one afresh";
}

// The refusal of a new session for a client whose evicted tombstones fill its share of the filter.
inline std::string session_share_full_message(int64_t wait_ns) {
  return "too many of this client's ended sessions were dropped from memory lately "
         "(--session-tombstone-max-per-client): its new sessions are refused for " +
         std::to_string((wait_ns + 999999999) / 1000000000) + " s; sequences with START still start";
}

}  // namespace seqserve
