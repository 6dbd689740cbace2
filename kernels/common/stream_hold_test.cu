// StreamHold: work enqueued behind a hold waits for release(), a hold without its release gives up
// after its timeout and says so, and consecutive holds (the timing loop's chunks) each wait for
// their own release.
#include <gtest/gtest.h>
#include <chrono>
#include <thread>
#include "kernels/common/cuda_check.h"
#include "kernels/common/stream_hold.h"

namespace punica::kernels::testing {
namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { PUNICA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() { PUNICA_CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { cudaEventDestroy(e); }
};

TEST(StreamHold, WorkWaitsForTheRelease) {
  Stream st;
  StreamHold h;
  Event after;
  h.hold(st.s, 10.0);
  PUNICA_CUDA_CHECK(cudaEventRecord(after.e, st.s));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaEventQuery(after.e), cudaErrorNotReady) << "the event behind the hold completed before release()";
  h.release();
  PUNICA_CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(cudaEventQuery(after.e), cudaSuccess);
  EXPECT_FALSE(h.timed_out());
}

TEST(StreamHold, GivesUpAfterItsTimeoutAndSaysSo) {
  Stream st;
  StreamHold h;
  const auto t0 = std::chrono::steady_clock::now();
  h.hold(st.s, 0.05);
  PUNICA_CUDA_CHECK(cudaStreamSynchronize(st.s));  // no release: the kernel must end by itself
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(h.timed_out());
  EXPECT_GE(s, 0.04);
  EXPECT_LT(s, 5.0);
  h.clear_timeout();
  EXPECT_FALSE(h.timed_out());
}

TEST(StreamHold, EachHoldWaitsForItsOwnRelease) {
  Stream st;
  StreamHold h;
  Event first, second;
  h.hold(st.s, 10.0);
  PUNICA_CUDA_CHECK(cudaEventRecord(first.e, st.s));
  h.release();
  h.hold(st.s, 10.0);
  PUNICA_CUDA_CHECK(cudaEventRecord(second.e, st.s));
  PUNICA_CUDA_CHECK(cudaEventSynchronize(first.e));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cudaEventQuery(second.e), cudaErrorNotReady) << "the second hold went on with the first release";
  h.release();
  PUNICA_CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_FALSE(h.timed_out());
  // A release issued before its hold's kernel runs lets it through at once.
  h.hold(st.s, 10.0);
  h.release();
  const auto t0 = std::chrono::steady_clock::now();
  PUNICA_CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_FALSE(h.timed_out());
}

}  // namespace
}  // namespace punica::kernels::testing
