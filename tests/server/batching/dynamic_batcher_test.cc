// DynamicBatcher: coalescing under concurrency, splitting of oversize
// requests, tokens identical to unbatched runs on the real CPU engine,
// admission (queue full -> RESOURCE_EXHAUSTED), deadlines and cancellation
// answered without compute, engine failures, ordered drain on Stop.
//
// The fake engine can hold its first launch until the test releases it, so
// "requests queue up while the engine is busy" is arranged, not hoped for:
// no test depends on timing.
#include "server/batching/dynamic_batcher.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/model/lm_head.h"
#include "server/model/safetensors_writer.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

using ::testing::ElementsAre;

// Token of each row = its params' seed (so scatter errors show), logz = seed
// + 0.5 when asked. Records the rows of every launch; when `hold_first` is
// set, the first launch waits for Release().
class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(bool hold_first = false, bool fail = false)
      : hold_first_(hold_first), fail_(fail) {
    shape_.vocab_size = shape_.valid_vocab = 10;
    shape_.hidden_size = 2;
  }
  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    bool hold;
    {
      absl::MutexLock lock(&mu_);
      launches_.push_back(batch.rows);
      hold = hold_first_ && launches_.size() == 1;
      sample_thread_ = std::this_thread::get_id();
    }
    if (hold) {
      first_started_.Notify();
      release_.WaitForNotification();
    }
    if (fail_) {
      healthy_ = false;
      return absl::InternalError("device lost");
    }
    for (int64_t row = 0; row < batch.rows; ++row) {
      if (poison_seed_ >= 0 && batch.params[row].seed == static_cast<uint64_t>(poison_seed_.load())) {
        // Named as an engine names a row: from the batch's request_row_offset.
        return absl::FailedPreconditionError(
            absl::StrCat("row ", batch.request_row_offset + row, " has no token left to sample"));
      }
    }
    SampleResult r;
    for (const RowParams& p : batch.params) {
      r.token_ids.push_back(static_cast<int32_t>(p.seed));
      if (batch.want_logz) r.logz.push_back(static_cast<float>(p.seed) + 0.5f);
      if (batch.want_logprobs) r.logprobs.push_back(-1.0f);
    }
    // With controls, every row gets a detail (the Engine contract).
    for (size_t row = 0; row < batch.controls.size(); ++row) {
      r.details.push_back(RowSampleDetail{{r.token_ids[row]}, {}, {}, {}});
    }
    // With drafts, every row gets a draft log-probability: -draft (NaN: none).
    if (!ignores_drafts_) {
      for (int32_t x : batch.draft_tokens) r.draft_logprobs.push_back(x >= 0 ? -float(x) : NAN);
    }
    return r;
  }
  bool serves_draft_rows(bool /*with_controls*/) const override { return serves_drafts_; }
  void set_serves_draft_rows(bool serves) { serves_drafts_ = serves; }
  // Breaks the contract: returns no draft_logprobs for a batch with drafts.
  void set_ignores_drafts(bool ignores) { ignores_drafts_ = ignores; }
  // A batch holding a row with this seed fails with FailedPrecondition (a
  // row the engine cannot serve, e.g. no token left after its controls); the
  // engine stays healthy.
  void set_poison_seed(int64_t seed) { poison_seed_ = seed; }
  const ModelShape& shape() const override { return shape_; }
  std::string backend_name() const override { return "fake"; }
  bool healthy() const override { return healthy_; }

  void WaitForFirstLaunch() { first_started_.WaitForNotification(); }
  void Release() { release_.Notify(); }
  std::vector<int64_t> launches() const {
    absl::MutexLock lock(&mu_);
    return launches_;
  }
  // The thread of the last Sample call (the batcher's worker).
  std::thread::id sample_thread() const {
    absl::MutexLock lock(&mu_);
    return sample_thread_;
  }

 private:
  const bool hold_first_;
  const bool fail_;
  std::atomic<bool> healthy_{true};
  std::atomic<bool> serves_drafts_{false};
  std::atomic<bool> ignores_drafts_{false};
  std::atomic<int64_t> poison_seed_{-1};
  ModelShape shape_;
  absl::Notification first_started_, release_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> launches_ ABSL_GUARDED_BY(mu_);
  std::thread::id sample_thread_ ABSL_GUARDED_BY(mu_);
};

// Rows with seeds first_seed, first_seed + 1, ...
SampleBatch Batch(int64_t rows, uint64_t first_seed = 0, bool want_logz = false) {
  SampleBatch b;
  b.rows = rows;
  b.hidden.assign(rows * 2, 0.0f);
  for (int64_t r = 0; r < rows; ++r) b.params.push_back(RowParams{1.0f, first_seed + r, 0, 0});
  b.want_logz = want_logz;
  return b;
}

// Collects one Submit's outcome. The callback owns the state with the
// Outcome: completions run on the batcher's pool threads and may still be
// running when a test (which declares its Outcomes after the batcher) ends
// without waiting for every request, e.g. the one StartHeld launched.
struct Outcome {
  struct State {
    absl::Notification done;
    absl::StatusOr<SampleResult> result = absl::UnknownError("not answered");
    std::thread::id thread;  // the one `done` ran on
  };
  std::shared_ptr<State> state = std::make_shared<State>();
  absl::Notification& done = state->done;
  absl::StatusOr<SampleResult>& result = state->result;
  DynamicBatcher::Done Callback() {
    return [s = state](absl::StatusOr<SampleResult> r) {
      s->result = std::move(r);
      s->thread = std::this_thread::get_id();
      s->done.Notify();
    };
  }
  absl::StatusCode code() {
    done.WaitForNotification();
    return result.status().code();
  }
};

BatcherOptions Options(int64_t max_batch_rows, absl::Duration delay, int64_t max_queue_rows = 1 << 16) {
  return BatcherOptions{max_batch_rows, delay, max_queue_rows};
}

// Holds the engine in a first 1-row launch, so that later submissions queue.
FakeEngine* StartHeld(DynamicBatcher& batcher, Outcome* first, SampleBatch* first_batch) {
  auto engine = std::make_unique<FakeEngine>(/*hold_first=*/true);
  FakeEngine* raw = engine.get();
  batcher.SetEngine(std::move(engine));
  batcher.Submit(first_batch, first->Callback());
  raw->WaitForFirstLaunch();
  return raw;
}

TEST(DynamicBatcher, UnavailableUntilAnEngineIsSet) {
  DynamicBatcher batcher(Options(8, absl::ZeroDuration()));
  EXPECT_FALSE(batcher.ready());
  SampleBatch b = Batch(1);
  Outcome o;
  batcher.Submit(&b, o.Callback());
  EXPECT_EQ(o.code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatcher, CoalescesRequestsFromConcurrentCallersIntoOneLaunch) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  // While the engine is busy, 16 callers on their own threads submit 1..3 rows.
  constexpr int kCallers = 16;
  std::vector<SampleBatch> batches;
  for (int i = 0; i < kCallers; ++i) batches.push_back(Batch(1 + i % 3, 100 * i, i % 2 == 0));
  std::vector<Outcome> outcomes(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { batcher.Submit(&batches[i], outcomes[i].Callback()); });
  }
  for (std::thread& t : callers) t.join();
  int64_t queued = 0;
  for (const SampleBatch& b : batches) queued += b.rows;
  EXPECT_EQ(batcher.queued_rows(), queued);
  engine->Release();
  for (int i = 0; i < kCallers; ++i) {
    ASSERT_EQ(outcomes[i].code(), absl::StatusCode::kOk) << i;
    const SampleResult& r = *outcomes[i].result;
    ASSERT_EQ(static_cast<int64_t>(r.token_ids.size()), batches[i].rows);
    for (int64_t row = 0; row < batches[i].rows; ++row) {
      EXPECT_EQ(r.token_ids[row], 100 * i + row) << "caller " << i << " got another's row";
    }
    // Only the callers that asked for logz get it, although the launch computed it.
    EXPECT_EQ(r.logz.size(), batches[i].want_logz ? r.token_ids.size() : 0u) << i;
  }
  ASSERT_EQ(first_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(engine->launches(), ElementsAre(1, queued)) << "the queued requests were not coalesced";
}

// A lone request's launch with nothing queued behind it is answered by the
// worker itself; a launch with requests queued behind it, or of several
// requests, hands its answers to the pool.
TEST(DynamicBatcher, AnswersOnTheWorkerOnlyALoneRequestWithNothingQueued) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 7);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  SampleBatch second = Batch(2, 20), third = Batch(1, 30);
  Outcome second_outcome, third_outcome;
  batcher.Submit(&second, second_outcome.Callback());  // queued behind the held launch
  batcher.Submit(&third, third_outcome.Callback());
  engine->Release();
  ASSERT_EQ(first_outcome.code(), absl::StatusCode::kOk);
  ASSERT_EQ(second_outcome.code(), absl::StatusCode::kOk);
  ASSERT_EQ(third_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(engine->launches(), ElementsAre(1, 3));
  const std::thread::id worker = engine->sample_thread();
  EXPECT_NE(first_outcome.state->thread, worker) << "answered on the worker with requests queued";
  EXPECT_NE(second_outcome.state->thread, worker) << "a launch of two requests answered on the worker";
  EXPECT_NE(third_outcome.state->thread, worker);
  SampleBatch lone = Batch(1, 40);
  Outcome lone_outcome;
  batcher.Submit(&lone, lone_outcome.Callback());
  ASSERT_EQ(lone_outcome.code(), absl::StatusCode::kOk);
  EXPECT_EQ(lone_outcome.state->thread, engine->sample_thread()) << "a lone request: the worker answers";
}

// A launch's answers go to the pool a few requests per posted callback: a
// launch of fewer than four requests is answered by one pool thread; a larger
// one still reaches every request once, with its own rows, off the worker.
TEST(DynamicBatcher, AnswersALaunchInChunksOverThePool) {
  BatcherOptions options = Options(64, absl::ZeroDuration());
  options.completion_threads = 3;
  DynamicBatcher batcher(options);
  SampleBatch first = Batch(1, 7);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  std::vector<SampleBatch> few = {Batch(1, 10), Batch(2, 20), Batch(1, 30)};
  std::vector<Outcome> few_outcomes(few.size());
  for (size_t i = 0; i < few.size(); ++i) batcher.Submit(&few[i], few_outcomes[i].Callback());
  engine->Release();
  for (Outcome& o : few_outcomes) ASSERT_EQ(o.code(), absl::StatusCode::kOk);
  EXPECT_EQ(few_outcomes[0].state->thread, few_outcomes[1].state->thread);
  EXPECT_EQ(few_outcomes[1].state->thread, few_outcomes[2].state->thread);
  EXPECT_NE(few_outcomes[0].state->thread, engine->sample_thread());

  // 13 requests queued behind a held launch form one launch: more than one
  // chunk.
  DynamicBatcher many_batcher(options);
  SampleBatch held = Batch(1, 5);
  Outcome held_outcome;
  FakeEngine* many_engine = StartHeld(many_batcher, &held_outcome, &held);
  constexpr int kRequests = 13;
  std::vector<SampleBatch> many;
  for (int i = 0; i < kRequests; ++i) many.push_back(Batch(1 + i % 2, 100 * (i + 1)));
  std::vector<Outcome> many_outcomes(kRequests);
  for (int i = 0; i < kRequests; ++i) many_batcher.Submit(&many[i], many_outcomes[i].Callback());
  many_engine->Release();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(many_outcomes[i].code(), absl::StatusCode::kOk) << i;
    const SampleResult& r = *many_outcomes[i].result;
    ASSERT_EQ(static_cast<int64_t>(r.token_ids.size()), many[i].rows) << i;
    for (int64_t row = 0; row < many[i].rows; ++row) EXPECT_EQ(r.token_ids[row], 100 * (i + 1) + row) << i;
    EXPECT_NE(many_outcomes[i].state->thread, many_engine->sample_thread()) << i;
  }
  ASSERT_EQ(held_outcome.code(), absl::StatusCode::kOk);
  EXPECT_EQ(many_engine->launches().size(), 2u) << "the queued requests were not one launch";
}

// With an idle poll far longer than the test, requests submitted while the
// worker polls are served, and Stop() ends the poll (a hang here is the
// failure: the ctest timeout reports it).
TEST(DynamicBatcher, IdlePollServesNewRequestsAndEndsOnStop) {
  BatcherOptions options = Options(64, absl::ZeroDuration());
  options.idle_spin = absl::Hours(1);
  DynamicBatcher batcher(options);
  batcher.SetEngine(std::make_unique<FakeEngine>());
  for (uint64_t i = 0; i < 20; ++i) {
    SampleBatch b = Batch(1, 100 + i);
    Outcome o;
    batcher.Submit(&b, o.Callback());
    ASSERT_EQ(o.code(), absl::StatusCode::kOk) << i;
    EXPECT_THAT(o.result->token_ids, ElementsAre(100 + i));
  }
  batcher.Stop();
  SampleBatch late = Batch(1);
  Outcome refused;
  batcher.Submit(&late, refused.Callback());
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatcher, WaitsForAFullBatchWithinTheQueueDelay) {
  // A delay far longer than the test: the only way to launch is a full batch.
  DynamicBatcher batcher(Options(4, absl::Hours(1)));
  auto engine = std::make_unique<FakeEngine>();
  FakeEngine* raw = engine.get();
  batcher.SetEngine(std::move(engine));
  std::vector<SampleBatch> batches = {Batch(1, 0), Batch(2, 10), Batch(1, 20)};
  std::vector<Outcome> outcomes(3);
  for (int i = 0; i < 3; ++i) batcher.Submit(&batches[i], outcomes[i].Callback());
  for (Outcome& o : outcomes) ASSERT_EQ(o.code(), absl::StatusCode::kOk);
  EXPECT_THAT(raw->launches(), ElementsAre(4));
  EXPECT_THAT(outcomes[1].result->token_ids, ElementsAre(10, 11));
}

TEST(DynamicBatcher, SplitsARequestLargerThanTheBatchLimit) {
  DynamicBatcher batcher(Options(4, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  SampleBatch big = Batch(10, 0, /*want_logz=*/true);
  SampleBatch small = Batch(1, 50);
  Outcome big_outcome, small_outcome;
  batcher.Submit(&big, big_outcome.Callback());
  batcher.Submit(&small, small_outcome.Callback());
  engine->Release();
  ASSERT_EQ(big_outcome.code(), absl::StatusCode::kOk);
  ASSERT_EQ(small_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(big_outcome.result->token_ids, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_EQ(big_outcome.result->logz.size(), 10u);
  EXPECT_FLOAT_EQ(big_outcome.result->logz[9], 9.5f);
  EXPECT_THAT(small_outcome.result->token_ids, ElementsAre(50));
  // 10 rows over launches of 4; the small request rides in the last one.
  EXPECT_THAT(engine->launches(), ElementsAre(1, 4, 4, 3));
}

TEST(DynamicBatcher, RequestsWithControlsNeverShareALaunchWithPlainOnes) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  SampleBatch plain_a = Batch(1, 0), controlled_a = Batch(2, 10), controlled_b = Batch(1, 20),
              plain_b = Batch(3, 30);
  controlled_a.controls.resize(2);
  controlled_a.controls[0].top_k = 3;
  controlled_b.controls.resize(1);
  controlled_b.controls[0].top_k = 4;
  std::vector<Outcome> outcomes(4);
  batcher.Submit(&plain_a, outcomes[0].Callback());
  batcher.Submit(&controlled_a, outcomes[1].Callback());
  batcher.Submit(&controlled_b, outcomes[2].Callback());
  batcher.Submit(&plain_b, outcomes[3].Callback());
  engine->Release();
  for (Outcome& o : outcomes) ASSERT_EQ(o.code(), absl::StatusCode::kOk);
  ASSERT_EQ(first_outcome.code(), absl::StatusCode::kOk);
  // In arrival order: the plain row, both controlled requests together, then plain again.
  EXPECT_THAT(engine->launches(), ElementsAre(1, 1, 3, 3));
  EXPECT_THAT(outcomes[1].result->token_ids, ElementsAre(10, 11));
  ASSERT_EQ(outcomes[2].result->details.size(), 1u);
  EXPECT_THAT(outcomes[2].result->details[0].token_ids, ElementsAre(20));
  EXPECT_TRUE(outcomes[3].result->details.empty());
}

// Verification rows (draft_tokens) join plain rows in one launch on a
// backend that serves them, and run apart on one that does not.
TEST(DynamicBatcher, DraftRowsShareALaunchOnlyWithAnEngineThatServesThem) {
  for (const bool serves : {true, false}) {
    DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
    SampleBatch first = Batch(1, 1000);
    Outcome first_outcome;
    FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
    engine->set_serves_draft_rows(serves);
    SampleBatch plain_a = Batch(2, 0), verify = Batch(3, 10), plain_b = Batch(1, 20);
    verify.draft_tokens = {4, 5, -1};
    std::vector<Outcome> outcomes(3);
    batcher.Submit(&plain_a, outcomes[0].Callback());
    batcher.Submit(&verify, outcomes[1].Callback());
    batcher.Submit(&plain_b, outcomes[2].Callback());
    engine->Release();
    for (Outcome& o : outcomes) ASSERT_EQ(o.code(), absl::StatusCode::kOk);
    ASSERT_EQ(first_outcome.code(), absl::StatusCode::kOk);
    if (serves) {
      EXPECT_THAT(engine->launches(), ElementsAre(1, 6));
    } else {
      EXPECT_THAT(engine->launches(), ElementsAre(1, 2, 3, 1));
    }
    // Each request gets its own rows back; draft_logprobs only where asked.
    EXPECT_THAT(outcomes[1].result->token_ids, ElementsAre(10, 11, 12));
    ASSERT_EQ(outcomes[1].result->draft_logprobs.size(), 3u);
    EXPECT_EQ(outcomes[1].result->draft_logprobs[1], -5.0f);
    EXPECT_TRUE(std::isnan(outcomes[1].result->draft_logprobs[2]));
    EXPECT_TRUE(outcomes[0].result->draft_logprobs.empty());
    EXPECT_THAT(outcomes[2].result->token_ids, ElementsAre(20));
  }
}

// A backend that ignores draft rows fails only the launch holding them
// (UNIMPLEMENTED), never hands out unverified tokens, and stays healthy.
TEST(DynamicBatcher, DraftRowsIgnoredByTheEngineAreUnimplemented) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  engine->set_ignores_drafts(true);
  SampleBatch plain = Batch(2, 0), verify = Batch(2, 10);
  verify.draft_tokens = {3, -1};
  Outcome plain_outcome, verify_outcome;
  batcher.Submit(&plain, plain_outcome.Callback());
  batcher.Submit(&verify, verify_outcome.Callback());
  engine->Release();
  EXPECT_EQ(plain_outcome.code(), absl::StatusCode::kOk);
  EXPECT_EQ(verify_outcome.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(batcher.ready());
}

// One request's bad row fails only that request: the launch it shared with
// others is re-run request by request.
TEST(DynamicBatcher, ARowTheEngineRefusesFailsOnlyItsOwnRequest) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  engine->set_poison_seed(666);
  SampleBatch a = Batch(2, 10), bad = Batch(3, 665), c = Batch(1, 20);  // bad's row 1: seed 666
  Outcome a_outcome, bad_outcome, c_outcome;
  batcher.Submit(&a, a_outcome.Callback());
  batcher.Submit(&bad, bad_outcome.Callback());
  batcher.Submit(&c, c_outcome.Callback());
  engine->Release();
  ASSERT_EQ(a_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(a_outcome.result->token_ids, ElementsAre(10, 11));
  EXPECT_EQ(bad_outcome.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(c_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(c_outcome.result->token_ids, ElementsAre(20));
  // The shared launch of 6 rows, then each request alone.
  EXPECT_THAT(engine->launches(), ElementsAre(1, 6, 2, 3, 1));
  EXPECT_TRUE(batcher.ready());
}

// The same when the bad request is split over launches: its queued rest
// leaves the queue with it, and the batcher goes on serving.
TEST(DynamicBatcher, ASplitRequestWithARefusedRowFailsAloneAndLeavesTheQueue) {
  DynamicBatcher batcher(Options(4, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  engine->set_poison_seed(666);
  SampleBatch small = Batch(1, 50), big = Batch(6, 665);  // big's row 1: seed 666
  Outcome small_outcome, big_outcome;
  batcher.Submit(&small, small_outcome.Callback());
  batcher.Submit(&big, big_outcome.Callback());
  engine->Release();
  ASSERT_EQ(small_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(small_outcome.result->token_ids, ElementsAre(50));
  EXPECT_EQ(big_outcome.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(big_outcome.result.status().message()), "row 1 has no token left to sample");
  EXPECT_EQ(batcher.queued_rows(), 0) << "the failed request's other rows must leave the queue";
  // small + big's first 3 rows, then small alone and big's 3 rows alone.
  EXPECT_THAT(engine->launches(), ElementsAre(1, 4, 1, 3));
  SampleBatch later = Batch(2, 70);
  Outcome later_outcome;
  batcher.Submit(&later, later_outcome.Callback());
  ASSERT_EQ(later_outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(later_outcome.result->token_ids, ElementsAre(70, 71));
}

// A refused row in a later part of a split request is named by its row in
// the request, not in the launch: alone in its launch, and re-run alone after
// a launch it shared with another request failed.
TEST(DynamicBatcher, ARefusedRowInALaterPartOfASplitRequestIsNamedByItsRequestRow) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "the bad part shares a launch" : "the bad part is alone");
    DynamicBatcher batcher(Options(4, absl::ZeroDuration()));
    SampleBatch first = Batch(1, 1000);
    Outcome first_outcome;
    FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
    engine->set_poison_seed(666);
    SampleBatch big = Batch(6, 661), after = Batch(2, 20);  // big's row 5: seed 666
    Outcome big_outcome, after_outcome;
    batcher.Submit(&big, big_outcome.Callback());
    if (shared) batcher.Submit(&after, after_outcome.Callback());
    engine->Release();
    EXPECT_EQ(big_outcome.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(std::string(big_outcome.result.status().message()), "row 5 has no token left to sample");
    if (shared) {
      ASSERT_EQ(after_outcome.code(), absl::StatusCode::kOk);
      EXPECT_THAT(after_outcome.result->token_ids, ElementsAre(20, 21));
      // big's rows 4-5 with `after`, then each alone.
      EXPECT_THAT(engine->launches(), ElementsAre(1, 4, 4, 2, 2));
    } else {
      EXPECT_THAT(engine->launches(), ElementsAre(1, 4, 2));
    }
  }
}

TEST(DynamicBatcher, RefusesAtOnceWhenTheQueueIsFullAndRecovers) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration(), /*max_queue_rows=*/4));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);  // not queued: launched
  SampleBatch three = Batch(3, 0), one = Batch(1, 10), another = Batch(1, 20);
  Outcome o3, o1, refused;
  batcher.Submit(&three, o3.Callback());
  batcher.Submit(&one, o1.Callback());   // 4 rows queued: full
  batcher.Submit(&another, refused.Callback());
  ASSERT_TRUE(refused.done.HasBeenNotified()) << "a full queue must answer at once";
  EXPECT_EQ(refused.result.status().code(), absl::StatusCode::kResourceExhausted);
  engine->Release();
  EXPECT_EQ(o3.code(), absl::StatusCode::kOk);
  EXPECT_EQ(o1.code(), absl::StatusCode::kOk);
  // Room again: the same request is now admitted and answered.
  Outcome retry;
  batcher.Submit(&another, retry.Callback());
  ASSERT_EQ(retry.code(), absl::StatusCode::kOk);
  EXPECT_THAT(retry.result->token_ids, ElementsAre(20));
}

// `admitted` runs for an admitted request only, after its rows count in the
// queue (so a request behind it is refused while it runs) and before any
// launch can see it: a change it makes to the batch reaches the engine.
TEST(DynamicBatcher, AdmittedRunsBeforeTheRequestIsQueued) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration(), /*max_queue_rows=*/4));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);  // launched, not queued
  SampleBatch three = Batch(3, 0), two = Batch(2, 10);
  Outcome o3, refused, refused_after;
  bool admitted_two = false;
  batcher.Submit(&three, o3.Callback(), absl::InfiniteFuture(), nullptr, [&] {
    EXPECT_EQ(batcher.queued_rows(), 3);  // counted, though not yet queued
    batcher.Submit(&two, refused.Callback());
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    three.params[1].seed = 42;  // the launch sees the batch as this leaves it
  });
  batcher.Submit(&two, refused_after.Callback(), absl::InfiniteFuture(), nullptr,
                 [&] { admitted_two = true; });
  EXPECT_EQ(refused_after.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(admitted_two) << "a refused request is never `admitted`";
  EXPECT_TRUE(batcher.launch_running());  // the held first launch
  engine->Release();
  ASSERT_EQ(o3.code(), absl::StatusCode::kOk);
  EXPECT_THAT(o3.result->token_ids, ElementsAre(0, 42, 2));
  EXPECT_EQ(batcher.queued_rows(), 0);
}

// launch_running() is true exactly while the worker is inside a launch.
TEST(DynamicBatcher, TellsWhetherALaunchIsRunning) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  EXPECT_FALSE(batcher.launch_running());
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  EXPECT_TRUE(batcher.launch_running());
  engine->Release();
  ASSERT_EQ(first_outcome.code(), absl::StatusCode::kOk);
  batcher.Stop();  // the worker has left its loop: no launch runs
  EXPECT_FALSE(batcher.launch_running());
}

// Stop() while a request is being admitted: the worker waits for it to join
// the queue and runs it; nothing is lost.
TEST(DynamicBatcher, StopWaitsForARequestBeingAdmitted) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  batcher.SetEngine(std::make_unique<FakeEngine>());
  SampleBatch batch = Batch(2, 5);
  Outcome outcome;
  absl::Notification in_admitted, go_on;
  std::thread submitter([&] {
    batcher.Submit(&batch, outcome.Callback(), absl::InfiniteFuture(), nullptr, [&] {
      in_admitted.Notify();
      go_on.WaitForNotification();
    });
  });
  in_admitted.WaitForNotification();
  std::thread stopper([&] { batcher.Stop(); });
  // Until Stop() has begun (new requests are refused), keep the admitted
  // request where it is; probes admitted before that simply run.
  for (SampleBatch probe = Batch(1, 100);;) {
    Outcome o;
    batcher.Submit(&probe, o.Callback());
    if (o.code() == absl::StatusCode::kUnavailable) break;
  }
  go_on.Notify();
  submitter.join();
  stopper.join();
  ASSERT_TRUE(outcome.done.HasBeenNotified()) << "Stop returned before the admitted request ran";
  ASSERT_EQ(outcome.code(), absl::StatusCode::kOk);
  EXPECT_THAT(outcome.result->token_ids, ElementsAre(5, 6));
}

TEST(DynamicBatcher, ExpiredDeadlineIsAnsweredWithoutCompute) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration()));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  SampleBatch expiring = Batch(5, 0), patient = Batch(2, 10);
  Outcome expired, answered;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(1);
  batcher.Submit(&expiring, expired.Callback(), deadline);
  batcher.Submit(&patient, answered.Callback(), absl::Now() + absl::Hours(1));
  while (absl::Now() <= deadline) absl::SleepFor(absl::Milliseconds(1));
  engine->Release();
  EXPECT_EQ(expired.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answered.code(), absl::StatusCode::kOk);
  EXPECT_THAT(engine->launches(), ElementsAre(1, 2)) << "the expired rows were computed";
}

TEST(DynamicBatcher, CancelledRequestsAreDroppedFromTheQueue) {
  DynamicBatcher batcher(Options(64, absl::ZeroDuration(), /*max_queue_rows=*/8));
  SampleBatch first = Batch(1, 1000);
  Outcome first_outcome;
  FakeEngine* engine = StartHeld(batcher, &first_outcome, &first);
  std::atomic<bool> gone{false};
  SampleBatch cancelled = Batch(6, 0), kept = Batch(2, 10);
  Outcome dropped, answered;
  batcher.Submit(&cancelled, dropped.Callback(), absl::InfiniteFuture(), [&] { return gone.load(); });
  batcher.Submit(&kept, answered.Callback());
  gone = true;  // the caller goes away while its request waits
  engine->Release();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(answered.code(), absl::StatusCode::kOk);
  EXPECT_THAT(engine->launches(), ElementsAre(1, 2));
  EXPECT_EQ(batcher.queued_rows(), 0) << "a dropped request must free its queue rows";
}

TEST(ClassifyQueuedCall, ACancellationInTheLastStretchBeforeTheDeadlineIsTheDeadline) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Time deadline = t0 + absl::Seconds(1);  // a 1 s budget: the stretch is 50 ms
  EXPECT_TRUE(ClassifyQueuedCall(t0, deadline, t0 + absl::Milliseconds(10), false).ok());
  EXPECT_EQ(ClassifyQueuedCall(t0, deadline, deadline, false).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ClassifyQueuedCall(t0, deadline, deadline + absl::Seconds(1), true).code(),
            absl::StatusCode::kDeadlineExceeded);
  // The client's deadline passed before the server's: its cancel is that deadline.
  EXPECT_EQ(ClassifyQueuedCall(t0, deadline, deadline - absl::Milliseconds(30), true).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ClassifyQueuedCall(t0, deadline, deadline - absl::Milliseconds(50), true).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ClassifyQueuedCall(t0, deadline, deadline - absl::Milliseconds(51), true).code(),
            absl::StatusCode::kCancelled);
  // Short budgets keep a 2 ms stretch; long ones at most 50 ms.
  const absl::Time soon = t0 + absl::Milliseconds(10);
  EXPECT_EQ(ClassifyQueuedCall(t0, soon, soon - absl::Microseconds(1900), true).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ClassifyQueuedCall(t0, soon, soon - absl::Microseconds(2100), true).code(),
            absl::StatusCode::kCancelled);
  const absl::Time late = t0 + absl::Seconds(60);
  EXPECT_EQ(ClassifyQueuedCall(t0, late, late - absl::Milliseconds(49), true).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ClassifyQueuedCall(t0, late, late - absl::Milliseconds(51), true).code(),
            absl::StatusCode::kCancelled);
  // No deadline: a cancellation is a cancellation.
  EXPECT_EQ(ClassifyQueuedCall(t0, absl::InfiniteFuture(), t0, true).code(), absl::StatusCode::kCancelled);
}

TEST(DynamicBatcher, EngineFailureAnswersTheWholeLaunchAndStopsServing) {
  absl::Notification failure_seen;
  DynamicBatcher batcher(Options(3, absl::ZeroDuration()), nullptr, [&] { failure_seen.Notify(); });
  batcher.SetEngine(std::make_unique<FakeEngine>(false, /*fail=*/true));
  SampleBatch b = Batch(7);  // split over three launches; the first one fails
  Outcome o;
  batcher.Submit(&b, o.Callback());
  EXPECT_EQ(o.code(), absl::StatusCode::kInternal);
  failure_seen.WaitForNotification();
  EXPECT_FALSE(batcher.ready());
  EXPECT_EQ(batcher.queued_rows(), 0) << "the failed request's other rows must leave the queue";
  Outcome later;
  batcher.Submit(&b, later.Callback());
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
}

TEST(DynamicBatcher, StopRunsEverythingQueuedInOrderThenRefuses) {
  DynamicBatcher batcher(Options(2, absl::Hours(1)));  // Stop must not wait for the delay
  auto engine = std::make_unique<FakeEngine>();
  batcher.SetEngine(std::move(engine));
  constexpr int kJobs = 25;
  std::vector<SampleBatch> batches;
  for (int i = 0; i < kJobs; ++i) batches.push_back(Batch(1 + i % 3, 100 * i));
  std::vector<Outcome> outcomes(kJobs);
  for (int i = 0; i < kJobs; ++i) batcher.Submit(&batches[i], outcomes[i].Callback());
  batcher.Stop();
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(outcomes[i].done.HasBeenNotified()) << i;
    ASSERT_EQ(outcomes[i].code(), absl::StatusCode::kOk) << i;
    EXPECT_EQ(outcomes[i].result->token_ids[0], 100 * i);
  }
  Outcome late;
  batcher.Submit(&batches[0], late.Callback());
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
}

// The real CPU engine: every request of a coalesced (and split) run gets the
// tokens, logz and logprobs it gets when run alone. The LM head and hidden
// states hold small integers, so every logit is exact in fp32 whatever the
// BLAS blocking for the batch size (see README-dev "Batch invariance"); what
// is tested is that coalescing, splitting and scattering never mix rows or
// params up.
TEST(DynamicBatcher, TokensEqualUnbatchedRunsOnTheCpuEngine) {
  constexpr int64_t kVocab = 3000, kHidden = 16;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> w(kVocab * kHidden);
  for (float& x : w) x = static_cast<float>(small(gen));
  testing::ScopedTempDir dir("batcher");
  const std::string path = dir.Path("head.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"lm_head.weight", "F32", {kVocab, kHidden}, w.data(),
                                       w.size() * sizeof(float)}})
                  .ok());
  auto make_engine = [&] {
    absl::StatusOr<LmHead> head = LmHead::Load(path, "");
    EXPECT_TRUE(head.ok()) << head.status();
    absl::StatusOr<std::unique_ptr<Engine>> e = MakeCpuEngine(*std::move(head), 2990, {2, 256});
    EXPECT_TRUE(e.ok()) << e.status();
    return *std::move(e);
  };
  constexpr int kRequests = 24;
  std::vector<SampleBatch> requests(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    SampleBatch& b = requests[i];
    b.rows = 1 + (i * 7) % 11;
    for (int64_t k = 0; k < b.rows * kHidden; ++k) b.hidden.push_back(static_cast<float>(small(gen)));
    for (int64_t r = 0; r < b.rows; ++r) {
      b.params.push_back(RowParams{i % 5 == 0 ? 0.0f : 0.7f, 1000u + i, static_cast<uint64_t>(i % 3),
                                   static_cast<uint32_t>(r)});
    }
    b.want_logz = i % 2 == 0;
    b.want_logprobs = i % 3 == 0;
  }
  std::unique_ptr<Engine> alone = make_engine();
  std::vector<SampleResult> expected;
  for (const SampleBatch& b : requests) {
    absl::StatusOr<SampleResult> r = alone->Sample(b);
    ASSERT_TRUE(r.ok()) << r.status();
    expected.push_back(*r);
  }
  // Launches of exactly 16 rows (the delay never runs out; Stop() launches
  // the remainder), so requests are coalesced and those crossing a multiple
  // of 16 rows are split.
  DynamicBatcher batcher(Options(16, absl::Hours(1)));
  batcher.SetEngine(make_engine());
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> callers;
  for (int i = 0; i < kRequests; ++i) {
    callers.emplace_back([&, i] { batcher.Submit(&requests[i], outcomes[i].Callback()); });
  }
  for (std::thread& t : callers) t.join();
  batcher.Stop();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(outcomes[i].code(), absl::StatusCode::kOk) << i;
    const SampleResult& got = *outcomes[i].result;
    EXPECT_EQ(got.token_ids, expected[i].token_ids) << "request " << i;
    EXPECT_EQ(got.logz, expected[i].logz) << "request " << i;
    EXPECT_EQ(got.logprobs, expected[i].logprobs) << "request " << i;
  }
}

}  // namespace
}  // namespace flashsampler
