// flashsampler-kernel-bench --backend=cuda_sharded --controls=...: one step of
// controlled rows with W split by vocabulary over --devices
// (kernels/cuda/sharded_sample.h) against the same step on one GPU.
//
// Control sets: those of the controlled mode (cuda_controlled_bench.cc: every
// row the same, temperature --temperature). Variants per (shape D x V, set,
// batch B), bf16 W, fp32 H exact in bf16, no log Z / log-probs:
//   one_full       LaunchControlledSample on GPU devices[0] with the whole W
//                  (cuBLAS logits, the filters, the sample).
//   shard_full     LaunchShardedControlledSample: each GPU's cuBLAS logits of
//                  its V/n tokens, strided peer copies into [rows, V] on GPU
//                  devices[0], the controlled sampler there (the engine's path
//                  for every controlled batch the fused path does not serve).
//   one_fused      LaunchFusedControlledSample on GPU devices[0] (only for the
//                  sets it serves: top_k, top_k_top_p, bitmask).
//   shard_fused    LaunchShardedFusedControlledSample: each GPU's fused stage
//                  1 on its tokens, copies of the per-tile summaries and
//                  candidates to GPU devices[0], stage 2 there.
// Shards split W evenly on 128-token tiles, as the server plans them.
// Timing: every step is synchronous, as the engine runs it: a start event on
// GPU devices[0]'s stream, every other shard's stream waits for it, the launch,
// an end event on GPU devices[0]'s stream (which the launch orders after every
// shard's work), then the host waits for all streams (WaitForShards). So the
// interval is the whole step, including any time the GPUs wait for the host to
// enqueue. Medians and minima of --iterations steps after --warmup.
// Check first: every row's status 0 (fused: no row handed back) and the
// tokens of one_* and shard_* compared (fused: identical by construction;
// full: cuBLAS may round a logit differently per GEMM shape, near-ties flip).
// Devices may repeat (--devices=0,0: both shards on one GPU, a check of this
// program, not a measurement of sharding); no NCCL is used.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/bench/cuda_bench.h"
#include "kernels/bench/sharded_bench.h"
#include "kernels/common/row_controls.h"
#include "kernels/cuda/controlled_sample.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/sharded_sample.h"
#include "nlohmann/json.hpp"

namespace flashsampler::kernels::bench {
namespace {

constexpr int64_t kAlign = 128;  // shard boundaries: the kernels' tile

#define SC_CHECK(expr)                 \
  do {                                 \
    if (!Ok((expr), #expr)) return 1;  \
  } while (0)

// b->Allocate(bytes) on `device` (DeviceBuffer frees it there).
bool AllocOn(DeviceBuffer* b, int device, size_t bytes) {
  return Ok(cudaSetDevice(device), "cudaSetDevice") && b->Allocate(bytes);
}

// One shard's GPU and buffers for one shape.
struct Shard {
  int device = 0;
  int64_t begin = 0, end = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceBuffer weight, hidden, params, controls, workspace, scratch;
};

struct Row {
  CudaShape shape;
  std::string set;
  int64_t batch = 0;
  bool fused = false;
  Stats one_full, shard_full, one_fused, shard_fused;
  int64_t agree_full = 0, agree_fused = 0;
};

int RunShape(const CudaBenchOptions& o, const std::vector<int>& devices, const CudaShape& shape,
             const std::string& which, std::vector<Row>* rows_out) {
  const int n = static_cast<int>(devices.size());
  const int64_t D = shape.hidden, V = shape.vocab;
  const int64_t bmax = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t tiles = (V + kAlign - 1) / kAlign;
  std::vector<Shard> shards(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    Shard& s = shards[k];
    s.device = devices[k];
    s.begin = tiles * k / n * kAlign;
    s.end = k + 1 == n ? V : tiles * (k + 1) / n * kAlign;
    const int64_t rows = s.end - s.begin;
    SC_CHECK(cudaSetDevice(s.device));
    SC_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    SC_CHECK(cublasCreate(&s.cublas));
    SC_CHECK(cublasSetStream(s.cublas, s.stream));
    const size_t scratch = ShardedControlledShardBytes(bmax, rows, D, CudaWeightDType::kBFloat16);
    const size_t workspace = FusedControlledWorkspaceBytes(bmax, rows, D);
    if (scratch == 0 || !AllocOn(&s.weight, s.device, static_cast<size_t>(rows * D) * 2) ||
        !AllocOn(&s.hidden, s.device, static_cast<size_t>(bmax * D) * sizeof(float)) ||
        !AllocOn(&s.params, s.device, static_cast<size_t>(bmax) * sizeof(RowParams)) ||
        !AllocOn(&s.workspace, s.device, workspace) || !AllocOn(&s.scratch, s.device, scratch)) {
      std::cerr << "flashsampler-kernel-bench: shard allocation failed on GPU " << s.device << "\n";
      return 1;
    }
    // W ~ N(0, logit_std^2 / D), each shard its own seed; the whole W on
    // devices[0] is then copied together from the shards.
    if (FillNormalBf16(s.weight.get(), static_cast<size_t>(rows * D),
                       o.logit_std / std::sqrt(static_cast<float>(D)), o.seed * 1000003 + k,
                       s.stream) != 0 ||
        FillNormalFloatBf16Exact(s.hidden.get<float>(), static_cast<size_t>(bmax * D), 1.0f,
                                 o.seed + 7, s.stream) != 0) {
      std::cerr << "flashsampler-kernel-bench: fill kernel failed\n";
      return 1;
    }
    SC_CHECK(cudaStreamSynchronize(s.stream));
  }
  Shard& s0 = shards[0];
  const int d0 = s0.device;
  // GPU devices[0]: the whole W, its workspaces, the outputs and the gathers.
  DeviceBuffer whole_weight, ws_full, ws_fused, gather_full, gather_fused;
  DeviceBuffer tokens, status, stokens, slogprobs, sranks, top_ids, top_lp, top_counts;
  if (!AllocOn(&whole_weight, d0, static_cast<size_t>(V * D) * 2) ||
      !AllocOn(&ws_full, d0, ControlledSampleWorkspaceBytes(bmax, V, D, CudaWeightDType::kBFloat16)) ||
      !AllocOn(&ws_fused, d0, FusedControlledWorkspaceBytes(bmax, V, D)) ||
      !AllocOn(&gather_full, d0, ShardedControlledGatherBytes(bmax, V)) ||
      !AllocOn(&gather_fused, d0, ShardedFusedControlledGatherBytes(bmax, V)) ||
      !AllocOn(&tokens, d0, bmax * 4) || !AllocOn(&status, d0, bmax * 4) ||
      !AllocOn(&stokens, d0, bmax * 4) || !AllocOn(&slogprobs, d0, bmax * 4) ||
      !AllocOn(&sranks, d0, bmax * 4) || !AllocOn(&top_ids, d0, bmax * kMaxTopLogprobs * 4) ||
      !AllocOn(&top_lp, d0, bmax * kMaxTopLogprobs * 4) || !AllocOn(&top_counts, d0, bmax * 4)) {
    std::cerr << "flashsampler-kernel-bench: allocation failed on GPU " << d0 << "\n";
    return 1;
  }
  for (const Shard& s : shards) {  // the whole W = the shards' rows, in order
    SC_CHECK(cudaMemcpyPeer(whole_weight.get<char>() + s.begin * D * 2, d0, s.weight.get(), s.device,
                            static_cast<size_t>((s.end - s.begin) * D) * 2));
  }
  for (const Shard& s : shards) {  // cudaMemcpyPeer orders only against the legacy stream
    SC_CHECK(cudaSetDevice(s.device));
    SC_CHECK(cudaDeviceSynchronize());
  }
  const ControlledSampleOutputs out{tokens.get<int32_t>(),  nullptr,
                                    nullptr,               status.get<int32_t>(),
                                    stokens.get<int32_t>(), slogprobs.get<float>(),
                                    sranks.get<int32_t>(),  top_ids.get<int32_t>(),
                                    top_lp.get<float>(),    top_counts.get<int32_t>()};
  std::vector<ShardDevice> devs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) devs[k] = ShardDevice{shards[k].device, shards[k].stream, nullptr, shards[k].cublas};

  // The step timer: start on GPU devices[0]'s stream, every other stream
  // waits for it, the launch, end on GPU devices[0]'s stream, host waits.
  cudaEvent_t start = nullptr, t0 = nullptr, t1 = nullptr;
  SC_CHECK(cudaSetDevice(d0));
  SC_CHECK(cudaEventCreateWithFlags(&start, cudaEventDisableTiming));
  SC_CHECK(cudaEventCreate(&t0));
  SC_CHECK(cudaEventCreate(&t1));
  auto wait_all = [&] { return WaitForBenchShards(&devs); };
  auto time_steps = [&](const std::function<KernelStatus()>& launch, Stats* stats) -> int {
    std::vector<double> ms;
    for (int i = 0; i < o.warmup + o.iterations; ++i) {
      SC_CHECK(cudaSetDevice(d0));
      SC_CHECK(cudaEventRecord(t0, s0.stream));
      SC_CHECK(cudaEventRecord(start, s0.stream));
      for (int k = 1; k < n; ++k) {
        SC_CHECK(cudaSetDevice(shards[k].device));
        SC_CHECK(cudaStreamWaitEvent(shards[k].stream, start, 0));
      }
      SC_CHECK(launch());
      SC_CHECK(cudaSetDevice(d0));
      SC_CHECK(cudaEventRecord(t1, s0.stream));
      if (wait_all() != 0) return 1;
      float t = 0;
      SC_CHECK(cudaEventElapsedTime(&t, t0, t1));
      if (i >= o.warmup) ms.push_back(t);
    }
    *stats = Summarize(ms);
    return 0;
  };

  for (const ControlSet& set : ControlSets(which, V)) {
    const std::vector<RowControls> row_controls(static_cast<size_t>(bmax), set.controls);
    FlatControls flat;
    SC_CHECK(FlattenControls(row_controls.data(), bmax, V, V, &flat));
    std::vector<uint8_t> packed(flat.PackedBytes());
    flat.PackTo(packed.data());
    for (Shard& s : shards) {  // the controls on every GPU (fused stage 1 reads them there)
      if (!AllocOn(&s.controls, s.device, packed.size())) return 1;
      SC_CHECK(cudaMemcpy(s.controls.get(), packed.data(), packed.size(), cudaMemcpyHostToDevice));
    }
    const bool fused_served =
        std::none_of(flat.rows.begin(), flat.rows.end(), [](const ControlledRowDesc& r) {
          return FusedRowKindOf(r) == kFusedUnservedRow;
        });
    for (int64_t batch : o.batches) {
      Row row;
      row.shape = shape;
      row.set = set.name;
      row.batch = batch;
      row.fused = fused_served;
      std::vector<RowParams> params(static_cast<size_t>(batch));
      for (int64_t r = 0; r < batch; ++r) {
        params[r] = RowParams{o.temperature, o.seed, 1, static_cast<uint32_t>(r)};
      }
      for (Shard& s : shards) {
        SC_CHECK(cudaSetDevice(s.device));
        SC_CHECK(cudaMemcpy(s.params.get(), params.data(), batch * sizeof(RowParams), cudaMemcpyHostToDevice));
        SC_CHECK(cudaDeviceSynchronize());
      }
      // Controls are flattened for bmax rows; a batch uses the first `batch`
      // rows' descriptors (every row is the same set).
      auto controlled_args = [&](const DeviceBuffer& ws) {
        ControlledSampleArgs a;
        a.weight = whole_weight.get();
        a.hidden = s0.hidden.get<float>();
        a.params = s0.params.get<RowParams>();
        a.batch = batch;
        a.vocab = a.valid_vocab = V;
        a.hidden_dim = D;
        a.controls = flat.DeviceView(s0.controls.get());
        a.outputs = out;
        a.workspace = ws.get();
        a.workspace_bytes = ws.bytes();
        return a;
      };
      auto batch_of = [&](ShardedControlledBatch* b, const DeviceBuffer& gather) {
        b->devices = devs.data();
        b->num_shards = n;
        b->batch = batch;
        b->hidden_dim = D;
        b->valid_vocab = V;
        b->params = s0.params.get<RowParams>();
        b->controls = flat.DeviceView(s0.controls.get());
        b->outputs = out;
        b->gather_scratch = gather.get();
        b->gather_scratch_bytes = gather.bytes();
      };
      std::vector<ShardedControlledShard> full_shards(static_cast<size_t>(n));
      std::vector<ShardedFusedControlledShard> fused_shards(static_cast<size_t>(n));
      for (int k = 0; k < n; ++k) {
        const Shard& s = shards[k];
        full_shards[k] = ShardedControlledShard{s.weight.get(), s.hidden.get<float>(), s.begin, s.end,
                                                s.scratch.get(), s.scratch.bytes()};
        ShardedFusedControlledShard& f = fused_shards[k];
        f.weight = s.weight.get();
        f.hidden = s.hidden.get<float>();
        f.params = s.params.get<RowParams>();
        f.controls = flat.DeviceView(s.controls.get());
        f.begin = s.begin;
        f.end = s.end;
        f.workspace = s.workspace.get();
        f.workspace_bytes = s.workspace.bytes();
      }
      auto one_full = [&] {
        cudaSetDevice(d0);
        return LaunchControlledSample(controlled_args(ws_full), s0.cublas, s0.stream);
      };
      auto one_fused = [&] {
        cudaSetDevice(d0);
        return LaunchFusedControlledSample(controlled_args(ws_fused), s0.stream);
      };
      auto shard_full = [&] {
        ShardedControlledArgs a;
        batch_of(&a, gather_full);
        a.shards = full_shards.data();
        return LaunchShardedControlledSample(a);
      };
      auto shard_fused = [&] {
        ShardedFusedControlledArgs a;
        batch_of(&a, gather_fused);
        a.shards = fused_shards.data();
        return LaunchShardedFusedControlledSample(a);
      };

      // Check: every row's status 0, the tokens of one_* and shard_* compared.
      auto run_once = [&](const std::function<KernelStatus()>& launch, std::vector<int32_t>* tk,
                          const char* name) -> int {
        SC_CHECK(launch());
        if (wait_all() != 0) return 1;
        std::vector<int32_t> st(static_cast<size_t>(batch));
        tk->resize(static_cast<size_t>(batch));
        SC_CHECK(cudaSetDevice(d0));
        SC_CHECK(cudaMemcpy(st.data(), status.get(), batch * 4, cudaMemcpyDeviceToHost));
        SC_CHECK(cudaMemcpy(tk->data(), tokens.get(), batch * 4, cudaMemcpyDeviceToHost));
        for (int64_t b = 0; b < batch; ++b) {
          if (st[b] != 0 || (*tk)[b] < 0 || (*tk)[b] >= V) {
            std::cerr << "flashsampler-kernel-bench: " << name << " check failed at row " << b
                      << " (status " << st[b] << ")\n";
            return 1;
          }
        }
        return 0;
      };
      std::vector<int32_t> a, b;
      if (run_once(one_full, &a, "one_full") != 0 || run_once(shard_full, &b, "shard_full") != 0) {
        return 1;
      }
      for (int64_t r = 0; r < batch; ++r) row.agree_full += a[r] == b[r];
      if (fused_served) {
        if (run_once(one_fused, &a, "one_fused") != 0 || run_once(shard_fused, &b, "shard_fused") != 0) {
          return 1;
        }
        for (int64_t r = 0; r < batch; ++r) row.agree_fused += a[r] == b[r];
      }
      if (time_steps(one_full, &row.one_full) != 0 || time_steps(shard_full, &row.shard_full) != 0 ||
          (fused_served && (time_steps(one_fused, &row.one_fused) != 0 ||
                            time_steps(shard_fused, &row.shard_fused) != 0))) {
        return 1;
      }
      std::fprintf(stderr, "  D=%lld V=%lld %s B=%lld: one_full %.3f shard_full %.3f one_fused %.3f shard_fused %.3f ms\n",
                   static_cast<long long>(D), static_cast<long long>(V), set.name.c_str(),
                   static_cast<long long>(batch), row.one_full.median_ms, row.shard_full.median_ms,
                   row.one_fused.median_ms, row.shard_fused.median_ms);
      rows_out->push_back(row);
    }
  }
  cudaSetDevice(d0);
  cudaEventDestroy(start);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  for (int k = 0; k < n; ++k) {
    cudaSetDevice(shards[k].device);
    cublasDestroy(shards[k].cublas);
    cudaStreamDestroy(shards[k].stream);
  }
  return 0;
}

}  // namespace

int RunShardedControlledBench(const CudaBenchOptions& o, const std::vector<int>& devices,
                              const std::string& which) {
  if (devices.size() < 2 || o.iterations < 1 || o.shapes.empty() || o.batches.empty() ||
      ControlSets(which, 1).empty()) {
    std::cerr << "flashsampler-kernel-bench: --backend=cuda_sharded --controls needs >= 2 "
                 "--devices, shapes, batches and control sets (all or a list of top_p, top_k, "
                 "top_k_top_p, min_p, bitmask)\n";
    return 2;
  }
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDeviceProperties(&prop, devices[0]), "cudaGetDeviceProperties")) return 1;
  std::vector<Row> rows;
  for (const CudaShape& shape : o.shapes) {
    if (RunShape(o, devices, shape, which, &rows) != 0) return 1;
  }
  std::string list;
  for (int d : devices) {
    if (!list.empty()) list += ',';
    list += std::to_string(d);
  }
  std::printf("flashsampler-kernel-bench backend=cuda_sharded controls  %zu x %s (GPUs %s)  %s  commit %s\n",
              devices.size(), prop.name, list.c_str(), o.date.c_str(), o.commit.c_str());
  std::printf("T=%g logit_std=%g iterations=%d; medians in ms of synchronous steps (CUDA events on "
              "GPU %d's stream)\n",
              o.temperature, o.logit_std, o.iterations, devices[0]);
  std::printf("%-12s %-12s %4s %9s %10s %7s %9s %11s %7s %9s %9s\n", "DxV", "controls", "B",
              "one_full", "shard_full", "ratio", "one_fused", "shard_fused", "ratio", "agreeF",
              "agreeU");
  for (const Row& r : rows) {
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(r.shape.hidden),
                  static_cast<long long>(r.shape.vocab));
    if (r.fused) {
      std::printf("%-12s %-12s %4lld %9.4f %10.4f %7.3f %9.4f %11.4f %7.3f %4lld/%-4lld %4lld/%-4lld\n",
                  shape, r.set.c_str(), static_cast<long long>(r.batch), r.one_full.median_ms,
                  r.shard_full.median_ms, r.shard_full.median_ms / r.one_full.median_ms,
                  r.one_fused.median_ms, r.shard_fused.median_ms,
                  r.shard_fused.median_ms / r.one_fused.median_ms,
                  static_cast<long long>(r.agree_full), static_cast<long long>(r.batch),
                  static_cast<long long>(r.agree_fused), static_cast<long long>(r.batch));
    } else {
      std::printf("%-12s %-12s %4lld %9.4f %10.4f %7.3f %9s %11s %7s %4lld/%-4lld %9s\n", shape,
                  r.set.c_str(), static_cast<long long>(r.batch), r.one_full.median_ms,
                  r.shard_full.median_ms, r.shard_full.median_ms / r.one_full.median_ms, "-", "-",
                  "-", static_cast<long long>(r.agree_full), static_cast<long long>(r.batch), "-");
    }
  }
  std::printf("ratio = shard_* / one_*; agreeF / agreeU: rows whose shard_full / shard_fused token "
              "equals one GPU's (fused: all, by construction; full: cuBLAS rounding per GEMM "
              "shape may flip near-ties). '-': the fused path does not serve the set.\n");
  if (!o.json_path.empty()) {
    nlohmann::json j = BenchJsonHeader(o, "cuda_sharded", prop.name);
    j["mode"] = "controls";
    j["devices"] = devices;
    j["timing"] = "synchronous steps: CUDA events on the first device's stream, every shard's stream "
                  "waiting for the start, the host waiting for every stream after each step";
    nlohmann::json results = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json e = {{"hidden", r.shape.hidden}, {"vocab", r.shape.vocab},
                          {"controls", r.set},        {"batch", r.batch},
                          {"one_full", StatsJson(r.one_full)},
                          {"shard_full", StatsJson(r.shard_full)},
                          {"tokens_agree_full", r.agree_full}};
      if (r.fused) {
        e["one_fused"] = StatsJson(r.one_fused);
        e["shard_fused"] = StatsJson(r.shard_fused);
        e["tokens_agree_fused"] = r.agree_fused;
      }
      results.push_back(e);
    }
    j["results"] = results;
    return WriteBenchJson(j, o.json_path);
  }
  return 0;
}

}  // namespace flashsampler::kernels::bench
