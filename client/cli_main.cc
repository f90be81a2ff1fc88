// flashsampler-cli: talk to a flashsampler-server from the shell.
//
//   flashsampler-cli --address=HOST:PORT info
//   flashsampler-cli --address=HOST:PORT health
//   flashsampler-cli --address=HOST:PORT sample [--rows=N] [--temperature=T] [--seed=S]
//                    [--input=FILE] [--dtype=bf16|fp16|fp32] [--logz] [--logprobs]
//                    [--stream] [--repeat=N]
//                    [--top_k=K] [--top_p=P] [--min_p=P] [--top_logprobs=N]
//                    [--num_samples=N] [--raw_logprobs] [--repetition_penalty=R]
//                    [--presence_penalty=X] [--frequency_penalty=X]
//   flashsampler-cli --address=HOST:PORT verify --drafts=ID,ID,... [--temperature=T]
//                    [--seed=S] [--offset=O] [--input=FILE] [--dtype=...] [--logz]
//   TLS / mTLS / token (every command): --tls_ca=CA.pem [--tls_cert=C.pem --tls_key=K.pem]
//                    [--tls_server_name=NAME] [--auth_token_file=FILE]
//
// `sample` sends random unit-normal hidden states (seeded by --data_seed), or
// the raw little-endian fp32 [rows, D] values of --input, and prints the
// tokens, logz / logprobs when asked, the seeds used and the round-trip latency.
// The sampling controls apply to every row (one shared SamplingParams entry);
// with --top_logprobs or --num_samples > 1 each row's samples, their logprobs
// and ranks and its top tokens are printed too.
// `verify` sends one sequence to Verify: gamma = the number of --drafts (may
// be empty), gamma + 1 rows of hidden states (random, or --input's rows, which
// must number gamma + 1), and prints num_accepted, the output tokens, each
// draft's acceptance probability, logz when asked and the seed used.
// Exit status: 0 on success, 1 when the server answered an error, 2 on usage errors.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/channel_security_flags.h"
#include "client/sampler_client.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server address HOST:PORT");
ABSL_FLAG(int64_t, rows, 1, "rows (B) of random hidden states");
ABSL_FLAG(float, temperature, 1.0f, "sampling temperature (0 = greedy)");
ABSL_FLAG(std::string, seed, "", "noise seed (uint64); empty: the server draws one");
ABSL_FLAG(uint64_t, offset, 0, "noise offset (e.g. decode step)");
ABSL_FLAG(std::string, input, "", "file of raw little-endian fp32 hidden states [rows, D]");
ABSL_FLAG(std::string, dtype, "bf16", "wire dtype of the hidden states: bf16, fp16 or fp32");
ABSL_FLAG(bool, logz, false, "ask for log Z per row");
ABSL_FLAG(bool, logprobs, false, "ask for the sampled token's log-probability per row");
ABSL_FLAG(bool, stream, false, "send the requests over one SampleStream");
ABSL_FLAG(int32_t, repeat, 1, "send the request this many times and report latency");
ABSL_FLAG(uint64_t, data_seed, 1, "seed of the random hidden states");
ABSL_FLAG(double, timeout_s, 60, "per-call deadline in seconds");
ABSL_FLAG(int32_t, top_k, 0, "keep the k most likely tokens (0 = off)");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass in (0, 1] (1 = off)");
ABSL_FLAG(float, min_p, 0.0f, "keep tokens with p >= min_p * max p, in [0, 1) (0 = off)");
ABSL_FLAG(int32_t, top_logprobs, 0, "return the N most likely tokens per row (0..20)");
ABSL_FLAG(int32_t, num_samples, 1, "independent samples per row (1..64)");
ABSL_FLAG(bool, raw_logprobs, false,
          "top logprobs / ranks under the model's raw distribution instead of the sampled one");
ABSL_FLAG(float, repetition_penalty, 1.0f, "vLLM repetition penalty (> 0, 1 = off)");
ABSL_FLAG(float, presence_penalty, 0.0f, "vLLM presence penalty in [-2, 2]");
ABSL_FLAG(float, frequency_penalty, 0.0f, "vLLM frequency penalty in [-2, 2]");
ABSL_FLAG(std::vector<std::string>, drafts, {}, "verify: comma-separated draft token ids");

namespace {

using flashsampler::SamplerClient;
namespace v1 = flashsampler::v1;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "flashsampler-cli: %s\n", status.ToString().c_str());
  return 1;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "flashsampler-cli: %s\n", message.c_str());
  return 2;
}

int RunInfo(SamplerClient& client) {
  absl::StatusOr<v1::ModelInfo> info = client.GetModelInfo();
  if (!info.ok()) return Fail(info.status());
  std::printf("vocab_size: %lld\nvalid_vocab_size: %lld\nhidden_size: %lld\nweight_dtype: %s\n"
              "backend: %s\nmax_request_rows: %lld\n",
              static_cast<long long>(info->vocab_size()),
              static_cast<long long>(info->valid_vocab_size()),
              static_cast<long long>(info->hidden_size()), v1::DType_Name(info->weight_dtype()).c_str(),
              info->backend().c_str(), static_cast<long long>(info->max_request_rows()));
  return 0;
}

int RunHealth(SamplerClient& client) {
  auto status = client.CheckHealth();
  if (!status.ok()) return Fail(status.status());
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status).c_str());
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

// The request's hidden states: --input's rows, or `rows` random rows
// (--data_seed), packed as --dtype. `rows` is updated to --input's count.
// Returns 0, or the exit status of a failure (already reported).
int LoadHiddenStates(SamplerClient& client, int64_t* rows, v1::Tensor* out) {
  absl::StatusOr<v1::ModelInfo> info = client.GetModelInfo();
  if (!info.ok()) return Fail(info.status());
  const int64_t cols = info->hidden_size();
  if (cols < 1) return Fail(absl::InternalError("the server reports a hidden size below 1"));
  std::vector<float> values;
  const std::string input = absl::GetFlag(FLAGS_input);
  if (!input.empty()) {
    std::ifstream in(input, std::ios::binary);
    if (!in) return Usage("cannot read --input " + input);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.empty() || bytes.size() % (cols * sizeof(float)) != 0) {
      return Usage("--input must hold whole rows of " + std::to_string(cols) + " fp32 values");
    }
    *rows = static_cast<int64_t>(bytes.size() / (cols * sizeof(float)));
    values.resize(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
  } else {
    if (*rows < 1) return Usage("--rows must be >= 1");
    std::mt19937_64 gen(absl::GetFlag(FLAGS_data_seed));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    values.resize(static_cast<size_t>(*rows * cols));
    for (float& v : values) v = normal(gen);
  }
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  v1::DType dtype;
  if (dtype_name == "bf16") dtype = v1::DTYPE_BF16;
  else if (dtype_name == "fp16") dtype = v1::DTYPE_FP16;
  else if (dtype_name == "fp32") dtype = v1::DTYPE_FP32;
  else return Usage("--dtype must be bf16, fp16 or fp32");
  *out = flashsampler::MakeHiddenStates(values, *rows, cols, dtype);
  return 0;
}

// --temperature, --offset and --seed into `params`; 0, or a usage error's status.
int SetBasicParams(v1::SamplingParams* params) {
  params->set_temperature(absl::GetFlag(FLAGS_temperature));
  params->set_offset(absl::GetFlag(FLAGS_offset));
  const std::string seed = absl::GetFlag(FLAGS_seed);
  if (!seed.empty()) {
    uint64_t value;
    if (!absl::SimpleAtoi(seed, &value) || seed[0] == '-' || seed[0] == '+') {
      return Usage("--seed must be an unsigned 64-bit integer");
    }
    params->set_seed(value);
  }
  return 0;
}

int RunVerify(SamplerClient& client) {
  v1::VerifyRequest request;
  v1::VerifySequence* sequence = request.add_sequences();
  for (const std::string& d : absl::GetFlag(FLAGS_drafts)) {
    int32_t id;
    if (!absl::SimpleAtoi(d, &id)) return Usage("--drafts must be comma-separated token ids");
    sequence->add_draft_token_ids(id);
  }
  int64_t rows = sequence->draft_token_ids_size() + 1;
  if (int rc = LoadHiddenStates(client, &rows, sequence->mutable_hidden_states()); rc != 0) return rc;
  if (int rc = SetBasicParams(sequence->mutable_params()); rc != 0) return rc;
  request.set_return_acceptance_probs(true);
  request.set_return_logz(absl::GetFlag(FLAGS_logz));
  request.set_request_id("flashsampler-cli");
  const auto start = std::chrono::steady_clock::now();
  auto result = client.Verify(request, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  if (!result.ok()) return Fail(result.status());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const v1::VerifyResult& out = result->sequences(0);
  std::printf("num_accepted: %d\n", out.num_accepted());
  std::printf("token_ids: [%s]\n", absl::StrJoin(out.token_ids(), ", ").c_str());
  std::printf("acceptance_probs: [%s]\n", absl::StrJoin(out.acceptance_probs(), ", ").c_str());
  if (out.logz_size() > 0) std::printf("logz: [%s]\n", absl::StrJoin(out.logz(), ", ").c_str());
  std::printf("seed: %llu\n", static_cast<unsigned long long>(out.seed()));
  std::printf("latency: %.3f ms\n", ms);
  return 0;
}

int RunSample(SamplerClient& client) {
  v1::SampleRequest request;
  int64_t rows = absl::GetFlag(FLAGS_rows);
  if (int rc = LoadHiddenStates(client, &rows, request.mutable_hidden_states()); rc != 0) return rc;
  v1::SamplingParams* params = request.add_params();
  if (int rc = SetBasicParams(params); rc != 0) return rc;
  // Controls left at their neutral values are not sent, so a plain request
  // stays plain; the server validates the others.
  params->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_top_p) != 1.0f) params->set_top_p(absl::GetFlag(FLAGS_top_p));
  params->set_min_p(absl::GetFlag(FLAGS_min_p));
  params->set_top_logprobs(absl::GetFlag(FLAGS_top_logprobs));
  if (absl::GetFlag(FLAGS_num_samples) != 1) params->set_num_samples(absl::GetFlag(FLAGS_num_samples));
  if (absl::GetFlag(FLAGS_raw_logprobs)) params->set_logprobs_mode(v1::LOGPROBS_MODE_RAW);
  if (absl::GetFlag(FLAGS_repetition_penalty) != 1.0f) {
    params->set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  }
  params->set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  params->set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  request.set_return_logz(absl::GetFlag(FLAGS_logz));
  request.set_return_logprobs(absl::GetFlag(FLAGS_logprobs));
  request.set_request_id("flashsampler-cli");

  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  std::vector<v1::SampleResponse> responses;
  std::vector<double> latencies_ms;
  const auto start_all = std::chrono::steady_clock::now();
  if (absl::GetFlag(FLAGS_stream)) {
    std::vector<v1::SampleRequest> requests(repeat, request);
    auto result = client.SampleStream(requests, timeout);
    if (!result.ok()) return Fail(result.status());
    responses = *std::move(result);
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - start_all).count() / repeat);
  } else {
    for (int i = 0; i < repeat; ++i) {
      const auto start = std::chrono::steady_clock::now();
      auto result = client.Sample(request, timeout);
      if (!result.ok()) return Fail(result.status());
      latencies_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      responses.push_back(*std::move(result));
    }
  }
  const v1::SampleResponse& last = responses.back();
  std::printf("token_ids: [%s]\n", absl::StrJoin(last.token_ids(), ", ").c_str());
  if (last.logz_size() > 0) std::printf("logz: [%s]\n", absl::StrJoin(last.logz(), ", ").c_str());
  if (last.logprobs_size() > 0) {
    std::printf("logprobs: [%s]\n", absl::StrJoin(last.logprobs(), ", ").c_str());
  }
  std::printf("seeds: [%s]\n", absl::StrJoin(last.seeds(), ", ").c_str());
  for (int b = 0; b < last.rows_size(); ++b) {
    const v1::RowOutput& row = last.rows(b);
    std::printf("row %d: samples [%s]", b, absl::StrJoin(row.sample_token_ids(), ", ").c_str());
    if (row.sample_logprobs_size() > 0) {
      std::printf(" logprobs [%s] ranks [%s]", absl::StrJoin(row.sample_logprobs(), ", ").c_str(),
                  absl::StrJoin(row.sample_ranks(), ", ").c_str());
    }
    if (row.top_logprobs_size() > 0) {
      std::printf(" top [%s]",
                  absl::StrJoin(row.top_logprobs(), ", ",
                                [](std::string* out, const v1::TokenLogprob& t) {
                                  absl::StrAppend(out, t.token_id(), ":", t.logprob());
                                })
                      .c_str());
    }
    std::printf("\n");
  }
  std::sort(latencies_ms.begin(), latencies_ms.end());
  std::printf("latency: %.3f ms (median of %zu%s)\n", latencies_ms[latencies_ms.size() / 2],
              latencies_ms.size(), absl::GetFlag(FLAGS_stream) ? " stream, per request" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("flashsampler-cli --address=HOST:PORT sample|verify|info|health [flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) return Usage("expected one command: sample, verify, info or health");
  const std::string command = args[1];
  absl::StatusOr<flashsampler::ChannelSecurity> security =
      flashsampler::LoadChannelSecurity(flashsampler::ChannelSecurityOptionsFromFlags());
  if (!security.ok()) return Usage(std::string(security.status().message()));
  SamplerClient client(absl::GetFlag(FLAGS_address), *std::move(security));
  if (command == "info") return RunInfo(client);
  if (command == "health") return RunHealth(client);
  if (command == "sample") return RunSample(client);
  if (command == "verify") return RunVerify(client);
  return Usage("unknown command '" + command + "' (expected sample, verify, info or health)");
}
