// TSan annotations for the prebuilt (uninstrumented) Abseil synchronization
// library, loaded into every binary of a FLASHSAMPLER_SANITIZE=thread build.
//
// Why: Debian's libabsl_synchronization is compiled without -fsanitize=thread,
// so ThreadSanitizer cannot see absl::Mutex, CondVar or Notification
// synchronize (they use their own atomics and futexes, which TSan does not
// intercept). Every field guarded by an absl::Mutex would then be reported as
// a race -- in our code and in gRPC's. This library interposes the entry
// points (it is linked before libabsl_synchronization, so the dynamic linker
// binds every caller, including gRPC and Abseil itself, to these
// definitions), calls the real function found with dlsym(RTLD_NEXT) and tells
// TSan about the happens-before edge: __tsan_release(mutex) before a lock is
// given up, __tsan_acquire(mutex) after it is taken. Nothing is suppressed:
// races on data not protected by an Abseil primitive are still reported.
//
// Reader locks are modelled as exclusive (a reader "acquires" what earlier
// readers released): this can hide a race between two readers that both
// write, never report a false one.
//
// Thread safety: the real-function pointers are resolved once per function
// (function-local statics); the wrappers are as thread-safe as Abseil's.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
// Exported by the TSan runtime (the dynamic-annotations interface).
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);

namespace {

#define FS_STR2(x) #x
#define FS_STR(x) FS_STR2(x)

// The Itanium-mangled name of a member of absl::<inline namespace>:: whose
// mangled tail after the namespace is `rest` ("5Mutex4LockEv"), with "NS@_"
// standing for the substitution of that namespace (NS0_ with the inline
// namespace, NS_ without). `is_const` for const member functions.
std::string AbslSymbol(const char* rest, bool is_const) {
  std::string tail = rest;
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const std::string ns = FS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string prefix = "4absl" + std::to_string(ns.size()) + ns;
  const std::string substitution = "NS0_";
#else
  const std::string prefix = "4absl";
  const std::string substitution = "NS_";
#endif
  for (size_t at = tail.find("NS@_"); at != std::string::npos; at = tail.find("NS@_")) {
    tail.replace(at, 4, substitution);
  }
  return std::string(is_const ? "_ZNK" : "_ZN") + prefix + tail;
}

template <typename Fn>
Fn Real(const char* rest, bool is_const = false) {
  const std::string name = AbslSymbol(rest, is_const);
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan absl annotations: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

using MutexFn = void (*)(absl::Mutex*);
using MutexBoolFn = bool (*)(absl::Mutex*);
using CondFn = void (*)(absl::Mutex*, const absl::Condition&);
using CondTimeoutFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using CondDeadlineFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CvWaitFn = void (*)(absl::CondVar*, absl::Mutex*);
using CvTimeoutFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CvDeadlineFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);
using NotifyFn = void (*)(absl::Notification*);
using WaitNotifyFn = void (*)(const absl::Notification*);
using WaitNotifyTimeoutFn = bool (*)(const absl::Notification*, absl::Duration);
using WaitNotifyDeadlineFn = bool (*)(const absl::Notification*, absl::Time);

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// Memory accesses inside the real Abseil call are not checked. Abseil
// evaluates a waiter's Condition (our code, reading guarded state) on
// whichever thread holds or releases the mutex, inside Lock/Unlock/Await:
// logically under the lock, but outside the window the Acquire/Release pair
// above marks. Abseil's own TSan build ignores those evaluations the same way.
struct IgnoreAccesses {
  IgnoreAccesses() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreAccesses() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  IgnoreAccesses(const IgnoreAccesses&) = delete;
  IgnoreAccesses& operator=(const IgnoreAccesses&) = delete;
};

// Calls `real` with accesses ignored and returns its result.
template <typename Fn, typename... Args>
auto CallReal(Fn real, Args&&... args) {
  IgnoreAccesses ignore;
  return real(std::forward<Args>(args)...);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// The destructor tells the deadlock detector to forget this mutex
// (ForgetDeadlockInfo: GraphCycles::RemoveNode, under a SpinLock TSan cannot
// see). Two mutexes destroyed on two threads at once would otherwise be
// reported as a race inside the detector's graph. Only the detector's own
// accesses are ignored; the mutex holds no data of ours.
Mutex::~Mutex() {
  static const MutexFn real = Real<MutexFn>("5MutexD2Ev");
  CallReal(real, this);
}

void Mutex::Lock() {
  static const MutexFn real = Real<MutexFn>("5Mutex4LockEv");
  CallReal(real, this);
  Acquire(this);
}
void Mutex::ReaderLock() {
  static const MutexFn real = Real<MutexFn>("5Mutex10ReaderLockEv");
  CallReal(real, this);
  Acquire(this);
}
void Mutex::Unlock() {
  static const MutexFn real = Real<MutexFn>("5Mutex6UnlockEv");
  Release(this);
  CallReal(real, this);
}
void Mutex::ReaderUnlock() {
  static const MutexFn real = Real<MutexFn>("5Mutex12ReaderUnlockEv");
  Release(this);
  CallReal(real, this);
}
bool Mutex::TryLock() {
  static const MutexBoolFn real = Real<MutexBoolFn>("5Mutex7TryLockEv");
  const bool locked = CallReal(real, this);
  if (locked) Acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  static const MutexBoolFn real = Real<MutexBoolFn>("5Mutex13ReaderTryLockEv");
  const bool locked = CallReal(real, this);
  if (locked) Acquire(this);
  return locked;
}
void Mutex::LockWhen(const Condition& cond) {
  static const CondFn real = Real<CondFn>("5Mutex8LockWhenERKNS@_9ConditionE");
  CallReal(real, this, cond);
  Acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  static const CondFn real = Real<CondFn>("5Mutex14ReaderLockWhenERKNS@_9ConditionE");
  CallReal(real, this, cond);
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const CondTimeoutFn real =
      Real<CondTimeoutFn>("5Mutex19LockWhenWithTimeoutERKNS@_9ConditionENS@_8DurationE");
  const bool met = CallReal(real, this, cond, timeout);
  Acquire(this);
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const CondDeadlineFn real =
      Real<CondDeadlineFn>("5Mutex20LockWhenWithDeadlineERKNS@_9ConditionENS@_4TimeE");
  const bool met = CallReal(real, this, cond, deadline);
  Acquire(this);
  return met;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const CondTimeoutFn real =
      Real<CondTimeoutFn>("5Mutex25ReaderLockWhenWithTimeoutERKNS@_9ConditionENS@_8DurationE");
  const bool met = CallReal(real, this, cond, timeout);
  Acquire(this);
  return met;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const CondDeadlineFn real =
      Real<CondDeadlineFn>("5Mutex26ReaderLockWhenWithDeadlineERKNS@_9ConditionENS@_4TimeE");
  const bool met = CallReal(real, this, cond, deadline);
  Acquire(this);
  return met;
}
// Await gives the lock up while it waits and holds it again on return.
void Mutex::Await(const Condition& cond) {
  static const CondFn real = Real<CondFn>("5Mutex5AwaitERKNS@_9ConditionE");
  Release(this);
  CallReal(real, this, cond);
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const CondTimeoutFn real =
      Real<CondTimeoutFn>("5Mutex16AwaitWithTimeoutERKNS@_9ConditionENS@_8DurationE");
  Release(this);
  const bool met = CallReal(real, this, cond, timeout);
  Acquire(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const CondDeadlineFn real =
      Real<CondDeadlineFn>("5Mutex17AwaitWithDeadlineERKNS@_9ConditionENS@_4TimeE");
  Release(this);
  const bool met = CallReal(real, this, cond, deadline);
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static const CvWaitFn real = Real<CvWaitFn>("7CondVar4WaitEPNS@_5MutexE");
  Release(mu);
  CallReal(real, this, mu);
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const CvTimeoutFn real =
      Real<CvTimeoutFn>("7CondVar15WaitWithTimeoutEPNS@_5MutexENS@_8DurationE");
  Release(mu);
  const bool timed_out = CallReal(real, this, mu, timeout);
  Acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const CvDeadlineFn real =
      Real<CvDeadlineFn>("7CondVar16WaitWithDeadlineEPNS@_5MutexENS@_4TimeE");
  Release(mu);
  const bool timed_out = CallReal(real, this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

// Notify happens before every wait that observes it.
void Notification::Notify() {
  static const NotifyFn real = Real<NotifyFn>("12Notification6NotifyEv");
  Release(this);
  CallReal(real, this);
}
void Notification::WaitForNotification() const {
  static const WaitNotifyFn real = Real<WaitNotifyFn>("12Notification19WaitForNotificationEv", /*is_const=*/true);
  CallReal(real, this);
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const WaitNotifyTimeoutFn real =
      Real<WaitNotifyTimeoutFn>("12Notification30WaitForNotificationWithTimeoutENS@_8DurationE", /*is_const=*/true);
  const bool notified = CallReal(real, this, timeout);
  if (notified) Acquire(this);
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const WaitNotifyDeadlineFn real =
      Real<WaitNotifyDeadlineFn>("12Notification31WaitForNotificationWithDeadlineENS@_4TimeE", /*is_const=*/true);
  const bool notified = CallReal(real, this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
