// flashsampler-kernel-bench --backend=cuda --controls=...: the materialized
// controlled path (kernels/cuda/controlled_sample.h) and the fused controlled
// path (kernels/cuda/fused_controlled_sample.h) for each control set and
// (shape, batch), beside the plain materialized and fused samplers.
//
// Control sets (every row of the batch the same, temperature --temperature):
//   top_p        top_p = 0.9
//   top_k        top_k = 50
//   top_k_top_p  top_k = 50, top_p = 0.9
//   min_p        min_p = 0.1
//   bitmask      every other token allowed (0x55555555 words), 16 biased
//                tokens (no filter: a summary row of the fused path)
// Variants:
//   filter       LaunchControlledSampleFromLogits (cluster size chosen per batch,
//                kControlledClusterAuto, as the engine runs it) on fp32 logits [B, V]
//                computed once by cuBLAS (the part that kernels/bench/peers.py
//                --controls times for vLLM's sort-based top-k / top-p and min-p
//                on logits of the same law): l', the filters, one sample, logz.
//   filter8      the same with an 8-block cluster per row.
//   filter1      the same with one block per row.
//   full         LaunchControlledSample: the cuBLAS GEMM (H cast to bf16) and
//                the above, from H to tokens (LogitsGemmPath::kCublas).
//   full_inv     the same on the fused kernels' own GEMM
//                (LogitsGemmPath::kBatchInvariant: a row's logits the same in
//                every batch; the default's kAuto on Hopper).
//   plain_mat    LaunchMaterializedSample (no controls), for reference.
//   fused_ctl    LaunchFusedControlledSample, from H to tokens (only for the
//                sets it serves: top_k, top_k_top_p, bitmask; its rows must
//                all come back with status 0, else the bench fails).
//   plain_fused  LaunchFusedSample (no controls): fused_ctl's reference.
// Inputs as in cuda_bench.cc: W ~ N(0, logit_std^2 / D) bf16, H ~ N(0, 1)
// exactly representable in bf16. Timing: warm-up, then --iterations runs per
// variant between CUDA event pairs; medians. The filter variants run back to
// back on the same logits (as peers.py times vLLM); the variants from H run
// round-robin. A check first: every row's status 0 and token in range.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/bench/cuda_bench.h"
#include "kernels/common/row_controls.h"
#include "kernels/cuda/controlled_sample.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/logits_gemm.h"
#include "kernels/cuda/materialized_sample.h"
#include "nlohmann/json.hpp"

namespace flashsampler::kernels::bench {

// Ok: cuda_bench.h.
#define CB_CHECK(expr)                 \
  do {                                 \
    if (!Ok((expr), #expr)) return 1;  \
  } while (0)

std::vector<ControlSet> ControlSets(const std::string& which, int64_t vocab) {
  std::vector<ControlSet> all;
  RowControls c;
  c.top_p = 0.9f;
  all.push_back({"top_p", c});
  c = RowControls{};
  c.top_k = 50;
  all.push_back({"top_k", c});
  c.top_p = 0.9f;
  all.push_back({"top_k_top_p", c});
  c = RowControls{};
  c.min_p = 0.1f;
  all.push_back({"min_p", c});
  c = RowControls{};
  c.allowed_bitmask.assign(1 << 16, 0x55555555u);  // covers any vocabulary <= 2^21
  for (int64_t i = 0; i < 16; ++i) {  // 16 biased tokens spread over this vocabulary
    c.logit_bias.push_back({static_cast<int32_t>(i * (vocab / 16)), 1.5f});
  }
  all.push_back({"bitmask", c});
  if (which == "all") return all;
  std::vector<ControlSet> out;
  for (const ControlSet& s : all) {
    if (("," + which + ",").find("," + s.name + ",") != std::string::npos) out.push_back(s);
  }
  return out;
}

int RunCudaControlledBench(const CudaBenchOptions& o, const std::string& which) {
  if (ControlSets(which, 1).empty() || o.shapes.empty() || o.batches.empty() || o.iterations < 100) {
    std::cerr << "flashsampler-kernel-bench: --controls wants all or a list of top_p, top_k, "
                 "top_k_top_p, min_p, bitmask; iterations >= 100\n";
    return 2;
  }
  cudaDeviceProp prop{};
  CB_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  CB_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas = nullptr;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  const int64_t bmax = *std::max_element(o.batches.begin(), o.batches.end());

  nlohmann::json results = nlohmann::json::array();
  std::printf("flashsampler-kernel-bench backend=cuda controls  %s  %s  commit %s  T=%g "
              "logit_std=%g iterations=%d stage1=%s (median ms, CUDA events)\n",
              prop.name, o.date.c_str(), o.commit.c_str(), o.temperature, o.logit_std, o.iterations,
              Stage1Name(o.stage1));
  std::printf("resident clusters (cudaOccupancyMaxActiveClusters): g=2 %d, g=4 %d, g=8 %d, g=16 %d\n",
              ControlledMaxActiveClusters(2), ControlledMaxActiveClusters(4),
              ControlledMaxActiveClusters(8), ControlledMaxActiveClusters(16));
  std::printf("%-12s %4s %-12s %10s %6s %10s %10s %10s %10s %10s %10s %10s %8s\n", "DxV", "B",
              "controls", "filter_ms", "auto_g", "filter8_ms", "filter1_ms", "full_ms", "full_inv",
              "plain_mat_ms", "fused_ctl", "plain_fused", "ctl/plain");
  for (const CudaShape& shape : o.shapes) {
    const int64_t d = shape.hidden, v = shape.vocab;
    DeviceBuffer w, h, logits, params, ws_from, ws_full, ws_mat, ws_fused, ws_fused_ctl, controls_buf;
    DeviceBuffer tokens, logz, status, stokens, slogprobs, sranks, top_ids, top_lp, top_counts;
    if (!w.Allocate(static_cast<size_t>(v * d) * 2) || !h.Allocate(static_cast<size_t>(bmax * d) * 4) ||
        !logits.Allocate(static_cast<size_t>(bmax * v) * 4) ||
        !params.Allocate(static_cast<size_t>(bmax) * sizeof(RowParams)) ||
        !ws_from.Allocate(ControlledFromLogitsWorkspaceBytes(bmax, v)) ||
        !ws_full.Allocate(ControlledSampleWorkspaceBytes(bmax, v, d, CudaWeightDType::kBFloat16)) ||
        !ws_mat.Allocate(MaterializedSampleWorkspaceBytes(bmax, v, d, CudaWeightDType::kBFloat16)) ||
        !ws_fused.Allocate(FusedSampleWorkspaceBytes(bmax, v, d)) ||
        !ws_fused_ctl.Allocate(FusedControlledWorkspaceBytes(bmax, v, d)) ||
        !tokens.Allocate(bmax * 4) || !logz.Allocate(bmax * 4) || !status.Allocate(bmax * 4) ||
        !stokens.Allocate(bmax * 4) || !slogprobs.Allocate(bmax * 4) || !sranks.Allocate(bmax * 4) ||
        !top_ids.Allocate(bmax * kMaxTopLogprobs * 4) || !top_lp.Allocate(bmax * kMaxTopLogprobs * 4) ||
        !top_counts.Allocate(bmax * 4)) {
      std::cerr << "flashsampler-kernel-bench: device allocation failed\n";
      return 1;
    }
    if (FillNormalBf16(w.get(), static_cast<size_t>(v * d), o.logit_std / std::sqrt(static_cast<float>(d)),
                       o.seed * 1000 + 7, stream) != 0 ||
        FillNormalFloatBf16Exact(h.get<float>(), static_cast<size_t>(bmax * d), 1.0f, o.seed * 1000 + 3,
                                 stream) != 0) {
      return 1;
    }
    std::vector<RowParams> host_params(bmax);
    for (int64_t b = 0; b < bmax; ++b) {
      host_params[b] = RowParams{o.temperature, o.seed, 1, static_cast<uint32_t>(b)};
    }
    CB_CHECK(cudaMemcpy(params.get(), host_params.data(), bmax * sizeof(RowParams), cudaMemcpyHostToDevice));
    DeviceBuffer cast;
    if (!cast.Allocate(LogitsGemmCastBytes(bmax, d, CudaWeightDType::kBFloat16))) return 1;
    LogitsGemmArgs gemm;
    gemm.weight = w.get();
    gemm.hidden = h.get<float>();
    gemm.batch = bmax;
    gemm.valid_vocab = v;
    gemm.hidden_dim = d;
    gemm.cast_hidden = cast.get();
    gemm.logits = logits.get<float>();
    CB_CHECK(LaunchLogitsGemm(gemm, cublas, stream));

    for (const ControlSet& set : ControlSets(which, v)) {
      FlatControls flat;
      const std::vector<RowControls> rows(bmax, set.controls);
      CB_CHECK(FlattenControls(rows.data(), bmax, v, v, &flat));
      std::vector<uint8_t> packed(flat.PackedBytes());
      flat.PackTo(packed.data());
      if (!controls_buf.Allocate(packed.size())) return 1;
      CB_CHECK(cudaMemcpy(controls_buf.get(), packed.data(), packed.size(), cudaMemcpyHostToDevice));
      const ControlledDeviceControls dc = flat.DeviceView(controls_buf.get());
      const ControlledSampleOutputs out{tokens.get<int32_t>(),  logz.get<float>(),     nullptr,
                                        status.get<int32_t>(),  stokens.get<int32_t>(), slogprobs.get<float>(),
                                        sranks.get<int32_t>(), top_ids.get<int32_t>(), top_lp.get<float>(),
                                        top_counts.get<int32_t>()};
      for (int64_t batch : o.batches) {
        auto filter_with = [&](int cluster_blocks) {
          return LaunchControlledSampleFromLogits(logits.get<float>(), params.get<RowParams>(), batch, v, dc,
                                                  out, ws_from.get(), ws_from.bytes(), stream, cluster_blocks);
        };
        auto filter = [&] { return filter_with(kControlledClusterAuto); };
        auto filter_g8 = [&] { return filter_with(kControlledClusterBlocks); };
        auto filter_g1 = [&] { return filter_with(1); };
        auto controlled_args = [&](const DeviceBuffer& ws) {
          ControlledSampleArgs a;
          a.weight = w.get();
          a.hidden = h.get<float>();
          a.params = params.get<RowParams>();
          a.batch = batch;
          a.vocab = a.valid_vocab = v;
          a.hidden_dim = d;
          a.controls = dc;
          a.outputs = out;
          a.workspace = ws.get();
          a.workspace_bytes = ws.bytes();
          a.stage1 = o.stage1;  // fused_ctl's stage 1 (the materialized path ignores it)
          return a;
        };
        auto plain_args = [&](const DeviceBuffer& ws) {
          FusedSampleArgs a;
          a.weight = w.get();
          a.hidden = h.get<float>();
          a.params = params.get<RowParams>();
          a.batch = batch;
          a.vocab = a.valid_vocab = v;
          a.hidden_dim = d;
          a.token_ids = tokens.get<int32_t>();
          a.workspace = ws.get();
          a.workspace_bytes = ws.bytes();
          a.stage1 = o.stage1;  // plain_fused: the same stage 1 as fused_ctl
          return a;
        };
        auto full_with = [&](LogitsGemmPath path) {
          ControlledSampleArgs a = controlled_args(ws_full);
          a.logits_gemm = path;
          return LaunchControlledSample(a, cublas, stream);
        };
        auto full = [&] { return full_with(LogitsGemmPath::kCublas); };
        auto full_inv = [&] { return full_with(LogitsGemmPath::kBatchInvariant); };
        auto plain = [&] { return LaunchMaterializedSample(plain_args(ws_mat), cublas, stream); };
        auto plain_fused = [&] { return LaunchFusedSample(plain_args(ws_fused), stream); };
        auto fused_ctl = [&] { return LaunchFusedControlledSample(controlled_args(ws_fused_ctl), stream); };
        const bool fused_served =
            std::none_of(flat.rows.begin(), flat.rows.end(), [](const ControlledRowDesc& r) {
              return FusedRowKindOf(r) == kFusedUnservedRow;
            });
        std::vector<int32_t> st(batch), tk(batch);
        if (fused_served) {  // check: every row served (status 0), tokens in range
          CB_CHECK(fused_ctl());
          CB_CHECK(cudaStreamSynchronize(stream));
          CB_CHECK(cudaMemcpy(st.data(), status.get(), batch * 4, cudaMemcpyDeviceToHost));
          CB_CHECK(cudaMemcpy(tk.data(), tokens.get(), batch * 4, cudaMemcpyDeviceToHost));
          for (int64_t b = 0; b < batch; ++b) {
            if (st[b] != 0 || tk[b] < 0 || tk[b] >= v) {
              std::cerr << "flashsampler-kernel-bench: fused controlled check failed at row " << b
                        << " (status " << st[b] << ")\n";
              return 1;
            }
          }
        }
        // Check: statuses 0, tokens in range.
        CB_CHECK(filter());
        CB_CHECK(cudaStreamSynchronize(stream));
        CB_CHECK(cudaMemcpy(st.data(), status.get(), batch * 4, cudaMemcpyDeviceToHost));
        CB_CHECK(cudaMemcpy(tk.data(), tokens.get(), batch * 4, cudaMemcpyDeviceToHost));
        for (int64_t b = 0; b < batch; ++b) {
          if (st[b] != 0 || tk[b] < 0 || tk[b] >= v) {
            std::cerr << "flashsampler-kernel-bench: controlled check failed at row " << b << "\n";
            return 1;
          }
        }
        std::vector<std::function<KernelStatus()>> variants = {filter, filter_g8, filter_g1, full, plain,
                                                               plain_fused, full_inv};
        if (fused_served) variants.push_back(fused_ctl);
        for (auto& fn : variants) {
          for (int i = 0; i < o.warmup; ++i) CB_CHECK(fn());
        }
        const int runs = o.iterations;
        std::vector<cudaEvent_t> ev(2 * variants.size() * runs);
        for (cudaEvent_t& e : ev) CB_CHECK(cudaEventCreate(&e));
        // The three filter variants (from logits) run back to back, each
        // `runs` times on the same logits, as peers.py times vLLM's filters:
        // the logits stay in L2 as they would right after the GEMM that wrote
        // them. The variants from H run round-robin (each sweeps W through L2).
        constexpr size_t kFilterVariants = 3;
        for (size_t k = 0; k < kFilterVariants; ++k) {
          for (int i = 0; i < runs; ++i) {
            const size_t e = 2 * (k * runs + i);
            CB_CHECK(cudaEventRecord(ev[e], stream));
            CB_CHECK(variants[k]());
            CB_CHECK(cudaEventRecord(ev[e + 1], stream));
          }
        }
        for (int i = 0; i < runs; ++i) {
          for (size_t k = kFilterVariants; k < variants.size(); ++k) {
            const size_t e = 2 * (k * runs + i);
            CB_CHECK(cudaEventRecord(ev[e], stream));
            CB_CHECK(variants[k]());
            CB_CHECK(cudaEventRecord(ev[e + 1], stream));
          }
        }
        CB_CHECK(cudaStreamSynchronize(stream));
        double med[8] = {0, 0, 0, 0, 0, 0, 0, NAN};
        for (size_t k = 0; k < variants.size(); ++k) {
          std::vector<double> ms(runs);
          for (int i = 0; i < runs; ++i) {
            float t = 0;
            CB_CHECK(cudaEventElapsedTime(&t, ev[2 * (k * runs + i)], ev[2 * (k * runs + i) + 1]));
            ms[i] = t;
          }
          med[k] = Summarize(ms).median_ms;
        }
        for (cudaEvent_t e : ev) cudaEventDestroy(e);
        char dxv[32];
        std::snprintf(dxv, sizeof dxv, "%lldx%lld", static_cast<long long>(d), static_cast<long long>(v));
        const int auto_g = ControlledClusterBlocksFor(batch);
        std::printf("%-12s %4lld %-12s %10.3f %6d %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %8.3f\n",
                    dxv, static_cast<long long>(batch), set.name.c_str(), med[0], auto_g, med[1],
                    med[2], med[3], med[6], med[4], med[7], med[5], med[7] / med[5]);
        std::fflush(stdout);
        results.push_back({{"hidden", d}, {"vocab", v}, {"batch", batch}, {"controls", set.name},
                           {"filter_median_ms", med[0]}, {"auto_cluster_blocks", auto_g},
                           {"filter_cluster8_median_ms", med[1]},
                           {"filter_one_block_median_ms", med[2]}, {"full_median_ms", med[3]},
                           {"plain_materialized_median_ms", med[4]},
                           {"plain_fused_median_ms", med[5]},
                           {"full_batch_invariant_median_ms", med[6]},
                           {"fused_controlled_median_ms", fused_served ? nlohmann::json(med[7]) : nlohmann::json()}});
      }
    }
  }
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  if (!o.json_path.empty()) {
    nlohmann::json j = BenchJsonHeader(o, "cuda", prop.name);
    j["mode"] = "controls";
    j["stage1"] = Stage1Name(o.stage1);
    j["weight_dtype"] = "bf16";
    j["variants"] = {{"filter", "LaunchControlledSampleFromLogits on cuBLAS fp32 logits, cluster size auto"},
                     {"filter_cluster8", "the same, 8 blocks per row"},
                     {"filter_one_block", "the same, one block per row"},
                     {"full", "LaunchControlledSample on cuBLAS logits (GEMM + filter + sample)"},
                     {"full_batch_invariant", "the same on the fused kernels' GEMM (LogitsGemmPath::kBatchInvariant)"},
                     {"plain_materialized", "LaunchMaterializedSample, no controls"},
                     {"plain_fused", "LaunchFusedSample, no controls"},
                     {"fused_controlled", "LaunchFusedControlledSample (null for sets it does not serve)"}};
    j["results"] = results;
    return WriteBenchJson(j, o.json_path);
  }
  return 0;
}

}  // namespace flashsampler::kernels::bench
