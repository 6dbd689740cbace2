// main() of every GPU test binary: exits 4 ("skipped", CTest SKIP_RETURN_CODE 4) when no GPU is
// present, because GTEST_SKIP() would exit 0 and be counted as a pass.
#include <gtest/gtest.h>
#include <cstdio>
#include "kernels/common/device_buffer.h"

int main(int argc, char** argv) {
  if (punica::kernels::gpu_count() == 0) {
    std::fprintf(stderr, "skipped: no CUDA device on this machine\n");
    return 4;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
