// @brief Internal to the attention family: BERT's options (kernels/attention.cuh AttentionOptions)
// on mma fragments. The key mask of a streamed key tile as per-warp bit words (one ballot per 32
// keys, its bytes fetched one tile ahead), and the dropout keep bits of a thread's fragment
// elements, drawn from the Philox words the spec fixes (element e = ((b*H + h)*S + i)*S + j uses
// word e % 4 of dropout_bits(key, e / 4)) with each call shared by the lanes that hold its 4 keys.
// Every function here that shuffles must be called by all 32 lanes.
#pragma once

#include <cstdint>

#include "kernels/attention_tiles.cuh"
#include "kernels/common/philox.cuh"

namespace cutrain::kernels::attn {

// What the kernels take of AttentionOptions: the mask, the key with its step already resolved on
// the device (resolve_step), the keep threshold and 1 / (1 - p).
struct OptionArgs {
  const std::uint8_t* key_mask = nullptr;
  DropoutKey key{};
  std::uint32_t threshold = 0;
  float drop_scale = 1.f;

  // The key with *step_ptr read once (per thread) and step_ptr cleared, so dropout_bits on it
  // compiles to the bare Philox call.
  __device__ __forceinline__ DropoutKey resolve_step() const {
    DropoutKey k = key;
    k.step = dropout_step(key);
    k.step_ptr = nullptr;
    return k;
  }
};

// Host: the kernels' view of `options` (throws cutrain::Error for p outside [0, 1)).
OptionArgs option_args(const AttentionOptions& options);

// The key mask of the streamed key tiles (BN keys each) of one sequence, for one warp: load(j)
// fetches tile j's bytes into registers (lane l: keys 32w + l of the tile), take() turns what was
// fetched into bit words (bit c of word c / 32: key n0 + c may be attended; keys at or past S: 0).
// Issuing load(j + 1) right after take() of tile j hides its latency behind tile j's math.
template <int BN>
struct KeyMaskTiles {
  static constexpr int kWords = (BN + 31) / 32;
  const std::uint8_t* mask;  // the sequence's S bytes
  int seq;
  bool next[kWords];

  __device__ __forceinline__ void load(int j) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      const int c = 32 * w + lane, col = j * BN + c;
      next[w] = c < BN && col < seq && __ldg(mask + col) != 0;
    }
  }
  __device__ __forceinline__ void take(std::uint32_t (&bits)[kWords]) const {
#pragma unroll
    for (int w = 0; w < kWords; ++w) bits[w] = __ballot_sync(0xffffffffu, next[w]);
  }
};

template <int W>
__device__ __forceinline__ bool any_key(const std::uint32_t (&bits)[W]) {
  std::uint32_t a = 0;
#pragma unroll
  for (int w = 0; w < W; ++w) a |= bits[w];
  return a != 0;
}
// Key c of the tile (0 <= c < BN) may be attended.
template <int W>
__device__ __forceinline__ bool key_ok(const std::uint32_t (&bits)[W], int c) {
  return (bits[c >> 5] >> (c & 31)) & 1u;
}

// The last key below `limit` that `mask` (one sequence's bytes) lets be attended, -1 for none; all
// kThreads threads of the CTA call it (two CTA barriers) and get the same answer. (The sm90
// forward and dQ pass stream no K/V tile past it.)
template <int kThreads>
__device__ __forceinline__ int last_valid_key(const std::uint8_t* __restrict__ mask, int limit) {
  __shared__ int last;
  if (threadIdx.x == 0) last = -1;
  __syncthreads();
  int mine = -1;
  for (int j = threadIdx.x; j < limit; j += kThreads)
    if (__ldg(mask + j) != 0) mine = j;
  mine = __reduce_max_sync(0xffffffffu, mine);
  if ((threadIdx.x & 31) == 0 && mine >= 0) atomicMax(&last, mine);
  __syncthreads();
  return last;
}

// The same answer from one warp alone (all 32 lanes call it; no CTA barrier, so a persistent
// CTA's warps each find it for their own work tile). It scans from the end in windows of 128 keys
// and stops at the first window holding a valid key: one window where only padding trails.
__device__ __forceinline__ int last_valid_key_warp(const std::uint8_t* __restrict__ mask, int limit) {
  const int lane = threadIdx.x & 31;
  for (int end = limit; end > 0; end -= 128) {
    int mine = -1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // the four loads independent; the highest valid key stays
      const int j = end - 128 + 32 * k + lane;
      if (j >= 0 && __ldg(mask + j) != 0) mine = j;
    }
    mine = __reduce_max_sync(0xffffffffu, mine);
    if (mine >= 0) return mine;
  }
  return -1;
}

// Bit w: word w of a Philox draw is kept.
__device__ __forceinline__ std::uint32_t keep_nibble(const PhiloxWords& r, std::uint32_t thr) {
  return static_cast<std::uint32_t>(dropout_keep(r.w[0], thr)) | static_cast<std::uint32_t>(dropout_keep(r.w[1], thr)) << 1 |
         static_cast<std::uint32_t>(dropout_keep(r.w[2], thr)) << 2 | static_cast<std::uint32_t>(dropout_keep(r.w[3], thr)) << 3;
}
// Word i (0..3, run-time) of a draw, by selects (an indexed register array would go to local memory).
__device__ __forceinline__ std::uint32_t philox_word(const PhiloxWords& r, unsigned i) {
  return i == 0 ? r.w[0] : i == 1 ? r.w[1] : i == 2 ? r.w[2] : r.w[3];
}

// Dropout keep bits of this thread's elements in one C-fragment row of NT n-tiles whose rows are
// queries and columns keys (forward, dQ pass): bit 2n + c is the key n0 + 8n + 2t + c.
// row_e: the element index of (this row, key 0), ((b*H + h)*S + i)*S. aligned: S % 4 == 0 (then
// every row starts a Philox group); it must be warp-uniform.
// The lane pair (t, t^1) holds keys 8n + 4(t>>1) .. +3 of n-tile n. Aligned, these are one Philox
// group: the pair draws alternate n-tiles and swaps keep nibbles (NT/2 draws per lane). Otherwise
// they span groups G and G+1 (G = first / 4): lane t&1 draws G + (t&1) and the pair ORs its nibbles.
template <int NT>
__device__ __forceinline__ std::uint32_t row_keep_bits(const DropoutKey& key, std::uint32_t thr, std::uint64_t row_e,
                                                       int n0, bool aligned) {
  static_assert(NT <= 8 && NT % 2 == 0, "a row's keep nibbles must fit one 32-bit word");
  const int t = threadIdx.x & 3, o = t & 1;
  const std::uint64_t first = row_e + n0 + 4 * (t >> 1);  // the pair's first key, n-tile 0
  std::uint32_t nibs = 0;                                  // nibble n: keys 8n + 4(t>>1) .. +3
  if (aligned) {
    std::uint32_t own = 0;
#pragma unroll
    for (int np = 0; np < NT / 2; ++np)  // this lane: n-tile 2np + o
      own |= keep_nibble(dropout_bits(key, (first + 8 * o + 16 * np) >> 2), thr) << (8 * np);
    own <<= 4 * o;
    nibs = own | __shfl_xor_sync(0xffffffffu, own, 1);
  } else {
    const unsigned a = static_cast<unsigned>(first & 3);  // the same for every n-tile (8n % 4 == 0)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const std::uint32_t kw = keep_nibble(dropout_bits(key, ((first + 8 * n) >> 2) + o), thr);
      // Key k of the 4 is word a + k of group G (k < 4 - a) or word k - (4 - a) of group G + 1.
      nibs |= (o ? (kw << (4 - a)) & 0xFu : kw >> a) << (4 * n);
    }
    nibs |= __shfl_xor_sync(0xffffffffu, nibs, 1);
  }
  nibs >>= 2 * o;  // this lane's keys: bits 2o, 2o + 1 of each nibble
  std::uint32_t bits = 0;
#pragma unroll
  for (int n = 0; n < NT; ++n) bits |= ((nibs >> (4 * n)) & 3u) << (2 * n);
  return bits;
}

// Dropout keep bits of this thread's elements of a transposed fragment (rows keys, columns
// queries: P^T in the dK/dV pass) of NT n-tiles: bit 4n + e is element e of n-tile n, key
// key_base + 8(e>>1) and query m0 + 8n + 2t + (e&1), key_base = (a multiple of 4) + gi.
// bh_e = (b*H + h)*S. aligned: S % 4 == 0, warp-uniform.
// Aligned, keys 4m .. 4m+3 (gi = 4m + k) of one query are one Philox group, held by the 4 lanes
// k = gi & 3 (same t). Of the 4 (query c, key half h) groups those lanes need per n-tile, lane k
// draws pair k = 2h + c; each lane then gathers bit k of pair e's nibble from lane k' = e.
template <int NT>
__device__ __forceinline__ std::uint32_t transposed_keep_bits(const DropoutKey& key, std::uint32_t thr,
                                                              std::uint64_t bh_e, int S, int key_base, int m0,
                                                              bool aligned) {
  static_assert(NT <= 8, "the keep bits must fit one 32-bit word");
  const int lane = threadIdx.x & 31, t = lane & 3, k = (lane >> 2) & 3;
  std::uint32_t bits = 0;
  if (aligned) {
    const int c = k & 1, h = k >> 1;
    const int key0 = key_base - k + 8 * h;  // the group's first key
    std::uint32_t mine = 0;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const std::uint64_t e = (bh_e + static_cast<std::uint64_t>(m0 + 8 * n + 2 * t + c)) * S + key0;
      mine |= keep_nibble(dropout_bits(key, e >> 2), thr) << (4 * n);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const std::uint32_t y = __shfl_sync(0xffffffffu, mine, (lane & ~0xC) | (e << 2)) >> k;
#pragma unroll
      for (int n = 0; n < NT; ++n) bits |= ((y >> (4 * n)) & 1u) << (4 * n + e);
    }
  } else {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::uint64_t el =
            (bh_e + static_cast<std::uint64_t>(m0 + 8 * n + 2 * t + (e & 1))) * S + key_base + 8 * (e >> 1);
        const std::uint32_t w = philox_word(dropout_bits(key, el >> 2), static_cast<unsigned>(el & 3));
        bits |= static_cast<std::uint32_t>(dropout_keep(w, thr)) << (4 * n + e);
      }
  }
  return bits;
}

// to_a_frags (attention_tiles.cuh) of the kept elements only: element e of n-tile n passes where
// bit 4n + e of `keep` is set (transposed_keep_bits' order), else it becomes 0.
template <typename E, int K>
__device__ __forceinline__ void to_a_frags_kept(std::uint32_t (&p)[K / 16][4], const float (&c)[K / 8][4],
                                                std::uint32_t keep) {
  auto kept = [&](int n, int e) { return (keep >> (4 * n + e)) & 1u ? c[n][e] : 0.f; };
#pragma unroll
  for (int j = 0; j < K / 16; ++j) {
    p[j][0] = mma::pack2<E>(kept(2 * j, 0), kept(2 * j, 1));
    p[j][1] = mma::pack2<E>(kept(2 * j, 2), kept(2 * j, 3));
    p[j][2] = mma::pack2<E>(kept(2 * j + 1, 0), kept(2 * j + 1, 1));
    p[j][3] = mma::pack2<E>(kept(2 * j + 1, 2), kept(2 * j + 1, 3));
  }
}

}  // namespace cutrain::kernels::attn
