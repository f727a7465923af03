// @brief Internal to the cross-entropy family: the row kernel's schedules, the production pick
// among them, and the host-side geometry each needs (slice buffers per CTA, their shared memory,
// the persistent grid). Plain C++ so the CPU tests check the kernel's own arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cutrain::kernels::ce {

// How ce_row_kernel's clusters walk the rows (the per-row math, and so every bit of the result, is
// the same in all three):
//   PerRow: one cluster per row, rows * CTAs-per-row CTAs; each CTA loads, reduces and writes its
//     slice once and exits (one slice buffer).
//   Persistent: as many clusters as are resident at once, each looping over the rows
//     cluster, cluster + clusters, ...; two slice buffers per CTA, so the next row's bulk load is in
//     flight while the current row is reduced and its gradient written by per-thread stores.
//   PersistentBulkStore: Persistent, with the gradient written into the slice buffer and sent to
//     global memory by one TMA bulk store (cp.async.bulk shared -> global); three buffers, so the
//     buffer the next load overwrites held a row whose store was issued a whole row earlier.
enum class Schedule { PerRow, Persistent, PersistentBulkStore };
inline constexpr Schedule kSchedules[] = {Schedule::PerRow, Schedule::Persistent, Schedule::PersistentBulkStore};

constexpr const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::PerRow: return "per_row";
    case Schedule::Persistent: return "persistent";
    case Schedule::PersistentBulkStore: return "persistent_bulk_store";
  }
  return "?";
}

constexpr bool is_persistent(Schedule s) { return s != Schedule::PerRow; }
constexpr int slice_buffers(Schedule s) {
  return s == Schedule::PerRow ? 1 : s == Schedule::Persistent ? 2 : 3;
}

// The cluster size is 1..kMaxSplit (cross_entropy_ctas_per_row); the static shared memory of the
// row kernel is kept under kStaticSmemBytes (the launcher checks the compiled kernel's figure).
inline constexpr int kMaxSplit = 8;
inline constexpr int kStaticSmemBytes = 1024;

// The production schedule by CTAs per row (index 1..kMaxSplit; 0 unused): a function of the
// vocabulary alone. Set from bench_k3's same-call comparison of the schedules (docs/perf-notes.md,
// "Cross-entropy"); until that runs on a device every entry is today's PerRow.
inline constexpr Schedule kProductionSchedule[kMaxSplit + 1] = {
    Schedule::PerRow, Schedule::PerRow, Schedule::PerRow, Schedule::PerRow, Schedule::PerRow,
    Schedule::PerRow, Schedule::PerRow, Schedule::PerRow, Schedule::PerRow};

constexpr Schedule production_schedule(int ctas_per_row) {
  return kProductionSchedule[ctas_per_row < 1 ? 1 : ctas_per_row > kMaxSplit ? kMaxSplit : ctas_per_row];
}

// What one CTA of the row kernel holds in shared memory under a schedule: `buffers` slice buffers
// of `park_vecs` 16-byte vectors each (the whole slice, `slice_vecs`, unless the device's opt-in
// maximum less the static part cannot hold `buffers` of them: then each buffer parks its first
// park_vecs vectors and the rest of the slice is read from global memory in every pass: the
// long-row fallback). dynamic_smem_bytes = buffers * park_vecs * 16.
struct RowGeometry {
  int buffers;
  int park_vecs;
  std::size_t dynamic_smem_bytes;
};

// slice_vecs: ce::slice_vecs(vocab, split) (cross_entropy_slice.h); smem_optin: the device's
// cudaDevAttrMaxSharedMemoryPerBlockOptin.
constexpr RowGeometry row_geometry(int slice_vecs, Schedule s, int smem_optin) {
  const int buffers = slice_buffers(s);
  const int budget = smem_optin > kStaticSmemBytes ? (smem_optin - kStaticSmemBytes) / 16 / buffers : 0;
  const int park = slice_vecs < budget ? slice_vecs : budget;
  return {buffers, park, static_cast<std::size_t>(buffers) * static_cast<std::size_t>(park) * 16u};
}

// The grid of a schedule, in clusters: one per row for PerRow; for the persistent ones the clusters
// resident at once (cudaOccupancyMaxActiveClusters), never more than the rows.
constexpr int grid_clusters(Schedule s, int rows, int max_active_clusters) {
  if (!is_persistent(s)) return rows;
  return rows < max_active_clusters ? rows : max_active_clusters;
}

// The rows cluster `cluster` of `clusters` processes: cluster, cluster + clusters, ... < rows.
constexpr int rows_of_cluster(int rows, int clusters, int cluster) {
  return cluster < rows ? (rows - cluster + clusters - 1) / clusters : 0;
}

// The persistent ring (used by the kernel, checked on the CPU): a cluster's k-th row (k = 0, 1, ...)
// lands in buffer ring_buffer(k), the ring_fill(k)-th fill of that buffer, whose mbarrier phase has
// parity ring_fill(k) & 1. Row k + 1's copy is started at the top of row k, into the buffer that
// last held row k + 1 - buffers; with the bulk store, thread 0 commits one bulk group at the end of
// every row, so when row k + 1's copy starts, the groups committed after that row's store are
// store_groups_after(buffers) = buffers - 2: waiting until at most that many are still reading
// leaves that store done with the buffer.
constexpr int ring_buffer(int k, int buffers) { return k % buffers; }
constexpr int ring_fill(int k, int buffers) { return k / buffers; }
constexpr unsigned ring_parity(int k, int buffers) { return static_cast<unsigned>(ring_fill(k, buffers)) & 1u; }
constexpr int store_groups_after(int buffers) { return buffers - 2; }

}  // namespace cutrain::kernels::ce
