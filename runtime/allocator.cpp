// The caching allocator. Free blocks live in two pools (small, large) ordered by
// (stream, size, address), so best fit within a stream is one lower_bound. Blocks of a segment
// form a doubly linked list in address order; a segment's first block object is never deleted
// while the segment lives (splits cut off the tail, merges absorb into the lower block), so the
// segment table can point at it.
#include "runtime/allocator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "runtime/check.h"
#include "runtime/choice.h"

namespace cutrain {

using namespace alloc_rules;

namespace {

// Requests beyond this are refused before any rounding could overflow.
constexpr std::size_t kMaxRequest = std::size_t{1} << 60;

enum class BlockState { Allocated, Pending, Free };  // Pending: freed, waiting on stream events

struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;
  cudaStream_t stream = nullptr;
  bool small = false;
  BlockState state = BlockState::Free;
  Block* prev = nullptr;
  Block* next = nullptr;
  int event_count = 0;                    // events still outstanding (Pending only)
  std::vector<cudaStream_t> stream_uses;  // other streams it was used on (record_stream)
};

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return addr(a->stream) < addr(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return addr(a->ptr) < addr(b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

struct Segment {
  Block* head;
  std::size_t size;
};

struct PendingEvent {
  void* event;
  Block* block;
};

void stat_add(Stat& s, std::int64_t n) {
  s.current += n;
  s.allocated += n;
  s.peak = std::max(s.peak, s.current);
}
void stat_sub(Stat& s, std::int64_t n) {
  s.current -= n;
  s.freed += n;
}
void stat_reset_peak(Stat& s) { s.peak = s.current; }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(addr(p)));
  return buf;
}

constexpr std::array<Choice<BlockState>, 3> kBlockStateNames{
    {{BlockState::Allocated, "allocated"}, {BlockState::Pending, "pending_free"}, {BlockState::Free, "free"}}};
const char* state_name(BlockState s) { return choice_name(kBlockStateNames, s, "?"); }

std::size_t segment_size(std::size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

nlohmann::json stat_json(const Stat& s) {
  return {{"current", s.current}, {"peak", s.peak}, {"allocated", s.allocated}, {"freed", s.freed}};
}

}  // namespace

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = bytes;
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", v);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

nlohmann::json to_json(const AllocatorStats& s) {
  return {{"allocated_bytes", stat_json(s.allocated_bytes)},
          {"reserved_bytes", stat_json(s.reserved_bytes)},
          {"active_bytes", stat_json(s.active_bytes)},
          {"requested_bytes", stat_json(s.requested_bytes)},
          {"allocation", stat_json(s.allocation)},
          {"segment", stat_json(s.segment)},
          {"active", stat_json(s.active)},
          {"num_raw_allocs", s.num_raw_allocs},
          {"num_raw_frees", s.num_raw_frees},
          {"num_alloc_retries", s.num_alloc_retries},
          {"num_ooms", s.num_ooms}};
}

struct CachingAllocator::Impl {
  std::unique_ptr<RawSource> source;
  AllocatorOptions opt;
  mutable std::mutex mu;
  Pool small_pool, large_pool;
  std::map<std::uintptr_t, Segment> segments;  // by base address
  std::unordered_map<void*, Block*> allocated;
  std::map<cudaStream_t, std::deque<PendingEvent>> pending;  // per used-on stream, in record order
  std::size_t pending_count = 0;
  std::vector<void*> event_pool;  // created events not in use
  AllocatorStats stats;

  Pool& pool_of(const Block* b) { return b->small ? small_pool : large_pool; }

  // ---- finding and carving blocks ----
  Block* find_free(bool small, cudaStream_t stream, std::size_t size) {
    Pool& pool = small ? small_pool : large_pool;
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    if (!small) {
      // Oversize blocks serve only oversize requests, and only when little is wasted.
      if (size < opt.max_split_size && b->size >= opt.max_split_size) return nullptr;
      if (size >= opt.max_split_size && b->size >= size + kLargeBuffer) return nullptr;
    }
    return b;
  }

  Block* new_segment(bool small, cudaStream_t stream, std::size_t size) {
    std::size_t bytes = segment_size(size);
    void* p = source->alloc(bytes);
    if (!p) return nullptr;
    if (addr(p) % opt.alignment != 0) {
      source->free(p, bytes);
      CUTRAIN_FAIL("caching allocator (", source->name(), "): the source returned segment ", hex(p),
                   ", which is not aligned to ", opt.alignment, " bytes as the allocator's blocks must be");
    }
    auto* b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = bytes;
    b->stream = stream;
    b->small = small;
    segments.emplace(addr(p), Segment{b, bytes});
    ++stats.num_raw_allocs;
    stat_add(stats.reserved_bytes, static_cast<std::int64_t>(bytes));
    stat_add(stats.segment, 1);
    return b;
  }

  std::size_t round(std::size_t bytes) const {
    return bytes <= opt.alignment ? opt.alignment : (bytes + opt.alignment - 1) / opt.alignment * opt.alignment;
  }

  bool should_split(const Block* b, std::size_t size) const {
    std::size_t remaining = b->size - size;
    if (b->small) return remaining >= opt.alignment;
    return size < opt.max_split_size && remaining > kSmallSize;
  }

  void* take(Block* b, bool in_pool, std::size_t size, std::size_t requested) {
    if (in_pool) pool_of(b).erase(b);
    if (should_split(b, size)) {
      auto* rest = new Block;
      rest->ptr = b->ptr + size;
      rest->size = b->size - size;
      rest->stream = b->stream;
      rest->small = b->small;
      rest->prev = b;
      rest->next = b->next;
      if (rest->next) rest->next->prev = rest;
      b->next = rest;
      b->size = size;
      pool_of(rest).insert(rest);
    }
    b->state = BlockState::Allocated;
    b->requested = requested;
    allocated.emplace(b->ptr, b);
    auto sz = static_cast<std::int64_t>(b->size);
    stat_add(stats.allocation, 1);
    stat_add(stats.allocated_bytes, sz);
    stat_add(stats.active, 1);
    stat_add(stats.active_bytes, sz);
    stat_add(stats.requested_bytes, static_cast<std::int64_t>(requested));
    return b->ptr;
  }

  // ---- returning blocks ----
  // The block is no longer in use anywhere: back to its pool, merged with free neighbours.
  void free_block(Block* b) {
    stat_sub(stats.active, 1);
    stat_sub(stats.active_bytes, static_cast<std::int64_t>(b->size));
    stat_sub(stats.requested_bytes, static_cast<std::int64_t>(b->requested));
    b->requested = 0;
    b->state = BlockState::Free;
    b->stream_uses.clear();
    Pool& pool = pool_of(b);
    if (Block* p = b->prev; p && p->state == BlockState::Free) {
      pool.erase(p);
      p->size += b->size;
      p->next = b->next;
      if (p->next) p->next->prev = p;
      delete b;
      b = p;
    }
    if (Block* n = b->next; n && n->state == BlockState::Free) {
      pool.erase(n);
      b->size += n->size;
      b->next = n->next;
      if (b->next) b->next->prev = b;
      delete n;
    }
    pool.insert(b);
  }

  void* get_event() {
    if (!event_pool.empty()) {
      void* e = event_pool.back();
      event_pool.pop_back();
      return e;
    }
    return source->create_event();
  }

  void finish_event(const PendingEvent& pe) {
    event_pool.push_back(pe.event);
    if (--pe.block->event_count == 0) free_block(pe.block);
  }

  // Events of one stream complete in order: stop at the first that is not done.
  void process_events() {
    if (pending_count == 0) return;
    for (auto it = pending.begin(); it != pending.end();) {
      auto& q = it->second;
      while (!q.empty() && source->query_event(q.front().event)) {
        PendingEvent pe = q.front();
        q.pop_front();
        --pending_count;
        finish_event(pe);
      }
      it = q.empty() ? pending.erase(it) : std::next(it);
    }
  }

  void synchronize_events() {
    for (auto it = pending.begin(); it != pending.end();) {
      auto& q = it->second;
      while (!q.empty()) {
        source->synchronize_event(q.front().event);
        PendingEvent pe = q.front();
        q.pop_front();
        --pending_count;
        finish_event(pe);
      }
      it = pending.erase(it);
    }
  }

  // Returns every segment that is one free block to the source.
  void release_cached() {
    synchronize_events();
    for (auto it = segments.begin(); it != segments.end();) {
      Block* h = it->second.head;
      if (h->state == BlockState::Free && h->next == nullptr) {
        source->free(h->ptr, it->second.size);  // first: if it throws, nothing changed
        pool_of(h).erase(h);
        ++stats.num_raw_frees;
        stat_sub(stats.reserved_bytes, static_cast<std::int64_t>(it->second.size));
        stat_sub(stats.segment, 1);
        delete h;
        it = segments.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::size_t largest_free_block() const {
    std::size_t best = 0;
    for (const Pool* pool : {&small_pool, &large_pool})
      for (const Block* b : *pool) best = std::max(best, b->size);
    return best;
  }

  [[noreturn]] void throw_oom(std::size_t bytes, std::size_t size, bool retried) {
    ++stats.num_ooms;
    std::size_t free_b = 0, total_b = 0;
    std::string mem;
    try {
      source->mem_info(&free_b, &total_b);
      mem = detail::concat(format_bytes(static_cast<double>(total_b)), " total, ",
                           format_bytes(static_cast<double>(free_b)), " free");
    } catch (const Error& e) {
      mem = detail::concat("total and free unknown (", e.message(), ")");
    }
    std::int64_t alloc_b = stats.allocated_bytes.current;
    std::int64_t unalloc_b = stats.reserved_bytes.current - alloc_b;
    std::string seg = size <= kMaxRequest ? detail::concat(" in a new segment of ", segment_size(size), " bytes") : "";
    throw OutOfMemoryError(
        detail::concat("caching allocator (", source->name(), "): out of memory: tried to allocate ",
                       format_bytes(static_cast<double>(bytes)), " (", bytes,
                       " bytes requested, ", size, " after rounding", seg, "); ", source->name(), " memory: ", mem,
                       "; this allocator: ", format_bytes(static_cast<double>(alloc_b)), " allocated, ",
                       format_bytes(static_cast<double>(unalloc_b)),
                       " reserved but unallocated, largest free block ",
                       format_bytes(static_cast<double>(largest_free_block())),
                       retried ? " (cached blocks were released and the allocation retried once)"
                               : " (the request is beyond what any source can hold)"),
        __FILE__, __LINE__);
  }

  [[noreturn]] void fail_unknown(void* p) const {
    const char* name = source->name();
    auto it = segments.upper_bound(addr(p));
    if (it != segments.begin()) {
      --it;
      if (addr(p) < it->first + it->second.size) {
        for (const Block* b = it->second.head; b; b = b->next) {
          if (addr(p) < addr(b->ptr) || addr(p) >= addr(b->ptr) + b->size) continue;
          if (b->state != BlockState::Allocated)
            CUTRAIN_FAIL("caching allocator (", name, "): double free of ", hex(p), ": that memory is already free (in ",
                         b->state == BlockState::Pending ? "a freed block waiting on stream events" : "a cached free block",
                         " of ", b->size, " bytes at ", hex(b->ptr), ")");
          CUTRAIN_FAIL("caching allocator (", name, "): ", hex(p), " points inside the allocated block at ", hex(b->ptr),
                       " (", b->size, " bytes), not at its start; only pointers returned by allocate can be freed");
        }
      }
    }
    CUTRAIN_FAIL("caching allocator (", name, "): unknown pointer ", hex(p),
                 ": it was not allocated by this allocator (or its segment was already released)");
  }

  Block* allocated_block(void* p, const char* what) const {
    auto it = allocated.find(p);
    if (it == allocated.end()) {
      try {
        fail_unknown(p);
      } catch (const Error& e) {
        throw Error(detail::concat(what, ": ", e.message()), e.file(), e.line());
      }
    }
    return it->second;
  }
};

CachingAllocator::CachingAllocator(std::unique_ptr<RawSource> source, AllocatorOptions options)
    : impl_(std::make_unique<Impl>()) {
  CUTRAIN_CHECK(source != nullptr, "CachingAllocator: the raw source is null");
  CUTRAIN_CHECK(options.alignment >= kMinBlockSize && options.alignment <= kRoundLarge &&
                    (options.alignment & (options.alignment - 1)) == 0,
                "CachingAllocator: alignment must be a power of two from 512 to 2 MiB, got ", options.alignment);
  CUTRAIN_CHECK(options.max_split_size >= kLargeBuffer, "CachingAllocator: max_split_size must be at least ",
                kLargeBuffer, " bytes (20 MiB, as in PyTorch), got ", options.max_split_size);
  impl_->source = std::move(source);
  impl_->opt = options;
  impl_->allocated.reserve(1024);
}

CachingAllocator::~CachingAllocator() {
  Impl& m = *impl_;
  // Best effort: nothing may throw from here. Outstanding events are waited for so no queued work
  // still touches memory that goes back to the source.
  try {
    m.synchronize_events();
  } catch (...) {
  }
  for (auto& [base, seg] : m.segments) {
    for (Block* b = seg.head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    try {
      m.source->free(reinterpret_cast<void*>(base), seg.size);
    } catch (...) {
    }
  }
  for (void* e : m.event_pool) {
    try {
      m.source->destroy_event(e);
    } catch (...) {
    }
  }
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

void* CachingAllocator::allocate(std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (bytes > kMaxRequest) m.throw_oom(bytes, bytes, false);
  m.process_events();
  std::size_t size = m.round(bytes);
  bool small = size <= kSmallSize;
  if (Block* b = m.find_free(small, stream, size)) return m.take(b, true, size, bytes);
  Block* b = m.new_segment(small, stream, size);
  if (!b) {
    // Exhausted: wait for freed blocks still in use elsewhere, then give the cache back, once.
    ++m.stats.num_alloc_retries;
    m.synchronize_events();
    if (Block* f = m.find_free(small, stream, size)) return m.take(f, true, size, bytes);
    m.release_cached();
    b = m.new_segment(small, stream, size);
  }
  if (!b) m.throw_oom(bytes, size, true);
  return m.take(b, false, size, bytes);
}

void CachingAllocator::deallocate(void* p) {
  if (!p) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  Block* b = m.allocated_block(p, "deallocate");
  // Record the events first: if that fails the block stays allocated and nothing changed.
  std::vector<void*> events;
  try {
    for (cudaStream_t s : b->stream_uses) {
      events.push_back(m.get_event());
      m.source->record_event(events.back(), s);
    }
  } catch (...) {
    for (void* e : events) m.event_pool.push_back(e);
    throw;
  }
  m.allocated.erase(p);
  stat_sub(m.stats.allocation, 1);
  stat_sub(m.stats.allocated_bytes, static_cast<std::int64_t>(b->size));
  if (events.empty()) {
    m.free_block(b);
    return;
  }
  b->state = BlockState::Pending;
  for (std::size_t i = 0; i < events.size(); ++i) {
    m.pending[b->stream_uses[i]].push_back({events[i], b});
    ++b->event_count;
    ++m.pending_count;
  }
  b->stream_uses.clear();
}

void CachingAllocator::record_stream(void* p, cudaStream_t stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  Block* b = m.allocated_block(p, "record_stream");
  if (stream == b->stream) return;  // its own stream orders the reuse already
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

void CachingAllocator::empty_cache() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.release_cached();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  AllocatorStats& s = impl_->stats;
  for (Stat* st : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes, &s.allocation,
                   &s.segment, &s.active})
    stat_reset_peak(*st);
}

nlohmann::json CachingAllocator::snapshot() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& [base, seg] : m.segments) {
    nlohmann::json blocks = nlohmann::json::array();
    std::size_t alloc_b = 0;
    for (const Block* b = seg.head; b; b = b->next) {
      if (b->state == BlockState::Allocated) alloc_b += b->size;
      blocks.push_back({{"address", addr(b->ptr)},
                        {"size", b->size},
                        {"requested", b->requested},
                        {"state", state_name(b->state)},
                        {"stream", addr(b->stream)}});
    }
    segs.push_back({{"address", base},
                    {"size", seg.size},
                    {"pool", seg.head->small ? "small" : "large"},
                    {"stream", addr(seg.head->stream)},
                    {"allocated_bytes", alloc_b},
                    {"blocks", std::move(blocks)}});
  }
  return {{"source", m.source->name()}, {"stats", to_json(m.stats)}, {"segments", std::move(segs)}};
}

const RawSource& CachingAllocator::source() const { return *impl_->source; }

std::string CachingAllocator::summary() const {
  AllocatorStats s = stats();
  return detail::concat(impl_->source->name(), " allocator: allocated ", format_bytes(s.allocated_bytes.current),
                        " (peak ", format_bytes(s.allocated_bytes.peak), "), reserved ",
                        format_bytes(s.reserved_bytes.current), " (peak ", format_bytes(s.reserved_bytes.peak), "), ",
                        s.segment.current, " segments, ", s.allocation.current, " blocks allocated");
}

// ---- the process-wide instances: created on first use and never destroyed, so no static
// destructor runs after the CUDA runtime has shut down ----

CachingAllocator& device_allocator(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<CachingAllocator*> slots[kMaxDevices];
  static std::mutex create_mu;
  if (device < 0) CUTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  CUTRAIN_CHECK(device < kMaxDevices, "device_allocator: device ", device, " is beyond the supported ", kMaxDevices);
  if (CachingAllocator* a = slots[device].load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(create_mu);
  CachingAllocator* a = slots[device].load(std::memory_order_relaxed);
  if (!a) {
    a = new CachingAllocator(make_device_source(device));
    slots[device].store(a, std::memory_order_release);
  }
  return *a;
}

CachingAllocator& pinned_allocator() {
  static CachingAllocator* a = [] {
    AllocatorOptions opt;
    opt.alignment = 4096;  // page-aligned blocks: bounce buffers for O_DIRECT I/O come from here
    return new CachingAllocator(make_pinned_source(), opt);
  }();
  return *a;
}

}  // namespace cutrain
