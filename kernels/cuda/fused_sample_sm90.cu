// Hopper (sm_90a) stage 1 of the fused sampler: the per-(row, 128-token tile)
// SampleSummary of the mma.sync stage 1 (fused_sample_mma.cu), with the dot
// products formed by WGMMA fed by TMA through a multi-stage shared-memory ring,
// warp-specialized as CUTLASS 3's KernelTmaWarpSpecializedCooperative: one
// producer warp issues the TMA loads, two consumer warpgroups issue the WGMMAs
// and then run our epilogue. The mainloop is CUTLASS's own collective
// (CollectiveBuilder -> sm90_mma_tma_gmma_ss_warpspecialized.hpp); the kernel
// around it and the epilogue are ours. Built only with FLASHSAMPLER_CUTLASS,
// only for sm_90a (kernels/CMakeLists.txt); selected by
// FusedSampleArgs::stage1 = kWgmma (fused_sample.cu).
//
// What it computes. logits^T [valid_vocab, batch] = W . Hr^T as a GEMM with
// M = tokens (W's rows, K-major), N = batch rows (Hr = H rounded to the weight
// dtype by LaunchRoundHidden, the mma.sync path's kernel 1, K-major), K =
// hidden_dim, fp32 accumulation. A block owns one 128-token tile (= one
// workspace tile, kMmaTileVocab) times kRows batch rows. Its accumulators go to
// shared memory as dots[row][token] (their coordinates from an identity tensor
// partitioned like the accumulators), and one warp per row folds the tile
// exactly as the mma.sync epilogue does (RowSampler::AddFour over tokens
// [4k, 4k + 4) in lane k, then the 32-lane butterfly of MergeSummaries):
// l' = TransformLogit(dot, 1/T), Philox Gumbel noise keyed by the global token
// id (token_offset added), greedy rows without noise, tokens >= valid_vocab
// skipped, the online log-sum-exp when want_lse, a draft row's l'_x stored and
// its x excluded from the sample. tile_summaries[row * num_tiles + tile] is
// what LaunchMmaStage1 writes for the same dots, bit for bit, so stage 2
// (LaunchMergeTileSummaries) is shared unchanged.
//
// Why exact. A token's score is the fp32 dot product plus its exact noise;
// the Gumbel-max argument needs nothing else (fused_sample.h). Edges: TMA
// fills out-of-bounds elements with zeros (tokens >= valid_vocab, rows >=
// batch, k >= hidden_dim), so padded k adds exact zeros and padded tokens /
// rows are never folded. Against the mma.sync path: between k16 steps both
// add in increasing k; inside one k16 step the hardware's order is not
// documented for either instruction. Measured on an H200, the two give
// bit-identical dots, summaries, tokens and log Z on every case of
// tests/gpu/fused_sample_sm90_test.cc, which asserts it: Stage1Kernel::kAuto
// switches from mma.sync to WGMMA above 64 rows on that guarantee.
//
// Batch invariance (a row's token, log Z and logprob bit-identical in every
// batch). What depends on the batch: the block's N (kRows: 32, 64, 96, 128 or 256,
// the smallest that holds the batch; 256-row chunks above), and so the WGMMA
// instruction's N (m64nNk16) and the stage count of the ring. What does not:
// (1) the K order: every accumulator element is D = sum over k16 steps in
// increasing k, one wgmma per k16 step per 64-token half (the collective
// issues the k blocks of a stage in order, stages in order; no split-K);
// (2) the first step's zero-initialisation (ScaleOut::Zero) and the rest;
// (3) the epilogue (same lanes, same tokens per lane, same butterfly for
// every kRows); (4) the noise (a function of the row's params and the token).
// The one assumption: an m64nNk16 WGMMA computes output element (m, n) with
// the same arithmetic for every N, i.e. column n's result does not depend on
// how many other columns the instruction carries. PTX does not state this;
// it is what the hardware is expected to do (the columns are independent dot
// products) and tests/gpu/fused_sample_sm90_test.cc's BatchInvariance test
// checks it bitwise on the device for every kRows. If it ever fails, fixing
// kRows (one config for every batch, wider batches in chunks) restores
// invariance by construction at the cost of small-batch tensor work.
//
// Two blocks per SM (Stage1Kernel::kWgmmaOverlap). With one block per SM
// (kWgmma) the block's epilogue (Philox, two logs and an exp per token, on
// 8 warps) leaves the tensor cores and the TMA idle, as its main loop leaves
// the ALUs idle. The overlap configurations halve the ring (<= 113 KB a
// block), cap a block at 128 rows (64 fp32 accumulators per consumer
// thread), keep one producer warp instead of a warpgroup (288 threads, 112
// registers each: two blocks fill the SM's 64K) and declare 2 blocks per
// SM, so the block scheduler runs one block's epilogue against the other's
// main loop, as the mma.sync kernel's 2-blocks-per-SM configs do. Their
// warps also fold four rows a pass with the pruned fold (FoldRowPairLanes:
// the noise's two logs only for each lane's most promising token and for
// the tokens whose bound reaches the tile's best score; two rows' chains
// interleave) and one butterfly for the four (FoldRowQuad: the same merge
// tree in fewer merges); the same summary bits. Nothing that decides a bit changes: the WGMMA is
// m64nNk16 with N = the block's rows as before, the same K order, the same
// epilogue per row; only the block shape and stage count differ, which the
// batch-invariance argument above already covers (256-row batches take two
// 128-row chunks here instead of one 256-row block). What it cannot do is
// keep the two blocks out of phase: both blocks of an SM start together and
// may run their main loops, then their epilogues, side by side.
//
// Ping-pong (Stage1Kernel::kWgmmaPingpong) enforces the overlap instead:
// one persistent block per SM walks work items (token tile, 128-row chunk);
// each consumer warpgroup owns whole items (128 tokens x up to 128 rows,
// 128 accumulators a thread) and the two alternate, ordered by CUTLASS's
// OrderedSequenceBarrier as in KernelTmaWarpSpecializedPingpong: warpgroup A's
// main loop, then B's main loop while A runs its epilogue, then A's next
// main loop while B runs its epilogue, ... The producer warp keeps loading
// the next item's stages throughout, so the TMA and the tensor cores never
// wait for an epilogue unless the epilogue (4 warps, four rows a pass, pruned) is the
// longer of the two. Per item the arithmetic is the one above (m64nNk16 with
// N = the item's rows, two 64-token atoms per warpgroup, K in order, the
// same fold), so it too gives kWgmma's bits.
//
// Separate epilogue warps (Stage1Kernel::kWgmmaSeparateEpilogue) give the
// epilogue warps of its own instead: one persistent block per SM walks the
// work items; its two MMA warpgroups run the cooperative main loop of item
// i + 1 while epilogue warps fold item i's dot tile (8 warps, 11 at 128
// rows; the pruned fold), and the producer warp keeps the ring full
// throughout. Per item the SM spends about max(main loop, epilogue) instead
// of their sum: at 32-128 rows, where a 128-token tile's main loop is bound
// by reading W, it runs within 2% of cuBLAS's GEMM (H100). Its limit from
// 256 rows is the two halves' contention for the SM: alone, the main loop
// runs within 10% of the GEMM and the epilogue in under 0.77 of its time,
// but beside the epilogue warps the MMA warps' own instructions issue late
// and the tensor pipe idles between batches (H200, NOTES-fused.md v31; the
// roles from the shuffled warp index, below, keep most of the MMA loop on
// the uniform datapath, v32). Fewer epilogue warps measured slower;
// a twelfth would put six warps on one scheduler and
// leave 80 registers a thread, fewer than the fold needs (90). Per item the
// arithmetic is kWgmma's (the same collective, K order and fold), so are
// the bits. At D >= 8192 its 96- and 128-row boxes run as tile pairs: two
// blocks of a 2-block cluster on adjacent tiles of one chunk, each loading
// half of every Hr box and multicasting it into both rings (WorkItems,
// kTilePairsMinHidden); the same WGMMAs on the same operands, the same bits.
//
// The controlled epilogue (the fused controlled path, fused_controlled_sample.h;
// WgmmaTileKernel<Cfg, true>): the same dot tile, and each row then runs
// fused_controls.cuh's ControlledTileRow, the mma.sync kernel's controlled
// epilogue statement for statement (one warp per row, lane k on tokens
// [4k, 4k + 4)), so its summaries and candidates are mma.sync's bit for bit.
// Built for every schedule but the ping-pong, which refuses controls.
//
// Hand-written PTX: none here beyond what sample_reduce.cuh already wraps
// (griddepcontrol for programmatic dependent launch, which CUTLASS only emits
// under CUTLASS_ENABLE_GDC_FOR_SM90, a global switch we do not set).
#include "kernels/cuda/fused_sample_sm90.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernels/common/candidate_order_key.h"
#include "kernels/common/gumbel_noise.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_controls.cuh"
#include "kernels/cuda/fused_sample_mma.cuh"
#include "kernels/cuda/sample_reduce.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "fused_sample_sm90.cu holds WGMMA code: compile it for sm_90a only (kernels/CMakeLists.txt)"
#endif

namespace flashsampler::kernels::cuda_internal {
namespace {

constexpr int kTileTokens = kMmaTileVocab;   // 128: block tile M = one workspace tile
constexpr int kKTile = 64;                   // K elements per ring stage: 128-byte rows, 128B swizzle
constexpr int kDotStride = kTileTokens + 4;  // floats per row of the epilogue's dot tile
constexpr int kConsumerThreads = 256;        // two warpgroups, 64 tokens each
constexpr int kConsumerWarps = kConsumerThreads / 32;
// Named barrier of the consumer warpgroups: user id 0, which NamedBarrier::sync
// maps past CUTLASS's reserved ids (hardware barrier 8; 0 is __syncthreads).
constexpr uint32_t kEpilogueBarrier = 0;
static_assert(kTileTokens == 4 * 32, "the epilogue gives each lane 4 tokens of a tile");

// Which kernel a block configuration is for (Cfg::kSchedule).
enum class Schedule {
  kBlockPerItem,      // WgmmaTileKernel: one block per work item (one or two per SM)
  kPingpong,          // WgmmaPingpongKernel: persistent; no controlled epilogue
  kSeparateEpilogue,  // WgmmaSeparateEpilogueKernel: persistent
};

// CUTLASS's SM90 TMA warp-specialized collective main loop for a block tile
// of 128 tokens x kRows rows x 64 k and a kStages ring. A = W [tokens, K]
// row-major (K-major), B = Hr [rows, K] row-major, which is CUTLASS's
// column-major K x N (K-major). Alignment 8 elements = 16 bytes. kK: K
// elements per stage (a multiple of 64: 128B-swizzled boxes). Schedule:
// KernelTmaWarpSpecializedCooperative (two warpgroups share each stage,
// 64 tokens each) or ...Pingpong (one warpgroup per stage, 128 tokens).
// kClusterTiles: blocks of a cluster along the tokens (GEMM M), 1 or 2. At 2
// the builder gives Hr (the B operand, the same chunk for both blocks) a
// multicast TMA: each block loads half of every Hr box and writes it into
// both blocks' rings, so Hr crosses L2 -> SM once for the pair; W keeps
// a plain TMA. The stages and their byte counts do not change.
template <class Element, int kRows, int kStages, class Schedule, int kK = kKTile,
          int kClusterTiles = 1>
using RingMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, 8,
    Element, cutlass::layout::ColumnMajor, 8, float,
    cute::Shape<cute::Int<kTileTokens>, cute::Int<kRows>, cute::Int<kK>>,
    cute::Shape<cute::Int<kClusterTiles>, cute::_1, cute::_1>,
    cutlass::gemm::collective::StageCount<kStages>, Schedule>::CollectiveOp;

// ---- Block shapes --------------------------------------------------------------
// Element: cutlass::bfloat16_t or cutlass::half_t. kRows: batch rows per block
// (GEMM N). kStages: depth of the TMA ring, each stage 128 x 64 W elements
// plus kRows x 64 Hr elements. kBlocksPerSm: 1 (the ring takes ~160-192 KB,
// so kStages - 1 steps of W, 16 KB each, are in flight per SM while the
// tensor cores work on one) or 2 (two rings of ~100 KB, one block's epilogue
// against the other's main loop). kStraightEpilogue: the epilogue's warps
// fold four rows per pass with the pruned fold (FoldTile, FoldRowPairLanes,
// FoldRowQuad).
template <class Element, int kRows_, int kStages_, int kBlocksPerSm_, bool kStraightEpilogue_>
struct WgmmaConfig {
  static constexpr int kRows = kRows_;
  static constexpr int kStages = kStages_;
  static constexpr int kBlocksPerSm = kBlocksPerSm_;
  static constexpr bool kStraightEpilogue = kStraightEpilogue_;
  static constexpr Schedule kSchedule = Schedule::kBlockPerItem;
  // Threads. One block per SM: warpgroup 0 produces (its warp 0 issues the
  // TMA loads; the other three only give their registers back), warpgroups
  // 1-2 consume. Two per SM: warpgroups 0-1 consume (WGMMA wants a
  // warpgroup's warps aligned to 4) and warp 8 alone produces, 288 threads.
  static constexpr bool kConsumersFirst = kBlocksPerSm == 2;
  static constexpr int kProducerThreads = kConsumersFirst ? 32 : 128;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  static constexpr int kFirstConsumer = kConsumersFirst ? 0 : kProducerThreads;
  static constexpr int kLoadWarp = kConsumersFirst ? kConsumerWarps : 0;
  // Registers per thread: ptxas compiles every warp within what
  // __launch_bounds__(kThreads, kBlocksPerSm) allows (kLaunchRegisters: 168
  // or 112), setmaxnreg regions included. One block per SM then moves
  // registers from the producer warpgroup to the consumers with setmaxnreg
  // (40 and 232, CUTLASS's cooperative kernel's values: the block's pool
  // exactly). Two per SM keeps 112 everywhere: setmaxnreg would need a
  // whole producer warpgroup (at 2 x 384 threads the consumers could not
  // hold the 64 accumulators plus a wgmma's operands within the 80 at launch).
  // The consumers need kRows / 2 fp32 accumulators (128 at kRows = 256).
  static constexpr int kLaunchRegisters = 65536 / (kThreads * kBlocksPerSm) / 8 * 8;
  static constexpr bool kMoveRegisters = !kConsumersFirst;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters =
      kMoveRegisters ? (kLaunchRegisters * kThreads - kProducerRegisters * kProducerThreads) /
                           kConsumerThreads / 8 * 8
                     : kLaunchRegisters;
  static_assert(kBlocksPerSm == 1 || kRows <= 128, "two blocks per SM: at most 64 accumulators");
  static_assert(kConsumerRegisters >= kRows / 2 + 32 && kConsumerRegisters <= 256,
                "the accumulators fit the consumers' registers");
  using TileShape = cute::Shape<cute::Int<kTileTokens>, cute::Int<kRows>, cute::Int<kKTile>>;
  static constexpr int kClusterTiles = 1;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop =
      RingMainloop<Element, kRows, kStages, cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using TiledMma = typename Mainloop::TiledMma;
  static_assert(cute::size(TiledMma{}) == kConsumerThreads,
                "two consumer warpgroups, 64 tokens each (AtomLayout 2x1x1)");

  // The ring, reused after the main loop for the epilogue's dot tile.
  struct SharedStorage {
    union Ring {
      typename Mainloop::TensorStorage tensors;
      float dots[kRows * kDotStride];
    } ring;
    typename Mainloop::PipelineStorage pipeline;
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(sizeof(typename Mainloop::TensorStorage) >= sizeof(float) * kRows * kDotStride,
                "the dot tile fits in the ring (it must not grow the union)");
  // An SM has 228 KB of shared memory, of which each resident block also
  // takes 1 KB (the runtime's reserved shared memory); 227 KB per block at most.
  static_assert(kSmemBytes <= 227 * 1024, "one block fits an H100 SM's shared memory");
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024,
                "kBlocksPerSm blocks fit an SM's shared memory");
};

// One block per SM (kWgmma): as many stages as fit ~192 KB.
template <class E> using Wgmma32 = WgmmaConfig<E, 32, 8, 1, false>;    // 8 x 20 KB
template <class E> using Wgmma64 = WgmmaConfig<E, 64, 8, 1, false>;    // 8 x 24 KB
template <class E> using Wgmma128 = WgmmaConfig<E, 128, 6, 1, false>;  // 6 x 32 KB
template <class E> using Wgmma256 = WgmmaConfig<E, 256, 4, 1, false>;  // 4 x 48 KB
// Two blocks per SM (kWgmmaOverlap): as many stages as fit 113 KB; batches
// above 128 rows in 128-row chunks.
template <class E> using Wgmma32x2 = WgmmaConfig<E, 32, 5, 2, true>;    // 5 x 20 KB
template <class E> using Wgmma64x2 = WgmmaConfig<E, 64, 4, 2, true>;    // 4 x 24 KB
template <class E> using Wgmma128x2 = WgmmaConfig<E, 128, 3, 2, true>;  // 3 x 32 KB

// Ping-pong (kWgmmaPingpong): a persistent block per SM, 384 threads:
// warpgroup 0 produces (its warp 0 loads every work item's stages in turn),
// warpgroups 1 and 2 each own whole work items of 128 tokens x kRows rows
// (TiledMma of one warpgroup: two m64nNk16 atoms along the tokens, kRows fp32
// accumulators a thread) and alternate: one runs its main loop while the
// other runs its epilogue (CUTLASS's KernelTmaWarpSpecializedPingpong, whose
// OrderedSequenceBarrier orders the two main loops and the two epilogues).
// The epilogues never overlap each other, so the two warpgroups share one dot
// tile outside the ring. kStages: as many as fit beside it (227 KB).
template <class Element, int kRows_, int kStages_>
struct PingpongConfig {
  static constexpr int kRows = kRows_;
  static constexpr int kStages = kStages_;
  static constexpr bool kStraightEpilogue = true;
  static constexpr Schedule kSchedule = Schedule::kPingpong;
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegisters = 40;   // setmaxnreg, as CUTLASS's ping-pong kernel
  static constexpr int kConsumerRegisters = 232;  // (ptxas still compiles every warp within 168)
  static_assert(kRows <= 128, "kRows accumulators a consumer thread: at most 128 of its 168");
  using TileShape = cute::Shape<cute::Int<kTileTokens>, cute::Int<kRows>, cute::Int<kKTile>>;
  static constexpr int kClusterTiles = 1;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop =
      RingMainloop<Element, kRows, kStages, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using TiledMma = typename Mainloop::TiledMma;
  static_assert(cute::size(TiledMma{}) == 128, "one warpgroup per work item");
  // Sequence depth 2 (main loop, epilogue) over 2 warpgroups.
  using OrderBarrier = cutlass::OrderedSequenceBarrier<2, 2>;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) float dots[kRows * kDotStride];
    typename Mainloop::PipelineStorage pipeline;
    typename OrderBarrier::SharedStorage order;
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "one block fits an H100 SM's shared memory");
};

template <class E> using Pingpong32 = PingpongConfig<E, 32, 8>;    // 8 x 20 KB + 17 KB
template <class E> using Pingpong64 = PingpongConfig<E, 64, 7>;    // 7 x 24 KB + 34 KB
template <class E> using Pingpong128 = PingpongConfig<E, 128, 4>;  // 4 x 32 KB + 68 KB

// Separate epilogue warps (kWgmmaSeparateEpilogue): a persistent block per
// SM of 256 + 32 kEpilogueWarps_ + 32 threads. Warpgroups 0-1 are the MMA
// warpgroups (the cooperative collective, as WgmmaConfig: 64 tokens x kRows
// each), the next kEpilogueWarps_ warps run the epilogue only, the last warp
// alone produces. The MMA warpgroups write an item's accumulators into the
// dot tile and go straight on to the next item's main loop; the epilogue
// warps fold the tile meanwhile. One dot tile (two would not fit beside a
// useful ring at 128 rows), so the MMA warps wait for the epilogue to
// release it before they write the next: per item the SM spends max(main
// loop, epilogue) plus the tile's store, not their sum.
// Registers: no setmaxnreg (it would need the producer to be a whole
// warpgroup), so every warp gets what the busiest of the SM's four
// schedulers leaves: 17 or 20 warps put five on one scheduler, 16384 / (5 x
// 32) -> 96 registers a thread (ptxas: 71-96, no spills). The MMA threads
// hold kRows / 2 accumulators. The epilogue is latency-bound (no eligible
// warp two cycles in three, 2026-11-28 profile), so at 128 rows 11 epilogue
// warps instead of 8 took 6% off at 256-1024 rows, D = 4096 (BENCHMARKS.md,
// "Eleven epilogue warps"); 8 and 6 were still slower on 2026-11-29 (v31).
// kK_: K elements per ring stage.
template <class Element, int kRows_, int kStages_, int kK_ = kKTile, int kEpilogueWarps_ = 8,
          int kClusterTiles_ = 1>
struct SeparateEpilogueConfig {
  static constexpr int kRows = kRows_;
  static constexpr int kStages = kStages_;
  static constexpr bool kStraightEpilogue = true;
  static constexpr Schedule kSchedule = Schedule::kSeparateEpilogue;
  static constexpr int kEpilogueThreads = 32 * kEpilogueWarps_;
  static constexpr int kThreads = kConsumerThreads + kEpilogueThreads + 32;
  static constexpr int kLoadWarp = (kConsumerThreads + kEpilogueThreads) / 32;
  static_assert(kRows <= 128, "kRows / 2 accumulators a thread within 96 registers");
  static_assert(kThreads <= 640, "at most five warps a scheduler: 96 registers a thread");
  using TileShape = cute::Shape<cute::Int<kTileTokens>, cute::Int<kRows>, cute::Int<kK_>>;
  // Blocks of a cluster, along the tokens (RingMainloop): 2 share each Hr box
  // through TMA multicast and walk their items in step (the kernel's item loop).
  static constexpr int kClusterTiles = kClusterTiles_;
  static_assert(kClusterTiles == 1 || kClusterTiles == 2, "one block or a pair");
  static_assert(kRows % (8 * kClusterTiles) == 0, "each block multicasts whole 8-row slabs of Hr");
  using ClusterShape = cute::Shape<cute::Int<kClusterTiles>, cute::_1, cute::_1>;
  using Mainloop = RingMainloop<Element, kRows, kStages,
                                cutlass::gemm::KernelTmaWarpSpecializedCooperative, kK_, kClusterTiles>;
  using TiledMma = typename Mainloop::TiledMma;
  static_assert(cute::size(TiledMma{}) == kConsumerThreads,
                "two MMA warpgroups, 64 tokens each (AtomLayout 2x1x1)");

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) float dots[kRows * kDotStride];
    typename Mainloop::PipelineStorage pipeline;
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "one block fits an H100 SM's shared memory");
};

// 32 and 64 rows: 128-element K steps (each stage reads 256 contiguous
// bytes of every W row instead of 128; the mma.sync kernel's v2 found the
// DRAM serves such runs better): 1-3% faster than 64-element steps at 8 and
// 7 stages (H100). The K order of the k16 WGMMAs is the same, so are the bits.
template <class E> using Separate32 = SeparateEpilogueConfig<E, 32, 4, 128>;  // 4 x 40 KB + 17 KB
template <class E> using Separate64 = SeparateEpilogueConfig<E, 64, 4, 128>;  // 4 x 48 KB + 34 KB
// 128 rows: 11 epilogue warps, the most within 96 registers (the register
// note above); a warp folds at most 12 of the 128 rows instead of 16.
template <class E> using Separate128 = SeparateEpilogueConfig<E, 128, 4, kKTile, 11>;  // 4 x 32 KB + 68 KB
// At D >= kDeepRingMinHidden, where a 128-row box holds the chunk (97-128
// and 193-256 rows; controlled rows 97-128 only): a fifth stage (5 x 32 KB +
// 66 KB = 227 KB, all of an SM's shared memory a block may have). There the
// main loop outlasts the epilogue and the W stream waits on data in flight
// (at 128 rows, 2026-11-28 profile: the MMA warps wait for TMA data, the
// producer for a free slot). H200: plain 4-6% faster at 128 rows, 2% at 256
// (D = 8192); controlled 3-4% at 128 rows once the tile-head bound had
// lightened its epilogue (v27; before it, 7% slower at 256 rows). 384-1024
// rows 0-1% slower and D = 4096 1-3% slower, so those keep four stages.
// Same instructions in the same K order: same bits.
// Tile pairs (D >= kTilePairsMinHidden, below) like every 96- and 128-row box there.
template <class E> using Separate128Deep = SeparateEpilogueConfig<E, 128, 5, kKTile, 11, 2>;
// 96-row boxes (WgmmaSeparateBox, stage1_shape.h) where the batch's chunks
// hold 65-96 rows: at 65-96 rows (one chunk) and 129-192 (two), 5 x 28 KB +
// 50 KB. In 128-row boxes such chunks spent a quarter to a half of the
// block's MMA work and H traffic on zero rows (H200: -10 to -25% at 65-96
// rows, -9 to -12% at 144-192; NOTES-fused v28). A 112-row box for 97-112
// and 193-224 rows was 30-60% slower than 128 (not found why) and is not
// built. Same K order per dot: same bits.
template <class E> using Separate96 = SeparateEpilogueConfig<E, 96, 5, kKTile, 11>;
// Tile pairs: the 96- and 128-row boxes as 2-block clusters, the blocks of a
// pair on adjacent tiles of one chunk, each loading half of every Hr box
// and multicasting it to both (RingMainloop, WorkItems): Hr crosses
// L2 -> SM once for two tiles, a quarter of an item's bytes. Where the main
// loop outlasts the epilogue, D >= kTilePairsMinHidden. H200, 2026-11-29,
// D = 8192: -1.5 to -3% at 128-1024 rows, 0 to -0.7% at 96-192 rows; at
// D = 4096 0 to +1% (NOTES-fused v30). Same WGMMAs in the same K order: same bits.
template <class E> using Separate96Pair = SeparateEpilogueConfig<E, 96, 5, kKTile, 11, 2>;
template <class E> using Separate128Pair = SeparateEpilogueConfig<E, 128, 4, kKTile, 11, 2>;
constexpr int64_t kTilePairsMinHidden = 8192;
constexpr int64_t kDeepRingMinHidden = 8192;
static_assert(kDeepRingMinHidden >= kTilePairsMinHidden, "Separate128Deep is a pair configuration");
constexpr int64_t kDeepRingMaxBatch = 256;
constexpr int64_t kDeepRingMaxControlledBatch = 128;
// The cross-tile bound ("The cross-tile bound", above) where the epilogue
// outlasts the main loop: more than one 128-row chunk, and D below 8192.
// H200, 2026-11-29 (NOTES-fused v29): -2.9 to -5.1% at 160-1024 rows,
// D = 4096; with the bound at D = 8192 (a main loop twice as long) 0 to
// +1.5%, and at 64-96 rows +1.5 to +2.3%.
constexpr int64_t kCrossTileBoundMinBatch = 129;
constexpr int64_t kCrossTileBoundHiddenBelow = 8192;

template <class Cfg>
struct WgmmaKernelParams {
  typename Cfg::Mainloop::Params mainloop;  // TMA descriptors (must live in param space)
  int32_t valid_vocab;                      // GEMM M
  int32_t batch;                            // rows sampled
  int32_t loaded_rows;                      // GEMM N: batch, or num_chunks * kRows (zero rows past the batch)
  int32_t hidden_dim;                       // GEMM K
  int32_t num_chunks;                       // ceil(batch / kRows)
  int32_t chunk_rows;                       // batch rows per chunk (ItemRows), <= kRows
  int64_t num_tiles;                        // ceil(valid_vocab / 128)
  const RowParams* params;
  bool want_lse;
  const int32_t* draft_tokens;
  float* draft_logits;
  int64_t token_offset;
  SampleSummary* tile_summaries;
  // RowBestKeys: [batch] OrderedFloatBits of a score some tile summary of
  // the row holds (0: none yet); null: no cross-tile bound, every tile
  // summary as AddFour's (the controlled path, the logits).
  uint32_t* row_best_keys;
  MmaControls ctl;  // the fused controlled path's (kControlled kernels only)
  // LaunchWgmmaLogits: the dot tile is written here (row stride logits_ld)
  // instead of folded; null for the samplers.
  float* logits;
  int64_t logits_ld;
};

// Chunk `chunk`'s rows of the batch: [first, end). Chunks hold chunk_rows
// rows each (the last one fewer), placed at chunk * kRows in Hr
// (HiddenChunks), so the dot tile's row l is batch row first + l.
struct ItemRows {
  int64_t first;
  int64_t end;
};
template <class Cfg>
__device__ __forceinline__ ItemRows RowsOfChunk(const WgmmaKernelParams<Cfg>& p, int chunk) {
  const int64_t first = static_cast<int64_t>(chunk) * p.chunk_rows;
  return {first, first + p.chunk_rows < p.batch ? first + p.chunk_rows : p.batch};
}

// ---- The epilogue's fold ----------------------------------------------------------
// The pruned fold (the two-blocks-per-SM, ping-pong and separate-epilogue
// schedules: two rows a warp pass). It gives RowSampler::AddFour's summary bit for bit while
// evaluating the noise (Philox word -> two logs) for about one token per
// lane and row instead of four:
//  1. Each lane forms its four transformed logits l' and Philox words, and
//     for each token that may win (below valid_vocab, not a sampled row's
//     draft) the bound ub = fl(l' + GumbelLeadingOnesBound(r)) >= its score
//     fl(l' + g) (fp32 addition is monotone).
//  2. The probe: each lane scores its token of largest ub exactly; the warp's
//     best probe score L is a score the row's tile really has.
//  3. A token with ub < L cannot win or tie, so it is skipped. Every other
//     token is scored exactly, in a loop that runs while any lane has one
//     left (the winner among them included: its score >= L, so ub >= L).
// The winner is the maximum of the scores under ScoreBeats' total order
// (score, then lower id), which no fold order changes, so the tile summary's
// best_score / best_index / best_logit are those of folding all four tokens
// in order. The log-sum-exp does not use the noise; it folds all four tokens
// in token order as before (one expf of the argument AddToken's branch would
// pass, then selects), so max_logit and sum_exp keep their bits. Greedy rows
// (no noise) fold their four tokens directly. Typical cost: one noise per
// lane and row, plus a loop pass for the few tokens within ~ln 2 of the
// tile's best; a row whose every l' is -inf has L = -inf and prunes nothing.
//
// The cross-tile bound (RowBestKeys; the sampler's launches, not the
// controlled path's). A sampled row also has a known score K: the largest
// winner score that tile summaries of the row already written hold, read
// from a per-row word that each tile raises with atomicMax after its fold.
// The row's winner scores at least K, because the summary that raised K is
// merged in stage 2. So a token with ub < K cannot win or tie the row
// (ScoreBeats: a tie needs an equal score): a lane whose largest ub is below
// K skips its probe, a warp with no probing lane skips the probe's
// butterfly, and step 3 uses max(L, K). Once a few tiles of a row are
// done, K is near the row's final best, and a token's bound exceeds it
// with odds of about e^-(K - l'): most warps skip the probe (on a
// 151936-token head, 55-78% of the tile summaries of fused_sample_sm90_test's
// rows came out pruned). The noise's Philox words and every bound are
// still formed (the bounds need them), so the saving is the probe's three
// logs and five shuffles, 14% of the epilogue's warp instructions: 3-5% of
// the launch at 160-1024 rows, D = 4096 (NOTES-fused.md v29;
// kCrossTileBoundMinBatch says where it is used). Each epilogue warp reads
// its rows' K once an item, before it waits for the item's dot tile
// (LaneKnownScores): read at each fold, the L2 latency stalled the epilogue
// and ate most of the saving.
// What changes is the summaries, not the row: a tile whose tokens all lie
// below K may keep an empty winner, or a token that is not its own best
// (one with ub >= K scored, its best skipped); either way every token that
// can win the row is scored in its tile, and the merged winner is the same
// token with the same score and l', bit for bit, in every timing. The
// log-sum-exp fields never change. K only grows, so a stale read is a
// smaller, still valid bound.

// The K of every row a warp of the straight epilogue folds in one item, a
// row a lane: FoldTile's warp takes rows r + q kWarps (q = 0..3) in passes
// r = warp, warp + 4 kWarps, ...; lane 4 pass + q holds that row's K
// (kRows <= 8 x 4 kWarps in every schedule: at most 32 rows); -inf for a
// row that is absent (past the chunk or kRows), that no summary has raised
// yet (key 0), or when the launch keeps no keys. Read from L2 (other blocks
// raise the keys) once an item, before the epilogue waits for its dot
// tile, so the latency hides behind the wait. LaunchRoundHidden's kernel
// zeroes the keys, and only the producer's thread has waited for it: so
// does each caller here.
template <class Cfg, int kWarps>
__device__ __forceinline__ float LaneKnownScores(const uint32_t* row_best_keys, int64_t row0,
                                                 int64_t row_end, int warp, int lane) {
  static_assert(Cfg::kRows <= 8 * 4 * kWarps, "a warp's rows fit its lanes");
  if (row_best_keys == nullptr) return -INFINITY;
  GridDependencyWait();
  const int local = warp + (lane / 4) * 4 * kWarps + (lane % 4) * kWarps;
  if (local >= Cfg::kRows || row0 + local >= row_end) return -INFINITY;
  const uint32_t key = __ldcg(row_best_keys + row0 + local);
  return key == 0u ? -INFINITY : FloatOfOrderedBits(key);
}

// GumbelFromBits (kernels/common/gumbel_noise.h) without its branch: both
// halves' -log u are evaluated (logf of the exact u, log1pf of the exact
// 1 - u) and the one ExponentialFromBits takes is selected. The same calls
// on the same operands, so the same bits; a warp whose lanes fall in both
// halves executes both anyway.
__device__ __forceinline__ float GumbelFromBitsStraight(uint32_t r) {
  const uint32_t k = r >> 8;
  const float lower = -logf((static_cast<float>(k) + 0.5f) * 0x1p-24f);
  const float upper = -log1pf(-((static_cast<float>((1u << 24) - 1u - k) + 0.5f) * 0x1p-24f));
  return -logf(k < (1u << 23) ? lower : upper);
}

template <class T>
__device__ __forceinline__ T PickOfFour(const T (&v)[4], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3];
}

// One lane's four tokens of one row.
struct LaneTokens {
  float logit[4];    // l' = TransformLogit(dot, 1/T)
  uint32_t bits[4];  // the tokens' Philox words
  float bound[4];    // >= the score when it may win, else -inf
  int32_t room;      // live tokens, 0-4: token i is below valid_vocab iff i < room
  uint32_t compete;  // bit i: token i may win (live, and not a sampled row's draft: score NaN)
  int32_t token0;    // global id of the first
  __device__ __forceinline__ bool live(int i) const { return i < room; }
  __device__ __forceinline__ bool competes(int i) const { return ((compete >> i) & 1u) != 0u; }
};

// Step 1, and RowSampler::DraftScore's store of the draft's l'.
// room: how many of the four lie below valid_vocab (0-4); live_mask: the
// bits i < room. The global id in 32 bits: its low word is all that is used
// (the int32 id and the Philox block), and the low word of a sum is the sum
// of the low words. The draft test is one unsigned compare (below), and the
// flags are bits of one word: ptxas had made the bool arrays and the 64-bit
// compares branches and per-flag bit packing (NOTES-fused.md v34).
__device__ __forceinline__ LaneTokens PrepareLaneTokens(const RowSampler& row,
                                                        int64_t local_token0, const float4& dots,
                                                        int32_t room, uint32_t live_mask) {
  LaneTokens t;
  const uint32_t token0 =
      static_cast<uint32_t>(local_token0) + static_cast<uint32_t>(row.token_offset);
  t.token0 = static_cast<int32_t>(token0);
  t.room = room;
  const r123::Philox4x32::ctr_type block = PhiloxNoiseBlock(
      row.params.seed, row.params.offset, row.params.stream, token0 >> 2);
  const float dot[4] = {dots.x, dots.y, dots.z, dots.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    t.logit[i] = TransformLogit(dot[i], row.scale);
    t.bits[i] = block.v[i];
  }
  // The draft x is token d = x - token0 of this lane when d < 4 (mod 2^32:
  // token0 + d == x exactly when d == x - token0), at most one of the four.
  uint32_t compete = live_mask;
  const uint32_t d = static_cast<uint32_t>(row.draft) - token0;
  if (d < 4u && ((live_mask >> d) & 1u) != 0u) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (d == static_cast<uint32_t>(i)) *row.draft_logit = t.logit[i];
    }
    if (row.sampled) compete &= ~(1u << d);
  }
  t.compete = compete;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float bound = __fadd_rn(t.logit[i], GumbelLeadingOnesBound(t.bits[i]));
    t.bound[i] = t.competes(i) ? bound : -INFINITY;
  }
  return t;
}

// AddToken's winner test as selects; a NaN score never wins.
__device__ __forceinline__ void FoldScore(SampleSummary& s, bool fold, float score,
                                          int32_t token, float logit) {
  const bool take = fold && score == score && ScoreBeats(score, token, s.best_score, s.best_index);
  s.best_score = take ? score : s.best_score;
  s.best_index = take ? token : s.best_index;
  s.best_logit = take ? logit : s.best_logit;
}

// AddToken's log-sum-exp over the four tokens, in token order.
__device__ __forceinline__ void FoldLogSumExp(SampleSummary& s, const LaneTokens& t) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float l = t.logit[i];
    const bool raise = t.live(i) && l > s.max_logit;
    const bool add = t.live(i) && !raise && l > -INFINITY;  // skips -inf and NaN
    const float e = expf(raise ? s.max_logit - l : l - s.max_logit);
    s.sum_exp = raise ? __fmaf_rn(s.sum_exp, e, 1.0f) : add ? __fadd_rn(s.sum_exp, e) : s.sum_exp;
    s.max_logit = raise ? l : s.max_logit;
  }
}

// Steps 2 and 3's selection for one row without the cross-tile bound
// (FoldRowPairLanes' !kBound): folds the probe (sampled rows) or
// all four tokens (greedy rows) into s, and returns the mask of the lane's
// tokens that still need their exact score. kSampled: the caller knows the
// row is sampled, so the greedy row's selects are not emitted (they cost
// about a tenth of a sampled row's fold when evaluated and discarded).
template <bool kSampled>
__device__ __forceinline__ uint32_t FoldProbe(const RowSampler& row, const LaneTokens& t,
                                              SampleSummary& s) {
  const bool sampled = kSampled || row.sampled;
  int j = 0;
#pragma unroll
  for (int i = 1; i < 4; ++i) j = t.bound[i] > PickOfFour(t.bound, j) ? i : j;
  const float logit_j = PickOfFour(t.logit, j);
  const bool probe_may_win = t.competes(j);
  const float score_j = __fadd_rn(logit_j, GumbelFromBitsStraight(PickOfFour(t.bits, j)));
  FoldScore(s, sampled && probe_may_win, score_j, t.token0 + j, logit_j);
  if constexpr (!kSampled) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      FoldScore(s, !sampled && t.competes(i), t.logit[i], t.token0 + i, t.logit[i]);
    }
  }
  float best = sampled && probe_may_win ? score_j : -INFINITY;
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) best = fmaxf(best, __shfl_xor_sync(kFullWarpMask, best, m));
  uint32_t need = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // A -inf bound (l' = -inf) is kept while best is -inf: it may still win.
    if (sampled && t.competes(i) && i != j && !(t.bound[i] < best)) need |= 1u << i;
  }
  return need;
}

// The same selection with the cross-tile bound (kBound), in parts:
// ChooseProbe, FoldProbeScore, FoldGreedy and NeedMask. known: a score that
// a token of the row has in some tile's summary (RowBestKeys), or -inf. A
// token whose bound is below it cannot win the row, so a lane whose best
// bound is below it skips its probe; when no lane of the warp probes, the
// butterfly is skipped too (warp-uniform).
struct ProbeChoice {
  int j;          // the lane's token of largest bound
  bool probe;     // it is scored now
};

// The arg-max as a running maximum: bound_j is PickOfFour(t.bound, j) at
// every step, so the same j. Its l' and word are picked in FoldProbeScore,
// which most warps skip.
__device__ __forceinline__ ProbeChoice ChooseProbe(bool sampled, const LaneTokens& t, float known) {
  int j = 0;
  float bound_j = t.bound[0];
#pragma unroll
  for (int i = 1; i < 4; ++i) {
    const bool higher = t.bound[i] > bound_j;
    j = higher ? i : j;
    bound_j = higher ? t.bound[i] : bound_j;
  }
  // !(bound < known): a NaN bound is probed, as it was before the bound
  // (its NaN score never wins).
  return {j, sampled && t.competes(j) && !(bound_j < known)};
}

// The probe's exact score folded into s (lanes with c.probe), and the
// warp's best probe score, or -inf.
__device__ __forceinline__ float FoldProbeScore(const LaneTokens& t, ProbeChoice c,
                                                SampleSummary& s) {
  const float logit_j = PickOfFour(t.logit, c.j);
  const float score_j = __fadd_rn(logit_j, GumbelFromBitsStraight(PickOfFour(t.bits, c.j)));
  FoldScore(s, c.probe, score_j, t.token0 + c.j, logit_j);
  float best = c.probe ? score_j : -INFINITY;
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) best = fmaxf(best, __shfl_xor_sync(kFullWarpMask, best, m));
  return best;
}

// The greedy row's fold (its four l' compete directly), when not kSampled.
template <bool kSampled>
__device__ __forceinline__ void FoldGreedy(bool sampled, const LaneTokens& t, SampleSummary& s) {
  if constexpr (!kSampled) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      FoldScore(s, !sampled && t.competes(i), t.logit[i], t.token0 + i, t.logit[i]);
    }
  }
}

// The tokens left after the probe: those that may still win or tie, i.e.
// whose bound is not below best = max(the warp's probe scores, known). A
// probed token is already folded. A -inf bound (l' = -inf) is kept while
// best is -inf: it may still win.
__device__ __forceinline__ uint32_t NeedMask(bool sampled, const LaneTokens& t, ProbeChoice c,
                                             float best) {
  uint32_t keep = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) keep |= !(t.bound[i] < best) ? 1u << i : 0u;
  const uint32_t probed = c.probe ? 1u << c.j : 0u;
  return sampled ? t.compete & ~probed & keep : 0u;
}

// Rows a and b of the dot tile (their 128 fp32 dots each, before the scale)
// to each lane's partial summaries: lane k folds tokens [4k, 4k + 4) of each
// as above (the mma.sync epilogue's lane-to-token map). The two rows' chains
// are independent, so they interleave. All 32 lanes call it; the butterfly
// is FoldRowQuad's. kBothSampled: both rows are known to be sampled
// (FoldGreedy's kSampled); the same bits either way. lane_known: the
// warp's K values, one row a lane (LaneKnownScores; -inf for an absent row
// or a launch without keys: no bound, every summary as AddFour's); ka / kb:
// the lanes holding rows a's and b's. Fetched by a shuffle after the Philox
// words, so no register holds them meanwhile.
template <bool kBothSampled, bool kBound>
__device__ __forceinline__ void FoldRowPairLanes(const RowSampler& a, const RowSampler& b,
                                                 const float* dots_a, const float* dots_b,
                                                 int64_t tok0, int lane, int64_t valid_vocab,
                                                 bool want_lse, float lane_known, int ka,
                                                 int kb, SampleSummary& sa, SampleSummary& sb) {
  // The lane's live tokens, 0-4 (the last tile and phantom tiles have fewer),
  // as a count and as a mask, both passed for both rows: with the mask
  // derived inside PrepareLaneTokens instead, ptxas spilled 32 / 40 bytes in
  // the bound kernel, not 8 / 8 (NOTES-fused.md v34).
  const int64_t left = valid_vocab - (tok0 + 4 * lane);
  const int32_t room = left <= 0 ? 0 : left >= 4 ? 4 : static_cast<int32_t>(left);
  const uint32_t live_mask = (1u << room) - 1u;
  const LaneTokens ta = PrepareLaneTokens(
      a, tok0 + 4 * lane, *reinterpret_cast<const float4*>(dots_a + 4 * lane), room, live_mask);
  const LaneTokens tb = PrepareLaneTokens(
      b, tok0 + 4 * lane, *reinterpret_cast<const float4*>(dots_b + 4 * lane), room, live_mask);
  sa = EmptySampleSummary();
  sb = EmptySampleSummary();
  uint32_t need;
  if constexpr (kBound) {
    const float known_a = __shfl_sync(kFullWarpMask, lane_known, ka);
    const float known_b = __shfl_sync(kFullWarpMask, lane_known, kb);
    const bool sampled_a = kBothSampled || a.sampled;
    const bool sampled_b = kBothSampled || b.sampled;
    FoldGreedy<kBothSampled>(sampled_a, ta, sa);
    FoldGreedy<kBothSampled>(sampled_b, tb, sb);
    // Step 2, the probes; known stands in for a row no lane probes (its
    // best bound is below a score the row has elsewhere, so nothing here
    // can win).
    const ProbeChoice ca = ChooseProbe(sampled_a, ta, known_a);
    const ProbeChoice cb = ChooseProbe(sampled_b, tb, known_b);
    float best_a = known_a, best_b = known_b;
    if (__any_sync(kFullWarpMask, ca.probe || cb.probe)) {
      best_a = fmaxf(best_a, FoldProbeScore(ta, ca, sa));
      best_b = fmaxf(best_b, FoldProbeScore(tb, cb, sb));
    }
    need = NeedMask(sampled_a, ta, ca, best_a) | NeedMask(sampled_b, tb, cb, best_b) << 4;
  } else {
    need = FoldProbe<kBothSampled>(a, ta, sa) | FoldProbe<kBothSampled>(b, tb, sb) << 4;
  }
  // Step 3: one token per lane and pass (bits 0-3: row a's, 4-7: row b's).
  while (__any_sync(kFullWarpMask, need != 0)) {
    const bool has = need != 0;
    const int bit = has ? __ffs(static_cast<int>(need)) - 1 : 0;
    const bool in_b = bit >= 4;
    const int i = bit & 3;
    const float logit = in_b ? PickOfFour(tb.logit, i) : PickOfFour(ta.logit, i);
    const uint32_t bits = in_b ? PickOfFour(tb.bits, i) : PickOfFour(ta.bits, i);
    const float score = __fadd_rn(logit, GumbelFromBitsStraight(bits));
    FoldScore(sa, has && !in_b, score, ta.token0 + i, logit);
    FoldScore(sb, has && in_b, score, tb.token0 + i, logit);
    need &= need - 1;
  }
  if (want_lse) {
    FoldLogSumExp(sa, ta);
    FoldLogSumExp(sb, tb);
  }
}

// FoldRowPairLanes without the greedy rows' selects when both rows are
// sampled (warp-uniform: one row each, the same for every lane).
template <bool kBound>
__device__ __forceinline__ void FoldPair(const RowSampler& a, const RowSampler& b,
                                         const float* dots_a, const float* dots_b, int64_t tok0,
                                         int lane, int64_t valid_vocab, bool want_lse,
                                         float lane_known, int ka, int kb, SampleSummary& sa,
                                         SampleSummary& sb) {
  if (a.sampled && b.sampled) {
    FoldRowPairLanes<true, kBound>(a, b, dots_a, dots_b, tok0, lane, valid_vocab, want_lse,
                                   lane_known, ka, kb, sa, sb);
  } else {
    FoldRowPairLanes<false, kBound>(a, b, dots_a, dots_b, tok0, lane, valid_vocab, want_lse,
                                    lane_known, ka, kb, sa, sb);
  }
}

// x ? a : b field by field: a conditional on the structs themselves selects
// an address, which puts them in local memory.
__device__ __forceinline__ SampleSummary SelectSummary(bool x, const SampleSummary& a,
                                                       const SampleSummary& b) {
  SampleSummary o;
  o.best_score = x ? a.best_score : b.best_score;
  o.best_index = x ? a.best_index : b.best_index;
  o.best_logit = x ? a.best_logit : b.best_logit;
  o.max_logit = x ? a.max_logit : b.max_logit;
  o.sum_exp = x ? a.sum_exp : b.sum_exp;
  return o;
}

// ShuffleXorSummary and MergeSummaries (sample_reduce.cuh, sample_summary.h)
// for the winner fields alone; the log-sum-exp fields are the caller's own.
__device__ __forceinline__ SampleSummary ShuffleXorWinner(const SampleSummary& s, int lane_mask) {
  SampleSummary o = s;
  o.best_score = __shfl_xor_sync(kFullWarpMask, s.best_score, lane_mask);
  o.best_index = __shfl_xor_sync(kFullWarpMask, s.best_index, lane_mask);
  o.best_logit = __shfl_xor_sync(kFullWarpMask, s.best_logit, lane_mask);
  return o;
}

__device__ __forceinline__ SampleSummary MergeWinner(const SampleSummary& a,
                                                     const SampleSummary& b) {
  return SelectSummary(ScoreBeats(b.best_score, b.best_index, a.best_score, a.best_index), b, a);
}

// One merge of FoldRowQuad: MergeSummaries(own, give of lane ^ lane_mask).
// kLse false (no log Z, logprobs or drafts): every partial has the empty
// log-sum-exp (max_logit = -inf, sum_exp = 0), which MergeSummaries passes
// through unchanged, so merging the winner fields alone (three shuffles, no
// rescale) gives the same summary.
template <bool kLse>
__device__ __forceinline__ SampleSummary QuadMerge(const SampleSummary& own, const SampleSummary& give,
                                                   int lane_mask) {
  if constexpr (kLse) {
    return MergeSummaries(own, ShuffleXorSummary(give, lane_mask));
  } else {
    return MergeWinner(own, ShuffleXorWinner(give, lane_mask));
  }
}

// Four rows' lane summaries (a, b, c, d: each lane's partials) to their
// tile summaries, with the butterfly's merge tree but 6 merges a lane
// instead of 20. The butterfly (FoldRow's) gives every lane L of a row
// the value v_5(L), where v_0(L) = lane L's partial and v_j(L) =
// MergeSummaries(v_{j-1}(L), v_{j-1}(L ^ m_j)) for m_j = 16, 8, 4, 2, 1.
// Here a lane computes v_j(L) for fewer rows as j grows: at m = 16, lanes
// 0-15 compute v_1 of rows a and b and lanes 16-31 of rows c and d (each
// sends the partials it gives up and receives the ones it keeps, so the
// merge operands are the butterfly's, in the same order); at m = 8, lanes
// with bit 3 clear keep a / c, the others b / d; at m = 4, 2, 1 each lane
// has one row left. Every lane therefore ends with the butterfly's v_5(L)
// of its row: row a in lanes 0-7, b in 8-15, c in 16-23, d in 24-31. The
// butterfly's value is the same in every lane (MergeSummaries is symmetric:
// the winner is a total order's maximum, and the log-sum-exp's rescaling
// adds the same two products whichever side comes first), so lane 8's row
// b is lane 0's, bit for bit. Returns the lane's row (0-3) and its summary.
// kLse: FoldTile's want_lse (QuadMerge).
template <bool kLse>
__device__ __forceinline__ int FoldRowQuad(const SampleSummary& a, const SampleSummary& b,
                                           const SampleSummary& c, const SampleSummary& d,
                                           int lane, SampleSummary& out) {
  const bool upper16 = (lane & 16) != 0;
  SampleSummary keep0 = SelectSummary(upper16, c, a);
  SampleSummary keep1 = SelectSummary(upper16, d, b);
  const SampleSummary give0 = SelectSummary(upper16, a, c);
  const SampleSummary give1 = SelectSummary(upper16, b, d);
  keep0 = QuadMerge<kLse>(keep0, give0, 16);
  keep1 = QuadMerge<kLse>(keep1, give1, 16);
  const bool upper8 = (lane & 8) != 0;
  out = QuadMerge<kLse>(SelectSummary(upper8, keep1, keep0), SelectSummary(upper8, keep0, keep1),
                        8);
#pragma unroll
  for (int m = 4; m >= 1; m /= 2) out = QuadMerge<kLse>(out, out, m);
  return (upper16 ? 2 : 0) + (upper8 ? 1 : 0);
}

// One row of the dot tile (dots: its 128 fp32 dots, before the scale) to its
// tile summary: lane k folds tokens [4k, 4k + 4) (one Philox block for all
// four), then the butterfly: fused_sample_mma.cu's epilogue statement for
// statement (the one-block-per-SM schedule), so equal dots give equal
// summaries, and the shape is the same for every block shape. All 32 lanes
// call it.
__device__ __forceinline__ SampleSummary FoldRow(const RowSampler& row, const float* dots,
                                                 int64_t tok0, int lane, int64_t valid_vocab,
                                                 bool want_lse) {
  const float4 d = *reinterpret_cast<const float4*>(dots + 4 * lane);
  SampleSummary s = EmptySampleSummary();
  row.AddFour(s, tok0 + 4 * lane, d, valid_vocab, want_lse);
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) s = MergeSummaries(s, ShuffleXorSummary(s, m));
  return s;
}

// The item's rows [row0, row_end) (its chunk's rows in the batch; the dot
// tile's first row_end - row0 rows), one warp per row (warp w of kWarps:
// rows w, w + kWarps, ...), each written to tile_summaries[row * num_tiles +
// tile].
// Cfg::kStraightEpilogue: a warp folds rows r + {0, 1, 2, 3} * kWarps in one
// pass with the pruned fold (FoldPair twice: two independent chains
// each) and one shared butterfly (FoldRowQuad), each row's summary
// unchanged; a row of the four past the batch is folded on the neutral setup
// (RowSampler::Load inactive: no draft) and not written, and when rows c and
// d both are, their pair is not folded at all (a batch of 16 in a 32-row
// block would otherwise fold twice the rows it has).
// kControlled: the fused controlled path's epilogue instead
// (ControlledTileRow, fused_controls.cuh: the mma.sync kernel's, statement
// for statement), one row per warp and pass; it may overwrite its row of
// the dot tile.
// kBound: the straight epilogue with the cross-tile bound (p.row_best_keys
// set); lane_known: LaneKnownScores' value for this item.
template <class Cfg, int kWarps, bool kControlled, bool kBound = false>
__device__ __forceinline__ void FoldTile(const WgmmaKernelParams<Cfg>& p, float* dots,
                                         int64_t row0, int64_t row_end, int64_t tok0, int tile,
                                         int warp, int lane, float lane_known = -INFINITY) {
  constexpr int kRows = Cfg::kRows;
  // The row params (and draft tokens) may come from the kernel this one
  // depends on (a ride-along copy, FusedSampleArgs::hidden_in_weight_dtype),
  // which lets this grid start before it has written them: each folding
  // thread waits for that kernel itself, as the producer does for Hr,
  // instead of relying on the barriers between them (one instruction once
  // the wait is resolved).
  GridDependencyWait();
  if (p.logits != nullptr) {
    // LaunchWgmmaLogits: the dots as they are (no scale), one warp per row,
    // lane j storing tokens j, j + 32, j + 64, j + 96 (128 contiguous bytes
    // per store instruction, any logits_ld). Uniform across the block.
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= row_end) break;  // uniform across the warp
      float* out = p.logits + (row0 + r) * p.logits_ld + tok0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = lane + 32 * q;
        if (tok0 + j < p.valid_vocab) out[j] = dots[r * kDotStride + j];
      }
    }
    return;
  }
  if constexpr (kControlled) {
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= row_end) break;  // uniform across the warp
      ControlledTileRow(p.ctl, p.params, row0 + r, dots + r * kDotStride, tok0, p.token_offset,
                        p.valid_vocab, p.num_tiles, tile, lane, p.tile_summaries);
    }
  } else if constexpr (Cfg::kStraightEpilogue) {
    // Row r + q * kWarps of a quad is present when it lies in the chunk and
    // in the batch. It may lie past kRows when kWarps does not divide
    // kRows / 4 (11 epilogue warps at 128 rows); such a row is absent like
    // one past the chunk: folded on the neutral setup, never written.
    // Recomputed where needed rather than kept: the fold has no register
    // to spare (a kept mask spilled).
    constexpr bool kWholeQuads = kRows % (4 * kWarps) == 0;  // no row past kRows
    const auto present = [&](int r, int q) {
      const int local = r + q * kWarps;
      return row0 + local < row_end;  // row_end <= row0 + kRows
    };
    // An absent row past kRows folds row r's dots (its setup is neutral).
    const auto row_dots = [&](int r, int q) {
      const int local = r + q * kWarps;
      return dots + (kWholeQuads || local < kRows ? local : r) * kDotStride;
    };
    for (int r = warp; r < kRows; r += 4 * kWarps) {
      if (row0 + r >= row_end) break;  // uniform across the warp
      RowSampler rows[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        rows[q] = RowSampler::Load(p.params, row0 + r + q * kWarps, present(r, q), p.draft_tokens,
                                   p.draft_logits, p.token_offset);
      }
      // The lane holding row r + q kWarps's K (LaneKnownScores): 4 pass + q.
      const auto key = [&](int q) { return (r - warp) / kWarps + q; };
      SampleSummary sa, sb, sc, sd;
      FoldPair<kBound>(rows[0], rows[1], row_dots(r, 0), row_dots(r, 1), tok0, lane, p.valid_vocab,
               p.want_lse, lane_known, key(0), key(1), sa, sb);
      if (present(r, 2)) {  // uniform across the warp
        FoldPair<kBound>(rows[2], rows[3], row_dots(r, 2), row_dots(r, 3), tok0, lane, p.valid_vocab,
                 p.want_lse, lane_known, key(2), key(3), sc, sd);
      } else {  // rows c and d are absent (a small batch in a wider block)
        sc = EmptySampleSummary();
        sd = EmptySampleSummary();
      }
      SampleSummary mine;
      const int q = p.want_lse ? FoldRowQuad<true>(sa, sb, sc, sd, lane, mine)
                               : FoldRowQuad<false>(sa, sb, sc, sd, lane, mine);
      if ((lane & 7) == 0 && present(r, q)) {
        const int64_t row = row0 + r + q * kWarps;
        p.tile_summaries[row * p.num_tiles + tile] = mine;
        // The winner raises its row's known score: one L2 atomic per row
        // and tile, unconditional (comparing with the score read, or
        // asking whether the row is sampled, would keep registers live
        // across the folds). A greedy row's K is a logit it never reads.
        if (kBound && p.row_best_keys != nullptr && mine.best_index >= 0) {
          atomicMax(p.row_best_keys + row, OrderedFloatBits(mine.best_score));
        }
      }
    }
  } else {
    for (int r = warp; r < kRows; r += kWarps) {
      if (row0 + r >= row_end) break;  // uniform across the warp
      const RowSampler row = RowSampler::Load(p.params, row0 + r, true, p.draft_tokens,
                                              p.draft_logits, p.token_offset);
      const SampleSummary s =
          FoldRow(row, dots + r * kDotStride, tok0, lane, p.valid_vocab, p.want_lse);
      if (lane == 0) p.tile_summaries[(row0 + r) * p.num_tiles + tile] = s;
    }
  }
}

// ---- What every schedule's kernel shares ---------------------------------------------
// An MMA warpgroup pair's (or one warpgroup's) accumulators -> dots[row][token]
// (fp32 dots, before the scale). The identity tensor, partitioned like the
// accumulators, names each register's (token, row) in the block tile. In the
// m64nNk16 layout a warp's 32 lanes write tokens g = lane / 4 (+ 0..7) of
// rows 2 (lane % 4) (+ 0, 1): bank (8 (lane % 4) + g) mod 32 with the
// 132-float row stride, all 32 distinct.
template <class Cfg, class Accum>
__device__ __forceinline__ void StoreDotTile(const typename Cfg::TiledMma& tiled_mma,
                                             const Accum& accum, int mma_thread, float* dots) {
  using namespace cute;
  Tensor coords = make_identity_tensor(take<0, 2>(typename Cfg::TileShape{}));
  Tensor thread_coords = tiled_mma.get_thread_slice(mma_thread).partition_C(coords);
  static_assert(decltype(size(accum))::value == decltype(size(thread_coords))::value);
  CUTE_UNROLL
  for (int i = 0; i < size(accum); ++i) {
    dots[get<1>(thread_coords(i)) * kDotStride + get<0>(thread_coords(i))] = accum(i);
  }
}

// The block's TMA ring pipeline: the load warp produces, `consumer` threads
// read every stage (num_consumers of them in all), anyone else takes no
// part. is_leader marks lane 0 of each warpgroup and lane 0 of the load
// warp, which arrives on each stage with its transaction bytes (the load
// warp need not start a warpgroup: warp 19 of the 640-thread block). Warp 0
// initialises the barriers; the caller makes that visible with
// __syncthreads() before any role uses them.
template <class Cfg>
__device__ __forceinline__ typename Cfg::Mainloop::MainloopPipeline MakeRingPipeline(
    typename Cfg::Mainloop::PipelineStorage& storage, const WgmmaKernelParams<Cfg>& p,
    int thread, bool load_warp, bool consumer, int num_consumers) {
  using Pipeline = typename Cfg::Mainloop::MainloopPipeline;
  typename Pipeline::Params params;
  if (load_warp) {
    params.role = Pipeline::ThreadCategory::Producer;
  } else if (consumer) {
    params.role = Pipeline::ThreadCategory::Consumer;
  }
  params.is_leader = load_warp ? thread % 32 == 0 : thread % 128 == 0;
  params.num_consumers = num_consumers;
  params.transaction_bytes = p.mainloop.tma_transaction_bytes;
  return Pipeline(storage, params, typename Cfg::ClusterShape{});
}

// A persistent block's work items. Items are numbered tile-major, the
// chunks of a tile adjacent (item i: chunk i % num_chunks), so blocks that
// run at the same time share W tiles through L2. One block a cluster: item
// i is tile i / num_chunks, and block b takes items b, b + gridDim.x, ...
// (the kernels write that loop out themselves). WorkItems walks a tile
// pair's items (kClusterTiles = 2, blocks 2c and 2c + 1 of cluster c): item i is
// tile pair i / num_chunks, and the block of rank r takes its tile
// 2 (i / num_chunks) + r, both blocks the same chunk, so the pair shares
// each Hr box (multicast); cluster c takes items c, c + clusters, ... Both
// blocks must run every item's stages, since each loads half of the pair's
// Hr: with an odd number of tiles the last pair's second tile lies past the
// vocabulary (a phantom: W's TMA box is zero fill); its block loads and
// consumes the stages but folds nothing (Real). Tiles grow with the item,
// so a block's real items come first and its phantom, if any, last.
template <class Cfg>
struct WorkItems {
  int32_t first;       // this block's first item
  int32_t stride;      // between its items
  int32_t count;       // items of the launch
  int32_t real_end;    // this block's items below it are real (a phantom's are not)
  int32_t num_chunks;
  int32_t rank;        // in the cluster

  static_assert(Cfg::kClusterTiles > 1, "one block a cluster walks blockIdx.x, + gridDim.x, ...");

  // 32-bit: LaunchTiles keeps the items and blocks of a launch below 2^31.
  __device__ __forceinline__ static WorkItems OfBlock(int64_t num_tiles, int32_t num_chunks) {
    constexpr int kPair = Cfg::kClusterTiles;
    const int32_t tiles = static_cast<int32_t>(num_tiles);
    WorkItems w;
    w.rank = static_cast<int32_t>(cute::block_rank_in_cluster());
    w.first = static_cast<int32_t>(blockIdx.x) / kPair;
    w.stride = static_cast<int32_t>(gridDim.x) / kPair;
    w.count = (tiles + kPair - 1) / kPair * num_chunks;
    // Rank r's tile of item i is kPair (i / num_chunks) + r: below num_tiles
    // iff i / num_chunks < (num_tiles - r + kPair - 1) / kPair.
    w.real_end = (tiles - w.rank + kPair - 1) / kPair * num_chunks;
    w.num_chunks = num_chunks;
    return w;
  }
  __device__ __forceinline__ int Tile(int32_t item) const {
    return item / num_chunks * Cfg::kClusterTiles + rank;
  }
  __device__ __forceinline__ int Chunk(int32_t item) const { return item % num_chunks; }
  __device__ __forceinline__ bool Real(int32_t item) const { return item < real_end; }
};

// A persistent block's load warp: the TMA loads of its work items
// (WorkItems) into the ring in that order, each item's k_tiles stages after
// the last's, then the tail (every stage released by its consumers, in a
// pair both blocks': the peer may neither arrive on this block's barriers
// nor write into its ring once it has exited). All 32 lanes call it.
template <class Cfg, class LoadInputs>
__device__ __forceinline__ void LoadWorkItems(const WgmmaKernelParams<Cfg>& p,
                                              typename Cfg::Mainloop& mainloop,
                                              typename Cfg::Mainloop::MainloopPipeline pipeline,
                                              const LoadInputs& load_inputs, int k_tiles, int lane,
                                              typename Cfg::Mainloop::TensorStorage& tensors) {
  using namespace cute;
  using Pipeline = typename Cfg::Mainloop::MainloopPipeline;
  GridDependencyWait();  // Hr is written
  typename Cfg::Mainloop::PipelineState write_state = cutlass::make_producer_start_state<Pipeline>();
  if constexpr (Cfg::kClusterTiles > 1) {
    const WorkItems<Cfg> items = WorkItems<Cfg>::OfBlock(p.num_tiles, p.num_chunks);
    for (int32_t item = items.first; item < items.count; item += items.stride) {
      const auto block_coord = make_coord(items.Tile(item), items.Chunk(item), _, 0);
      auto k_tile_iter = make_coord_iterator(shape<3>(get<0>(load_inputs)));
      mainloop.load(p.mainloop, pipeline, write_state, load_inputs, block_coord, k_tile_iter,
                    k_tiles, lane, static_cast<uint32_t>(items.rank), tensors);
      write_state.advance(k_tiles);
    }
  } else {  // items blockIdx.x, + gridDim.x, ... (tile i / num_chunks, chunk i % num_chunks)
    const int64_t num_items = p.num_tiles * p.num_chunks;
    for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
      const auto block_coord = make_coord(static_cast<int>(item / p.num_chunks),
                                          static_cast<int>(item % p.num_chunks), _, 0);
      auto k_tile_iter = make_coord_iterator(shape<3>(get<0>(load_inputs)));
      mainloop.load(p.mainloop, pipeline, write_state, load_inputs, block_coord, k_tile_iter, k_tiles,
                    lane, 0, tensors);
      write_state.advance(k_tiles);
    }
  }
  mainloop.load_tail(pipeline, write_state);
}

// ---- The kernel -------------------------------------------------------------------
// Block b: row chunk b % num_chunks (rows [chunk * kRows, + kRows)), tile
// b / num_chunks (tokens [tile * 128, + 128)); chunks of a tile are adjacent
// so they run together and share its W through L2. Cfg::kThreads threads:
// the producer's load warp and two consumer warpgroups (WgmmaConfig).
// Launched as a programmatic dependent of LaunchRoundHidden's kernel: only
// the producer reads Hr, and it waits first.
template <class Cfg, bool kControlled>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kBlocksPerSm)
    WgmmaTileKernel(const __grid_constant__ WgmmaKernelParams<Cfg> p) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  // 1024-byte alignment: the 128B-swizzled TMA destinations need it.
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  auto& shared = *reinterpret_cast<typename Cfg::SharedStorage*>(wgmma_smem);

  const int thread = static_cast<int>(threadIdx.x);
  const int warp = __shfl_sync(kFullWarpMask, thread / 32, 0);
  const bool producer = Cfg::kConsumersFirst ? thread >= kConsumerThreads
                                             : thread < Cfg::kProducerThreads;
  const bool load_warp = warp == Cfg::kLoadWarp;
  const int chunk = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_chunks));
  const int tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_chunks));

  if (load_warp && cute::elect_one_sync()) Mainloop::prefetch_tma_descriptors(p.mainloop);
  Pipeline pipeline =
      MakeRingPipeline<Cfg>(shared.pipeline, p, thread, load_warp, !producer, kConsumerThreads);
  __syncthreads();  // the barriers' initialisation is visible to every role

  Mainloop mainloop;
  const auto problem = make_shape(p.valid_vocab, p.loaded_rows, p.hidden_dim, 1);
  const auto load_inputs = mainloop.load_init(problem, p.mainloop);
  const int k_tiles = static_cast<int>(size<3>(get<0>(load_inputs)));  // ceil(hidden_dim / 64)

  if (producer) {
    if constexpr (Cfg::kMoveRegisters) cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegisters>();
    if (load_warp) {
      GridDependencyWait();  // Hr is written
      PipelineState write_state = cutlass::make_producer_start_state<Pipeline>();
      const auto block_coord = make_coord(tile, chunk, _, 0);
      auto k_tile_iter = make_coord_iterator(shape<3>(get<0>(load_inputs)));
      mainloop.load(p.mainloop, pipeline, write_state, load_inputs, block_coord, k_tile_iter,
                    k_tiles, thread % 32, 0, shared.ring.tensors);
      write_state.advance(k_tiles);
      mainloop.load_tail(pipeline, write_state);  // every stage released by the consumers
    }
    return;
  }

  if constexpr (Cfg::kMoveRegisters) cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegisters>();
  const int mma_thread = thread - Cfg::kFirstConsumer;
  typename Cfg::TiledMma tiled_mma;
  Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
  PipelineState read_state;
  mainloop.mma(pipeline, read_state, accum, k_tiles, mma_thread, shared.ring.tensors, p.mainloop);
  mainloop.mma_tail(pipeline, read_state, k_tiles);  // this warpgroup's WGMMAs have completed
  AllowDependentLaunch();  // stage 2 may be scheduled; it waits for our writes

  // Both warpgroups are done reading the ring (the producer wrote nothing
  // past the last stage they waited for), so it can hold the dot tile.
  cutlass::arch::NamedBarrier::sync(kConsumerThreads, kEpilogueBarrier);

  // Epilogue, 1: accumulators -> dots[row][token].
  float* dots = shared.ring.dots;
  StoreDotTile<Cfg>(tiled_mma, accum, mma_thread, dots);
  cutlass::arch::NamedBarrier::sync(kConsumerThreads, kEpilogueBarrier);

  // Epilogue, 2: one warp per row (FoldTile).
  const ItemRows rows = RowsOfChunk(p, chunk);
  const float lane_known = LaneKnownScores<Cfg, kConsumerWarps>(
      p.row_best_keys, rows.first, rows.end, mma_thread / 32, mma_thread % 32);
  // Two blocks per SM (straight epilogue): the bound's fold whenever the
  // launch keeps keys (forced schedules only; kAuto takes separate warps).
  FoldTile<Cfg, kConsumerWarps, kControlled, Cfg::kStraightEpilogue && !kControlled>(
                p, dots, rows.first, rows.end,
                static_cast<int64_t>(tile) * kTileTokens, tile, mma_thread / 32, mma_thread % 32,
                lane_known);
}

// Ping-pong: block b takes work items b, b + grid, b + 2 grid, ... (item i:
// tile i / num_chunks, chunk i % num_chunks, as blocks of WgmmaTileKernel);
// its consumer warpgroup w (0, 1) takes every other one, starting at the
// w-th. The producer loads them all in that order, so warpgroup w's stages
// start k_tiles * w into the ring and it skips the other's k_tiles after
// each item (CUTLASS's ping-pong kernel's pipeline state arithmetic).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    WgmmaPingpongKernel(const __grid_constant__ WgmmaKernelParams<Cfg> p) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using OrderBarrier = typename Cfg::OrderBarrier;

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  auto& shared = *reinterpret_cast<typename Cfg::SharedStorage*>(wgmma_smem);

  const int thread = static_cast<int>(threadIdx.x);
  const int warp_group = __shfl_sync(kFullWarpMask, thread / 128, 0);
  const bool load_warp = __shfl_sync(kFullWarpMask, thread / 32, 0) == 0;
  const int64_t num_items = p.num_tiles * p.num_chunks;

  if (load_warp && cute::elect_one_sync()) Mainloop::prefetch_tma_descriptors(p.mainloop);
  // Each stage is read by one warpgroup.
  Pipeline pipeline = MakeRingPipeline<Cfg>(shared.pipeline, p, thread, load_warp, warp_group > 0, 128);
  typename OrderBarrier::Params order_params;
  order_params.group_id = warp_group > 0 ? warp_group - 1 : 0;  // the producer never uses it
  order_params.group_size = 128;
  OrderBarrier order(shared.order, order_params);  // warp 0 inits
  __syncthreads();  // the barriers' initialisation is visible to every role

  Mainloop mainloop;
  const auto problem = make_shape(p.valid_vocab, p.loaded_rows, p.hidden_dim, 1);
  const auto load_inputs = mainloop.load_init(problem, p.mainloop);
  const int k_tiles = static_cast<int>(size<3>(get<0>(load_inputs)));  // ceil(hidden_dim / 64)
  const int64_t grid = gridDim.x;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegisters>();
    if (load_warp) {
      LoadWorkItems<Cfg>(p, mainloop, pipeline, load_inputs, k_tiles, thread % 32, shared.tensors);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegisters>();
  const int consumer = warp_group - 1;
  const int mma_thread = thread % 128;
  typename Cfg::TiledMma tiled_mma;
  PipelineState read_state;
  read_state.advance(k_tiles * consumer);
  for (int64_t item = blockIdx.x + grid * consumer; item < num_items; item += 2 * grid) {
    const int tile = static_cast<int>(item / p.num_chunks);
    const int chunk = static_cast<int>(item % p.num_chunks);
    Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
    order.wait();  // the other warpgroup has issued its main loop
    mainloop.mma(pipeline, read_state, accum, k_tiles, mma_thread, shared.tensors, p.mainloop);
    order.arrive();  // the other's next main loop may start
    mainloop.mma_tail(pipeline, read_state, k_tiles);  // our WGMMAs have completed
    read_state.advance(2 * k_tiles);

    const ItemRows rows = RowsOfChunk(p, chunk);
    const float lane_known = LaneKnownScores<Cfg, 4>(p.row_best_keys, rows.first, rows.end,
                                                     mma_thread / 32, mma_thread % 32);
    order.wait();  // the other warpgroup's epilogue is done with the dot tile
    StoreDotTile<Cfg>(tiled_mma, accum, mma_thread, shared.dots);
    cutlass::arch::NamedBarrier::sync(128, kEpilogueBarrier + 1 + consumer);
    FoldTile<Cfg, 4, false, true>(p, shared.dots, rows.first, rows.end,
                            static_cast<int64_t>(tile) * kTileTokens, tile, mma_thread / 32,
                            mma_thread % 32, lane_known);
    order.arrive();  // each thread's reads of the dot tile are done
  }
  AllowDependentLaunch();  // stage 2 may be scheduled; it waits for our writes
}

// Separate epilogue warps: block b takes work items b, b + grid, ... (item
// i: tile i / num_chunks, chunk i % num_chunks); the producer loads them in
// that order and both MMA warpgroups read every stage, as WgmmaTileKernel's.
// Two named barriers hand the dot tile over: kDotsFull (the MMA warpgroups
// arrive after storing an item, the epilogue waits) and kDotsEmpty (the
// epilogue arrives after folding it, the MMA warpgroups wait before storing
// the next). bar.arrive orders the arriving threads' shared-memory writes
// and reads before the waiters' later accesses. The first item needs no
// kDotsEmpty wait and the last no arrival, so no barrier is left half
// arrived when the block exits. Each item is folded exactly as
// WgmmaTileKernel folds it (FoldTile over the same dot tile; the rows of a
// warp differ, each row's fold does not), so the bits are kWgmma's.
constexpr uint32_t kDotsFull = kEpilogueBarrier + 1;
constexpr uint32_t kDotsEmpty = kEpilogueBarrier + 2;

// kBound: the plain epilogue with the cross-tile bound (p.row_best_keys set).
template <class Cfg, bool kControlled, bool kBound>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    WgmmaSeparateEpilogueKernel(const __grid_constant__ WgmmaKernelParams<Cfg> p) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  constexpr int kHandOverThreads = kConsumerThreads + Cfg::kEpilogueThreads;
  static_assert(Cfg::kClusterTiles == 1 || !kBound, "tile pairs fold without the cross-tile bound");

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  auto& shared = *reinterpret_cast<typename Cfg::SharedStorage*>(wgmma_smem);

  const int thread = static_cast<int>(threadIdx.x);
  const int warp = __shfl_sync(kFullWarpMask, thread / 32, 0);
  const bool load_warp = warp == Cfg::kLoadWarp;
  // The role from the shuffled warp index, not from threadIdx: ptxas then
  // knows each role's code runs on whole warps, and keeps the MMA loop's
  // stage index, barrier addresses and smem descriptors in uniform
  // registers (ULEA / UIADD3 / UMOV on the uniform datapath). From
  // threadIdx it built every descriptor in vector registers and moved it
  // with R2UR before each WGMMA: 61 instructions a k-tile instead of 45,
  // most of them IMAD / VIADD / SEL on the FMA and ALU pipes that the
  // epilogue warps keep busy (NOTES-fused.md v31, v32).
  const bool mma = warp < kConsumerWarps;
  // One block a cluster walks items blockIdx.x, + gridDim.x, ... (these
  // two); a pair walks WorkItems. The single-block loops are kept as they
  // were before the pairs: WorkItems' form of them compiled to code that
  // measured 0.5-1.4% slower at D = 4096 (H200, 160-512 rows).
  const int64_t num_items = p.num_tiles * p.num_chunks;
  const int64_t grid = gridDim.x;

  if (load_warp && cute::elect_one_sync()) Mainloop::prefetch_tma_descriptors(p.mainloop);
  Pipeline pipeline =
      MakeRingPipeline<Cfg>(shared.pipeline, p, thread, load_warp, mma, kConsumerThreads);
  // The barriers' initialisation is visible to every role, and in a pair to
  // the peer too, before it multicasts into this ring or arrives on them.
  if constexpr (Cfg::kClusterTiles > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  Mainloop mainloop;
  const auto problem = make_shape(p.valid_vocab, p.loaded_rows, p.hidden_dim, 1);
  const auto load_inputs = mainloop.load_init(problem, p.mainloop);
  const int k_tiles = static_cast<int>(size<3>(get<0>(load_inputs)));  // ceil(hidden_dim / 64)

  if (load_warp) {
    LoadWorkItems<Cfg>(p, mainloop, pipeline, load_inputs, k_tiles, thread % 32, shared.tensors);
    return;
  }

  if (mma) {
    typename Cfg::TiledMma tiled_mma;
    PipelineState read_state;
    if constexpr (Cfg::kClusterTiles > 1) {
      const WorkItems<Cfg> items = WorkItems<Cfg>::OfBlock(p.num_tiles, p.num_chunks);
      for (int32_t item = items.first; item < items.count; item += items.stride) {
        Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
        mainloop.mma(pipeline, read_state, accum, k_tiles, thread, shared.tensors, p.mainloop);
        mainloop.mma_tail(pipeline, read_state, k_tiles);  // our WGMMAs have completed
        read_state.advance(k_tiles);
        if (!items.Real(item)) continue;  // a phantom tile: its stages are released, nothing folds
        if (item != items.first) {
          cutlass::arch::NamedBarrier::sync(kHandOverThreads, kDotsEmpty);  // the last tile is folded
        }
        StoreDotTile<Cfg>(tiled_mma, accum, thread, shared.dots);
        cutlass::arch::NamedBarrier::arrive(kHandOverThreads, kDotsFull);
      }
    } else {
      for (int64_t item = blockIdx.x; item < num_items; item += grid) {
        Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
        mainloop.mma(pipeline, read_state, accum, k_tiles, thread, shared.tensors, p.mainloop);
        mainloop.mma_tail(pipeline, read_state, k_tiles);  // our WGMMAs have completed
        read_state.advance(k_tiles);
        if (item != blockIdx.x) {
          cutlass::arch::NamedBarrier::sync(kHandOverThreads, kDotsEmpty);  // the last tile is folded
        }
        StoreDotTile<Cfg>(tiled_mma, accum, thread, shared.dots);
        cutlass::arch::NamedBarrier::arrive(kHandOverThreads, kDotsFull);
      }
    }
    AllowDependentLaunch();  // stage 2 may be scheduled; it waits for our writes
    return;
  }

  const int epilogue_thread = thread - kConsumerThreads;
  constexpr int kEpilogueWarps = Cfg::kEpilogueThreads / 32;
  if constexpr (Cfg::kClusterTiles > 1) {
    const WorkItems<Cfg> items = WorkItems<Cfg>::OfBlock(p.num_tiles, p.num_chunks);
    for (int32_t item = items.first; item < items.real_end; item += items.stride) {
      const int tile = items.Tile(item);
      const ItemRows rows = RowsOfChunk(p, items.Chunk(item));
      cutlass::arch::NamedBarrier::sync(kHandOverThreads, kDotsFull);
      // No cross-tile bound with pairs (LaunchTiles' kBoundBuilt): FoldTile's default.
      FoldTile<Cfg, kEpilogueWarps, kControlled>(
          p, shared.dots, rows.first, rows.end, static_cast<int64_t>(tile) * kTileTokens, tile,
          epilogue_thread / 32, epilogue_thread % 32);
      if (item + items.stride < items.real_end) {
        cutlass::arch::NamedBarrier::arrive(kHandOverThreads, kDotsEmpty);
      }
    }
  } else {
    for (int64_t item = blockIdx.x; item < num_items; item += grid) {
      const int tile = static_cast<int>(item / p.num_chunks);
      const int chunk = static_cast<int>(item % p.num_chunks);
      const ItemRows rows = RowsOfChunk(p, chunk);
      // The item's known scores are read before the wait for its dot tile.
      float lane_known = -INFINITY;
      if constexpr (kBound) {
        lane_known = LaneKnownScores<Cfg, kEpilogueWarps>(p.row_best_keys, rows.first, rows.end,
                                                         epilogue_thread / 32, epilogue_thread % 32);
      }
      cutlass::arch::NamedBarrier::sync(kHandOverThreads, kDotsFull);
      FoldTile<Cfg, kEpilogueWarps, kControlled, kBound>(
          p, shared.dots, rows.first, rows.end, static_cast<int64_t>(tile) * kTileTokens, tile,
          epilogue_thread / 32, epilogue_thread % 32, lane_known);
      if (item + grid < num_items) {
        cutlass::arch::NamedBarrier::arrive(kHandOverThreads, kDotsEmpty);
      }
    }
  }
  AllowDependentLaunch();
}

// ---- Launcher ----------------------------------------------------------------------
// The main loop's parameters for (problem, args): its two TMA descriptors
// (W and Hr), which CUTLASS encodes with cuTensorMapEncodeTiled after looking
// the driver entry point up by name (cutlass/cuda_host_adapter.hpp), at
// every call: host time on every launch (with the attribute below, about
// 5 us of an H200 host's 19-20 us in LaunchFusedSample; BENCHMARKS.md, "A
// launch's host time"). A serving engine's launches repeat W, Hr (its
// workspace) and, step after step, the row count, so each thread keeps the
// last kKept parameter sets it made for a main-loop type (a sharded engine
// launches every shard from one thread: up to 8 GPUs, and a few shapes
// each) and reuses one while the pointers and sizes are the same. Nothing
// else goes into them: the strides follow from hidden_dim, L is 1, and the
// rest is the type's (element types, tile and shared-memory layouts).
template <class Mainloop, class Problem>
const typename Mainloop::Params& MainloopParamsFor(const Problem& problem,
                                                   const typename Mainloop::Arguments& args,
                                                   const void* weight, const void* hidden_rounded) {
  struct Made {
    const void* weight = nullptr;
    const void* hidden_rounded = nullptr;
    int m = -1, n = -1, k = -1;
    typename Mainloop::Params params{};
  };
  constexpr int kKept = 16;
  struct Kept {
    Made made[kKept];
    int next = 0;  // the slot replaced on a miss
  };
  // On the heap from a thread's first launch of this main loop: only the
  // threads that launch hold one. (A thread_local array itself would sit in
  // every thread's TLS block, over 100 KB for all the configurations.)
  thread_local std::unique_ptr<Kept> kept;
  if (kept == nullptr) kept = std::make_unique<Kept>();
  const int m = cute::get<0>(problem), n = cute::get<1>(problem), k = cute::get<2>(problem);
  for (const Made& e : kept->made) {
    if (e.weight == weight && e.hidden_rounded == hidden_rounded && e.m == m && e.n == n && e.k == k) {
      return e.params;
    }
  }
  Made& e = kept->made[kept->next];
  kept->next = (kept->next + 1) % kKept;
  e.params = Mainloop::to_underlying_arguments(problem, args, nullptr);
  e.weight = weight;
  e.hidden_rounded = hidden_rounded;
  e.m = m;
  e.n = n;
  e.k = k;
  return e.params;
}

// Grid: num_tiles * ceil(batch / kRows) blocks (1187 tiles at V = 151936) of
// Cfg::kThreads threads and Cfg::kSmemBytes of dynamic shared memory (ring +
// barriers): 384 threads, ~160-192 KB, one block per SM (9 waves on 132 SMs);
// or 288 threads, ~100 KB, two per SM (4.5 waves of 264 blocks). Ping-pong:
// min(work items, SMs) persistent blocks of 384 threads, ~177-202 KB. The
// TMA descriptors are encoded on the host (MainloopParamsFor) only when W,
// Hr or the sizes are not among the thread's last launches of the main loop.
template <class Element, class Cfg>
cudaError_t LaunchTiles(const FusedSampleArgs& a, const unsigned short* hidden_rounded,
                        const HiddenChunks& layout, int64_t num_tiles, bool want_lse,
                        SampleSummary* tile_summaries, cudaStream_t stream,
                        const MmaControls* controls, float* logits, int64_t logits_ld,
                        uint32_t* row_best_keys) {
  using Mainloop = typename Cfg::Mainloop;
  // The controlled epilogue is built for every schedule but the ping-pong.
  if (Cfg::kSchedule == Schedule::kPingpong && controls != nullptr) return cudaErrorInvalidValue;
  const int64_t num_chunks = (a.batch + Cfg::kRows - 1) / Cfg::kRows;
  int64_t blocks = num_tiles * num_chunks;  // work items
  if (blocks > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  // Persistent: a block per SM (tile pairs: a cluster per resident cluster, below).
  if constexpr (Cfg::kSchedule != Schedule::kBlockPerItem && Cfg::kClusterTiles == 1) {
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    blocks = std::min<int64_t>(blocks, sms);
  }

  const int m = static_cast<int>(a.valid_vocab);
  // Chunks laid out for this block (HiddenChunks, padded or balanced): the
  // main loop loads whole boxes of kRows rows, zeros after each chunk's
  // rows, whose dot products land in absent rows, never written. Else
  // (identity) row r of H is row r of the GEMM.
  const bool chunked = layout.num_chunks > 1;
  if (chunked && (layout.block_rows != Cfg::kRows || layout.num_chunks != num_chunks)) {
    return cudaErrorInvalidValue;
  }
  const int n = static_cast<int>(chunked ? layout.rows_filled() : a.batch);
  const int k = static_cast<int>(a.hidden_dim);
  // Strides of (M, K, L) and (N, K, L): row pitches hidden_dim, unit K
  // stride, one batch (L = 1) whose stride is never used.
  typename Mainloop::Arguments args{
      static_cast<const Element*>(a.weight),
      typename Mainloop::StrideA{static_cast<int64_t>(k), cute::Int<1>{}, int64_t{0}},
      reinterpret_cast<const Element*>(hidden_rounded),
      typename Mainloop::StrideB{static_cast<int64_t>(k), cute::Int<1>{}, int64_t{0}}};
  const auto problem = cute::make_shape(m, n, k, 1);
  if (!Mainloop::can_implement(problem, args)) return cudaErrorInvalidValue;

  WgmmaKernelParams<Cfg> params{};
  params.mainloop = MainloopParamsFor<Mainloop>(problem, args, a.weight, hidden_rounded);
  params.valid_vocab = m;
  params.batch = static_cast<int32_t>(a.batch);
  params.loaded_rows = n;
  params.hidden_dim = k;
  params.num_chunks = static_cast<int32_t>(num_chunks);
  params.chunk_rows = static_cast<int32_t>(chunked ? layout.chunk_rows : Cfg::kRows);
  params.num_tiles = num_tiles;
  params.params = a.params;
  params.want_lse = want_lse;
  params.draft_tokens = a.draft_tokens;
  params.draft_logits = a.draft_logprobs;
  params.token_offset = a.token_offset;
  params.tile_summaries = tile_summaries;
  // Keys come only with plain sampling above 128 rows (LaunchWgmmaStage1),
  // so the 32- and 64-row boxes never fold with them.
  // Nor do tile pairs: the bound is used below D = 8192, pairs from it (a
  // launch with keys would run without the bound there, still exact).
  constexpr bool kBoundBuilt = Cfg::kStraightEpilogue && Cfg::kRows > 64 && Cfg::kClusterTiles == 1;
  static_assert(kCrossTileBoundHiddenBelow <= kTilePairsMinHidden || Cfg::kClusterTiles == 1,
                "no launch would take the bound with tile pairs");
  params.row_best_keys = kBoundBuilt ? row_best_keys : nullptr;
  if (controls != nullptr) params.ctl = *controls;
  params.logits = logits;
  params.logits_ld = logits_ld;

  const bool bound = params.row_best_keys != nullptr;
  auto* kernel = [controls, bound] {
    if constexpr (Cfg::kSchedule == Schedule::kSeparateEpilogue) {
      // The plain kernel with the cross-tile bound only where the launch
      // keeps keys: without, the fold is the one before the bound (it is
      // 1-4% faster at 64-128 rows than the bound's code with no keys).
      if constexpr (kBoundBuilt) {
        if (bound) return &WgmmaSeparateEpilogueKernel<Cfg, false, true>;
      }
      return controls != nullptr ? &WgmmaSeparateEpilogueKernel<Cfg, true, false>
                                 : &WgmmaSeparateEpilogueKernel<Cfg, false, false>;
    } else if constexpr (Cfg::kSchedule == Schedule::kPingpong) {
      return &WgmmaPingpongKernel<Cfg>;
    } else {
      return controls != nullptr ? &WgmmaTileKernel<Cfg, true> : &WgmmaTileKernel<Cfg, false>;
    }
  }();
  cudaError_t err = OptInDynamicSharedMemory(reinterpret_cast<const void*>(kernel),
                                             static_cast<int>(Cfg::kSmemBytes));
  if (err != cudaSuccess) return err;
  // Programmatic dependent launch: blocks may start while the H rounding
  // still runs (the producer waits for it before its first TMA load).
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config =
      DependentLaunch(dim3(static_cast<unsigned>(blocks)), dim3(Cfg::kThreads), Cfg::kSmemBytes,
                      stream, &attributes[0]);
  if constexpr (Cfg::kClusterTiles > 1) {
    // Pairs (WorkItems): one cluster per pair of tiles and chunk, at most as
    // many clusters as can be resident at once (a cluster's blocks share a
    // GPC; an SM left alone in its GPC runs none), each persistent.
    const int64_t pair_items = (num_tiles + Cfg::kClusterTiles - 1) / Cfg::kClusterTiles * num_chunks;
    if (pair_items * Cfg::kClusterTiles > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
    attributes[1] = cudaLaunchAttribute{};
    attributes[1].id = cudaLaunchAttributeClusterDimension;
    attributes[1].val.clusterDim.x = Cfg::kClusterTiles;
    attributes[1].val.clusterDim.y = 1;
    attributes[1].val.clusterDim.z = 1;
    config.numAttrs = 2;
    config.gridDim = dim3(static_cast<unsigned>(pair_items * Cfg::kClusterTiles));
    // The resident clusters depend only on the kernel and the device: the
    // driver is asked once per (kernel, device), not at every launch. Slots
    // are atomics (launches of several GPUs may run on several threads), 0
    // until known; two threads that race both ask and store the same answer.
    constexpr int kCachedDevices = 64;
    static std::atomic<int> resident_clusters[2][kCachedDevices];  // [controlled][device]
    int device = 0;
    err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    std::atomic<int>* slot = device >= 0 && device < kCachedDevices
                                 ? &resident_clusters[controls != nullptr ? 1 : 0][device]
                                 : nullptr;
    int resident = slot != nullptr ? slot->load(std::memory_order_relaxed) : 0;
    if (resident == 0) {
      err = cudaOccupancyMaxActiveClusters(&resident, kernel, &config);
      if (err != cudaSuccess) return err;
      if (resident < 1) return cudaErrorNotSupported;
      if (slot != nullptr) slot->store(resident, std::memory_order_relaxed);
    }
    config.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(pair_items, resident) *
                                                Cfg::kClusterTiles));
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

// The smallest block that holds the batch; above the largest (256 rows, or
// 128 at two blocks per SM and in ping-pong), chunks of it.
template <class Element>
cudaError_t LaunchForBatch(const FusedSampleArgs& a, const unsigned short* hr, const HiddenChunks& layout,
                           int64_t num_tiles, bool want_lse, SampleSummary* ts,
                           cudaStream_t stream, Stage1Kernel variant, const MmaControls* c,
                           uint32_t* keys, float* lg = nullptr, int64_t ld = 0) {
  if (variant == Stage1Kernel::kWgmmaPingpong) {
    if (a.batch <= 32) return LaunchTiles<Element, Pingpong32<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    if (a.batch <= 64) return LaunchTiles<Element, Pingpong64<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    return LaunchTiles<Element, Pingpong128<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  }
  if (variant == Stage1Kernel::kWgmmaSeparateEpilogue) {
    if (a.batch <= 32) return LaunchTiles<Element, Separate32<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    if (a.batch <= 64) return LaunchTiles<Element, Separate64<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    const int64_t box = WgmmaSeparateBox(a.batch);
    const bool pairs = a.hidden_dim >= kTilePairsMinHidden;
    if (box == 96) {
      if (pairs) return LaunchTiles<Element, Separate96Pair<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
      return LaunchTiles<Element, Separate96<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    }
    if (lg == nullptr && a.hidden_dim >= kDeepRingMinHidden &&
        a.batch <= (c == nullptr ? kDeepRingMaxBatch : kDeepRingMaxControlledBatch)) {
      return LaunchTiles<Element, Separate128Deep<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    }
    if (pairs) return LaunchTiles<Element, Separate128Pair<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    return LaunchTiles<Element, Separate128<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  }
  if (variant == Stage1Kernel::kWgmmaOverlap) {
    if (a.batch <= 32) return LaunchTiles<Element, Wgmma32x2<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    if (a.batch <= 64) return LaunchTiles<Element, Wgmma64x2<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
    return LaunchTiles<Element, Wgmma128x2<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  }
  if (a.batch <= 32) return LaunchTiles<Element, Wgmma32<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  if (a.batch <= 64) return LaunchTiles<Element, Wgmma64<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  if (a.batch <= 128) return LaunchTiles<Element, Wgmma128<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
  return LaunchTiles<Element, Wgmma256<Element>>(a, hr, layout, num_tiles, want_lse, ts, stream, c, lg, ld, keys);
}

}  // namespace

bool WgmmaStage1Eligible(const FusedSampleArgs& args) {
  const bool half = args.weight_dtype == CudaWeightDType::kBFloat16 ||
                    args.weight_dtype == CudaWeightDType::kFloat16;
  return half && args.hidden_dim % 16 == 0 && reinterpret_cast<uintptr_t>(args.weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.hidden) % 16 == 0;
}

// The device check of both launchers: sm_90a code runs on compute capability 9.0 only.
static cudaError_t CheckSm90() {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  return major == 9 && minor == 0 ? cudaSuccess : cudaErrorNotSupported;
}

cudaError_t LaunchWgmmaLogits(const FusedSampleArgs& args, float* logits, int64_t logits_ld,
                              unsigned short* hidden_rounded, cudaStream_t stream) {
  if (logits == nullptr || logits_ld < args.valid_vocab) return cudaErrorInvalidValue;
  cudaError_t err = CheckSm90();
  if (err != cudaSuccess) return err;
  const HiddenChunks identity = HiddenChunks::Identity(args.batch);
  err = LaunchRoundHidden(args, hidden_rounded, stream, identity);
  if (err != cudaSuccess) return err;
  const int64_t num_tiles = (args.valid_vocab + kTileTokens - 1) / kTileTokens;
  // One block per SM, up to 256 rows a block: the epilogue is a store, so
  // the main loop's reuse of each W tile across the most rows decides.
  if (args.weight_dtype == CudaWeightDType::kFloat16) {
    return LaunchForBatch<cutlass::half_t>(args, hidden_rounded, identity, num_tiles, false,
                                           nullptr, stream, Stage1Kernel::kWgmma, nullptr, nullptr, logits,
                                           logits_ld);
  }
  return LaunchForBatch<cutlass::bfloat16_t>(args, hidden_rounded, identity, num_tiles, false,
                                             nullptr, stream, Stage1Kernel::kWgmma, nullptr, nullptr, logits,
                                             logits_ld);
}

cudaError_t LaunchWgmmaStage1(const FusedSampleArgs& args, int64_t num_tiles, bool want_lse,
                              SampleSummary* tile_summaries, unsigned short* hidden_rounded,
                              cudaStream_t stream, Stage1Kernel variant,
                              const MmaControls* controls, uint32_t* row_best_keys) {
  cudaError_t err = CheckSm90();
  if (err != cudaSuccess) return err;
  // The box LaunchForBatch's block takes: 256 rows for kWgmma above 128
  // rows, WgmmaSeparateBox's for separate epilogue warps, else 128. A batch
  // above it goes in chunks (HiddenChunks): balanced
  // for the persistent schedules, padded for one block per item (balanced
  // chunks measured 1% slower plain, 8% controlled, at 160-192 rows there).
  const int64_t box = variant == Stage1Kernel::kWgmma                  ? 256
                      : variant == Stage1Kernel::kWgmmaSeparateEpilogue ? WgmmaSeparateBox(args.batch)
                                                                        : 128;
  const bool persistent = variant == Stage1Kernel::kWgmmaSeparateEpilogue ||
                          variant == Stage1Kernel::kWgmmaPingpong;
  const HiddenChunks layout = WgmmaHiddenChunks(args.batch, box, persistent);
  // The workspace holds RoundedHiddenRows(batch) rows (FusedSampleWorkspaceBytes).
  if (layout.rows_filled() > RoundedHiddenRows(args.batch)) return cudaErrorInvalidValue;
  // The rounding kernel also zeroes RowBestKeys (stage 1 waits for it).
  if (controls != nullptr || args.batch < kCrossTileBoundMinBatch ||
      args.hidden_dim >= kCrossTileBoundHiddenBelow) {
    row_best_keys = nullptr;
  }
  err = LaunchRoundHidden(args, hidden_rounded, stream, layout, row_best_keys);
  if (err != cudaSuccess) return err;
  if (args.weight_dtype == CudaWeightDType::kFloat16) {
    return LaunchForBatch<cutlass::half_t>(args, hidden_rounded, layout, num_tiles, want_lse,
                                           tile_summaries, stream, variant, controls,
                                           row_best_keys);
  }
  return LaunchForBatch<cutlass::bfloat16_t>(args, hidden_rounded, layout, num_tiles, want_lse,
                                             tile_summaries, stream, variant, controls,
                                             row_best_keys);
}

}  // namespace flashsampler::kernels::cuda_internal
