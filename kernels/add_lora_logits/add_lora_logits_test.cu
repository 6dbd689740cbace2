// launch_add_lora_logits against punica::ref::add_lora_logits (intermediate rounded to the weight
// dtype, as the GPU does): request-level routing, mixed ranks with NaN padding in A and B, empty
// and last slots, -1 rows bit-equal to y0, vocab 32000 / 258048 / odd, hidden 2049, guards.
#include <gtest/gtest.h>

#include "kernels/add_lora_logits/add_lora_logits.h"
#include "kernels/common/test_util.h"

namespace punica::kernels::testing {
namespace {

struct LogitsCase {
  DType dtype;
  int64_t R, hidden, vocab;
  std::vector<int> ranks;
  int max_rank;
  std::vector<int32_t> slots;
  float scale = 0.5f;
  int64_t x_pad = 0, y_pad = 0;
  bool gpu_meta = false;
};

void run_case(const LogitsCase& c, uint64_t seed) {
  const int L = int(c.ranks.size());
  const int64_t Rw = c.R, H = c.hidden, V = c.vocab, xs = H + c.x_pad, ys = V + c.y_pad;
  const int K = c.max_rank;
  const std::vector<int32_t> mapping = random_mapping(seed, Rw, c.slots);
  HostTensor x(c.dtype, std::size_t(std::max<int64_t>(Rw, 1) * xs));
  HostTensor A(c.dtype, std::size_t(L) * K * H), B(c.dtype, std::size_t(L) * V * K);
  x.fill_uniform(seed + 1);
  A.fill_uniform(seed + 2, 0.1f);
  B.fill_uniform(seed + 3);
  for (int l = 0; l < L; ++l) {
    for (int k = c.ranks[l]; k < K; ++k)
      for (int64_t h = 0; h < H; ++h) A.set((std::size_t(l) * K + k) * H + h, std::nanf(""));
    for (int64_t n = 0; n < V; ++n)
      for (int k = c.ranks[l]; k < K; ++k) B.set((std::size_t(l) * V + n) * K + k, std::nanf(""));
  }
  HostTensor y0(c.dtype, std::size_t(std::max<int64_t>(Rw, 1) * ys));
  y0.fill_uniform(seed + 4, 4.0f);
  std::vector<int32_t> ranks(c.ranks.begin(), c.ranks.end());

  const HostMeta hm = host_meta(mapping, L);
  HostTensor ref = y0;
  AddLoraLogitsArgs a;
  a.dtype = c.dtype;
  a.num_rows = Rw;
  a.hidden = H;
  a.x = x.data();
  a.x_row_stride = xs;
  a.lora_a = A.data();
  a.lora_b = B.data();
  a.vocab_size = V;
  a.max_loras = L;
  a.max_rank = K;
  a.lora_ranks = ranks.data();
  a.meta.token_lora_mapping = hm.mapping.data();
  a.scale = c.scale;
  a.y = ref.data();
  a.y_row_stride = ys;
  punica::ref::add_lora_logits(a);

  GuardedBuffer dx = to_guarded(x), dA = to_guarded(A), dB = to_guarded(B), dy = to_guarded(y0),
                dranks = to_guarded(ranks);
  const std::size_t wsb = add_lora_logits_workspace_bytes(Rw, K);
  GuardedBuffer ws(wsb);
  device_fill_pattern(ws.data(), wsb / 4, 4, 0x7fc00000u, nullptr);  // NaN: unwritten reads show
  DeviceMeta dm = c.gpu_meta ? gpu_meta(mapping, L) : upload_meta(hm);
  a.x = dx.data();
  a.lora_a = dA.data();
  a.lora_b = dB.data();
  a.lora_ranks = dranks.as<int32_t>();
  a.meta = dm.view();
  a.y = dy.data();
  a.workspace = ws.data();
  launch_add_lora_logits(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor y(c.dtype, y0.n);
  dy.download(y.data(), y.nbytes());
  EXPECT_TRUE(dy.guards_ok());
  EXPECT_TRUE(ws.guards_ok());

  const CompareResult r = compare(y, ref, y0, Rw, ys, [&](int64_t i, int64_t j) {
    return mapping[std::size_t(i)] >= 0 && j < V;
  });
  EXPECT_EQ(r.nwrong, 0) << r.first << " (checked " << r.nchecked << ", rms " << r.rms << ")";
  EXPECT_EQ(r.nbitdiff, 0) << r.first;
}

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};

TEST(AddLoraLogits, Vocab32000MixedRanks) {
  uint64_t seed = 100;
  for (DType t : kDtypes)
    for (int64_t R : {1, 4, 33}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " R=" + std::to_string(R));
      run_case({t, R, 4096, 32000, {8, 16, 64, 16}, 64, {-1, 0, 1, 3}}, ++seed);
    }
}

TEST(AddLoraLogits, Vocab258048) {
  uint64_t seed = 200;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 5, 1024, 258048, {16, 8, 16}, 16, {-1, 0, 2}, 1.0f}, ++seed);
  }
}

TEST(AddLoraLogits, OddShapes) {
  uint64_t seed = 300;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 7, 2049, 32003, {8, 13, 16}, 16, {-1, 0, 1, 2}, 0.25f, 3, 5}, ++seed);
    run_case({t, 9, 2048, 1001, {5, 3}, 7, {0, 1}, 2.0f, 0, 1}, ++seed);  // odd max_rank
  }
}

TEST(AddLoraLogits, EdgeBatches) {
  uint64_t seed = 400;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 0, 512, 1000, {16}, 16, {0}}, ++seed);
    run_case({t, 1, 512, 1000, {16, 8}, 16, {1}}, ++seed);
    run_case({t, 16, 512, 1000, {16, 8}, 16, {-1}}, ++seed);
    run_case({t, 200, 1024, 5000, {8, 16, 64, 16}, 64, {-1, 0, 1, 3}, 0.5f, 0, 0, true}, ++seed);
    // > 128 rows: the pipelined tensor-core expand (16-bit, 16-byte rows; max_rank 16 and 64
    // configurations), and the sorted fallback for an odd vocabulary.
    run_case({t, 300, 1024, 32000, {8, 16, 64, 16}, 64, {-1, 0, 1, 3}, 0.5f, 0, 8, true}, ++seed);
    run_case({t, 257, 512, 20000, {16, 8}, 16, {-1, 0, 1}, 1.0f, 0, 0, true}, ++seed);
    run_case({t, 300, 1024, 32003, {8, 16, 64, 16}, 64, {0, 1, 3}, 0.5f, 0, 0, true}, ++seed);
  }
}

}  // namespace
}  // namespace punica::kernels::testing

namespace punica::kernels::testing {
namespace {

TEST(AddLoraLogits, DISABLED_Timing) {
  const int L = 4, r = 16;
  const int64_t H = 4096;
  for (int64_t V : {32000, 258048})
    for (int64_t R : {1, 8, 64}) {
      const std::vector<int32_t> m = random_mapping(5, R, {0, 1, 2, 3});
      std::vector<int32_t> ranks(L, r);
      DeviceBuffer x(R * H * 2), A(std::size_t(L) * r * H * 2), B(std::size_t(L) * V * r * 2),
          y(std::size_t(R) * V * 2), dr(L * 4), ws(add_lora_logits_workspace_bytes(R, r));
      for (DeviceBuffer* b : {&x, &A, &B, &y}) device_fill_pattern(b->get(), b->bytes() / 2, 2, 0x3c00, nullptr);
      dr.upload(ranks.data(), L * 4);
      DeviceMeta dm = gpu_meta(m, L);
      AddLoraLogitsArgs a;
      a.dtype = DType::bf16;
      a.num_rows = R;
      a.hidden = H;
      a.x = x.get();
      a.x_row_stride = H;
      a.lora_a = A.get();
      a.lora_b = B.get();
      a.vocab_size = V;
      a.max_loras = L;
      a.max_rank = r;
      a.lora_ranks = dr.as<int32_t>();
      a.meta = dm.view();
      a.y = y.get();
      a.y_row_stride = V;
      a.workspace = ws.get();
      const double us = time_us([&] { launch_add_lora_logits(a, nullptr); });
      const int active = int(std::min<int64_t>(R, L));
      const double bytes = double(active) * (double(V) * r * 2 + double(r) * H * 2) + double(R) * V * 4 + double(R) * H * 2;
      std::printf("TIMING add_lora_logits bf16 R=%lld V=%lld r=%d: %.2f us, %.0f GB/s\n",
                  (long long)R, (long long)V, r, us, bytes / us / 1e3);
    }
}

}  // namespace
}  // namespace punica::kernels::testing
