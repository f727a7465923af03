#include "locked_memory.h"

#include <nanobind/stl/string.h>

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "runtime/allocator.h"
#include "runtime/error.h"

namespace cutrain::python {

namespace {
constexpr std::size_t kAlign = 4096;

bool have_cuda_device() {
  static const bool yes = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return yes;
}

// The live blocks of new_locked_tensor (is_locked asks).
std::mutex live_m;
std::set<const void*> live;

struct Block {
  void* p = nullptr;
  std::size_t bytes = 0;
  bool pinned = false;
};

Block allocate(std::size_t bytes, const char* op) {
  Block b;
  b.bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (b.bytes == 0) b.bytes = kAlign;
  if (have_cuda_device()) {
    b.p = pinned_allocator().allocate(b.bytes);
    b.pinned = true;
  } else {
    if (posix_memalign(&b.p, kAlign, b.bytes) != 0)
      CUTRAIN_FAIL(op, ": cannot allocate ", b.bytes, " bytes of host memory");
    if (::mlock(b.p, b.bytes) != 0) {
      const int e = errno;
      std::free(b.p);
      rlimit rl{};
      ::getrlimit(RLIMIT_MEMLOCK, &rl);
      CUTRAIN_FAIL(op, ": mlock of ", b.bytes, " bytes failed: ", std::strerror(e), " (no CUDA device, so the ",
                   "memory is locked with mlock; RLIMIT_MEMLOCK is ", rl.rlim_cur, " bytes: raise it with ulimit -l)");
    }
  }
  std::lock_guard<std::mutex> g(live_m);
  live.insert(b.p);
  return b;
}

void release(void* raw) noexcept {
  auto* b = static_cast<Block*>(raw);
  {
    std::lock_guard<std::mutex> g(live_m);
    live.erase(b->p);
  }
  try {
    if (b->pinned) {
      pinned_allocator().deallocate(b->p);
    } else {
      ::munlock(b->p, b->bytes);
      std::free(b->p);
    }
  } catch (...) {
    // A destructor path (the tensor's owner): nothing to report to.
  }
  delete b;
}
}  // namespace

nb::object new_locked_tensor(std::size_t num_elem, nb::dlpack::dtype dtype, bool torch, const char* op) {
  const std::size_t bytes = num_elem * ((dtype.bits + 7) / 8);
  auto* b = new Block(allocate(bytes, op));
  nb::capsule owner(b, [](void* p) noexcept { release(p); });
  const std::size_t shape[1] = {num_elem};
  if (torch)
    return nb::ndarray<nb::pytorch>(b->p, 1, shape, owner, nullptr, dtype, nb::device::cpu::value).cast();
  if (dtype.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    throw nb::type_error((std::string(op) + ": NumPy has no bfloat16; pass a torch tensor as the example").c_str());
  return nb::ndarray<nb::numpy>(b->p, 1, shape, owner, nullptr, dtype, nb::device::cpu::value).cast();
}

bool is_locked(const void* p) {
  {
    std::lock_guard<std::mutex> g(live_m);
    if (live.count(p)) return true;
  }
  if (!have_cuda_device()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace cutrain::python
