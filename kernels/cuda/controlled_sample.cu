// Controlled sampling, materialized path (what and why: controlled_sample.h).
// Reads top to bottom: the order-preserving keys and the kept-prefix "cut",
// the cluster-wide building blocks (reductions, radix selects by count and by
// mass, the sample draw), the row kernel, host flattening of the controls, the
// launchers.
#include "kernels/cuda/controlled_sample.h"

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "kernels/common/candidate_order_key.h"
#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/logits_gemm.h"
#include "kernels/cuda/sample_reduce.cuh"

namespace flashsampler::kernels {
namespace {

using cuda_internal::DeviceGumbelNoise;
using cuda_internal::DeviceLogitScale;
using cuda_internal::kFullWarpMask;
using cuda_internal::StatusFromCuda;

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---- Keys and cuts ---------------------------------------------------------------
// DescKey(x) ascends as x descends: the canonical order (l' desc, id asc) is
// (DescKey asc, id asc). -0 is folded into +0 (the CPU compares them equal, so
// they tie and go by id).
__device__ __forceinline__ uint32_t DescKey(float x) { return ~OrderedFloatBits(x); }

__device__ __forceinline__ float FloatOfDescKey(uint32_t d) { return FloatOfOrderedBits(~d); }

// A prefix of the canonical order: token (key d, id i) is kept iff
// d < key || (d == key && i <= id).
struct Cut {
  uint32_t key;
  int32_t id;
};

__device__ __forceinline__ bool Kept(uint32_t d, int32_t i, Cut c) {
  return d < c.key || (d == c.key && i <= c.id);
}

// Every token with a value above -inf (the l' buffer holds -inf for every
// non-finite value).
__device__ __forceinline__ Cut AllFinite() { return Cut{DescKey(-INFINITY), -1}; }

// ---- Exact sums of masses ------------------------------------------------------
// log Z sums m_i = exp(double(l'_i) - max) over a row's kept tokens, each in
// (0, 1]. A float64 sum would round after every addition, so its bits would
// depend on how the tokens are split over threads, blocks and the cluster
// (whose size is chosen per batch): log Z could move by a rounding with the
// batch. Instead each m_i is rounded down to a multiple of 2^-96 and summed
// as a 128-bit integer, which is exact, so the sum is the same for every
// split and order. Dropped: < 2^-96 per token, below 2^-64 of the largest
// term (1) for any vocabulary under 2^32; the sum is < 2^31, so it fits.
// It is turned into a double only once, at the end.
constexpr int kMassFracBits = 96;

// Trivial (cub keeps it in unions): value-initialize, ExactMass{}, for zero.
struct ExactMass {
  unsigned long long lo;  // bits 0..63 of the 128-bit fixed-point value
  unsigned long long hi;  // bits 64..127
};

struct MassSum {
  __device__ ExactMass operator()(ExactMass a, ExactMass b) const {
    ExactMass r{};
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);  // the carry of the low words
    return r;
  }
};

// floor(m * 2^96) for m in [0, 1] (NaN, negatives and zero: 0). From the
// bits: m = f * 2^(E - 1075) with the 53-bit significand f and the biased
// exponent E, so m * 2^96 is f shifted by E - 979 (<= 44 for m <= 1).
// Subnormal m (E = 0) are far below 2^-96: 0.
__device__ __forceinline__ ExactMass MassOf(double m) {
  ExactMass r{};
  if (!(m > 0.0)) return r;
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(m));
  const int biased = static_cast<int>(bits >> 52);  // sign bit 0: m > 0
  const unsigned long long f = (bits & ((1ull << 52) - 1)) | (1ull << 52);
  const int shift = biased - 1075 + kMassFracBits;
  if (shift >= 64 || shift <= -64) return r;  // m >= 2^32 is not a mass; below 2^-96: 0
  if (shift > 0) {
    r.lo = f << shift;
    r.hi = f >> (64 - shift);
  } else {
    r.lo = f >> (-shift);
  }
  return r;
}

// The sum as a double (one deterministic rounding per word: a function of
// the exact sum only).
__device__ __forceinline__ double MassToDouble(ExactMass v) {
  return ldexp(__ull2double_rn(v.hi), 64 - kMassFracBits) + ldexp(__ull2double_rn(v.lo), -kMassFracBits);
}

// ---- Cluster-wide building blocks ---------------------------------------------
// A row is served by a cluster of G blocks (G = 1, 2, 4, 8 or 16; one block
// per cluster when G = 1): block `rank` sweeps the 4-aligned slice [lo, hi) of
// the row, and every reduction combines the blocks' partial results in rank
// order through distributed shared memory, so all blocks of the cluster get
// the same value and the result does not depend on timing (deterministic).
// Histograms hold integers (order-free). Every helper is called by all threads
// of all blocks of the cluster with uniform arguments and returns the same
// value to all of them. Cluster barriers dominate a small batch's time, so
// each helper uses as few as its shared-memory reuse allows (the reasoning is
// next to each); a block that read another's shared memory passes one more
// barrier before it exits.
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;  // 11-bit digits; levels: bits 31..21, 20..10, 9..0
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kLevels = 3;
constexpr int kMaxCluster = 16;  // a non-portable cluster size (sm_90 allows 16)
__device__ __constant__ int kLevelShift[kLevels] = {21, 10, 0};
__device__ __constant__ uint32_t kLevelMask[kLevels] = {0x7ffu, 0x7ffu, 0x3ffu};

// The outcome of one radix-descent level (PickBin): the crossing digit (-1:
// none), its count of tokens, the weight before it, and the level's total.
struct BinPick {
  int bin;
  int count;
  unsigned long long before;
  unsigned long long total;
};

struct Shared {
  union {
    cub::BlockReduce<float, kThreads>::TempStorage reduce_float;
    cub::BlockReduce<int, kThreads>::TempStorage reduce_int;
    cub::BlockReduce<ExactMass, kThreads>::TempStorage reduce_mass;
    cub::BlockScan<int, kThreads>::TempStorage scan_int;
    cub::BlockScan<unsigned long long, kThreads>::TempStorage scan_u64;
  } cub;
  // Two histogram buffers, used by alternate radix-descent levels (see
  // Histogram for why two). A bin's fixed-point mass is mass_hi * 2^32 +
  // mass_lo: two native 32-bit shared atomics per token (the carry out of the
  // low word goes to the high one), where a 64-bit shared atomicAdd compiles
  // to a compare-and-swap loop on sm_90 (ATOMS.CAST.SPIN.64), contended on the
  // few bins most logits fall into. A block's bin sum is < 2^63, so mass_hi
  // never wraps.
  unsigned int count[2][kBins];
  unsigned int mass_lo[2][kBins];
  unsigned int mass_hi[2][kBins];
  // Broadcast slots inside the block.
  float f;
  int i0;
  int i1;
  ExactMass mass;
  // This block's share of a level's total (PickBin), read by the cluster.
  unsigned long long range_total;
  BinPick pick;  // broadcast inside the block
  // Per-block partials read by the other blocks of the cluster
  // (ClusterCombine), in two slots used by alternate calls.
  alignas(16) unsigned char ring[2][32];
  float warp_score[kWarps];
  int warp_token[kWarps];
  int top_n;
  int top_token[kMaxTopLogprobs];
  float top_value[kMaxTopLogprobs];
  int samples[kMaxNumSamples];
};

// This block's place in its row's cluster.
struct Slice {
  int rank;  // 0 .. g - 1
  int g;     // blocks per row
  int lo;    // this block's tokens: [lo, hi)
  int hi;
  // Calls so far of ClusterCombine and Histogram: which ring slot and which
  // histogram buffer the next one uses. Every thread counts the same calls.
  mutable int combines;
  mutable int histograms;
};

__device__ __forceinline__ void ClusterSync(const Slice& s) {
  if (s.g > 1) {
    cooperative_groups::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

// `p` (in this block's shared memory) as seen in block `rank` of the cluster.
template <class T>
__device__ __forceinline__ T* InBlock(T* p, int rank, const Slice& s) {
  return s.g > 1 ? cooperative_groups::this_cluster().map_shared_rank(p, rank) : p;
}

// Distributed shared memory reads are slow round trips: a value every block
// publishes is gathered with one load per lane (lane q reads block q's copy,
// all in flight at once) and then handed around the warp by shuffles.
template <class T>
__device__ __forceinline__ T LaneGather(T* p, T fallback, const Slice& s) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  return lane < s.g ? *InBlock(p, lane, s) : fallback;
}

template <class T>
__device__ __forceinline__ T ShuffleFrom(T v, int lane) {
  static_assert(sizeof(T) % 4 == 0, "shuffled in 32-bit words");
  unsigned int w[sizeof(T) / 4];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (size_t k = 0; k < sizeof(T) / 4; ++k) w[k] = __shfl_sync(kFullWarpMask, w[k], lane);
  memcpy(&v, w, sizeof(T));
  return v;
}

// Calls f(i, vals[i]) for this thread's tokens of [lo, hi), always in the same
// order (deterministic per-thread partial sums). 16-byte loads where the row
// allows them, unrolled so that each thread keeps several loads in flight.
template <class F>
__device__ __forceinline__ void ForEach(const float* vals, int lo, int hi, F&& f) {
  int scalar_from = lo;
  if ((lo & 3) == 0 && (reinterpret_cast<uintptr_t>(vals) & 15u) == 0) {
    const float4* v4 = reinterpret_cast<const float4*>(vals + lo);
    const int n4 = (hi - lo) >> 2;
#pragma unroll 4
    for (int q = threadIdx.x; q < n4; q += kThreads) {
      const float4 x = v4[q];
      const int i = lo + (q << 2);
      f(i, x.x);
      f(i + 1, x.y);
      f(i + 2, x.z);
      f(i + 3, x.w);
    }
    scalar_from = lo + (n4 << 2);
  }
  for (int i = scalar_from + static_cast<int>(threadIdx.x); i < hi; i += kThreads) f(i, vals[i]);
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Thread 0's `r` (a cub block reduction's result, valid only there) for every
// thread, through `slot`; the second barrier lets the slot be reused at once.
template <class T>
__device__ T FromThread0(T r, T* slot) {
  if (threadIdx.x == 0) *slot = r;
  __syncthreads();
  const T out = *slot;
  __syncthreads();
  return out;
}

// Block-level reductions (every thread gets the result).
__device__ float BlockMax(float v, Shared& sh) {
  return FromThread0(cub::BlockReduce<float, kThreads>(sh.cub.reduce_float).Reduce(v, MaxOp()), &sh.f);
}

__device__ int BlockSumInt(int v, Shared& sh) {
  return FromThread0(cub::BlockReduce<int, kThreads>(sh.cub.reduce_int).Sum(v), &sh.i0);
}

__device__ ExactMass BlockSumMass(ExactMass v, Shared& sh) {
  return FromThread0(cub::BlockReduce<ExactMass, kThreads>(sh.cub.reduce_mass).Reduce(v, MassSum()),
                     &sh.mass);
}

// Cluster combinations of block values: op(...op(op(init, v_0), v_1)...) over
// the blocks of ranks [0, upto), in rank order, the same in every block. One
// cluster barrier: call k writes ring slot k % 2, which call k + 2 writes
// again only after passing call k + 1's barrier, and every block reaches that
// barrier after its reads of call k.
template <class T, class Op>
__device__ T ClusterCombine(T block_value, T init, int upto, Op op, Shared& sh, const Slice& s) {
  static_assert(sizeof(T) <= sizeof(sh.ring[0]), "ring slot too small");
  if (s.g == 1) return upto == 1 ? op(init, block_value) : init;
  T* slot = reinterpret_cast<T*>(sh.ring[s.combines & 1]);
  ++s.combines;
  if (threadIdx.x == 0) *slot = block_value;
  ClusterSync(s);
  const T gathered = LaneGather(slot, init, s);
  T r = init;
  for (int q = 0; q < upto; ++q) r = op(r, ShuffleFrom(gathered, q));
  return r;
}

__device__ int ClusterSumInt(int v, Shared& sh, const Slice& s) {
  return ClusterCombine(v, 0, s.g, [](int a, int b) { return a + b; }, sh, s);
}
// Sum of the blocks ranked below this one (an exclusive prefix over ranks).
__device__ int ClusterPrefixInt(int v, Shared& sh, const Slice& s) {
  return ClusterCombine(v, 0, s.rank, [](int a, int b) { return a + b; }, sh, s);
}
__device__ int ClusterMinInt(int v, Shared& sh, const Slice& s) {
  return ClusterCombine(v, INT_MAX, s.g, [](int a, int b) { return a < b ? a : b; }, sh, s);
}
__device__ ExactMass ClusterSumMass(ExactMass v, Shared& sh, const Slice& s) {
  return ClusterCombine(v, ExactMass{}, s.g, MassSum(), sh, s);
}

// The max of a row's values and how many there are, over the cluster.
struct MaxCount {
  float max;
  int count;
};
__device__ MaxCount ClusterMaxCount(float m, int c, Shared& sh, const Slice& s) {
  const MaxCount block{BlockMax(m, sh), BlockSumInt(c, sh)};
  return ClusterCombine(block, MaxCount{-INFINITY, 0}, s.g,
                        [](MaxCount a, MaxCount b) { return MaxCount{fmaxf(a.max, b.max), a.count + b.count}; },
                        sh, s);
}

// Max over kept values of the row and their count.
__device__ void MaxAndCount(const float* vals, Cut cut, Shared& sh, const Slice& s,
                            float* max_out, int* count_out) {
  float m = -INFINITY;
  int c = 0;
  ForEach(vals, s.lo, s.hi, [&](int i, float x) {
    if (Kept(DescKey(x), i, cut)) {
      m = fmaxf(m, x);
      ++c;
    }
  });
  const MaxCount r = ClusterMaxCount(m, c, sh, s);
  *max_out = r.max;
  *count_out = r.count;
}

// The id of the rank-th (1-based) token of the row, in id order, whose key is
// d: each block counts its slice's ties, the block whose share of the order
// holds it scans its slice in order (a block scan per chunk of kThreads).
__device__ int NthTieId(const float* vals, uint32_t d, int rank, Shared& sh, const Slice& s) {
  int mine = 0;
  ForEach(vals, s.lo, s.hi, [&](int, float x) { mine += DescKey(x) == d ? 1 : 0; });
  const int in_block = BlockSumInt(mine, sh);
  const int before = ClusterPrefixInt(in_block, sh, s);
  int found = INT_MAX;
  if (before < rank && rank <= before + in_block) {
    const int want = rank - before;  // 1-based within this slice
    if (threadIdx.x == 0) sh.i1 = INT_MAX;
    __syncthreads();
    int seen = 0;
    for (int base = s.lo; base < s.hi && seen < want; base += kThreads) {
      const int i = base + static_cast<int>(threadIdx.x);
      const int flag = i < s.hi && DescKey(vals[i]) == d ? 1 : 0;
      int prefix = 0, total = 0;
      cub::BlockScan<int, kThreads>(sh.cub.scan_int).ExclusiveSum(flag, prefix, total);
      if (flag != 0 && seen + prefix == want - 1) sh.i1 = i;
      seen += total;
      __syncthreads();  // scan storage reuse
    }
    found = sh.i1;
    __syncthreads();
  }
  return ClusterMinInt(found, sh, s);
}

// After a descent ended at key d with `rank` (1-based) of the `count_eq` kept
// ties wanted: the new cut. Kept ties are always the lowest ids among the
// row's ties at d, so the rank-th kept tie is the rank-th tie of the row.
__device__ Cut TieCut(const float* vals, Cut cut, uint32_t d, int rank, int count_eq, Shared& sh,
                      const Slice& s) {
  if (rank >= count_eq) return Cut{d, cut.key == d ? cut.id : INT_MAX};
  return Cut{d, NthTieId(vals, d, rank, sh, s)};
}

// One level of a radix descent: the histogram of the kept tokens whose key
// matches `prefix` on `prefix_mask`, by digit (key >> shift) & mask, with
// counts and (when with_mass) fixed-point masses (Histogram), then the bin
// where a running sum over the cluster's merged histogram, in digit order,
// crosses a target (PickBin). Two cluster barriers per level:
//   A (end of Histogram): every block's histogram is complete. Block `rank`
//     of g owns the digits [rank * R, (rank + 1) * R), R = kBins / g, and
//     sums those over the g blocks (a reduce-scatter through distributed
//     shared memory: every block reading every block's whole histogram moved
//     g times as much and bounded the kernel).
//   B (in PickBin): every block's share of the total is published. Every
//     block finds the range the crossing falls in, merges that range itself
//     and scans it: the same integers in every block, the same bin.
// Level k fills buffer k % 2. Blocks read each other's level-k buffers only
// between A_k and their arrival at A_(k+1); level k + 2 zeroes that buffer
// after passing A_(k+1). One buffer would need a third barrier per level.
__device__ __forceinline__ unsigned long long FixedMass(float x, double max, double unit) {
  return __double2ull_rz(exp(static_cast<double>(x) - max) * unit);
}

// A thread's share of one range of the merged histogram: bins first ..
// first + n - 1 (n = 0 for threads past the range).
struct OwnedBins {
  int first;
  int n;
  unsigned int count[kBinsPerThread];
  unsigned long long mass[kBinsPerThread];
};

// The weight a radix level sums: bin b's mass (top_p) or count.
template <bool kWithMass>
__device__ __forceinline__ unsigned long long BinWeight(const OwnedBins& bins, int b) {
  return kWithMass ? bins.mass[b] : bins.count[b];
}

// The thread's share of a level's total weight.
template <bool kWithMass>
__device__ __forceinline__ unsigned long long OwnedWeight(const OwnedBins& bins) {
  unsigned long long w = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    if (b < bins.n) w += BinWeight<kWithMass>(bins, b);
  }
  return w;
}

// Range `range_index` of histogram buffer `buf`, summed over the cluster.
// kSlots = g * per_thread: 4 for g <= 4 (1 x 4, 2 x 2, 4 x 1), 8 or 16 for
// g = 8 or 16 (one bin per thread). Slot k = (block k / per_thread, bin k %
// per_thread): every slot is loaded first, so that all remote loads are in
// flight at once, then added.
template <bool kWithMass, int kSlots>
__device__ void MergeRangeSlots(int range_index, int buf, Shared& sh, const Slice& s, OwnedBins& own) {
  const int range = kBins / s.g;
  const int per_thread = range > kThreads ? range / kThreads : 1;
  const int local = static_cast<int>(threadIdx.x) * per_thread;
  own.first = range_index * range + local;
  own.n = local < range ? per_thread : 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    own.count[b] = 0;
    own.mass[b] = 0;
  }
  if (own.n == 0) return;
  const int b_bits = per_thread == 4 ? 2 : (per_thread == 2 ? 1 : 0);
  unsigned int c[kSlots], lo[kSlots], hi[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int q = k >> b_bits;
    const int bin = own.first + (k & (per_thread - 1));
    c[k] = InBlock(sh.count[buf], q, s)[bin];
    lo[k] = kWithMass ? InBlock(sh.mass_lo[buf], q, s)[bin] : 0u;
    hi[k] = kWithMass ? InBlock(sh.mass_hi[buf], q, s)[bin] : 0u;
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
#pragma unroll
    for (int b = 0; b < kBinsPerThread; ++b) {
      if ((k & (per_thread - 1)) == b) {
        own.count[b] += c[k];
        if (kWithMass) own.mass[b] += (static_cast<unsigned long long>(hi[k]) << 32) + lo[k];
      }
    }
  }
}

template <bool kWithMass>
__device__ void MergeRange(int range_index, int buf, Shared& sh, const Slice& s, OwnedBins& own) {
  static_assert(kBins / kThreads == 4 && kMaxCluster == 16, "slot counts below");
  if (s.g <= 4) {
    MergeRangeSlots<kWithMass, 4>(range_index, buf, sh, s, own);
  } else if (s.g == 8) {
    MergeRangeSlots<kWithMass, 8>(range_index, buf, sh, s, own);
  } else {
    MergeRangeSlots<kWithMass, 16>(range_index, buf, sh, s, own);
  }
}

// Returns the buffer this level used; `own` is this block's range, merged.
template <bool kWithMass>
__device__ int Histogram(const float* vals, Cut cut, uint32_t prefix, uint32_t prefix_mask,
                         int shift, uint32_t mask, double max, double unit, Shared& sh,
                         const Slice& s, OwnedBins& own) {
  const int buf = s.histograms & 1;
  ++s.histograms;
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sh.count[buf][b] = 0;
    if (kWithMass) {
      sh.mass_lo[buf][b] = 0;
      sh.mass_hi[buf][b] = 0;
    }
  }
  __syncthreads();
  ForEach(vals, s.lo, s.hi, [&](int i, float x) {
    const uint32_t d = DescKey(x);
    if ((d & prefix_mask) == prefix && Kept(d, i, cut)) {
      const uint32_t bin = (d >> shift) & mask;
      atomicAdd(&sh.count[buf][bin], 1u);
      if (kWithMass) {
        const unsigned long long m = FixedMass(x, max, unit);
        const unsigned int lo = static_cast<unsigned int>(m);
        const unsigned int old = atomicAdd(&sh.mass_lo[buf][bin], lo);
        const unsigned int hi = static_cast<unsigned int>(m >> 32) + (old + lo < old ? 1u : 0u);
        if (hi != 0) atomicAdd(&sh.mass_hi[buf][bin], hi);
      }
    }
  });
  ClusterSync(s);  // A: every block's histogram is complete
  MergeRange<kWithMass>(s.rank, buf, sh, s, own);
  return buf;
}

// The crossing bin of one level: the unique bin where the running sum of
// weights (masses, or counts) over the cluster's digits, starting at `offset`,
// goes from `before` to `before + w` with crosses(before, before + w, total),
// total = the level's sum of weights; crosses must hold for at most one step
// of any running sum (a first-reach test). bin = -1 when no bin crosses.
// Called by every thread of the cluster right after Histogram; the same
// result everywhere.
template <bool kWithMass, class Crosses>
__device__ BinPick PickBin(const OwnedBins& own, int buf, unsigned long long offset,
                           Crosses crosses, Shared& sh, const Slice& s) {
  unsigned long long unused = 0, block_total = 0;
  cub::BlockScan<unsigned long long, kThreads>(sh.cub.scan_u64)
      .ExclusiveSum(OwnedWeight<kWithMass>(own), unused, block_total);
  if (threadIdx.x == 0) sh.range_total = block_total;
  ClusterSync(s);  // B: every range total published
  const unsigned long long gathered = LaneGather(&sh.range_total, 0ull, s);
  unsigned long long total = 0;
  for (int q = 0; q < s.g; ++q) total += ShuffleFrom(gathered, q);
  int range = -1;
  unsigned long long range_before = offset;
  unsigned long long run = offset;
  for (int q = 0; q < s.g; ++q) {
    const unsigned long long t = ShuffleFrom(gathered, q);
    if (range < 0 && crosses(run, run + t, total)) {
      range = q;
      range_before = run;
    }
    run += t;
  }
  if (range < 0) return BinPick{-1, 0, 0, total};  // uniform
  OwnedBins merged;
  if (range == s.rank) {
    merged = own;
  } else {
    MergeRange<kWithMass>(range, buf, sh, s, merged);
  }
  unsigned long long before = 0;
  if (threadIdx.x == 0) sh.pick = BinPick{-1, 0, 0, total};
  __syncthreads();  // scan storage free again; pick reset before a thread writes it
  cub::BlockScan<unsigned long long, kThreads>(sh.cub.scan_u64)
      .ExclusiveSum(OwnedWeight<kWithMass>(merged), before);
  before += range_before;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    if (b < merged.n) {
      const unsigned long long w = BinWeight<kWithMass>(merged, b);
      if (crosses(before, before + w, total)) {
        sh.pick = BinPick{merged.first + b, static_cast<int>(merged.count[b]), before, total};
      }
      before += w;
    }
  }
  __syncthreads();
  // sh.pick is reset again only after the next level's two cluster barriers.
  return sh.pick;
}

// The cut keeping exactly the first `rank` kept tokens (1 <= rank <= kept
// count): radix select on DescKey, three levels of histograms.
__device__ Cut SelectNth(const float* vals, Cut cut, int rank, Shared& sh, const Slice& s) {
  uint32_t prefix = 0, prefix_mask = 0;
  int remaining = rank;
  int count_eq = 0;
  for (int level = 0; level < kLevels; ++level) {
    const int shift = kLevelShift[level];
    const uint32_t mask = kLevelMask[level];
    OwnedBins own;
    const int buf = Histogram<false>(vals, cut, prefix, prefix_mask, shift, mask, 0.0, 0.0, sh, s, own);
    const unsigned long long want = static_cast<unsigned long long>(remaining);
    const BinPick pick = PickBin<false>(
        own, buf, 0,
        [&](unsigned long long lo, unsigned long long hi, unsigned long long) {
          return lo < want && want <= hi;
        },
        sh, s);
    if (pick.bin < 0) return cut;  // unreachable for 1 <= rank <= kept count (uniform)
    remaining -= static_cast<int>(pick.before);
    count_eq = pick.count;
    prefix |= static_cast<uint32_t>(pick.bin) << shift;
    prefix_mask |= mask << shift;
  }
  return TieCut(vals, cut, prefix, remaining, count_eq, sh, s);
}

// top_p: the cut keeping every kept token whose fixed-point mass strictly
// before it (canonical order) is < top_p * total: the same three-level radix
// descent, on per-bin masses.
__device__ Cut SelectTopP(const float* vals, Cut cut, float top_p, double max, int frac_bits,
                          Shared& sh, const Slice& s) {
  const double unit = ldexp(1.0, frac_bits);
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long mass_before = 0;  // of the kept tokens before the current prefix
  double target = 0.0;
  int count_eq = 0;
  for (int level = 0; level < kLevels; ++level) {
    const int shift = kLevelShift[level];
    const uint32_t mask = kLevelMask[level];
    OwnedBins own;
    const int buf = Histogram<true>(vals, cut, prefix, prefix_mask, shift, mask, max, unit, sh, s, own);
    const BinPick pick = PickBin<true>(
        own, buf, mass_before,
        [&](unsigned long long lo, unsigned long long hi, unsigned long long total) {
          // Level 0 sees every kept token: its total is the row's mass.
          const double t = level == 0 ? static_cast<double>(top_p) * static_cast<double>(total) : target;
          return static_cast<double>(lo) < t && static_cast<double>(hi) >= t;
        },
        sh, s);
    if (level == 0) target = static_cast<double>(top_p) * static_cast<double>(pick.total);
    if (pick.bin < 0) return cut;  // unreachable: the level-0 bins reach total > target (uniform)
    mass_before = pick.before;
    count_eq = pick.count;
    prefix |= static_cast<uint32_t>(pick.bin) << shift;
    prefix_mask |= mask << shift;
  }
  // The count_eq ties at value v: tie t (0-based, id order) has mass_before +
  // t * e before it; the kept ones are t < keep.
  const unsigned long long e = FixedMass(FloatOfDescKey(prefix), max, unit);
  long long keep = count_eq;
  if (e > 0) {
    const auto fails = [&](long long t) {
      return static_cast<double>(mass_before + static_cast<unsigned long long>(t) * e) >= target;
    };
    keep = static_cast<long long>(ceil((target - static_cast<double>(mass_before)) / static_cast<double>(e)));
    keep = keep < 1 ? 1 : (keep > count_eq ? count_eq : keep);
    while (keep > 1 && fails(keep - 1)) --keep;
    while (keep < count_eq && !fails(keep)) ++keep;
  }
  return TieCut(vals, cut, prefix, static_cast<int>(keep), count_eq, sh, s);
}

// A block's share of a draw: its winner, and the mass and count of its kept tokens.
struct DrawPart {
  float score;
  int token;
  ExactMass sum;
  int kept;
};

// argmax over kept i != exclude of (l'_i + noise on `stream`) (greedy: l'_i),
// ties to the lower id (-1 when nothing else is kept); optionally the sum of
// exp(l' - max) over the kept tokens (exclude too; exact, ExactMass) and
// their count.
__device__ int DrawSample(const float* lp, Cut cut, RowParams p, bool sampled, uint32_t stream,
                          int exclude, double max, double* sum_out, int* count_out, Shared& sh,
                          const Slice& s) {
  p.stream = stream;
  float best_score = -INFINITY;
  int best = -1;
  ExactMass sum{};
  int kept = 0;
  const bool want_sum = sum_out != nullptr;
  ForEach(lp, s.lo, s.hi, [&](int i, float x) {
    if (!Kept(DescKey(x), i, cut)) return;
    if (want_sum) {
      sum = MassSum()(sum, MassOf(exp(static_cast<double>(x) - max)));
      ++kept;
    }
    if (i == exclude) return;  // a draft's residual: x stays in logz only
    float score = x;
    if (sampled) {
      // Exact pruning: l' + any noise < best score cannot win or tie.
      if (best >= 0 && x + kGumbelMax < best_score) return;
      score = __fadd_rn(x, DeviceGumbelNoise(p, static_cast<uint32_t>(i)));
    }
    if (ScoreBeats(score, i, best_score, best)) {
      best_score = score;
      best = i;
    }
  });
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) {
    const float os = __shfl_xor_sync(kFullWarpMask, best_score, m);
    const int ot = __shfl_xor_sync(kFullWarpMask, best, m);
    if (ScoreBeats(os, ot, best_score, best)) {
      best_score = os;
      best = ot;
    }
  }
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) {
    sh.warp_score[warp] = best_score;
    sh.warp_token[warp] = best;
  }
  const ExactMass block_sum = want_sum ? BlockSumMass(sum, sh) : ExactMass{};  // its barriers order the slots
  const int block_kept = want_sum ? BlockSumInt(kept, sh) : 0;
  __syncthreads();
  DrawPart part{sh.warp_score[0], sh.warp_token[0], block_sum, block_kept};
  for (int w = 1; w < kWarps; ++w) {
    if (ScoreBeats(sh.warp_score[w], sh.warp_token[w], part.score, part.token)) {
      part.score = sh.warp_score[w];
      part.token = sh.warp_token[w];
    }
  }
  __syncthreads();  // every thread has read the warp slots before the next draw writes them
  // The blocks' winners, sums and counts, combined in rank order.
  const DrawPart all = ClusterCombine(
      part, DrawPart{-INFINITY, -1, ExactMass{}, 0}, s.g,
      [](DrawPart a, DrawPart b) {
        if (ScoreBeats(b.score, b.token, a.score, a.token)) {
          a.score = b.score;
          a.token = b.token;
        }
        a.sum = MassSum()(a.sum, b.sum);
        a.kept += b.kept;
        return a;
      },
      sh, s);
  if (want_sum) {
    *sum_out = MassToDouble(all.sum);
    *count_out = all.kept;
  }
  return all.token;
}

// vLLM's rank: kept values >= v.
__device__ int RankOf(const float* vals, Cut cut, float v, Shared& sh, const Slice& s) {
  int c = 0;
  ForEach(vals, s.lo, s.hi, [&](int i, float x) {
    if (Kept(DescKey(x), i, cut) && x >= v) ++c;
  });
  return ClusterSumInt(BlockSumInt(c, sh), sh, s);
}

// log sum exp over kept values with maximum `max` (float64 terms, summed exactly).
__device__ double LogSumExp(const float* vals, Cut cut, float max, Shared& sh, const Slice& s) {
  ExactMass sum{};
  ForEach(vals, s.lo, s.hi, [&](int i, float x) {
    if (Kept(DescKey(x), i, cut)) {
      sum = MassSum()(sum, MassOf(exp(static_cast<double>(x) - static_cast<double>(max))));
    }
  });
  return static_cast<double>(max) + log(MassToDouble(ClusterSumMass(BlockSumMass(sum, sh), sh, s)));
}

// The first `top` kept tokens in canonical order, with value - logz, written
// by block 0 of the cluster.
__device__ void WriteTopList(const float* vals, Cut cut, int kept, int top, double logz,
                             int32_t* ids_out, float* logprobs_out, int32_t* count_out,
                             Shared& sh, const Slice& s) {
  top = top < kept ? top : kept;
  const Cut top_cut = SelectNth(vals, cut, top, sh, s);
  if (threadIdx.x == 0) sh.top_n = 0;
  __syncthreads();
  ForEach(vals, s.lo, s.hi, [&](int i, float x) {
    if (Kept(DescKey(x), i, top_cut)) {
      const int slot = atomicAdd(&sh.top_n, 1);
      if (slot < kMaxTopLogprobs) {
        sh.top_token[slot] = i;
        sh.top_value[slot] = x;
      }
    }
  });
  ClusterSync(s);
  if (s.rank == 0 && threadIdx.x == 0) {
    int tokens[kMaxTopLogprobs];
    float values[kMaxTopLogprobs];
    int m = 0;
    for (int q = 0; q < s.g; ++q) {
      const Shared* o = InBlock(&sh, q, s);
      const int nq = o->top_n < kMaxTopLogprobs ? o->top_n : kMaxTopLogprobs;
      for (int a = 0; a < nq && m < kMaxTopLogprobs; ++a, ++m) {
        tokens[m] = o->top_token[a];
        values[m] = o->top_value[a];
      }
    }
    // Insertion sort into (value desc, id asc).
    for (int a = 1; a < m; ++a) {
      const int t = tokens[a];
      const float v = values[a];
      int b = a - 1;
      while (b >= 0 && (values[b] < v || (values[b] == v && tokens[b] > t))) {
        tokens[b + 1] = tokens[b];
        values[b + 1] = values[b];
        --b;
      }
      tokens[b + 1] = t;
      values[b + 1] = v;
    }
    for (int a = 0; a < m; ++a) {
      ids_out[a] = tokens[a];
      logprobs_out[a] = static_cast<float>(static_cast<double>(values[a]) - logz);
    }
    *count_out = m;
  }
  ClusterSync(s);
}

// ---- The row kernel -------------------------------------------------------------
// Cluster r (blocks r * g .. r * g + g - 1): row row0 + r, raw logits
// raw_all + r * n, l' buffer lp_all + r * n.
__global__ void __launch_bounds__(kThreads)
    ControlledRowKernel(const float* __restrict__ raw_all, float* lp_all, int n, int64_t row0,
                        const RowParams* __restrict__ params, ControlledDeviceControls controls,
                        ControlledSampleOutputs out, int frac_bits, int g) {
  // Dynamic: Shared is over the 48 KiB static limit (LaunchRows opts in).
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  Slice s;
  s.g = g;
  s.combines = 0;
  s.histograms = 0;
  s.rank = static_cast<int>(blockIdx.x % g);
  const int per = (((n + g - 1) / g) + 3) & ~3;  // 4-aligned share of the row
  s.lo = min(n, s.rank * per);
  s.hi = min(n, s.lo + per);
  const int64_t local_row = blockIdx.x / g;
  const int64_t row = row0 + local_row;
  const float* raw = raw_all + local_row * n;
  float* lp = lp_all + local_row * n;
  const ControlledRowDesc c = controls.rows[row];
  const RowParams p = params[row];
  const float scale = DeviceLogitScale(p.temperature);
  const bool sampled = p.temperature > 0.0f;
  const uint32_t* mask = c.bitmask_begin >= 0 ? controls.bitmask + c.bitmask_begin : nullptr;
  const bool leader = s.rank == 0 && threadIdx.x == 0;

  // ---- Steps 1-4 on this block's slice: l' (non-finite -> -inf), then the
  // touched tokens that fall in it.
  // The pass also takes the max and count of the finite l' (what MaxAndCount
  // over AllFinite() returns), valid when no touched token rewrites l' below.
  float pass_max = -INFINITY;
  int pass_count = 0;
  const auto transform = [&](int i, float x) {
    const bool allowed = mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1u) != 0u;
    float y = allowed ? cuda_internal::TransformLogit(x, scale) : -INFINITY;
    y = isfinite(y) ? y : -INFINITY;
    pass_max = fmaxf(pass_max, y);
    pass_count += y > -INFINITY ? 1 : 0;
    return y;
  };
  int scalar_from = s.lo;
  if ((s.lo & 3) == 0 && (reinterpret_cast<uintptr_t>(raw) & 15u) == 0 &&
      (reinterpret_cast<uintptr_t>(lp) & 15u) == 0) {
    const float4* raw4 = reinterpret_cast<const float4*>(raw + s.lo);
    float4* lp4 = reinterpret_cast<float4*>(lp + s.lo);
    const int n4 = (s.hi - s.lo) >> 2;
#pragma unroll 4
    for (int q = threadIdx.x; q < n4; q += kThreads) {
      const float4 x = raw4[q];
      const int i = s.lo + (q << 2);
      lp4[q] = make_float4(transform(i, x.x), transform(i + 1, x.y), transform(i + 2, x.z),
                           transform(i + 3, x.w));
    }
    scalar_from = s.lo + (n4 << 2);
  }
  for (int i = scalar_from + static_cast<int>(threadIdx.x); i < s.hi; i += kThreads) {
    lp[i] = transform(i, raw[i]);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < c.touched_count; e += kThreads) {
    const TouchedToken t = controls.touched[c.touched_begin + e];
    if (t.id < s.lo || t.id >= s.hi) continue;
    const bool allowed = mask == nullptr || ((mask[t.id >> 5] >> (t.id & 31)) & 1u) != 0u;
    float y = -INFINITY;
    if (allowed && t.banned == 0) {
      y = TouchedLogit(raw[t.id], t, c.repetition_penalty, c.frequency_penalty,
                       c.presence_penalty, scale);
    }
    lp[t.id] = isfinite(y) ? y : -INFINITY;
  }
  __threadfence();  // l' of this slice visible to the cluster's blocks (tokens read across slices)
  __syncthreads();

  // ---- Steps 5-7: the kept prefix.
  Cut cut = AllFinite();
  float max = -INFINITY;
  int kept = 0;
  if (c.touched_count == 0) {
    const MaxCount r = ClusterMaxCount(pass_max, pass_count, sh, s);
    max = r.max;
    kept = r.count;
  } else {
    MaxAndCount(lp, cut, sh, s, &max, &kept);
  }
  if (kept == 0) {
    if (leader) {
      out.row_status[row] = 1;
      out.token_ids[row] = -1;
    }
    ClusterSync(s);  // no block exits while another may still read its shared memory
    return;          // uniform over the cluster
  }
  const double dmax = static_cast<double>(max);
  if (c.min_p > 0.0f) {
    // The smallest float t with exp(double(t) - max) >= min_p; max itself
    // passes (exp(0) = 1 > min_p). Start at the analytic value and step ulps.
    // Every block computes the same t.
    if (threadIdx.x == 0) {
      const auto passes = [&](float t) {
        return exp(static_cast<double>(t) - dmax) >= static_cast<double>(c.min_p);
      };
      float t = static_cast<float>(dmax + log(static_cast<double>(c.min_p)));
      if (!(t <= max)) t = max;
      for (int k = 0; k < 64 && t > -INFINITY && passes(t); ++k) t = nextafterf(t, -INFINITY);
      for (int k = 0; k < 128 && !passes(t); ++k) t = nextafterf(t, INFINITY);
      sh.f = t;
    }
    __syncthreads();
    const float threshold = sh.f;
    __syncthreads();
    cut = Cut{DescKey(threshold), INT_MAX};
    float unused = 0.0f;
    MaxAndCount(lp, cut, sh, s, &unused, &kept);
  }
  if (c.top_k > 0 && kept > c.top_k) {
    cut = SelectNth(lp, cut, c.top_k, sh, s);
    kept = c.top_k;
  }
  if (c.top_p < 1.0f) cut = SelectTopP(lp, cut, c.top_p, dmax, frac_bits, sh, s);

  // ---- Step 8: the samples; logz and the kept count from the first draw's pass.
  // A kept draft x is left out of a sampled row's draws (the residual); when
  // x is all that is kept, the draws find nothing and the sample is x.
  const int32_t draft = controls.draft_tokens != nullptr ? controls.draft_tokens[row] : -1;
  bool draft_kept = false;
  if (draft >= 0 && draft < n) {
    const float xd = lp[draft];
    draft_kept = xd > -INFINITY && Kept(DescKey(xd), draft, cut);
  }
  const int exclude = sampled && draft_kept ? draft : -1;
  double sum = 0.0;
  for (int j = 0; j < c.num_samples; ++j) {
    const uint32_t stream = p.stream + static_cast<uint32_t>(j) * c.sample_stream_stride;
    int token = DrawSample(lp, cut, p, sampled, stream, exclude, dmax, j == 0 ? &sum : nullptr,
                           j == 0 ? &kept : nullptr, sh, s);
    if (token < 0) token = draft;  // uniform: every thread has the same token
    if (threadIdx.x == 0) sh.samples[j] = token;
    if (leader) out.sample_tokens[c.sample_begin + j] = token;
  }
  __syncthreads();
  const double logz = dmax + log(sum);
  const int token0 = sh.samples[0];
  if (leader) {
    out.token_ids[row] = token0;
    out.row_status[row] = 0;
    if (out.logz != nullptr) out.logz[row] = static_cast<float>(logz);
    if (out.logprobs != nullptr) {
      out.logprobs[row] = static_cast<float>(static_cast<double>(lp[token0]) - logz);
    }
    if (controls.draft_tokens != nullptr) {
      out.draft_logprobs[row] =
          draft < 0 ? NAN
                    : (draft_kept ? static_cast<float>(static_cast<double>(lp[draft]) - logz) : -INFINITY);
    }
  }
  if (c.top_logprobs <= 0) {
    ClusterSync(s);  // no block exits while another may still read its shared memory
    return;
  }

  // ---- Details: each sample's logprob and rank, and the top list.
  const bool raw_mode = c.logprobs_mode == static_cast<int32_t>(LogprobsMode::kRaw);
  const float* vals = raw_mode ? raw : lp;
  Cut detail_cut = cut;
  double detail_logz = logz;
  int detail_kept = kept;
  if (raw_mode) {
    // Every raw logit of the valid vocabulary (the CPU takes the raw row as is).
    detail_cut = Cut{0xffffffffu, INT_MAX};
    float raw_max = -INFINITY;
    MaxAndCount(raw, detail_cut, sh, s, &raw_max, &detail_kept);
    detail_logz = LogSumExp(raw, detail_cut, raw_max, sh, s);
  }
  for (int j = 0; j < c.num_samples; ++j) {
    const float v = vals[sh.samples[j]];
    const int rank = RankOf(vals, detail_cut, v, sh, s);
    if (leader) {
      out.sample_logprobs[c.sample_begin + j] =
          static_cast<float>(static_cast<double>(v) - detail_logz);
      out.sample_ranks[c.sample_begin + j] = rank;
    }
  }
  WriteTopList(vals, detail_cut, detail_kept, c.top_logprobs, detail_logz,
               out.top_ids + row * kMaxTopLogprobs, out.top_logprobs + row * kMaxTopLogprobs,
               out.top_counts + row, sh, s);
}

// F = 63 - ceil(log2(n + 1)): n masses of at most 2^F sum below 2^63.
int FracBits(int64_t n) {
  int bits = 0;
  while ((int64_t{1} << bits) < n + 1) ++bits;
  return 63 - bits;
}


bool ValidCluster(int g) {
  return g == kControlledClusterAuto || g == 1 || g == 2 || g == 4 || g == 8 || g == kMaxCluster;
}

// The row kernel's launch attributes, set once per device: Shared (two
// histogram buffers) is over the 48 KiB of static shared memory, so it is
// dynamic and needs an opt-in; clusters of 16 blocks are non-portable. Where
// the device refuses, the launch (or the occupancy query) fails on its own:
// kDeviceError, or no resident cluster of 16 (auto never picks it).
void ConfigureRowKernel() {
  static std::mutex mu;
  static std::set<int> done;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert(device).second) return;
  if (cudaFuncSetAttribute(ControlledRowKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(sizeof(Shared))) != cudaSuccess ||
      cudaFuncSetAttribute(ControlledRowKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
          cudaSuccess) {
    cudaGetLastError();  // not sticky
  }
}

// One cluster of g blocks per row (a plain launch for g = 1).
KernelStatus LaunchRows(const float* raw, float* lp, int64_t rows, int64_t row0, int64_t n,
                        const RowParams* params, const ControlledDeviceControls& controls,
                        const ControlledSampleOutputs& outputs, int g, cudaStream_t stream) {
  if (g == kControlledClusterAuto) g = ControlledClusterBlocksFor(rows);
  ConfigureRowKernel();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(rows * g));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(Shared);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(g);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = g > 1 ? 1 : 0;
  return StatusFromCuda(cudaLaunchKernelEx(&config, ControlledRowKernel, raw, lp, static_cast<int>(n),
                                           row0, params, controls, outputs, FracBits(n), g));
}

}  // namespace

// Every required output, a place for draft log-probabilities when rows have
// drafts, and the controls' required parts.
bool ControlledBuffersValid(const ControlledDeviceControls& c, const ControlledSampleOutputs& o) {
  return c.rows != nullptr && c.touched != nullptr && o.token_ids != nullptr &&
         o.row_status != nullptr && o.sample_tokens != nullptr && o.sample_logprobs != nullptr &&
         o.sample_ranks != nullptr && o.top_ids != nullptr && o.top_logprobs != nullptr &&
         o.top_counts != nullptr && (c.draft_tokens == nullptr || o.draft_logprobs != nullptr);
}

// ---- Host flattening ------------------------------------------------------------
size_t FlatControls::PackedBytes() const {
  return AlignUp(rows.size() * sizeof(ControlledRowDesc)) +
         AlignUp(touched.size() * sizeof(TouchedToken)) + AlignUp(bitmask.size() * sizeof(uint32_t));
}

void FlatControls::PackTo(void* host) const {
  auto* base = static_cast<char*>(host);
  std::memcpy(base, rows.data(), rows.size() * sizeof(ControlledRowDesc));
  base += AlignUp(rows.size() * sizeof(ControlledRowDesc));
  if (!touched.empty()) std::memcpy(base, touched.data(), touched.size() * sizeof(TouchedToken));
  base += AlignUp(touched.size() * sizeof(TouchedToken));
  if (!bitmask.empty()) std::memcpy(base, bitmask.data(), bitmask.size() * sizeof(uint32_t));
}

ControlledDeviceControls FlatControls::DeviceView(const void* device) const {
  const auto* base = static_cast<const char*>(device);
  ControlledDeviceControls v;
  v.rows = reinterpret_cast<const ControlledRowDesc*>(base);
  base += AlignUp(rows.size() * sizeof(ControlledRowDesc));
  v.touched = reinterpret_cast<const TouchedToken*>(base);
  base += AlignUp(touched.size() * sizeof(TouchedToken));
  v.bitmask = reinterpret_cast<const uint32_t*>(base);
  return v;
}

KernelStatus FlattenControls(const RowControls* controls, int64_t batch, int64_t vocab,
                             int64_t valid_vocab, FlatControls* out) {
  if (controls == nullptr || out == nullptr || batch < 1 || batch > kMaxInt32 || valid_vocab < 1 ||
      valid_vocab > vocab || vocab > kMaxInt32) {
    return KernelStatus::kInvalidArgument;
  }
  *out = FlatControls{};
  out->rows.resize(static_cast<size_t>(batch));
  const size_t words = static_cast<size_t>((valid_vocab + 31) / 32);
  for (int64_t b = 0; b < batch; ++b) {
    const RowControls& c = controls[b];
    if (!ValidRowControls(c, vocab, valid_vocab)) return KernelStatus::kInvalidArgument;
    ControlledRowDesc& d = out->rows[b];
    d.top_k = c.top_k;
    d.top_p = c.top_p;
    d.min_p = c.min_p;
    d.repetition_penalty = c.repetition_penalty;
    d.presence_penalty = c.presence_penalty;
    d.frequency_penalty = c.frequency_penalty;
    const std::vector<TouchedToken> touched = MergeTouchedTokens(c);
    d.touched_begin = static_cast<int32_t>(out->touched.size());
    d.touched_count = static_cast<int32_t>(touched.size());
    out->touched.insert(out->touched.end(), touched.begin(), touched.end());
    if (!c.allowed_bitmask.empty()) {
      d.bitmask_begin = static_cast<int32_t>(out->bitmask.size());
      out->bitmask.insert(out->bitmask.end(), c.allowed_bitmask.begin(),
                          c.allowed_bitmask.begin() + static_cast<std::ptrdiff_t>(words));
    }
    d.top_logprobs = c.top_logprobs;
    d.logprobs_mode = static_cast<int32_t>(c.logprobs_mode);
    d.num_samples = c.num_samples;
    d.sample_stream_stride = c.sample_stream_stride;
    d.sample_begin = static_cast<int32_t>(out->total_samples);
    out->total_samples += c.num_samples;
    if (out->touched.size() > static_cast<size_t>(kMaxInt32) ||
        out->bitmask.size() > static_cast<size_t>(kMaxInt32) || out->total_samples > kMaxInt32) {
      return KernelStatus::kInvalidArgument;
    }
  }
  return KernelStatus::kOk;
}

// ---- Launchers ------------------------------------------------------------------
// Cached per (device, g): the answer depends only on the kernel and the device.
int ControlledMaxActiveClusters(int g) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, g);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  ConfigureRowKernel();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(g));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(Shared);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(g);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, ControlledRowKernel, &config) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so the launch does not report it
    clusters = 0;
  }
  cache.emplace(key, clusters);
  return clusters;
}

int ControlledClusterBlocksFor(int64_t rows) {
  for (int g = kMaxCluster; g >= 2; g /= 2) {
    if (rows <= ControlledMaxActiveClusters(g)) return g;
  }
  return 1;
}

size_t ControlledFromLogitsWorkspaceBytes(int64_t batch, int64_t valid_vocab) {
  if (batch < 1 || batch > kMaxInt32 || valid_vocab < 1 || valid_vocab > kMaxInt32) return 0;
  return AlignUp(static_cast<size_t>(batch) * static_cast<size_t>(valid_vocab) * sizeof(float));
}

KernelStatus LaunchControlledSampleFromLogits(const float* logits, const RowParams* params,
                                              int64_t batch, int64_t valid_vocab,
                                              const ControlledDeviceControls& controls,
                                              const ControlledSampleOutputs& outputs,
                                              void* workspace, size_t workspace_bytes,
                                              cudaStream_t stream, int cluster_blocks) {
  const size_t need = ControlledFromLogitsWorkspaceBytes(batch, valid_vocab);
  if (logits == nullptr || params == nullptr || !ControlledBuffersValid(controls, outputs) ||
      workspace == nullptr ||
      need == 0 ||
      workspace_bytes < need || !ValidCluster(cluster_blocks) ||
      reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return KernelStatus::kInvalidArgument;
  }
  return LaunchRows(logits, static_cast<float*>(workspace), batch, 0, valid_vocab, params,
                    controls, outputs, cluster_blocks, stream);
}

KernelStatus LaunchControlledChunkFromLogits(const float* logits, float* lp, int64_t rows,
                                             int64_t row_begin, int64_t valid_vocab,
                                             const RowParams* params,
                                             const ControlledDeviceControls& controls,
                                             const ControlledSampleOutputs& outputs,
                                             cudaStream_t stream, int cluster_blocks) {
  if (logits == nullptr || lp == nullptr || params == nullptr ||
      !ControlledBuffersValid(controls, outputs) || rows < 1 ||
      row_begin < 0 || row_begin > kMaxInt32 - rows || valid_vocab < 1 ||
      valid_vocab > kMaxInt32 || !ValidCluster(cluster_blocks) ||
      reinterpret_cast<uintptr_t>(lp) % 16 != 0) {
    return KernelStatus::kInvalidArgument;
  }
  return LaunchRows(logits, lp, rows, row_begin, valid_vocab, params, controls, outputs,
                    cluster_blocks, stream);
}

namespace {
struct Layout {
  size_t raw = 0, lp = 0, cast = 0, total = 0;
};
Layout ControlledLayout(int64_t batch, int64_t valid_vocab, int64_t hidden_dim,
                        CudaWeightDType dtype) {
  Layout l;
  if (batch < 1 || batch > kMaxInt32 || valid_vocab < 1 || valid_vocab > kMaxInt32 ||
      hidden_dim < 1 || hidden_dim > kMaxInt32 || CudaWeightDTypeBytes(dtype) == 0) {
    return l;
  }
  const int64_t chunk = batch < kControlledChunkRows ? batch : kControlledChunkRows;
  const size_t logits = AlignUp(static_cast<size_t>(chunk) * static_cast<size_t>(valid_vocab) * sizeof(float));
  l.raw = 0;
  l.lp = logits;
  l.cast = 2 * logits;
  l.total = 2 * logits + AlignUp(LogitsGemmCastBytes(chunk, hidden_dim, dtype));
  return l;
}
}  // namespace

size_t ControlledSampleWorkspaceBytes(int64_t batch, int64_t valid_vocab, int64_t hidden_dim,
                                      CudaWeightDType weight_dtype) {
  return ControlledLayout(batch, valid_vocab, hidden_dim, weight_dtype).total;
}

KernelStatus LaunchControlledSample(const ControlledSampleArgs& args, cublasHandle_t cublas,
                                    cudaStream_t stream) {
  const Layout layout = ControlledLayout(args.batch, args.valid_vocab, args.hidden_dim, args.weight_dtype);
  if ((cublas == nullptr && args.logits_gemm != LogitsGemmPath::kBatchInvariant) ||
      args.weight == nullptr ||
      args.hidden == nullptr || args.params == nullptr ||
      !ControlledBuffersValid(args.controls, args.outputs) ||
      args.workspace == nullptr || layout.total == 0 ||
      !ValidCluster(args.cluster_blocks) ||
      args.workspace_bytes < layout.total || args.valid_vocab > args.vocab ||
      reinterpret_cast<uintptr_t>(args.workspace) % 256 != 0) {
    return KernelStatus::kInvalidArgument;
  }
  char* ws = static_cast<char*>(args.workspace);
  float* raw = reinterpret_cast<float*>(ws + layout.raw);
  float* lp = reinterpret_cast<float*>(ws + layout.lp);
  for (int64_t row0 = 0; row0 < args.batch; row0 += kControlledChunkRows) {
    const int64_t rows = args.batch - row0 < kControlledChunkRows ? args.batch - row0 : kControlledChunkRows;
    LogitsGemmArgs gemm;
    gemm.weight = args.weight;
    gemm.weight_dtype = args.weight_dtype;
    gemm.hidden = args.hidden + row0 * args.hidden_dim;
    gemm.batch = rows;
    gemm.valid_vocab = args.valid_vocab;
    gemm.hidden_dim = args.hidden_dim;
    gemm.cast_hidden = ws + layout.cast;
    gemm.logits = raw;
    gemm.path = args.logits_gemm;
    if (const KernelStatus s = LaunchLogitsGemm(gemm, cublas, stream); s != KernelStatus::kOk) return s;
    if (const KernelStatus s = LaunchRows(raw, lp, rows, row0, args.valid_vocab, args.params,
                                          args.controls, args.outputs, args.cluster_blocks,
                                          stream);
        s != KernelStatus::kOk) {
      return s;
    }
  }
  return KernelStatus::kOk;
}

}  // namespace flashsampler::kernels
