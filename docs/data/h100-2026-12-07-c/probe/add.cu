extern "C" __global__ void add_f32(const float* x, const float* y, float* z, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) z[i] = x[i] + y[i];
}
