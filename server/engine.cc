#include "server/engine.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace flashsampler {

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const std::string& backend, LmHead head,
                                                   const EngineOptions& options) {
  if (backend == "cpu" || backend == "auto") {
    // No CUDA backend is built yet, so auto means the CPU.
    return MakeCpuEngine(std::move(head), options.cpu);
  }
  if (backend == "cuda") {
    return absl::UnavailableError("this build of flashsampler-server has no CUDA backend");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", backend, "' (expected auto, cpu or cuda)"));
}

}  // namespace flashsampler
