// CPU tests of the caching allocator with the plain-host source: pool rules, split/merge, best
// fit, streams and record_stream (simulated events), empty_cache, OOM message, errors, and a
// randomized run checked against a model.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/host_source.h"
#include "tests/support/test_support.h"

using namespace cutrain;

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

cudaStream_t fake_stream(int i) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(0x1000 * i)); }

// A test keeps the HostSource to drive its events and read its counters.
struct Fixture {
  HostSource* host;
  std::unique_ptr<CachingAllocator> alloc;
  explicit Fixture(std::size_t limit = SIZE_MAX, AllocatorOptions opt = {}) {
    auto src = std::make_unique<HostSource>(limit);
    host = src.get();
    alloc = std::make_unique<CachingAllocator>(std::move(src), opt);
  }
};

// Forwards to a HostSource the test owns, to see what the allocator's destructor gave back.
class ForwardingSource final : public RawSource {
 public:
  explicit ForwardingSource(HostSource& h) : h_(h) {}
  void* alloc(std::size_t b) override { return h_.alloc(b); }
  void free(void* p, std::size_t b) override { h_.free(p, b); }
  const char* name() const override { return h_.name(); }
  bool is_device() const override { return false; }
  void mem_info(std::size_t* f, std::size_t* t) const override { h_.mem_info(f, t); }
  void* create_event() override { return h_.create_event(); }
  void record_event(void* e, cudaStream_t s) override { h_.record_event(e, s); }
  bool query_event(void* e) override { return h_.query_event(e); }
  void synchronize_event(void* e) override { h_.synchronize_event(e); }
  void destroy_event(void* e) override { h_.destroy_event(e); }

 private:
  HostSource& h_;
};

std::uintptr_t uaddr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Checks the structure of a snapshot: blocks tile each segment, no two free neighbours, the
// sums match the statistics and the source. Returns the allocated blocks by address.
std::map<std::uintptr_t, nlohmann::json> check_snapshot(const CachingAllocator& a, const HostSource& host) {
  nlohmann::json snap = a.snapshot();
  AllocatorStats st = a.stats();
  std::map<std::uintptr_t, nlohmann::json> allocated;
  std::int64_t reserved = 0, alloc_bytes = 0, active_bytes = 0;
  std::uintptr_t prev_end = 0;
  for (const auto& seg : snap["segments"]) {
    std::uintptr_t base = seg["address"], next = base;
    std::size_t seg_size = seg["size"];
    EXPECT_GE(base, prev_end) << "segments overlap";
    prev_end = base + seg_size;
    reserved += static_cast<std::int64_t>(seg_size);
    std::string prev_state;
    for (const auto& b : seg["blocks"]) {
      std::uintptr_t p = b["address"];
      std::size_t size = b["size"];
      std::string state = b["state"];
      EXPECT_EQ(p, next) << "blocks do not tile segment at " << base;
      EXPECT_EQ(p % 512, 0u);
      EXPECT_EQ(size % 512, 0u);
      EXPECT_GT(size, 0u);
      EXPECT_EQ(b["stream"], seg["stream"]) << "a block on another stream than its segment";
      if (state == "free") {
        EXPECT_NE(prev_state, "free") << "two free neighbours were not merged at " << p;
      }
      if (state == "allocated") {
        allocated[p] = b;
        alloc_bytes += static_cast<std::int64_t>(size);
      }
      if (state != "free") active_bytes += static_cast<std::int64_t>(size);
      prev_state = state;
      next = p + size;
    }
    EXPECT_EQ(next, base + seg_size) << "blocks do not cover segment at " << base;
  }
  EXPECT_EQ(reserved, st.reserved_bytes.current);
  EXPECT_EQ(static_cast<std::size_t>(reserved), host.used_bytes());
  EXPECT_EQ(static_cast<std::size_t>(st.segment.current), snap["segments"].size());
  EXPECT_EQ(host.live_allocations(), snap["segments"].size());
  EXPECT_EQ(alloc_bytes, st.allocated_bytes.current);
  EXPECT_EQ(active_bytes, st.active_bytes.current);
  EXPECT_EQ(static_cast<std::int64_t>(allocated.size()), st.allocation.current);
  return allocated;
}

std::size_t num_blocks(const nlohmann::json& snap) {
  std::size_t n = 0;
  for (const auto& s : snap["segments"]) n += s["blocks"].size();
  return n;
}

}  // namespace

TEST(Allocator, RoundsTo512AndZeroGivesNull) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1000000), 1000448u);
  Fixture f;
  EXPECT_EQ(f.alloc->allocate(0), nullptr);
  void* p = f.alloc->allocate(700);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(uaddr(p) % 512, 0u);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.current, 1024);
  EXPECT_EQ(s.requested_bytes.current, 700);
  EXPECT_EQ(s.active_bytes.current, 1024);
  EXPECT_EQ(s.allocation.current, 1);
  EXPECT_EQ(s.active.current, 1);
  std::memset(p, 0xAB, 700);  // the memory is real
  f.alloc->deallocate(p);
  f.alloc->deallocate(nullptr);  // like free(nullptr)
  s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.active.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));  // cached, not returned
  EXPECT_EQ(f.alloc->source().name(), std::string("host"));
}

TEST(Allocator, SmallRequestsShareTwoMiBSegments) {
  Fixture f;
  std::vector<void*> ps;
  for (int i = 0; i < 64; ++i) ps.push_back(f.alloc->allocate(32 * KiB));  // exactly 2 MiB
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.segment.current, 1);
  EXPECT_EQ(s.num_raw_allocs, 1);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  ps.push_back(f.alloc->allocate(1));  // the 65th needs a second small segment
  EXPECT_EQ(f.alloc->stats().segment.current, 2);
  for (void* p : ps) f.alloc->deallocate(p);
  check_snapshot(*f.alloc, *f.host);
  // 1 MiB is still "small": two share one 2 MiB segment.
  Fixture g;
  void* a = g.alloc->allocate(MiB);
  void* b = g.alloc->allocate(MiB);
  EXPECT_EQ(g.alloc->stats().reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(uaddr(b) - uaddr(a), MiB);
  g.alloc->deallocate(a);
  g.alloc->deallocate(b);
}

TEST(Allocator, LargePoolSegmentSizes) {
  struct Case {
    std::size_t request, segment;
  };
  const Case cases[] = {{MiB + 1, 20 * MiB},        {5 * MiB, 20 * MiB},          {10 * MiB - 512, 20 * MiB},
                        {10 * MiB, 10 * MiB},       {11 * MiB + 1, 12 * MiB},     {64 * MiB, 64 * MiB},
                        {100 * MiB + 3, 102 * MiB}};
  for (const Case& c : cases) {
    Fixture f;
    void* p = f.alloc->allocate(c.request);
    EXPECT_EQ(f.alloc->stats().reserved_bytes.current, static_cast<std::int64_t>(c.segment))
        << "request " << c.request;
    nlohmann::json snap = f.alloc->snapshot();
    EXPECT_EQ(snap["segments"][0]["pool"], "large");
    f.alloc->deallocate(p);
  }
  Fixture f;
  void* small = f.alloc->allocate(MiB);
  EXPECT_EQ(f.alloc->snapshot()["segments"][0]["pool"], "small");
  f.alloc->deallocate(small);
}

TEST(Allocator, LargeBlocksSplitOnlyWhenRemainderExceedsOneMiB) {
  Fixture f;
  void* a = f.alloc->allocate(5 * MiB);  // 20 MiB segment, split: 15 MiB stay free
  void* b = f.alloc->allocate(5 * MiB);  // shares the segment
  EXPECT_EQ(f.alloc->stats().segment.current, 1);
  EXPECT_EQ(uaddr(b) - uaddr(a), 5 * MiB);
  void* c = f.alloc->allocate(9 * MiB);  // 10 MiB left: remainder 1 MiB is not split off
  EXPECT_EQ(f.alloc->stats().segment.current, 1);
  EXPECT_EQ(f.alloc->stats().allocated_bytes.current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(f.alloc->stats().requested_bytes.current, static_cast<std::int64_t>(19 * MiB));
  check_snapshot(*f.alloc, *f.host);
  for (void* p : {a, b, c}) f.alloc->deallocate(p);
  nlohmann::json snap = f.alloc->snapshot();
  ASSERT_EQ(snap["segments"].size(), 1u);
  EXPECT_EQ(snap["segments"][0]["blocks"].size(), 1u);  // all merged back
}

TEST(Allocator, SplitMergeAndReuse) {
  Fixture f;
  void* a = f.alloc->allocate(4 * KiB);
  void* b = f.alloc->allocate(8 * KiB);
  void* c = f.alloc->allocate(4 * KiB);
  EXPECT_EQ(uaddr(b), uaddr(a) + 4 * KiB);
  EXPECT_EQ(uaddr(c), uaddr(b) + 8 * KiB);
  EXPECT_EQ(num_blocks(f.alloc->snapshot()), 4u);  // a, b, c, free tail
  f.alloc->deallocate(b);
  EXPECT_EQ(num_blocks(f.alloc->snapshot()), 4u);  // a hole between a and c
  void* b2 = f.alloc->allocate(8 * KiB);            // best fit: exactly the hole
  EXPECT_EQ(b2, b);
  f.alloc->deallocate(b2);
  f.alloc->deallocate(a);  // merges with the hole
  nlohmann::json snap = f.alloc->snapshot();
  ASSERT_EQ(num_blocks(snap), 3u);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["size"], 12 * KiB);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["state"], "free");
  f.alloc->deallocate(c);  // merges both sides: one free block of 2 MiB
  snap = f.alloc->snapshot();
  ASSERT_EQ(num_blocks(snap), 1u);
  EXPECT_EQ(snap["segments"][0]["blocks"][0]["size"], 2 * MiB);
  check_snapshot(*f.alloc, *f.host);
}

TEST(Allocator, BestFitPicksTheSmallestHoleThatFits) {
  Fixture f;
  const std::size_t sizes[] = {4 * KiB, 1 * KiB, 2 * KiB, 1 * KiB, 8 * KiB, 1 * KiB};
  std::vector<void*> ps;
  for (std::size_t s : sizes) ps.push_back(f.alloc->allocate(s));
  void* tail = f.alloc->allocate(64 * KiB);  // keeps the segment tail apart from the holes
  f.alloc->deallocate(ps[0]);                // holes: 4 KiB, 2 KiB, 8 KiB
  f.alloc->deallocate(ps[2]);
  f.alloc->deallocate(ps[4]);
  EXPECT_EQ(f.alloc->allocate(2 * KiB), ps[2]);
  EXPECT_EQ(f.alloc->allocate(3 * KiB), ps[0]);  // 4 KiB hole, split
  EXPECT_EQ(f.alloc->allocate(5 * KiB), ps[4]);
  check_snapshot(*f.alloc, *f.host);
  (void)tail;
}

TEST(Allocator, StreamsHaveSeparatePools) {
  Fixture f;
  cudaStream_t s1 = fake_stream(1), s2 = fake_stream(2);
  void* a = f.alloc->allocate(64 * KiB, s1);
  f.alloc->deallocate(a);
  void* b = f.alloc->allocate(64 * KiB, s2);  // s1's cached block is not for s2
  EXPECT_EQ(f.alloc->stats().segment.current, 2);
  void* c = f.alloc->allocate(64 * KiB, s1);
  EXPECT_EQ(c, a);
  nlohmann::json snap = f.alloc->snapshot();
  std::set<std::uintptr_t> streams;
  for (const auto& s : snap["segments"]) streams.insert(s["stream"].get<std::uintptr_t>());
  EXPECT_EQ(streams, (std::set<std::uintptr_t>{uaddr(s1), uaddr(s2)}));
  check_snapshot(*f.alloc, *f.host);
  f.alloc->deallocate(b);
  f.alloc->deallocate(c);
}

TEST(Allocator, RecordStreamDefersReuseUntilEventsComplete) {
  Fixture f;
  cudaStream_t s1 = fake_stream(1), s2 = fake_stream(2), s3 = fake_stream(3);
  void* a = f.alloc->allocate(256 * KiB, s1);
  f.alloc->record_stream(a, s2);
  f.alloc->record_stream(a, s3);
  f.alloc->record_stream(a, s2);  // twice: one event
  f.alloc->record_stream(a, s1);  // its own stream: nothing
  f.alloc->deallocate(a);
  EXPECT_EQ(f.host->live_events(), 2u);
  AllocatorStats st = f.alloc->stats();
  EXPECT_EQ(st.allocated_bytes.current, 0);
  EXPECT_EQ(st.allocation.current, 0);
  EXPECT_EQ(st.active_bytes.current, static_cast<std::int64_t>(256 * KiB));  // still in use on s2, s3
  EXPECT_EQ(st.active.current, 1);
  EXPECT_EQ(st.requested_bytes.current, static_cast<std::int64_t>(256 * KiB));
  EXPECT_EQ(f.alloc->snapshot()["segments"][0]["blocks"][0]["state"], "pending_free");
  check_snapshot(*f.alloc, *f.host);

  void* b = f.alloc->allocate(256 * KiB, s1);
  EXPECT_NE(b, a) << "a block still used on other streams was handed out again";
  f.host->complete_stream(s2);
  void* c = f.alloc->allocate(256 * KiB, s1);
  EXPECT_NE(c, a) << "reused before the event on s3 completed";
  f.host->complete_stream(s3);
  void* d = f.alloc->allocate(256 * KiB, s1);
  EXPECT_EQ(d, a) << "not reused after all events completed";
  EXPECT_EQ(f.alloc->stats().active.current, 3);
  check_snapshot(*f.alloc, *f.host);
  for (void* p : {b, c, d}) f.alloc->deallocate(p);
  EXPECT_EQ(f.host->live_events(), 2u);  // pooled for reuse, not recreated
  void* e = f.alloc->allocate(KiB, s1);
  f.alloc->record_stream(e, s2);
  f.alloc->deallocate(e);
  EXPECT_EQ(f.host->live_events(), 2u);
  EXPECT_EQ(f.host->synchronizations(), 0);
}

TEST(Allocator, EventsCompletedBeforeARecordDoNotFreeLaterUse) {
  Fixture f;
  cudaStream_t s1 = fake_stream(1), s2 = fake_stream(2);
  void* a = f.alloc->allocate(KiB, s1);
  f.host->complete_stream(s2);  // nothing recorded yet: completes nothing
  f.alloc->record_stream(a, s2);
  f.alloc->deallocate(a);
  void* b = f.alloc->allocate(KiB, s1);
  EXPECT_NE(b, a);
  f.alloc->deallocate(b);
  f.host->complete_all();
  EXPECT_EQ(f.alloc->allocate(KiB, s1), a);
}

TEST(Allocator, EmptyCacheReturnsUnusedSegments) {
  Fixture f;
  void* keep = f.alloc->allocate(3 * MiB);  // 20 MiB large segment, stays
  void* big = f.alloc->allocate(40 * MiB);
  void* small = f.alloc->allocate(KiB);
  void* pend = f.alloc->allocate(18 * MiB);  // too big for keep's 17 MiB free tail
  f.alloc->record_stream(pend, fake_stream(7));
  f.alloc->deallocate(big);
  f.alloc->deallocate(small);
  f.alloc->deallocate(pend);
  EXPECT_EQ(f.alloc->stats().segment.current, 4);
  f.alloc->empty_cache();  // waits for pend's event, then releases 3 segments
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(f.host->synchronizations(), 1);
  EXPECT_EQ(s.segment.current, 1);
  EXPECT_EQ(s.num_raw_frees, 3);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(s.reserved_bytes.peak, static_cast<std::int64_t>((20 + 40 + 2 + 18) * MiB));
  EXPECT_EQ(s.active_bytes.current, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(f.host->used_bytes(), 20 * MiB);
  check_snapshot(*f.alloc, *f.host);
  f.alloc->deallocate(keep);
  f.alloc->empty_cache();
  EXPECT_EQ(f.host->used_bytes(), 0u);
  EXPECT_EQ(f.alloc->stats().reserved_bytes.current, 0);
  EXPECT_EQ(f.alloc->snapshot()["segments"].size(), 0u);
}

TEST(Allocator, OversizeBlocksAreNotSplit) {
  AllocatorOptions opt;
  opt.max_split_size = 40 * MiB;
  Fixture f(SIZE_MAX, opt);
  void* big = f.alloc->allocate(64 * MiB);
  f.alloc->deallocate(big);
  void* normal = f.alloc->allocate(30 * MiB);  // must not carve the oversize cached block
  EXPECT_NE(normal, big);
  EXPECT_EQ(f.alloc->stats().segment.current, 2);
  void* wasteful = f.alloc->allocate(40 * MiB);  // oversize, but 64 >= 40 + 20: not reused
  EXPECT_NE(wasteful, big);
  EXPECT_EQ(f.alloc->stats().segment.current, 3);
  void* fits = f.alloc->allocate(50 * MiB);  // oversize, 64 < 50 + 20: takes it whole
  EXPECT_EQ(fits, big);
  EXPECT_EQ(f.alloc->stats().segment.current, 3);
  nlohmann::json snap = f.alloc->snapshot();
  for (const auto& s : snap["segments"])
    if (s["address"] == uaddr(big)) {
      ASSERT_EQ(s["blocks"].size(), 1u);
      EXPECT_EQ(s["blocks"][0]["size"], 64 * MiB);
      EXPECT_EQ(s["blocks"][0]["requested"], 50 * MiB);
    }
  check_snapshot(*f.alloc, *f.host);
  for (void* p : {normal, wasteful, fits}) f.alloc->deallocate(p);

  AllocatorOptions bad;
  bad.max_split_size = 8 * MiB;
  try {
    Fixture g(SIZE_MAX, bad);
    FAIL() << "max_split_size below 20 MiB was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_split_size"), std::string::npos) << e.what();
  }
}

TEST(Allocator, ExhaustionReleasesCacheAndRetriesOnce) {
  Fixture f(36 * MiB);
  void* a = f.alloc->allocate(12 * MiB);  // 12 MiB segment
  void* b = f.alloc->allocate(KiB);       // 2 MiB segment
  f.alloc->deallocate(a);
  f.alloc->deallocate(b);
  void* c = f.alloc->allocate(30 * MiB);  // 14 + 30 > 36: release the cache, then it fits
  ASSERT_NE(c, nullptr);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_raw_frees, 2);
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(30 * MiB));
  check_snapshot(*f.alloc, *f.host);
  f.alloc->deallocate(c);
}

TEST(Allocator, RetryWaitsForPendingBlocksAndReusesThem) {
  Fixture f(20 * MiB);
  cudaStream_t s1 = fake_stream(1);
  void* a = f.alloc->allocate(20 * MiB, s1);
  f.alloc->record_stream(a, fake_stream(2));
  f.alloc->deallocate(a);
  void* b = f.alloc->allocate(20 * MiB, s1);  // no room: waits for the event, reuses the block
  EXPECT_EQ(b, a);
  EXPECT_EQ(f.host->synchronizations(), 1);
  EXPECT_EQ(f.alloc->stats().num_alloc_retries, 1);
  EXPECT_EQ(f.alloc->stats().num_raw_allocs, 1);
  f.alloc->deallocate(b);
}

TEST(Allocator, OutOfMemoryMessageExplainsItself) {
  Fixture f(64 * MiB);
  // Fragment a 20 MiB segment: 4 MiB allocated, 3 MiB hole, 4 MiB allocated, 9 MiB free tail.
  void* p1 = f.alloc->allocate(4 * MiB);
  void* hole = f.alloc->allocate(3 * MiB);
  void* p2 = f.alloc->allocate(4 * MiB);
  void* big = f.alloc->allocate(40 * MiB);  // 60 MiB reserved of 64
  f.alloc->deallocate(hole);
  try {
    f.alloc->allocate(10 * MiB);  // 10 MiB segment does not fit in the 4 MiB left
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    for (const char* part : {"out of memory", "tried to allocate 10.00 MiB", "10485760 bytes requested",
                             "host memory: 64.00 MiB total, 4.00 MiB free", "48.00 MiB allocated",
                             "12.00 MiB reserved but unallocated", "largest free block 9.00 MiB"})
      EXPECT_NE(m.find(part), std::string::npos) << "missing \"" << part << "\" in: " << m;
  }
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  check_snapshot(*f.alloc, *f.host);
  // Still usable after the failure.
  void* ok = f.alloc->allocate(2 * MiB);  // fits in the 3 MiB hole (remainder 1 MiB not split)
  EXPECT_EQ(ok, hole);
  for (void* p : {p1, p2, big, ok}) f.alloc->deallocate(p);
  EXPECT_THROW(f.alloc->allocate(SIZE_MAX - 3), OutOfMemoryError);
  EXPECT_EQ(f.alloc->stats().num_ooms, 2);
}

TEST(Allocator, BadFreesAreClearErrors) {
  Fixture f;
  auto expect_error = [](auto fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected one containing \"" << part << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  int on_stack = 0;
  expect_error([&] { f.alloc->deallocate(&on_stack); }, "unknown pointer");
  void* a = f.alloc->allocate(4 * KiB);
  void* b = f.alloc->allocate(4 * KiB);
  expect_error([&] { f.alloc->deallocate(static_cast<char*>(a) + 512); }, "points inside the allocated block");
  f.alloc->deallocate(a);
  expect_error([&] { f.alloc->deallocate(a); }, "double free");
  expect_error([&] { f.alloc->record_stream(a, fake_stream(1)); }, "record_stream");
  f.alloc->record_stream(b, fake_stream(1));
  f.alloc->deallocate(b);
  expect_error([&] { f.alloc->deallocate(b); }, "waiting on stream events");
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocation.current, 0);  // the errors changed nothing
  EXPECT_EQ(s.active.current, 1);
  check_snapshot(*f.alloc, *f.host);
}

TEST(Allocator, StatisticsPeaksTotalsAndReset) {
  Fixture f;
  void* a = f.alloc->allocate(3 * MiB);
  void* b = f.alloc->allocate(1000);
  f.alloc->deallocate(a);
  void* c = f.alloc->allocate(512);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.peak, static_cast<std::int64_t>(3 * MiB + 1024));
  EXPECT_EQ(s.allocated_bytes.current, 1024 + 512);
  EXPECT_EQ(s.allocated_bytes.allocated, static_cast<std::int64_t>(3 * MiB + 1024 + 512));
  EXPECT_EQ(s.allocated_bytes.freed, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(s.requested_bytes.peak, static_cast<std::int64_t>(3 * MiB + 1000));
  EXPECT_EQ(s.allocation.allocated, 3);
  EXPECT_EQ(s.allocation.freed, 1);
  EXPECT_EQ(s.allocation.peak, 2);
  EXPECT_EQ(s.segment.current, 2);
  EXPECT_EQ(s.num_raw_allocs, 2);
  f.alloc->reset_peak();
  s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.peak, s.allocated_bytes.current);
  EXPECT_EQ(s.reserved_bytes.peak, s.reserved_bytes.current);
  EXPECT_EQ(s.allocation.peak, 2);
  EXPECT_EQ(s.allocated_bytes.allocated, static_cast<std::int64_t>(3 * MiB + 1024 + 512));  // totals stay
  nlohmann::json j = to_json(s);
  EXPECT_EQ(j["allocated_bytes"]["current"], 1536);
  EXPECT_EQ(j["num_raw_allocs"], 2);
  EXPECT_NE(f.alloc->summary().find("allocated 1.50 KiB"), std::string::npos) << f.alloc->summary();
  f.alloc->deallocate(b);
  f.alloc->deallocate(c);
}

TEST(Allocator, FragmentationThenCoalescing) {
  Fixture f;
  std::vector<void*> ps;
  for (int i = 0; i < 96; ++i) ps.push_back(f.alloc->allocate(64 * KiB));  // 3 full small segments
  ASSERT_EQ(f.alloc->stats().segment.current, 3);
  for (int i = 0; i < 96; i += 2) f.alloc->deallocate(ps[i]);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.current, static_cast<std::int64_t>(48 * 64 * KiB));
  EXPECT_EQ(s.reserved_bytes.current, static_cast<std::int64_t>(6 * MiB));
  void* wide = f.alloc->allocate(128 * KiB);  // 3 MiB free, but only in 64 KiB holes
  EXPECT_EQ(f.alloc->stats().segment.current, 4);
  EXPECT_EQ(num_blocks(f.alloc->snapshot()), 96u + 2u);
  check_snapshot(*f.alloc, *f.host);
  for (int i = 1; i < 96; i += 2) f.alloc->deallocate(ps[i]);
  nlohmann::json snap = f.alloc->snapshot();
  for (const auto& seg : snap["segments"])
    if (seg["address"] != uaddr(wide)) {
      EXPECT_EQ(seg["blocks"].size(), 1u) << "holes were not coalesced";
    }
  f.alloc->deallocate(wide);
  f.alloc->empty_cache();
  EXPECT_EQ(f.host->used_bytes(), 0u);
}

TEST(Allocator, DestructorReturnsEverything) {
  HostSource host;
  {
    CachingAllocator a(std::make_unique<ForwardingSource>(host));
    void* x = a.allocate(5 * MiB);
    void* y = a.allocate(KiB);
    a.record_stream(y, fake_stream(3));
    a.deallocate(y);
    (void)x;  // still allocated at destruction
    EXPECT_GT(host.used_bytes(), 0u);
  }
  EXPECT_EQ(host.used_bytes(), 0u);
  EXPECT_EQ(host.live_allocations(), 0u);
  EXPECT_EQ(host.live_events(), 0u);
  EXPECT_EQ(host.synchronizations(), 1);
}

// Thousands of random operations checked against a model of what must be true.
static void randomized_against_model(std::size_t align) {
  auto rng = test::fresh_rng();
  const std::size_t cap = 192 * MiB;
  AllocatorOptions opt;
  opt.alignment = align;
  Fixture f(cap, opt);
  auto round_up = [align](std::size_t n) { return n <= align ? align : (n + align - 1) / align * align; };
  const cudaStream_t streams[] = {nullptr, fake_stream(1), fake_stream(2), fake_stream(3)};
  struct Live {
    std::size_t req, size;
    cudaStream_t stream;
    std::vector<cudaStream_t> uses;
    std::uint64_t tag;
  };
  struct Pending {
    std::size_t req, size;
    std::set<cudaStream_t> waiting;
  };
  std::map<std::uintptr_t, Live> live;
  std::map<std::uintptr_t, Pending> pending;
  std::vector<std::uintptr_t> freed_recently;
  std::int64_t peak = 0, total_alloc = 0, total_freed = 0;
  std::uint64_t next_tag = 1;
  std::uniform_real_distribution<double> u01(0, 1);

  auto pick = [&](auto& m) {
    auto it = m.begin();
    std::advance(it, std::uniform_int_distribution<std::size_t>(0, m.size() - 1)(rng));
    return it;
  };
  auto write_tag = [](std::uintptr_t p, std::size_t req, std::uint64_t tag) {
    std::memcpy(reinterpret_cast<void*>(p), &tag, 8);
    std::memcpy(reinterpret_cast<void*>(p + req - 8), &tag, 8);
  };
  auto check_tag = [](std::uintptr_t p, std::size_t req, std::uint64_t tag) {
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, reinterpret_cast<void*>(p), 8);
    std::memcpy(&b, reinterpret_cast<void*>(p + req - 8), 8);
    return a == tag && b == tag;
  };
  // Pending blocks whose streams all completed return on the next allocate (or a retry/empty_cache).
  auto settle = [&](bool all) {
    for (auto it = pending.begin(); it != pending.end();)
      it = (all || it->second.waiting.empty()) ? pending.erase(it) : std::next(it);
  };

  const int kOps = 6000;
  int ooms = 0, retries_seen = 0;
  for (int op = 0; op < kOps; ++op) {
    // Allocation wins while few blocks are live, so the run hovers around the cap now and then.
    double p_alloc = live.size() < 24 ? 0.55 : 0.3;
    double r0 = u01(rng);
    double r = (r0 - p_alloc) / (1 - p_alloc);  // the other operations' share
    AllocatorStats before = f.alloc->stats();
    if (r0 < p_alloc || live.empty()) {
      std::size_t req = u01(rng) < 0.75
                            ? static_cast<std::size_t>(std::exp(std::uniform_real_distribution<double>(std::log(16), std::log(MiB))(rng)))
                            : std::uniform_int_distribution<std::size_t>(MiB + 1, 24 * MiB)(rng);
      cudaStream_t s = streams[std::uniform_int_distribution<int>(0, 3)(rng)];
      void* p = nullptr;
      try {
        p = f.alloc->allocate(req, s);
      } catch (const OutOfMemoryError&) {
        ++ooms;
        AllocatorStats after = f.alloc->stats();
        EXPECT_EQ(after.num_alloc_retries, before.num_alloc_retries + 1);
        EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
        settle(true);
        // The cache was given back: every remaining segment holds a live block, and the
        // segment the request needed really does not fit.
        for (const auto& seg : f.alloc->snapshot()["segments"]) {
          bool used = false;
          for (const auto& b : seg["blocks"]) used |= b["state"] != "free";
          EXPECT_TRUE(used) << "an unused segment survived the OOM retry";
        }
        std::size_t rounded = round_up(req);
        std::size_t seg = rounded <= MiB ? 2 * MiB : rounded < 10 * MiB ? 20 * MiB : (rounded + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        EXPECT_GT(f.host->used_bytes() + seg, cap);
        continue;
      }
      AllocatorStats after = f.alloc->stats();
      if (after.num_alloc_retries > before.num_alloc_retries) {
        ++retries_seen;
        settle(true);
      } else {
        settle(false);
      }
      std::uintptr_t a = uaddr(p);
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(a % align, 0u);
      std::size_t size = static_cast<std::size_t>(after.allocated_bytes.current - before.allocated_bytes.current);
      std::size_t rounded = round_up(req);
      if (rounded <= MiB) ASSERT_EQ(size, rounded) << "small blocks are always split to size";
      else ASSERT_TRUE(size >= rounded && size - rounded <= MiB) << "large block of " << size << " for " << rounded;
      // No overlap with any live or pending block.
      auto overlaps = [&](const auto& m) {
        auto it = m.upper_bound(a);
        if (it != m.end() && it->first < a + size) return true;
        if (it != m.begin()) {
          --it;
          if (it->first + it->second.size > a) return true;
        }
        return false;
      };
      ASSERT_FALSE(overlaps(live)) << "block at " << a << " overlaps a live block";
      ASSERT_FALSE(overlaps(pending)) << "block at " << a << " overlaps a block still in use on another stream";
      std::uint64_t tag = next_tag++;
      write_tag(a, req < 8 ? 8 : req, tag);
      live[a] = Live{req, size, s, {}, tag};
      total_alloc += static_cast<std::int64_t>(size);
    } else if (r < 0.69) {
      auto it = pick(live);
      std::uintptr_t a = it->first;
      ASSERT_TRUE(check_tag(a, std::max<std::size_t>(it->second.req, 8), it->second.tag))
          << "block at " << a << " was overwritten: overlapping blocks";
      f.alloc->deallocate(reinterpret_cast<void*>(a));
      total_freed += static_cast<std::int64_t>(it->second.size);
      if (!it->second.uses.empty())
        pending[a] = Pending{it->second.req, it->second.size,
                             std::set<cudaStream_t>(it->second.uses.begin(), it->second.uses.end())};
      live.erase(it);
      freed_recently.push_back(a);
    } else if (r < 0.84) {
      auto it = pick(live);
      cudaStream_t s = streams[std::uniform_int_distribution<int>(0, 3)(rng)];
      f.alloc->record_stream(reinterpret_cast<void*>(it->first), s);
      if (s != it->second.stream) it->second.uses.push_back(s);
    } else if (r < 0.93) {
      cudaStream_t s = streams[std::uniform_int_distribution<int>(0, 3)(rng)];
      f.host->complete_stream(s);
      for (auto& [a, pb] : pending) pb.waiting.erase(s);
    } else if (r < 0.96) {
      f.alloc->empty_cache();
      settle(true);
      for (const auto& seg : f.alloc->snapshot()["segments"]) {
        bool used = false;
        for (const auto& b : seg["blocks"]) used |= b["state"] != "free";
        EXPECT_TRUE(used) << "empty_cache kept an unused segment";
      }
    } else if (r < 0.98) {
      f.alloc->reset_peak();
      peak = f.alloc->stats().allocated_bytes.current;
    } else if (!freed_recently.empty()) {
      std::uintptr_t a = freed_recently[std::uniform_int_distribution<std::size_t>(0, freed_recently.size() - 1)(rng)];
      if (!live.count(a)) {
        EXPECT_THROW(f.alloc->deallocate(reinterpret_cast<void*>(a)), Error);
      }
    }
    if (freed_recently.size() > 64) freed_recently.erase(freed_recently.begin());

    // The statistics equal the model's after every operation.
    AllocatorStats s = f.alloc->stats();
    std::int64_t live_bytes = 0, live_req = 0, pend_bytes = 0, pend_req = 0;
    for (const auto& [a, l] : live) live_bytes += l.size, live_req += l.req;
    for (const auto& [a, pb] : pending) pend_bytes += pb.size, pend_req += pb.req;
    peak = std::max(peak, live_bytes);
    ASSERT_EQ(s.allocation.current, static_cast<std::int64_t>(live.size())) << "op " << op;
    ASSERT_EQ(s.allocated_bytes.current, live_bytes) << "op " << op;
    ASSERT_EQ(s.allocated_bytes.peak, peak) << "op " << op;
    ASSERT_EQ(s.allocated_bytes.allocated, total_alloc);
    ASSERT_EQ(s.allocated_bytes.freed, total_freed);
    ASSERT_EQ(s.active_bytes.current, live_bytes + pend_bytes) << "op " << op;
    ASSERT_EQ(s.active.current, static_cast<std::int64_t>(live.size() + pending.size())) << "op " << op;
    ASSERT_EQ(s.requested_bytes.current, live_req + pend_req) << "op " << op;
    ASSERT_EQ(static_cast<std::size_t>(s.reserved_bytes.current), f.host->used_bytes());
    ASSERT_LE(f.host->used_bytes(), cap);
    if (op % 97 == 0) {
      auto allocated = check_snapshot(*f.alloc, *f.host);
      ASSERT_EQ(allocated.size(), live.size());
      for (const auto& [a, l] : live) {
        auto it = allocated.find(a);
        ASSERT_NE(it, allocated.end()) << "live block " << a << " missing from the snapshot";
        EXPECT_EQ(it->second["requested"], l.req);
        EXPECT_EQ(it->second["size"], l.size);
        EXPECT_EQ(it->second["stream"], uaddr(l.stream));
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("randomized: %d ops, %d OOMs, %d retries, %zu live at the end\n", kOps, ooms, retries_seen, live.size());
  for (const auto& [a, l] : live) {
    EXPECT_TRUE(check_tag(a, std::max<std::size_t>(l.req, 8), l.tag));
    f.alloc->deallocate(reinterpret_cast<void*>(a));
  }
  f.host->complete_all();
  f.alloc->empty_cache();
  EXPECT_EQ(f.host->used_bytes(), 0u);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.active.current, 0);
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.num_raw_allocs, s.num_raw_frees);
}

TEST(Allocator, RandomizedAgainstModel) { randomized_against_model(512); }
TEST(Allocator, RandomizedAgainstModelPageAligned) { randomized_against_model(4096); }

TEST(Allocator, AlignmentOptionRoundsEveryBlock) {
  AllocatorOptions opt;
  opt.alignment = 4096;
  Fixture f(SIZE_MAX, opt);
  std::vector<void*> ps;
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{4096}, 3 * MiB + 1, std::size_t{700}})
    ps.push_back(f.alloc->allocate(n));
  for (void* p : ps) EXPECT_EQ(uaddr(p) % 4096, 0u) << p;
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocated_bytes.current, static_cast<std::int64_t>(4096 + 8192 + 4096 + (3 * MiB + 4096) + 4096));
  EXPECT_EQ(uaddr(ps[1]) - uaddr(ps[0]), 4096u);
  check_snapshot(*f.alloc, *f.host);
  for (void* p : ps) f.alloc->deallocate(p);
  for (std::size_t bad : {std::size_t{256}, std::size_t{1000}, 4 * MiB}) {
    AllocatorOptions o;
    o.alignment = bad;
    EXPECT_THROW(Fixture(SIZE_MAX, o), Error) << "alignment " << bad << " was accepted";
  }
}

TEST(Allocator, ThreadsShareOneAllocator) {
  Fixture f;
  constexpr int kThreads = 4, kOps = 3000;
  std::vector<std::thread> ts;
  std::atomic<int> corrupt{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::pair<unsigned char*, std::size_t>> mine;
      cudaStream_t s = fake_stream(t % 2);
      for (int i = 0; i < kOps; ++i) {
        if (mine.size() < 16 && (mine.empty() || rng() % 2)) {
          std::size_t n = 1 + rng() % (rng() % 8 == 0 ? 3 * MiB : 16 * KiB);
          auto* p = static_cast<unsigned char*>(f.alloc->allocate(n, s));
          std::memset(p, t + 1, std::min<std::size_t>(n, 64 * KiB));
          mine.emplace_back(p, n);
        } else {
          std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          for (std::size_t j = 0; j < std::min<std::size_t>(n, 64 * KiB); ++j)
            if (p[j] != t + 1) {
              ++corrupt;
              break;
            }
          f.alloc->deallocate(p);
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto [p, n] : mine) f.alloc->deallocate(p);
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(corrupt.load(), 0) << "threads saw each other's writes: overlapping blocks";
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.allocation.current, 0);
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.allocation.allocated, s.allocation.freed);
  check_snapshot(*f.alloc, *f.host);
  f.alloc->empty_cache();
  EXPECT_EQ(f.host->used_bytes(), 0u);
}
