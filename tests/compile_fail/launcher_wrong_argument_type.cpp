// Must not compile: a generated launcher rejects an argument of the wrong type.
#include "test_mixed_kernels.hpp"

void misuse(cora::stream& s, cora::device_buffer<double>& wrong, cora::device_buffer<float>& y) {
  // axpy takes (float, const float*, float*, uint64_t): a double buffer is no const float*.
  (void)test_mixed_kernels::axpy(s, {}, 2.0f, wrong, y, std::uint64_t{4});
}
