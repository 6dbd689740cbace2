// StreamHold: keeps a stream waiting on the GPU until the host lets it go (the "blocking kernel" of
// NVIDIA's nvbench). A timing loop holds the stream, enqueues every timed launch and its events,
// then releases it: the GPU then runs them back to back, so per-iteration event times measure the
// GPU and not the rate at which the host issues launches (at decode sizes and with NCCL calls the
// host is slower than the GPU, and without the hold the events time its launch gaps).
//
// The spin kernel gives up after `timeout_s` so that a host that cannot enqueue (a full launch
// queue, a host synchronisation inside the held work) never hangs; timed_out() reports it, and
// the timings of that hold may then include host gaps.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace punica::kernels {

class StreamHold {
 public:
  StreamHold();  // one mapped, pinned host word pair (cudaHostAlloc)
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  // Enqueue the spin kernel on `stream`: work enqueued after it waits for the matching release().
  void hold(cudaStream_t stream, double timeout_s = 1.0);
  // Host side: let the latest hold go (a release store the spinning kernel reads through PCIe).
  void release();
  // Whether any hold since the last clear_timeout() gave up before its release (read it after the
  // stream has completed).
  bool timed_out() const;
  void clear_timeout();

 private:
  volatile uint32_t* host_ = nullptr;  // [0] released epoch, [1] timed-out flag
  uint32_t* dev_ = nullptr;            // the same words, as the device sees them
  uint32_t epoch_ = 0;
};

}  // namespace punica::kernels
