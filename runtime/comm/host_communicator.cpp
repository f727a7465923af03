#include "runtime/comm/host_communicator.h"

#include <cuda_fp16.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/rendezvous.h"
#include "runtime/error.h"

namespace cutrain::comm {
namespace {

constexpr std::uint64_t kMagic = 0x63757472686f7374ull;  // "cutrhost"
enum RankState : int { Joining = 0, Alive = 1, Left = 2, Dead = 3 };

struct alignas(64) Header {
  std::uint64_t magic;  // written last by rank 0: the segment is initialised
  int world;
  std::uint64_t slot_bytes, channel_bytes;
  pthread_mutex_t mu;  // guards everything below and the ring cursors
  pthread_cond_t cv;   // any change: a barrier generation, a ring cursor, a rank's state
  std::uint64_t generation;  // barriers completed
  int arrived;               // ranks in the current barrier
  std::uint64_t arrived_gen[kHostCommMaxWorld];  // rank r is in barrier number arrived_gen[r] - 1
  int state[kHostCommMaxWorld];
  int pid[kHostCommMaxWorld];
  pthread_mutex_t life[kHostCommMaxWorld];  // held by rank r while it runs (robust)
  int failed_rank;       // the first rank found gone, -1 while none
  char failure[256];     // what was found, for every rank's error
};

struct Cursor {
  std::uint64_t head, tail;  // bytes written / read, ever
};

std::size_t round64(std::size_t n) { return (n + 63) / 64 * 64; }

enum class Elem { F32, BF16, F16, I32, U8, F64 };
Elem elem_of(DType t) {
  switch (t) {
    case DType::F32: return Elem::F32;
    case DType::BF16: return Elem::BF16;
    case DType::F16: return Elem::F16;
    case DType::I32: return Elem::I32;
    case DType::U8: return Elem::U8;
    default: CUTRAIN_FAIL("host communicator: no collective type for ", dtype_name(t),
                          " (the types of the NCCL communicator: float32, bfloat16, float16, int32, uint8)");
  }
}
std::size_t elem_size(Elem e) {
  switch (e) {
    case Elem::F32: case Elem::I32: return 4;
    case Elem::BF16: case Elem::F16: return 2;
    case Elem::U8: return 1;
    case Elem::F64: return 8;
  }
  return 0;
}
// out[i] = reduce over ranks r = 0..n-1 (in that order) of src[r][i]; floats accumulate in fp64,
// integers in int64, each result rounded (or truncated, Avg of integers) once.
template <typename T, typename Acc, typename Load, typename Store>
void reduce_typed(void* out, const std::vector<const char*>& src, std::size_t n, bool avg, Load load, Store store) {
  const auto w = static_cast<Acc>(src.size());
  for (std::size_t i = 0; i < n; ++i) {
    Acc acc = 0;
    for (const char* s : src) {
      T v;
      std::memcpy(&v, s + i * sizeof(T), sizeof(T));
      acc += load(v);
    }
    if (avg) acc /= w;
    const T r = store(acc);
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &r, sizeof(T));
  }
}
// Before any rank writes its slot: every rank refuses the op at the same call.
void check_op(ReduceOp op, const char* what) {
  CUTRAIN_CHECK(op != ReduceOp::Max, "host communicator: ", what,
                " with a max reduction is not built (sum and avg only; max is NCCL's, for the GPU model)");
}
void reduce_into(Elem e, void* out, const std::vector<const char*>& src, std::size_t n, ReduceOp op) {
  const bool avg = op == ReduceOp::Avg;
  switch (e) {
    case Elem::F32:
      return reduce_typed<float, double>(out, src, n, avg, [](float v) { return double(v); },
                                         [](double a) { return float(a); });
    case Elem::F64:
      return reduce_typed<double, double>(out, src, n, avg, [](double v) { return v; }, [](double a) { return a; });
    case Elem::BF16:
      return reduce_typed<std::uint16_t, double>(
          out, src, n, avg, [](std::uint16_t v) { return double(bf16_bits_to_f32(v)); },
          [](double a) { return f32_to_bf16_bits(float(a)); });
    case Elem::F16:
      return reduce_typed<__half, double>(out, src, n, avg, [](__half v) { return double(__half2float(v)); },
                                          [](double a) { return __float2half_rn(float(a)); });
    case Elem::I32:
      return reduce_typed<std::int32_t, std::int64_t>(out, src, n, avg, [](std::int32_t v) { return std::int64_t(v); },
                                                      [](std::int64_t a) { return std::int32_t(a); });
    case Elem::U8:
      return reduce_typed<std::uint8_t, std::int64_t>(out, src, n, avg, [](std::uint8_t v) { return std::int64_t(v); },
                                                      [](std::int64_t a) { return std::uint8_t(a); });
  }
}

timespec deadline_in(std::chrono::milliseconds d) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long ns = ts.tv_nsec + (d.count() % 1000) * 1000000ll;
  ts.tv_sec += d.count() / 1000 + ns / 1000000000ll;
  ts.tv_nsec = ns % 1000000000ll;
  return ts;
}

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(const LaunchEnv& env, const HostCommOptions& o) : Communicator(env, -1), opt_(o) {}
  ~HostCommunicator() override { close(); }
  const char* backend_name() const override { return "host (shared memory, test backend)"; }

  void open(const std::string& name, bool create) {
    const int W = world_size();
    cursor_off_ = round64(sizeof(Header));
    slot_off_ = cursor_off_ + round64(sizeof(Cursor) * W * W);
    ring_off_ = slot_off_ + round64(opt_.slot_bytes) * W;
    bytes_ = ring_off_ + round64(opt_.channel_bytes) * W * W;
    name_ = name;
    const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    CUTRAIN_CHECK(fd >= 0, "host communicator: rank ", rank(), ": shm_open('/dev/shm", name, "') failed: ",
                  std::strerror(errno));
    owner_ = create;
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      const int e = errno;
      ::close(fd);
      CUTRAIN_FAIL("host communicator: cannot size /dev/shm", name, " to ", bytes_, " bytes: ", std::strerror(e));
    }
    struct stat st {};
    ::fstat(fd, &st);
    if (!create && static_cast<std::size_t>(st.st_size) != bytes_) {
      ::close(fd);
      CUTRAIN_FAIL("host communicator: rank ", rank(), ": /dev/shm", name, " holds ", st.st_size, " bytes, expected ",
                   bytes_, " (the ranks were given different slot or channel sizes or world sizes)");
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    CUTRAIN_CHECK(p != MAP_FAILED, "host communicator: mmap of /dev/shm", name, " (", bytes_, " bytes) failed: ",
                  std::strerror(e));
    base_ = static_cast<char*>(p);
    h_ = reinterpret_cast<Header*>(base_);
    if (create) init_header();
    else
      CUTRAIN_CHECK(reinterpret_cast<std::atomic<std::uint64_t>*>(&h_->magic)->load() == kMagic && h_->world == W &&
                        h_->slot_bytes == opt_.slot_bytes && h_->channel_bytes == opt_.channel_bytes,
                    "host communicator: rank ", rank(), ": /dev/shm", name, " is not a segment of this job (world ",
                    h_->world, ", expected ", W, ")");
    // Join: hold this rank's life mutex until close() (or the process's end).
    const int rc = pthread_mutex_lock(&h_->life[rank()]);
    if (rc == EOWNERDEAD) pthread_mutex_consistent(&h_->life[rank()]);
    else CUTRAIN_CHECK(rc == 0, "host communicator: rank ", rank(), ": cannot take its life mutex: ", std::strerror(rc));
    holding_life_ = true;
    Lock l(*this, "joining");
    h_->pid[rank()] = static_cast<int>(::getpid());
    h_->state[rank()] = Alive;
    pthread_cond_broadcast(&h_->cv);
  }

  void unlink_name() {
    if (owner_ && !name_.empty()) ::shm_unlink(name_.c_str());
    owner_ = false;
  }

  void all_reduce(void* buf, std::size_t n, DType t, ReduceOp op, cudaStream_t) override {
    reduce_chunks(elem_of(t), buf, n, op, "all_reduce");
  }
  void all_reduce_sum_f64(double* buf, std::size_t n, cudaStream_t) override {
    reduce_chunks(Elem::F64, buf, n, ReduceOp::Sum, "all_reduce_sum_f64");
  }
  void reduce_scatter(const void* send, void* recv, std::size_t n, DType t, ReduceOp op, cudaStream_t) override {
    check_op(op, "reduce_scatter");
    const Elem e = elem_of(t);
    const std::size_t es = elem_size(e), W = std::size_t(world_size());
    const std::size_t chunk = chunk_elems(es * W, "reduce_scatter");
    std::vector<const char*> src(W);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t c = std::min(chunk, n - c0);
      for (std::size_t j = 0; j < W; ++j)  // block j's chunk at slot offset j*c
        std::memcpy(slot(rank()) + j * c * es, static_cast<const char*>(send) + (j * n + c0) * es, c * es);
      barrier_named("reduce_scatter");
      for (std::size_t r = 0; r < W; ++r) src[r] = slot(int(r)) + std::size_t(rank()) * c * es;
      reduce_into(e, static_cast<char*>(recv) + c0 * es, src, c, op);
      barrier_named("reduce_scatter");
    }
  }
  void all_gather(const void* send, void* recv, std::size_t n, DType t, cudaStream_t) override {
    const std::size_t es = dtype_size(t), W = std::size_t(world_size());
    (void)elem_of(t);
    const std::size_t chunk = chunk_elems(es, "all_gather");
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t c = std::min(chunk, n - c0);
      std::memcpy(slot(rank()), static_cast<const char*>(send) + c0 * es, c * es);
      barrier_named("all_gather");
      for (std::size_t r = 0; r < W; ++r)
        std::memcpy(static_cast<char*>(recv) + (r * n + c0) * es, slot(int(r)), c * es);
      barrier_named("all_gather");
    }
  }
  void all_to_all(const void* send, void* recv, std::size_t n, DType t, cudaStream_t) override {
    const std::size_t es = dtype_size(t), W = std::size_t(world_size());
    (void)elem_of(t);
    const std::size_t chunk = chunk_elems(es * W, "all_to_all");
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t c = std::min(chunk, n - c0);
      for (std::size_t j = 0; j < W; ++j)
        std::memcpy(slot(rank()) + j * c * es, static_cast<const char*>(send) + (j * n + c0) * es, c * es);
      barrier_named("all_to_all");
      for (std::size_t r = 0; r < W; ++r)
        std::memcpy(static_cast<char*>(recv) + (r * n + c0) * es, slot(int(r)) + std::size_t(rank()) * c * es, c * es);
      barrier_named("all_to_all");
    }
  }
  void broadcast(void* buf, std::size_t n, DType t, int root, cudaStream_t) override {
    CUTRAIN_CHECK(root >= 0 && root < world_size(), "host communicator: broadcast: root ", root,
                  " is outside world size ", world_size());
    const std::size_t es = dtype_size(t);
    (void)elem_of(t);
    const std::size_t chunk = chunk_elems(es, "broadcast");
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t c = std::min(chunk, n - c0);
      char* p = static_cast<char*>(buf) + c0 * es;
      if (rank() == root) std::memcpy(slot(root), p, c * es);
      barrier_named("broadcast");
      if (rank() != root) std::memcpy(p, slot(root), c * es);
      barrier_named("broadcast");
    }
  }
  void send(const void* buf, std::size_t n, DType t, int peer, cudaStream_t) override {
    check_peer(peer, "send");
    (void)elem_of(t);
    Cursor& cur = cursor(rank(), peer);
    char* ring = ring_of(rank(), peer);
    const std::uint64_t cap = opt_.channel_bytes;
    const char* p = static_cast<const char*>(buf);
    std::size_t left = n * dtype_size(t);
    while (left) {
      std::uint64_t head, free;
      {
        Lock l(*this, "send");
        wait_for([&] { return cur.head - cur.tail < cap; }, {peer}, "send to", l);
        head = cur.head;
        free = cap - (cur.head - cur.tail);
      }
      const std::size_t k = std::size_t(std::min<std::uint64_t>(free, left));
      ring_write(ring, head, p, k);
      Lock l(*this, "send");
      cur.head += k;
      pthread_cond_broadcast(&h_->cv);
      p += k;
      left -= k;
    }
  }
  void recv(void* buf, std::size_t n, DType t, int peer, cudaStream_t) override {
    check_peer(peer, "recv");
    (void)elem_of(t);
    Cursor& cur = cursor(peer, rank());
    char* ring = ring_of(peer, rank());
    char* p = static_cast<char*>(buf);
    std::size_t left = n * dtype_size(t);
    while (left) {
      std::uint64_t tail, avail;
      {
        Lock l(*this, "recv");
        wait_for([&] { return cur.head > cur.tail; }, {peer}, "recv from", l);
        tail = cur.tail;
        avail = cur.head - cur.tail;
      }
      const std::size_t k = std::size_t(std::min<std::uint64_t>(avail, left));
      ring_read(ring, tail, p, k);
      Lock l(*this, "recv");
      cur.tail += k;
      pthread_cond_broadcast(&h_->cv);
      p += k;
      left -= k;
    }
  }
  void barrier(cudaStream_t) override { barrier_named("barrier"); }

 private:
  // The segment's mutex, robust: an owner that died while holding it makes the state suspect,
  // which is an error.
  struct Lock {
    HostCommunicator& c;
    Lock(HostCommunicator& comm, const char* what) : c(comm) {
      const int rc = pthread_mutex_lock(&c.h_->mu);
      if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&c.h_->mu);
        const std::string dead = c.dead_ranks();
        pthread_mutex_unlock(&c.h_->mu);
        CUTRAIN_FAIL("host communicator: rank ", c.rank(), ": ", what, ": a rank died inside the communicator's lock",
                     dead);
      }
      CUTRAIN_CHECK(rc == 0, "host communicator: rank ", c.rank(), ": ", what, ": lock failed: ", std::strerror(rc));
    }
    ~Lock() { pthread_mutex_unlock(&c.h_->mu); }
  };

  void init_header() {
    std::memset(h_, 0, sizeof(Header));
    h_->world = world_size();
    h_->slot_bytes = opt_.slot_bytes;
    h_->channel_bytes = opt_.channel_bytes;
    h_->failed_rank = -1;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h_->mu, &ma);
    for (int r = 0; r < world_size(); ++r) pthread_mutex_init(&h_->life[r], &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h_->cv, &ca);
    pthread_condattr_destroy(&ca);
    reinterpret_cast<std::atomic<std::uint64_t>*>(&h_->magic)->store(kMagic);
  }

  void close() noexcept {
    if (!h_) return;
    if (holding_life_) {
      if (pthread_mutex_lock(&h_->mu) == EOWNERDEAD) pthread_mutex_consistent(&h_->mu);
      h_->state[rank()] = Left;
      pthread_cond_broadcast(&h_->cv);
      pthread_mutex_unlock(&h_->mu);
      pthread_mutex_unlock(&h_->life[rank()]);
    }
    ::munmap(base_, bytes_);
    h_ = nullptr;
    unlink_name();
  }

  char* slot(int r) const { return base_ + slot_off_ + round64(opt_.slot_bytes) * std::size_t(r); }
  Cursor& cursor(int from, int to) const {
    return reinterpret_cast<Cursor*>(base_ + cursor_off_)[std::size_t(from) * world_size() + to];
  }
  char* ring_of(int from, int to) const {
    return base_ + ring_off_ + round64(opt_.channel_bytes) * (std::size_t(from) * world_size() + to);
  }
  // k bytes into / out of a ring at stream position pos (wrapping at the end).
  void ring_write(char* ring, std::uint64_t pos, const char* p, std::size_t k) const {
    const std::size_t at = std::size_t(pos % opt_.channel_bytes), first = std::min(k, opt_.channel_bytes - at);
    std::memcpy(ring + at, p, first);
    std::memcpy(ring, p + first, k - first);
  }
  void ring_read(const char* ring, std::uint64_t pos, char* p, std::size_t k) const {
    const std::size_t at = std::size_t(pos % opt_.channel_bytes), first = std::min(k, opt_.channel_bytes - at);
    std::memcpy(p, ring + at, first);
    std::memcpy(p + first, ring, k - first);
  }

  std::size_t chunk_elems(std::size_t bytes_per_elem, const char* what) const {
    const std::size_t c = opt_.slot_bytes / bytes_per_elem;
    CUTRAIN_CHECK(c > 0, "host communicator: ", what, ": slot_bytes ", opt_.slot_bytes, " holds no element of ",
                  bytes_per_elem, " bytes");
    return c;
  }
  void check_peer(int peer, const char* what) const {
    CUTRAIN_CHECK(peer >= 0 && peer < world_size() && peer != rank(), "host communicator: rank ", rank(), ": ", what,
                  ": expected a peer rank in [0, ", world_size(), ") other than ", rank(), ", found ", peer);
  }

  void reduce_chunks(Elem e, void* buf, std::size_t n, ReduceOp op, const char* what) {
    check_op(op, what);
    const std::size_t es = elem_size(e), W = std::size_t(world_size());
    const std::size_t chunk = chunk_elems(es, what);
    std::vector<const char*> src(W);
    for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
      const std::size_t c = std::min(chunk, n - c0);
      char* p = static_cast<char*>(buf) + c0 * es;
      std::memcpy(slot(rank()), p, c * es);
      barrier_named(what);
      for (std::size_t r = 0; r < W; ++r) src[r] = slot(int(r));
      reduce_into(e, p, src, c, op);
      barrier_named(what);
    }
  }

  // ": rank R (pid P) exited without closing the communicator" for each other rank whose process
  // ended (the one that died holding the lock among them), or "" if none is found. mu held.
  std::string dead_ranks() {
    std::string out;
    for (int r = 0; r < world_size(); ++r) {
      std::string why;
      if (r != rank() && gone(r, &why) && h_->state[r] == Dead) out += ": " + why;
    }
    return out;
  }

  // Whether rank r is gone (its process ended, or it closed its communicator). Called with mu held.
  bool gone(int r, std::string* why) {
    int st = h_->state[r];
    if (st == Alive) {
      const int rc = pthread_mutex_trylock(&h_->life[r]);
      if (rc == EOWNERDEAD) {  // the kernel released it: the owner's process or thread ended
        pthread_mutex_consistent(&h_->life[r]);
        h_->state[r] = st = Dead;
        pthread_mutex_unlock(&h_->life[r]);
      } else if (rc == 0) {
        pthread_mutex_unlock(&h_->life[r]);  // released without Left: only during close()
      }
    }
    if (st == Dead)
      *why = detail::concat("rank ", r, " (pid ", h_->pid[r], ") exited without closing the communicator");
    else if (st == Left)
      *why = detail::concat("rank ", r, " (pid ", h_->pid[r], ") closed its communicator");
    return st == Dead || st == Left;
  }

  // With mu held: throws when a rank recorded a failure, when a rank of `peers` is gone (recording
  // it for the others) or when `start` is more than the timeout ago.
  // `peer`: a send / recv, whose message names its peer ("recv from rank 1: ...").
  void check_peers(const std::vector<int>& peers, const char* what, std::chrono::steady_clock::time_point start,
                   bool peer = false) {
    const std::string who = peer ? " rank " + std::to_string(peers[0]) : std::string();
    if (h_->failed_rank >= 0) CUTRAIN_FAIL("host communicator: rank ", rank(), ": ", what, who, ": ", h_->failure);
    for (int r : peers) {
      std::string why;
      if (!gone(r, &why)) continue;
      h_->failed_rank = r;
      std::snprintf(h_->failure, sizeof h_->failure, "%s (found by rank %d in %s)", why.c_str(), rank(), what);
      pthread_cond_broadcast(&h_->cv);
      CUTRAIN_FAIL("host communicator: rank ", rank(), ": ", what, who, ": ", why);
    }
    if (std::chrono::steady_clock::now() - start > opt_.timeout) {
      std::string missing;
      for (int r : peers) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      CUTRAIN_FAIL("host communicator: rank ", rank(), ": ", what, who, ": timed out after ", opt_.timeout.count(),
                   " ms waiting for rank(s) ", missing);
    }
  }
  // One condition wait of at most `poll` (mu held).
  void timed_wait(const char* what) {
    const timespec ts = deadline_in(opt_.poll);
    const int rc = pthread_cond_timedwait(&h_->cv, &h_->mu, &ts);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&h_->mu);
      CUTRAIN_FAIL("host communicator: rank ", rank(), ": ", what, ": a rank died inside the communicator's lock",
                   dead_ranks());
    }
  }
  // Waits (mu held through the Lock) until done(), checking on `peers` between waits.
  template <typename Done>
  void wait_for(Done done, const std::vector<int>& peers, const char* what, Lock&) {
    const auto start = std::chrono::steady_clock::now();
    while (!done()) {
      check_peers(peers, what, start, /*peer=*/true);
      timed_wait(what);
    }
  }

  void barrier_named(const char* what) {
    Lock l(*this, what);
    const std::uint64_t gen = h_->generation;
    h_->arrived_gen[rank()] = gen + 1;
    if (++h_->arrived == world_size()) {
      h_->arrived = 0;
      ++h_->generation;
      pthread_cond_broadcast(&h_->cv);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::string label = std::string(what) + " (a barrier)";
    std::vector<int> missing;
    while (h_->generation == gen) {
      missing.clear();  // the ranks not yet in this barrier
      for (int r = 0; r < world_size(); ++r)
        if (h_->arrived_gen[r] != gen + 1) missing.push_back(r);
      check_peers(missing, label.c_str(), start);
      timed_wait(label.c_str());
    }
  }

  HostCommOptions opt_;
  std::string name_;
  bool owner_ = false, holding_life_ = false;
  char* base_ = nullptr;
  Header* h_ = nullptr;
  std::size_t bytes_ = 0, cursor_off_ = 0, slot_off_ = 0, ring_off_ = 0;
};

std::string fresh_name() {
  std::random_device rd;
  char b[64];
  std::snprintf(b, sizeof b, "/cutrain-host-%d-%08x%08x", int(::getpid()), rd(), rd());
  return b;
}

}  // namespace

std::unique_ptr<Communicator> create_host_communicator(const LaunchEnv& env, const HostCommOptions& o) {
  CUTRAIN_CHECK(env.world_size >= 1 && env.world_size <= kHostCommMaxWorld, "host communicator: world size ",
                env.world_size, ": expected 1..", kHostCommMaxWorld);
  CUTRAIN_CHECK(o.slot_bytes >= 64 && o.channel_bytes >= 64, "host communicator: slot_bytes ", o.slot_bytes,
                " and channel_bytes ", o.channel_bytes, ": expected at least 64 each");
  auto c = std::make_unique<HostCommunicator>(env, o);
  std::vector<char> blob;
  if (env.rank == 0) {
    const std::string name = fresh_name();
    c->open(name, /*create=*/true);
    blob.assign(name.begin(), name.end());
  }
  if (env.world_size > 1) blob = rendezvous_broadcast(env, blob, o.timeout);
  if (env.rank != 0) c->open(std::string(blob.begin(), blob.end()), /*create=*/false);
  c->barrier(nullptr);  // every rank has mapped the segment: its name can go
  c->unlink_name();
  return c;
}

}  // namespace cutrain::comm
