// The CPU Engine: lays the LM head out once as token panels in its own dtype
// (the layout of kernels/cpu/fixed_order_logits.h) and runs CpuTiledSampler for
// plain rows and CpuControlledSampler (path chosen by PlanCpuControlledPath)
// for rows with sampling controls. A batch without controls takes the plain
// sampler exactly as before; a mixed batch is split into its plain rows and
// its controlled rows (each row's token depends only on its own inputs, so the
// split changes no result) and the results are scattered back. Draft rows
// (SampleBatch::draft_tokens) go to the same samplers, which exclude the draft
// from sampled rows and report log p(x) (kernels/cpu/tiled_sampler.h,
// candidate_sampler.h), after every control for controlled rows.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/controlled_sampler.h"
#include "kernels/cpu/fixed_order_logits.h"
#include "kernels/cpu/tiled_sampler.h"
#include "server/engine/engine.h"

namespace flashsampler {
namespace {

// W in the token-panel layout (kernels/cpu/fixed_order_logits.h), in the
// head's own element type: fp32 for an F32 head (4 * V * D bytes), the raw
// bits of a BF16 or F16 head (2 * V * D bytes), which the kernels widen to
// fp32 in registers (exactly, so the logits are those of the widened head).
// The only copy of the weights the CPU backend keeps: the head's mapping is
// released once it is packed.
struct WeightPanels {
  WeightDType dtype = WeightDType::kFloat32;
  std::vector<float> fp32;       // F32 heads
  std::vector<uint16_t> bits16;  // BF16 and F16 heads

  kernels::TokenPanels view() const {
    switch (dtype) {
      case WeightDType::kBFloat16: return kernels::TokenPanels::BFloat16(bits16.data());
      case WeightDType::kFloat16: return kernels::TokenPanels::Float16(bits16.data());
      case WeightDType::kFloat32: break;
    }
    return fp32.data();
  }
};

// 16 rows (one panel) at a time are copied into a scratch block, since the
// mapping gives no alignment guarantee, and scattered into their panel.
template <typename Element>
std::vector<Element> PackedPanels(const LmHead& head) {
  const int64_t vocab = head.vocab_size(), d = head.hidden_size();
  std::vector<Element> panels(static_cast<size_t>(kernels::TokenPanelElements(vocab, d)),
                              Element{0});
  std::vector<Element> block(static_cast<size_t>(kernels::kTokenPanelWidth * d));
  for (int64_t t0 = 0; t0 < vocab; t0 += kernels::kTokenPanelWidth) {
    const int64_t count = std::min<int64_t>(kernels::kTokenPanelWidth, vocab - t0);
    const auto* rows = static_cast<const unsigned char*>(head.data()) + t0 * d * sizeof(Element);
    std::memcpy(block.data(), rows, static_cast<size_t>(count * d) * sizeof(Element));
    kernels::PackTokenPanels(block.data(), t0, count, d, panels.data());
  }
  return panels;
}

WeightPanels PackWeightPanels(const LmHead& head) {
  WeightPanels panels;
  panels.dtype = head.dtype();
  if (head.dtype() == WeightDType::kFloat32) {
    panels.fp32 = PackedPanels<float>(head);
  } else {
    panels.bits16 = PackedPanels<uint16_t>(head);
  }
  return panels;
}

class CpuEngine final : public Engine {
 public:
  CpuEngine(WeightPanels panels, const ModelShape& shape, const CpuEngineOptions& options)
      : panels_(std::move(panels)),
        shape_(shape),
        sampler_(panels_.view(), shape.vocab_size, shape.valid_vocab, shape.hidden_size,
                 kernels::CpuSamplerConfig{options.num_threads, options.tile_rows}),
        controlled_(panels_.view(), shape.vocab_size, shape.valid_vocab, shape.hidden_size,
                    kernels::CpuSamplerConfig{options.num_threads, options.tile_rows}) {}

  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    if (absl::Status s = CheckBatchLayout(batch, shape_.hidden_size,
                                          std::numeric_limits<int64_t>::max(), "cpu engine");
        !s.ok()) {
      return s;
    }
    // The request parser has usually rounded H already (hidden_in_weight_dtype);
    // otherwise a rounded copy is made here.
    const float* hidden = batch.hidden.data();
    if (!batch.hidden_in_weight_dtype) {
      hidden_.assign(batch.hidden.begin(), batch.hidden.end());
      if (absl::Status s = RoundHiddenToWeightDType(shape_.weight_dtype, hidden_.data(),
                                                    static_cast<int64_t>(hidden_.size()),
                                                    shape_.hidden_size, "hidden_states",
                                                    batch.request_row_offset);
          !s.ok()) {
        return s;
      }
      hidden = hidden_.data();
    }
    if (!batch.controls.empty()) return SampleWithControls(batch, hidden);
    SampleResult result;
    result.path = LaunchPath::kCpu;
    result.token_ids.resize(batch.rows);
    if (batch.want_logz) result.logz.resize(batch.rows);
    if (batch.want_logprobs) result.logprobs.resize(batch.rows);
    const bool drafts = !batch.draft_tokens.empty();
    if (drafts) result.draft_logprobs.resize(batch.rows);
    kernels::CpuSampleOutputs out{result.token_ids.data(),
                                  batch.want_logz ? result.logz.data() : nullptr,
                                  batch.want_logprobs ? result.logprobs.data() : nullptr,
                                  drafts ? result.draft_logprobs.data() : nullptr};
    const kernels::KernelStatus status =
        sampler_.Sample(hidden, batch.rows, batch.params.data(),
                        drafts ? batch.draft_tokens.data() : nullptr, out);
    if (status != kernels::KernelStatus::kOk) return KernelStatusToStatus(status, "cpu sampler");
    return result;
  }

  const ModelShape& shape() const override { return shape_; }
  std::string backend_name() const override { return "cpu"; }
  bool serves_draft_rows(bool /*with_controls*/) const override { return true; }

 private:
  // `hidden` is the batch's H rounded to W's dtype. The rows are gathered
  // into three sub-batches by their own controls alone: plain rows
  // (HasAnyControl false), rows the fused controlled path serves, and the
  // rest (materialized path). So the path, and with it every output bit, of a
  // row never depends on the other rows of its batch (batch invariance; the
  // paths sum log Z in different groupings).
  absl::StatusOr<SampleResult> SampleWithControls(const SampleBatch& batch, const float* hidden) {
    const int64_t rows = batch.rows;
    const int64_t d = shape_.hidden_size;
    std::vector<int64_t> plain, fused, materialized;
    for (int64_t r = 0; r < rows; ++r) {
      const RowControls& c = batch.controls[r];
      if (!HasAnyControl(c)) {
        plain.push_back(r);
      } else if (kernels::PlanCpuControlledPath(&c, 1) == kernels::CpuControlledPath::kFused) {
        fused.push_back(r);
      } else {
        materialized.push_back(r);
      }
    }
    SampleResult result;
    result.path = LaunchPath::kCpu;
    result.token_ids.resize(rows);
    if (batch.want_logz) result.logz.resize(rows);
    if (batch.want_logprobs) result.logprobs.resize(rows);
    result.details.resize(rows);
    const bool drafts = !batch.draft_tokens.empty();
    if (drafts) result.draft_logprobs.resize(rows);
    for (const std::vector<int64_t>* part : {&plain, &fused, &materialized}) {
      if (part->empty()) continue;
      const int64_t n = static_cast<int64_t>(part->size());
      std::vector<float> part_hidden(static_cast<size_t>(n * d));
      std::vector<RowParams> params(n);
      std::vector<RowControls> controls;
      std::vector<int32_t> draft_tokens(drafts ? n : 0);
      std::vector<float> draft_logprobs(drafts ? n : 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = (*part)[i];
        std::copy_n(hidden + r * d, d, part_hidden.data() + i * d);
        params[i] = batch.params[r];
        if (drafts) draft_tokens[i] = batch.draft_tokens[r];
      }
      std::vector<int32_t> tokens(n);
      std::vector<float> logz(batch.want_logz ? n : 0), logprobs(batch.want_logprobs ? n : 0);
      std::vector<RowSampleDetail> details(n);
      kernels::KernelStatus status;
      if (part == &plain) {
        status = sampler_.Sample(part_hidden.data(), n, params.data(),
                                 drafts ? draft_tokens.data() : nullptr,
                                 kernels::CpuSampleOutputs{tokens.data(),
                                                           batch.want_logz ? logz.data() : nullptr,
                                                           batch.want_logprobs ? logprobs.data() : nullptr,
                                                           drafts ? draft_logprobs.data() : nullptr});
        for (int64_t i = 0; i < n; ++i) details[i].token_ids = {tokens[i]};
      } else {
        // Every row controlled (the usual case): no copy of the controls.
        const RowControls* row_controls = batch.controls.data();
        if (n != rows) {
          controls.reserve(n);
          for (int64_t r : *part) controls.push_back(batch.controls[r]);
          row_controls = controls.data();
        }
        const kernels::CpuControlledPath path =
            part == &fused ? kernels::CpuControlledPath::kFused : kernels::CpuControlledPath::kMaterialized;
        status = controlled_.Sample(
            part_hidden.data(), n, params.data(), row_controls, drafts ? draft_tokens.data() : nullptr,
            path,
            kernels::CpuControlledOutputs{tokens.data(), batch.want_logz ? logz.data() : nullptr,
                                          batch.want_logprobs ? logprobs.data() : nullptr,
                                          details.data(),
                                          drafts ? draft_logprobs.data() : nullptr});
      }
      if (status != kernels::KernelStatus::kOk) {
        return KernelStatusToStatus(status, part == &plain ? "cpu sampler" : "cpu controlled sampler");
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = (*part)[i];
        result.token_ids[r] = tokens[i];
        if (batch.want_logz) result.logz[r] = logz[i];
        if (batch.want_logprobs) result.logprobs[r] = logprobs[i];
        result.details[r] = std::move(details[i]);
        if (drafts) result.draft_logprobs[r] = draft_logprobs[i];
      }
    }
    return result;
  }

  WeightPanels panels_;  // W, PackWeightPanels
  ModelShape shape_;
  kernels::CpuTiledSampler sampler_;
  kernels::CpuControlledSampler controlled_;
  std::vector<float> hidden_;  // a rounded copy of H, when the parser has not rounded it
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> MakeCpuEngine(LmHead head, int64_t valid_vocab,
                                                      const CpuEngineOptions& options) {
  absl::StatusOr<ModelShape> shape = ResolveModelShape(head, valid_vocab);
  if (!shape.ok()) return shape.status();
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", options.num_threads));
  }
  if (options.tile_rows <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("tile_rows must be > 0, got ", options.tile_rows));
  }
  WeightPanels panels = PackWeightPanels(head);
  return std::unique_ptr<Engine>(new CpuEngine(std::move(panels), *shape, options));
}

}  // namespace flashsampler
