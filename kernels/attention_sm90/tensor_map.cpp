// @brief Host side of the sm90 attention pair: argument checks, the tensor-map geometry
// of qkv and of [B, S, H, D] rows (dO), and its encoding through the driver's cuTensorMapEncodeTiled (reached through the
// runtime's driver entry point, so nothing links libcuda directly).
#include "kernels/attention_sm90/tensor_map.h"

#include <cudaTypedefs.h>

#include <cstdint>

#include <string>
#include <type_traits>

#include "kernels/attention_sm90/attention_sm90.h"
#include "runtime/check.h"
#include "runtime/error.h"

namespace cutrain::kernels::sm90 {

namespace {

// The shape checks both directions make (head_dim, sizes, grid and TMA limits).
void check_shape(const AttentionShape& sh, const char* who) {
  CUTRAIN_CHECK(sh.head_dim == 64 || sh.head_dim == 128, who, ": head_dim must be 64 or 128, got ", sh.head_dim);
  CUTRAIN_CHECK(sh.batch >= 1 && sh.seq >= 1 && sh.heads >= 1, who, ": batch, seq and heads must be >= 1, got batch=",
                sh.batch, " seq=", sh.seq, " heads=", sh.heads);
  CUTRAIN_CHECK(sh.heads <= 65535 && sh.batch <= 65535, who,
                ": heads and batch must be <= 65535 (grid y/z), got heads=", sh.heads, " batch=", sh.batch);
  // The forward and the dQ pass number their work tiles (128 queries of one batch and head) with an
  // int (a 1-D grid: the persistent and causal launches).
  const std::uint64_t work_tiles = (static_cast<std::uint64_t>(sh.seq) + 127) / 128 * sh.heads * sh.batch;
  CUTRAIN_CHECK(work_tiles < (1ull << 31), who, ": ceil(seq / 128) * heads * batch must be under 2^31, got ",
                work_tiles, " (seq=", sh.seq, " heads=", sh.heads, " batch=", sh.batch, ")");
  // The TMA's coordinates are int32 and its strides below 2^40 bytes.
  const std::uint64_t batch_stride = 2ull * sh.seq * 3 * sh.heads * sh.head_dim;
  CUTRAIN_CHECK(batch_stride < (1ull << 40), who, ": one sequence of qkv must be under 2^40 bytes, got ", batch_stride,
                " (seq=", sh.seq, " heads=", sh.heads, " head_dim=", sh.head_dim, ")");
}

}  // namespace

void check_forward_args(const void* qkv, const void* out, const float* lse, const AttentionShape& sh) {
  const char* who = "attention_forward";
  check_shape(sh, who);
  CUTRAIN_CHECK(qkv && out && lse, who, ": qkv, out and lse must be non-null, got qkv=", qkv,
                " out=", out, " lse=", static_cast<const void*>(lse));
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0, who,
                ": qkv must be 16-byte aligned (tensor-copy engine), got ", qkv);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(out) % 16 == 0, who,
                ": out must be 16-byte aligned (O is stored in 16-byte pieces), got ", out);
  CUTRAIN_CHECK(reinterpret_cast<std::uintptr_t>(lse) % 4 == 0, who, ": lse must be 4-byte aligned, got ",
                static_cast<const void*>(lse));
}

void check_backward_args(const void* qkv, const void* out, const void* dout, const float* lse, const void* dqkv,
                         const void* scratch, const AttentionShape& sh) {
  const char* who = "attention_backward";
  check_shape(sh, who);
  CUTRAIN_CHECK(qkv && out && dout && lse && dqkv && scratch, who,
                ": qkv, out, dout, lse, dqkv and scratch must be non-null, got qkv=", qkv,
                " out=", out, " dout=", dout,
                " lse=", static_cast<const void*>(lse), " dqkv=", dqkv, " scratch=", scratch);
  const auto misaligned = [](const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a != 0; };
  CUTRAIN_CHECK(!misaligned(qkv, 16) && !misaligned(dout, 16), who,
                ": qkv and dout must be 16-byte aligned (tensor-copy engine), got qkv=", qkv,
                " dout=", dout);
  CUTRAIN_CHECK(!misaligned(scratch, 16), who, ": scratch must be 16-byte aligned, got ", scratch);
  CUTRAIN_CHECK(!misaligned(dqkv, 16), who,
                ": dqkv must be 16-byte aligned (dQ, dK and dV are stored in 16-byte pieces), got ", dqkv);
  CUTRAIN_CHECK(!misaligned(out, 16), who, ": out must be 16-byte aligned (read in 16-byte pieces, as the forward stores it), got ",
                out);
  CUTRAIN_CHECK(!misaligned(lse, 4), who, ": lse must be 4-byte aligned, got ", static_cast<const void*>(lse));
}

void check_device(const char* who, std::uint32_t smem_bytes) {
  int dev = 0, major = 0, minor = 0, optin = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CUTRAIN_CHECK(major == 9 && minor == 0, who, ": needs a compute capability 9.0 device (sm_90a code: H100/H200), device ",
                dev, " is ", major, ".", minor);
  CUTRAIN_CHECK(static_cast<std::uint32_t>(optin) >= smem_bytes, who, ": needs ", smem_bytes,
                " bytes of shared memory per block, device ", dev, " offers ", optin);
}

int multiprocessors() {
  int dev = 0, sms = 0;
  CUTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  CUTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

void check_register_pool(const void* kernel, int threads, int need, const char* who) {
  cudaFuncAttributes a{};
  CUTRAIN_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
  CUTRAIN_CHECK(a.numRegs * threads >= need, who, ": the kernel was built with ", a.numRegs, " registers a thread, ",
                a.numRegs * threads, " for its ", threads, " threads; its setmaxnreg counts need ", need);
}

QkvTmaGeometry rows_tma_geometry(const AttentionShape& sh, int slots, int box_rows) {
  CUTRAIN_CHECK(box_rows >= 1 && box_rows <= 256, "rows_tma_geometry: box_rows must lie in [1, 256], got ", box_rows);
  CUTRAIN_CHECK(slots == 1 || slots == 3, "rows_tma_geometry: slots must be 1 ([B, S, H, D]) or 3 (qkv), got ", slots);
  const std::uint64_t D = sh.head_dim, H = sh.heads, S = sh.seq, B = sh.batch, W = slots, e = 2;  // bf16 / fp16
  QkvTmaGeometry g{};
  const std::uint64_t dims[5] = {D, H, W, S, B};
  const std::uint64_t strides[4] = {D * e, H * D * e, W * H * D * e, S * W * H * D * e};
  const std::uint32_t box[5] = {64, 1, 1, static_cast<std::uint32_t>(box_rows), 1};
  for (int i = 0; i < 5; ++i) g.dims[i] = dims[i], g.box[i] = box[i];
  for (int i = 0; i < 4; ++i) g.strides[i] = strides[i];
  return g;
}

QkvTmaGeometry qkv_tma_geometry(const AttentionShape& sh, int box_rows) {
  return rows_tma_geometry(sh, 3, box_rows);
}

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_entry() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUTRAIN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    CUTRAIN_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr,
                  "attention (sm90): the driver has no cuTensorMapEncodeTiled (query result ", static_cast<int>(q), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A tiled map with the pair's settings: every element stride 1, the 128-byte swizzle, 256-byte L2
// promotion, zero fill out of bounds. `what` names the map in the error.
CUtensorMap encode_tiled(CUtensorMapDataType type, cuuint32_t rank, void* base, const cuuint64_t* dims,
                         const cuuint64_t* strides, const cuuint32_t* box, const AttentionShape& sh,
                         const std::string& what) {
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode_entry()(&map, type, rank, base, dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CUTRAIN_CHECK(r == CUDA_SUCCESS, "attention (sm90): cuTensorMapEncodeTiled (", what, ") failed with CUresult ",
                static_cast<int>(r), " (batch=", sh.batch, " seq=", sh.seq, " heads=", sh.heads,
                " head_dim=", sh.head_dim, ")");
  return map;
}

}  // namespace

template <typename E>
CUtensorMap encode_rows_map(const E* base, const AttentionShape& sh, int slots, int box_rows) {
  static_assert(std::is_same_v<E, bf16> || std::is_same_v<E, f16>, "bf16 or f16");
  constexpr CUtensorMapDataType kType =
      std::is_same_v<E, bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const QkvTmaGeometry g = rows_tma_geometry(sh, slots, box_rows);
  return encode_tiled(kType, 5, const_cast<E*>(base), g.dims, g.strides, g.box, sh,
                      "slots=" + std::to_string(slots) + " box_rows=" + std::to_string(box_rows));
}

template <typename E>
CUtensorMap encode_qkv_map(const E* qkv, const AttentionShape& sh, int box_rows) {
  return encode_rows_map(qkv, sh, 3, box_rows);
}

CUtensorMap encode_dq_acc_map(float* dq_acc, const AttentionShape& sh) {
  const std::uint64_t D = sh.head_dim, H = sh.heads, S = sh.seq, B = sh.batch, e = 4;
  const cuuint64_t dims[4] = {D, H, S, B};
  const cuuint64_t strides[3] = {D * e, H * D * e, S * H * D * e};
  const cuuint32_t box[4] = {32, 1, 64, 1};
  return encode_tiled(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, dq_acc, dims, strides, box, sh, "dQ accumulator");
}

template CUtensorMap encode_rows_map<bf16>(const bf16*, const AttentionShape&, int, int);
template CUtensorMap encode_rows_map<f16>(const f16*, const AttentionShape&, int, int);
template CUtensorMap encode_qkv_map<bf16>(const bf16*, const AttentionShape&, int);
template CUtensorMap encode_qkv_map<f16>(const f16*, const AttentionShape&, int);

}  // namespace cutrain::kernels::sm90
