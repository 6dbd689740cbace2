// launch_add_lora_embedding against punica::ref::add_lora_embedding: mixed ranks with NaN padding
// in A and B, empty slots, the last slot, -1 rows bit-equal to y0, add_inputs on (random y0) and
// off (NaN-poisoned y), odd widths (2049) and padded row strides, guard regions, T = 0 / 1.
#include <gtest/gtest.h>

#include "kernels/add_lora_embedding/add_lora_embedding.h"
#include "kernels/common/test_util.h"

namespace punica::kernels::testing {
namespace {

struct EmbCase {
  DType dtype;
  int64_t T, D, vocab;
  std::vector<int> ranks;      // per slot (size L)
  int max_rank;
  std::vector<int32_t> slots;  // values drawn for the mapping
  bool add_inputs = true;
  int64_t stride_pad = 0;
  bool nan_padding = true;
  bool gpu_meta = false;
};

void run_case(const EmbCase& c, uint64_t seed) {
  const int L = int(c.ranks.size());
  const int64_t T = c.T, D = c.D, V = c.vocab, stride = D + c.stride_pad;
  const int R = c.max_rank;
  const std::vector<int32_t> mapping = random_mapping(seed, T, c.slots);
  std::vector<int32_t> ids(std::size_t(std::max<int64_t>(T, 1)));
  for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(hash_below(seed + 1, t, uint64_t(V)));

  HostTensor A(c.dtype, std::size_t(L) * V * R), B(c.dtype, std::size_t(L) * D * R);
  A.fill_uniform(seed + 2);
  B.fill_uniform(seed + 3);
  if (c.nan_padding)
    for (int l = 0; l < L; ++l) {
      for (int64_t v = 0; v < V; ++v)
        for (int k = c.ranks[l]; k < R; ++k) A.set((std::size_t(l) * V + v) * R + k, std::nanf(""));
      for (int64_t n = 0; n < D; ++n)
        for (int k = c.ranks[l]; k < R; ++k) B.set((std::size_t(l) * D + n) * R + k, std::nanf(""));
    }
  HostTensor y0(c.dtype, std::size_t(std::max<int64_t>(T, 1) * stride));
  if (c.add_inputs) y0.fill_uniform(seed + 4, 2.0f);
  else y0.fill_nan();
  std::vector<int32_t> ranks(c.ranks.begin(), c.ranks.end());

  // Reference on host.
  const HostMeta hm = host_meta(mapping, L);
  HostTensor ref = y0;
  AddLoraEmbeddingArgs a;
  a.dtype = c.dtype;
  a.num_tokens = T;
  a.token_ids = ids.data();
  a.vocab_size = V;
  a.embed_dim = D;
  a.lora_a = A.data();
  a.lora_b = B.data();
  a.max_loras = L;
  a.max_rank = R;
  a.lora_ranks = ranks.data();
  a.meta.token_lora_mapping = hm.mapping.data();
  a.y = ref.data();
  a.y_row_stride = stride;
  a.add_inputs = c.add_inputs;
  punica::ref::add_lora_embedding(a);

  // GPU.
  GuardedBuffer dA = to_guarded(A), dB = to_guarded(B), dy = to_guarded(y0), dids = to_guarded(ids),
                dranks = to_guarded(ranks);
  DeviceMeta dm = c.gpu_meta ? gpu_meta(mapping, L) : upload_meta(hm);
  a.token_ids = dids.as<int32_t>();
  a.lora_a = dA.data();
  a.lora_b = dB.data();
  a.lora_ranks = dranks.as<int32_t>();
  a.meta = dm.view();
  a.y = dy.data();
  launch_add_lora_embedding(a, nullptr);
  PUNICA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor y(c.dtype, y0.n);
  dy.download(y.data(), y.nbytes());
  EXPECT_TRUE(dy.guards_ok());
  EXPECT_TRUE(dA.guards_ok() && dB.guards_ok());

  const CompareResult r = compare(y, ref, y0, T, stride, [&](int64_t i, int64_t j) {
    return mapping[std::size_t(i)] >= 0 && j < D;
  });
  EXPECT_EQ(r.nwrong, 0) << r.first << " (checked " << r.nchecked << ", rms " << r.rms << ")";
  EXPECT_EQ(r.nbitdiff, 0) << r.first;
}

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};

TEST(AddLoraEmbedding, MixedRanksNanPadding) {
  uint64_t seed = 1000;
  for (DType t : kDtypes)
    for (int64_t T : {1, 5, 37, 300}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " T=" + std::to_string(T));
      // slots 0..4 with ranks 8/16/64/0-empty; slot 2 never used; last slot 4 used.
      run_case({t, T, 4096, 1000, {8, 16, 64, 16, 64}, 64, {-1, 0, 1, 3, 4}}, ++seed);
      run_case({t, T, 2049, 333, {8, 16, 64, 16, 64}, 64, {-1, 0, 1, 3, 4}, true, 3}, ++seed);
      run_case({t, T, 1024, 500, {8, 16, 64, 16}, 64, {-1, 0, 1, 2, 3}, /*add=*/false}, ++seed);
    }
}

TEST(AddLoraEmbedding, OddRankNoVectorPath) {
  uint64_t seed = 2000;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 50, 777, 100, {5, 12, 1}, 13, {-1, 0, 1, 2}}, ++seed);
    run_case({t, 50, 777, 100, {12, 3, 9}, 12, {0, 1, 2}, false, 1}, ++seed);
  }
}

TEST(AddLoraEmbedding, EdgeBatches) {
  uint64_t seed = 3000;
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    run_case({t, 0, 512, 64, {16, 16}, 16, {0, 1}}, ++seed);                 // T = 0
    run_case({t, 1, 512, 64, {16, 16}, 16, {1}}, ++seed);                    // T = 1, last slot
    run_case({t, 64, 512, 64, {16, 16}, 16, {-1}}, ++seed);                  // all -1
    run_case({t, 3000, 2048, 256, {8, 64, 16}, 64, {-1, 0, 1, 2}, true, 0, true, true}, ++seed);
    run_case({t, 9000, 256, 256, {8, 64, 16}, 64, {-1, 0, 2}, true, 8, true, true}, ++seed);
    // Prefill through the pipelined tensor-core expand with gathered A rows (16-bit, max_rank
    // <= 16 and <= 64 configurations), with and without add_inputs, ragged adapter tiles.
    run_case({t, 1000, 4096, 777, {16, 8, 16}, 16, {-1, 0, 1, 2}, true, 0, true, true}, ++seed);
    run_case({t, 700, 1032, 99, {8, 16}, 16, {0, 1}, false, 0, true, true}, ++seed);
    run_case({t, 2000, 3000, 500, {32, 24, 8}, 32, {-1, 0, 1, 2}, true, 16, true, true}, ++seed);
  }
}

}  // namespace
}  // namespace punica::kernels::testing

namespace punica::kernels::testing {
namespace {

TEST(AddLoraEmbedding, DISABLED_Timing) {
  const int L = 8, vocab = 32000;
  const int64_t D = 4096;
  for (int r : {16, 64})
    for (int64_t T : {1, 16, 256, 8192}) {
      const std::vector<int32_t> m = random_mapping(5, T, {0, 1, 2, 3, 4, 5, 6, 7});
      std::vector<int32_t> ids(T), ranks(L, r);
      for (int64_t t = 0; t < T; ++t) ids[t] = int32_t(hash_below(9, t, vocab));
      DeviceBuffer A(std::size_t(L) * vocab * r * 2), B(std::size_t(L) * D * r * 2),
          y(std::size_t(T) * D * 2), dids(T * 4), dr(L * 4);
      device_fill_pattern(A.get(), A.bytes() / 2, 2, 0x3c00, nullptr);
      device_fill_pattern(B.get(), B.bytes() / 2, 2, 0x3c00, nullptr);
      device_fill_pattern(y.get(), y.bytes() / 2, 2, 0x3c00, nullptr);
      dids.upload(ids.data(), T * 4);
      dr.upload(ranks.data(), L * 4);
      DeviceMeta dm = gpu_meta(m, L);
      AddLoraEmbeddingArgs a;
      a.dtype = DType::bf16;
      a.num_tokens = T;
      a.token_ids = dids.as<int32_t>();
      a.vocab_size = vocab;
      a.embed_dim = D;
      a.lora_a = A.get();
      a.lora_b = B.get();
      a.max_loras = L;
      a.max_rank = r;
      a.lora_ranks = dr.as<int32_t>();
      a.meta = dm.view();
      a.y = y.get();
      a.y_row_stride = D;
      const double us = time_us([&] { launch_add_lora_embedding(a, nullptr); });
      const int active = int(std::min<int64_t>(T, L));
      const double bytes = double(active) * D * r * 2 + double(T) * D * 4 + double(T) * r * 2;
      std::printf("TIMING add_lora_embedding bf16 T=%lld D=%lld r=%d: %.2f us, %.0f GB/s\n",
                  (long long)T, (long long)D, r, us, bytes / us / 1e3);
    }
}

}  // namespace
}  // namespace punica::kernels::testing
