// End to end: TLS, mTLS, the bearer token and the plaintext health-only port,
// against the real flashsampler-server binary on loopback. The PKI is made at
// test time by make_test_certs.sh (a CA, a server certificate for localhost /
// 127.0.0.1, a client certificate, and an unrelated CA with its own client).
#include <stdio.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/sampler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/scoped_temp_dir.h"
#include "tests/e2e/server_process.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::ServerProcess;
using Serving = grpc::health::v1::HealthCheckResponse;

constexpr int64_t kHidden = 32;
constexpr char kToken[] = "s3cr3t-token_0123456789";

const std::vector<std::string> kSmallServer = {"--backend=cpu", "--demo_vocab=500",
                                               "--demo_hidden=32", "--threads=1"};

std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> flags = kSmallServer;
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

v1::SampleRequest OneRowRequest() {
  v1::SampleRequest r;
  *r.mutable_hidden_states() =
      MakeHiddenStates(std::vector<float>(kHidden, 0.25f), 1, kHidden, v1::DTYPE_FP32);
  v1::SamplingParams* p = r.add_params();
  p->set_temperature(1.0f);
  p->set_seed(7);
  return r;
}

// The security of a client; dies on a bad test setup.
ChannelSecurity Security(ChannelSecurityOptions options) {
  absl::StatusOr<ChannelSecurity> s = LoadChannelSecurity(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : ChannelSecurity();
}

absl::StatusCode SampleCode(const ChannelSecurity& security, const std::string& address) {
  SamplerClient client(address, security);
  // A refused handshake fails the call at once; the deadline only bounds a
  // machine too busy to get there (60 s, so a slow handshake is never read
  // as DEADLINE_EXCEEDED).
  return client.Sample(OneRowRequest(), absl::Seconds(60)).status().code();
}

// Runs `command` with a shell; its exit status and combined output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pipe ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

class SecurityE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir("security_e2e");
    const auto [code, output] = RunCommand(
        absl::StrCat("bash ", FLASHSAMPLER_MAKE_TEST_CERTS, " ", dir_->path()));
    ASSERT_EQ(code, 0) << output;
    std::ofstream(dir_->Path("token")) << "  " << kToken << "\n";
    std::ofstream(dir_->Path("wrong_token")) << kToken << "x\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string File(const std::string& name) { return dir_->Path(name); }
  static std::string Flag(const std::string& flag, const std::string& file) {
    return absl::StrCat("--", flag, "=", File(file));
  }
  static ChannelSecurityOptions TrustingCa() { return {.tls_ca = File("ca.pem")}; }
  static ChannelSecurityOptions WithClientCert(const std::string& name) {
    return {.tls_ca = File("ca.pem"), .tls_cert = File(name + ".pem"), .tls_key = File(name + ".key")};
  }

  static ScopedTempDir* dir_;
};

ScopedTempDir* SecurityE2E::dir_ = nullptr;

TEST_F(SecurityE2E, TlsServesTrustingClientsAndRefusesOthers) {
  ServerProcess server(Flags({Flag("tls_cert", "server.pem"), Flag("tls_key", "server.key"),
                              "--health_address=127.0.0.1:0"}));
  ASSERT_TRUE(server.Start().ok());

  auto client_ptr = std::make_unique<SamplerClient>(server.address(), Security(TrustingCa()));
  SamplerClient& client = *client_ptr;
  absl::StatusOr<v1::SampleResponse> response = client.Sample(OneRowRequest());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->token_ids_size(), 1);
  EXPECT_TRUE(client.GetModelInfo().ok());
  // The name the certificate holds, through the override, on the IP address.
  EXPECT_EQ(SampleCode(Security({.tls_ca = File("ca.pem"), .tls_server_name = "localhost"}),
                       server.address()),
            absl::StatusCode::kOk);

  // A handshake that fails is UNAVAILABLE: a CA that did not sign the server,
  // or no TLS at all.
  EXPECT_EQ(SampleCode(Security({.tls_ca = File("other_ca.pem")}), server.address()),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(SampleCode(ChannelSecurity(), server.address()), absl::StatusCode::kUnavailable);

  // The plaintext health-only port answers probes and nothing else.
  ASSERT_FALSE(server.health_address().empty());
  auto probe_ptr = std::make_unique<SamplerClient>(server.health_address());
  SamplerClient& probe = *probe_ptr;
  absl::StatusOr<Serving::ServingStatus> health = probe.CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, Serving::SERVING);
  health = probe.CheckHealth("flashsampler.v1.Sampler");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, Serving::SERVING);
  EXPECT_EQ(probe.Sample(OneRowRequest()).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(probe.GetModelInfo().status().code(), absl::StatusCode::kUnimplemented);

  // flashsampler-cli speaks TLS with --tls_ca and fails without it.
  const std::string cli = absl::StrCat(testing::CliBinary(), " --address=", server.address());
  auto [code, output] = RunCommand(absl::StrCat(cli, " --tls_ca=", File("ca.pem"), " sample"));
  EXPECT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("token_ids"));
  std::tie(code, output) = RunCommand(absl::StrCat(cli, " --timeout_s=60 info"));
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("UNAVAILABLE"));

  // With both listeners, SIGTERM still drains and exits cleanly. (The
  // clients go first: gRPC's graceful shutdown waits a few seconds for a
  // connected idle TLS client to go away, which only slows the test.)
  probe_ptr.reset();
  client_ptr.reset();
  absl::StatusOr<int> exit_code = server.Stop(SIGTERM, absl::Seconds(30));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

// Both certificate providers: the files watched (the default refresh) and
// read once (--credentials_refresh_s=0).
TEST_F(SecurityE2E, MutualTlsRequiresAClientCertificateFromTheConfiguredCa) {
  for (const char* refresh : {"--credentials_refresh_s=60", "--credentials_refresh_s=0"}) {
    SCOPED_TRACE(refresh);
    ServerProcess server(Flags({Flag("tls_cert", "server.pem"), Flag("tls_key", "server.key"),
                                Flag("tls_client_ca", "ca.pem"), refresh}),
                         Security(WithClientCert("client")));
    ASSERT_TRUE(server.Start().ok());
    EXPECT_EQ(SampleCode(Security(WithClientCert("client")), server.address()), absl::StatusCode::kOk);
    EXPECT_EQ(SampleCode(Security(TrustingCa()), server.address()), absl::StatusCode::kUnavailable);
    EXPECT_EQ(SampleCode(Security(WithClientCert("other_client")), server.address()),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(SampleCode(ChannelSecurity(), server.address()), absl::StatusCode::kUnavailable);
  }
}

TEST_F(SecurityE2E, BearerTokenGuardsEverySamplerRpcButNotHealth) {
  ServerProcess server(Flags({Flag("auth_token_file", "token")}));
  ASSERT_TRUE(server.Start().ok());  // readiness is a health check without a token

  const ChannelSecurity right = Security({.auth_token_file = File("token")});
  const ChannelSecurity wrong = Security({.auth_token_file = File("wrong_token")});
  for (const ChannelSecurity* security : {&right, &wrong}) {
    const absl::StatusCode expected =
        security == &right ? absl::StatusCode::kOk : absl::StatusCode::kUnauthenticated;
    SamplerClient client(server.address(), *security);
    EXPECT_EQ(client.Sample(OneRowRequest()).status().code(), expected);
    EXPECT_EQ(client.SampleStream({OneRowRequest(), OneRowRequest()}).status().code(), expected);
    EXPECT_EQ(client.GetModelInfo().status().code(), expected);
  }
  SamplerClient anonymous(server.address());
  EXPECT_EQ(anonymous.Sample(OneRowRequest()).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous.SampleStream({OneRowRequest()}).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous.GetModelInfo().status().code(), absl::StatusCode::kUnauthenticated);
  absl::StatusOr<Serving::ServingStatus> health = anonymous.CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, Serving::SERVING);

  // Another scheme, or the token with a different case, is refused too.
  for (const char* value : {"Basic czNjcjN0", "Bearer S3CR3T-TOKEN_0123456789", "Bearer"}) {
    v1::SampleResponse response;
    grpc::ClientContext context;
    context.AddMetadata("authorization", value);
    auto stub = v1::Sampler::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    EXPECT_EQ(stub->Sample(&context, OneRowRequest(), &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << value;
  }

  const std::string cli = absl::StrCat(testing::CliBinary(), " --address=", server.address());
  auto [code, output] = RunCommand(absl::StrCat(cli, " --auth_token_file=", File("token"), " info"));
  EXPECT_EQ(code, 0) << output;
  std::tie(code, output) = RunCommand(absl::StrCat(cli, " info"));
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("UNAUTHENTICATED"));
}

TEST_F(SecurityE2E, MutualTlsWithTokenNeedsBoth) {
  ServerProcess server(Flags({Flag("tls_cert", "server.pem"), Flag("tls_key", "server.key"),
                              Flag("tls_client_ca", "ca.pem"), Flag("auth_token_file", "token")}),
                       Security(WithClientCert("client")));
  ASSERT_TRUE(server.Start().ok());
  ChannelSecurityOptions both = WithClientCert("client");
  both.auth_token_file = File("token");
  EXPECT_EQ(SampleCode(Security(both), server.address()), absl::StatusCode::kOk);
  EXPECT_EQ(SampleCode(Security(WithClientCert("client")), server.address()),
            absl::StatusCode::kUnauthenticated);
  ChannelSecurityOptions token_only = TrustingCa();
  token_only.auth_token_file = File("token");
  EXPECT_EQ(SampleCode(Security(token_only), server.address()), absl::StatusCode::kUnavailable);
}

// With TLS, the token is checked on a call's headers: a unary Sampler call
// and a reflection stream without it that never send a message are refused
// at once, with UNAUTHENTICATED, instead of the server waiting for (and
// buffering) a message (server/security/header_token_check.h). Without the
// header check each call would end only at its deadline.
TEST_F(SecurityE2E, OverTlsATokenlessCallIsRefusedOnItsHeaders) {
  ServerProcess server(Flags({Flag("tls_cert", "server.pem"), Flag("tls_key", "server.key"),
                              Flag("auth_token_file", "token")}),
                       Security(TrustingCa()));
  ASSERT_TRUE(server.Start().ok());
  grpc::GenericStub stub(MakeSecureChannel(server.address(), Security(TrustingCa()), grpc::ChannelArguments()));
  for (const char* path :
       {"/flashsampler.v1.Sampler/Sample", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    SCOPED_TRACE(path);
    grpc::CompletionQueue cq;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&context, path, &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(2));
    void* tag = nullptr;
    bool ok = false;
    bool finished = false;
    while (!finished && cq.Next(&tag, &ok)) finished = tag == reinterpret_cast<void*>(2);
    ASSERT_TRUE(finished);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  // With the token the same server serves; health needs none.
  ChannelSecurityOptions with_token = TrustingCa();
  with_token.auth_token_file = File("token");
  EXPECT_EQ(SampleCode(Security(with_token), server.address()), absl::StatusCode::kOk);
  SamplerClient tokenless(server.address(), Security(TrustingCa()));
  const absl::StatusOr<Serving::ServingStatus> health = tokenless.CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, Serving::SERVING);
}

// Copies `from` to `to` through a new file renamed over `to`: an atomic
// replacement, as a rotation should be.
void ReplaceFile(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(content.empty()) << from;
  std::ofstream(to + ".next", std::ios::binary) << content;
  ASSERT_EQ(std::rename((to + ".next").c_str(), to.c_str()), 0);
}

// Polls until a call with `security` gets `want` (the server re-reads its
// files every --credentials_refresh_s): true once it does, false at the
// deadline. Each call opens a new channel, so a new handshake.
bool EventuallySampleCode(const ChannelSecurity& security, const std::string& address, absl::StatusCode want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    if (SampleCode(security, address) == want) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// --credentials_refresh_s: a rotated token and a rotated server certificate
// (another CA's) take effect while the server runs, and the old ones stop
// working; no restart.
TEST_F(SecurityE2E, RotatedTokenAndCertificateTakeEffectWithoutARestart) {
  ReplaceFile(File("server.pem"), File("rotating.pem"));
  ReplaceFile(File("server.key"), File("rotating.key"));
  ReplaceFile(File("token"), File("rotating_token"));
  ServerProcess server(Flags({Flag("tls_cert", "rotating.pem"), Flag("tls_key", "rotating.key"),
                              Flag("auth_token_file", "rotating_token"), "--credentials_refresh_s=1"}),
                       Security(TrustingCa()));
  ASSERT_TRUE(server.Start().ok());
  ChannelSecurityOptions old_ca_old_token = TrustingCa();
  old_ca_old_token.auth_token_file = File("token");
  EXPECT_EQ(SampleCode(Security(old_ca_old_token), server.address()), absl::StatusCode::kOk);

  std::ofstream(File("new_token")) << "rotated-token-42\n";
  ReplaceFile(File("new_token"), File("rotating_token"));
  ChannelSecurityOptions old_ca_new_token = TrustingCa();
  old_ca_new_token.auth_token_file = File("new_token");
  EXPECT_TRUE(EventuallySampleCode(Security(old_ca_new_token), server.address(), absl::StatusCode::kOk));
  EXPECT_EQ(SampleCode(Security(old_ca_old_token), server.address()), absl::StatusCode::kUnauthenticated);

  // The key first, then its certificate: between the two renames the files
  // disagree, and a read then fails handshakes until the next one.
  ReplaceFile(File("other_server.key"), File("rotating.key"));
  ReplaceFile(File("other_server.pem"), File("rotating.pem"));
  ChannelSecurityOptions new_ca_new_token = {.tls_ca = File("other_ca.pem")};
  new_ca_new_token.auth_token_file = File("new_token");
  EXPECT_TRUE(EventuallySampleCode(Security(new_ca_new_token), server.address(), absl::StatusCode::kOk));
  EXPECT_EQ(SampleCode(Security(old_ca_new_token), server.address()), absl::StatusCode::kUnavailable);
}

TEST_F(SecurityE2E, BadSecurityFilesStopTheStartWithTheFlagNamed) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tls_cert=/nonexistent/server.pem", Flag("tls_key", "server.key")}, "--tls_cert"},
      {{Flag("tls_cert", "server.pem")}, "--tls_cert and --tls_key"},
      {{Flag("tls_cert", "client.pem"), Flag("tls_key", "server.key")}, "--tls_key does not match"},
      {{Flag("tls_cert", "server.key"), Flag("tls_key", "server.key")}, "--tls_cert: no PEM certificate"},
      {{Flag("tls_client_ca", "ca.pem")}, "--tls_client_ca needs --tls_cert"},
      {{Flag("tls_cert", "server.pem"), Flag("tls_key", "server.key"), Flag("tls_client_ca", "token")},
       "--tls_client_ca"},
      {{"--auth_token_file=/nonexistent/token"}, "--auth_token_file"},
      {{Flag("auth_token_file", "token"), "--credentials_refresh_s=-1"}, "--credentials_refresh_s"},
  };
  for (const Case& c : cases) {
    std::string command = testing::ServerBinary() + " --address=127.0.0.1:0";
    for (const std::string& flag : Flags(c.flags)) absl::StrAppend(&command, " ", flag);
    const auto [code, output] = RunCommand(command);
    EXPECT_EQ(code, 2) << command << "\n" << output;
    EXPECT_THAT(output, HasSubstr(c.message)) << command;
    EXPECT_THAT(output, HasSubstr("INVALID_ARGUMENT")) << command;
    EXPECT_THAT(output, ::testing::Not(HasSubstr("PRIVATE KEY"))) << command;
  }
}

}  // namespace
}  // namespace flashsampler
