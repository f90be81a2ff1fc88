// A library that starts a thread before main, as some libraries do (OpenBLAS
// did, while the CPU backend used it): server_e2e_test preloads it into the
// server (LD_PRELOAD) so that a thread whose mask does not block SIGTERM
// exists, and SigtermThatLandsOnALibraryThreadStillDrains can send the signal
// to it. The thread only sleeps.
#include <pthread.h>
#include <unistd.h>

namespace {

void* SleepForever(void*) {
  for (;;) pause();
  return nullptr;
}

__attribute__((constructor)) void StartEarlyThread() {
  pthread_t thread;
  if (pthread_create(&thread, nullptr, SleepForever, nullptr) == 0) pthread_detach(thread);
}

}  // namespace
