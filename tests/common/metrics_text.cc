#include "tests/common/metrics_text.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/common/http_get.h"

namespace flashsampler::testing {

double SeriesValue(const std::string& exposition, const std::string& series) {
  const std::string prefix = series + " ";
  for (size_t at = exposition.find(prefix); at != std::string::npos;
       at = exposition.find(prefix, at + 1)) {
    if (at != 0 && exposition[at - 1] != '\n') continue;
    const size_t end = exposition.find('\n', at);
    double v = 0;
    if (absl::SimpleAtod(exposition.substr(at + prefix.size(), end - at - prefix.size()), &v)) return v;
  }
  return 0;
}

absl::Status WaitForMetrics(const std::string& metrics_address,
                            const std::function<bool(const std::string&)>& ready,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> body = HttpGet(metrics_address, "/metrics");
    if (!body.ok()) return body.status();
    if (ready(*body)) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("/metrics did not reach the awaited state within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));  // poll interval, not a synchronisation
  }
}

}  // namespace flashsampler::testing
