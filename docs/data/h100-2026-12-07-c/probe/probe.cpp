// Raw pipelines (the pipeline benchmark's copy-launch-copy) with cora's driver choices, one at
// a time, to tell what each costs: device memory from a stream-ordered pool (POOL), host memory
// mapped (DEVMAP), cuLaunchKernelEx (EX), an event record and busy queries instead of
// cuStreamSynchronize (EVENT), slices of one allocation shared by all threads (SHARED), copies
// by direction (TYPED), and cuStreamQuery instead of an event in the polling rows (SQ). Rows
// "pollN": each thread keeps N streams busy and polls their events, as cora's executor threads do.
// Build: nvcc -cubin -arch=sm_90 add.cu -o add.cubin
//        g++ -O2 -std=c++20 probe.cpp -I/usr/local/cuda/include -lcuda -pthread -o probe
// Run:   probe SECONDS_PER_ROW add.cubin SET   (SET 1: the driver choices; 2: copies by direction)
#include <cuda.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#include <sys/resource.h>
using clk = std::chrono::steady_clock;
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s; cuGetErrorString(r_, &s); std::fprintf(stderr, "%s: %s line %d\n", #x, s, __LINE__); std::exit(1);} } while (0)
enum { POOL = 1, DEVMAP = 2, EX = 4, EVENT = 8, SHARED = 16, TYPED = 32, SQ = 64 };
constexpr size_t elements = 512, in_bytes = 2 * elements * 4, out_bytes = elements * 4;
CUcontext ctx; CUfunction fn; CUmemoryPool pool; CUstream memstream;
double cpu_s() { rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec); }
struct slot {
  CUstream s; CUevent e; float* hin; float* hout; CUdeviceptr din, dout; bool busy = false;
};
struct arena {
  int flags; std::vector<slot> slots; std::vector<void*> hosts; std::vector<CUdeviceptr> devs;
  CUdeviceptr dalloc(size_t b) {
    CUdeviceptr p;
    if (flags & POOL) { CK(cuMemAllocFromPoolAsync(&p, b, pool, memstream)); CK(cuStreamSynchronize(memstream)); }
    else CK(cuMemAlloc(&p, b));
    devs.push_back(p); return p;
  }
  void* halloc(size_t b) {
    void* p; CK(cuMemHostAlloc(&p, b, CU_MEMHOSTALLOC_PORTABLE | ((flags & DEVMAP) ? CU_MEMHOSTALLOC_DEVICEMAP : 0)));
    hosts.push_back(p); return p;
  }
  arena(int f, int n) : flags(f), slots(n) {
    float *H1 = nullptr, *H2 = nullptr; CUdeviceptr D1 = 0, D2 = 0;
    if (f & SHARED) { H1 = (float*)halloc(n * in_bytes); H2 = (float*)halloc(n * out_bytes); D1 = dalloc(n * in_bytes); D2 = dalloc(n * out_bytes); }
    for (int i = 0; i < n; ++i) {
      slot& s = slots[i];
      CK(cuStreamCreateWithPriority(&s.s, CU_STREAM_NON_BLOCKING, 0));
      CK(cuEventCreate(&s.e, CU_EVENT_DISABLE_TIMING));
      if (f & SHARED) { s.hin = H1 + i * 2 * elements; s.hout = H2 + i * elements; s.din = D1 + i * in_bytes; s.dout = D2 + i * out_bytes; }
      else { s.hin = (float*)halloc(in_bytes); s.hout = (float*)halloc(out_bytes); s.din = dalloc(in_bytes); s.dout = dalloc(out_bytes); }
      for (size_t k = 0; k < 2 * elements; ++k) s.hin[k] = 1.0f;
    }
  }
  ~arena() {
    for (auto& s : slots) { cuStreamSynchronize(s.s); cuEventDestroy(s.e); cuStreamDestroy(s.s); }
    for (auto p : hosts) cuMemFreeHost(p);
    for (auto p : devs) { if (flags & POOL) cuMemFreeAsync(p, memstream); else cuMemFree(p); }
    cuStreamSynchronize(memstream);
  }
};
void submit(const slot& s, int f) {
  if (f & TYPED) CK(cuMemcpyHtoDAsync(s.din, s.hin, in_bytes, s.s)); else
  CK(cuMemcpyAsync(s.din, (CUdeviceptr)s.hin, in_bytes, s.s));
  CUdeviceptr x = s.din, y = s.din + elements * 4, z = s.dout; unsigned long long n = elements;
  void* p[] = {&x, &y, &z, &n};
  if (f & EX) {
    CUlaunchConfig c{}; c.gridDimX = 2; c.gridDimY = 1; c.gridDimZ = 1; c.blockDimX = 256; c.blockDimY = 1; c.blockDimZ = 1; c.hStream = s.s;
    CK(cuLaunchKernelEx(&c, fn, p, nullptr));
  } else CK(cuLaunchKernel(fn, 2, 1, 1, 256, 1, 1, 0, s.s, p, nullptr));
  if (f & TYPED) CK(cuMemcpyDtoHAsync(s.hout, s.dout, out_bytes, s.s)); else
  CK(cuMemcpyAsync((CUdeviceptr)s.hout, s.dout, out_bytes, s.s));
}
// threads: T; per: streams per thread (1 = thread per request; >1 = each thread polls its streams' events)
double run(int f, int T, int per, double secs, double& cpu) {
  arena a(f, T * per);
  std::atomic<long> total{0};
  auto start = clk::now(); auto from = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(0.1 * secs)); auto end = start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(1.1 * secs));
  double c0 = cpu_s();
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back([&, t] {
    CK(cuCtxSetCurrent(ctx));
    long n = 0;
    if (per == 1) {
      slot& s = a.slots[t];
      for (auto now = clk::now(); now < end; now = clk::now()) {
        submit(s, f);
        if (f & EVENT) { CK(cuEventRecord(s.e, s.s)); CUresult r; while ((r = cuEventQuery(s.e)) == CUDA_ERROR_NOT_READY) {} CK(r); }
        else CK(cuStreamSynchronize(s.s));
        if (now >= from) ++n;
      }
    } else {
      for (int i = 0; i < per; ++i) { slot& s = a.slots[t * per + i]; submit(s, f); if (!(f & SQ)) CK(cuEventRecord(s.e, s.s)); }
      for (bool go = true; go;) {
        for (int i = 0; i < per; ++i) {
          slot& s = a.slots[t * per + i];
          CUresult r = (f & SQ) ? cuStreamQuery(s.s) : cuEventQuery(s.e);
          if (r == CUDA_ERROR_NOT_READY) continue;
          CK(r);
          auto now = clk::now();
          if (now >= end) { go = false; break; }
          if (now >= from) ++n;
          submit(s, f); if (!(f & SQ)) CK(cuEventRecord(s.e, s.s));
        }
      }
    }
    total += n;
  });
  for (auto& x : th) x.join();
  cpu = (cpu_s() - c0) / std::chrono::duration<double>(clk::now() - start).count();
  return total / std::chrono::duration<double>(end - from).count();
}
int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.5;
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, d)); CK(cuCtxSetCurrent(ctx));
  CUmodule m; CK(cuModuleLoad(&m, argc > 2 ? argv[2] : "add.cubin")); CK(cuModuleGetFunction(&fn, m, "add_f32"));
  CUmemPoolProps pp{}; pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0; CK(cuMemPoolCreate(&pool, &pp));
  int no = 0; CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &no));
  CK(cuStreamCreateWithPriority(&memstream, CU_STREAM_NON_BLOCKING, 0));
  struct V { const char* name; int f; int per; };
  const int set = argc > 3 ? atoi(argv[3]) : 2;
  std::vector<V> vs = set == 1 ? std::vector<V>{
    {"base", 0, 1}, {"pool", POOL, 1}, {"devmap", DEVMAP, 1}, {"ex", EX, 1}, {"event", EVENT, 1},
    {"shared", SHARED, 1}, {"pool+shared", POOL | SHARED, 1}, {"cora-like", POOL | DEVMAP | EX | EVENT | SHARED, 1},
    {"poll16 base", 0, 16}, {"poll16 cora-like", POOL | DEVMAP | EX | SHARED, 16},
    {"poll64 base", 0, 64}, {"poll64 cora-like", POOL | DEVMAP | EX | SHARED, 64},
    {"poll4 base", 0, 4},
  } : std::vector<V>{
    {"base", 0, 1}, {"typed", TYPED, 1}, {"event", EVENT, 1}, {"typed+event", TYPED | EVENT, 1},
    {"poll16 base", 0, 16}, {"poll16 typed", TYPED, 16}, {"poll16 sq", SQ, 16}, {"poll16 typed+sq", TYPED | SQ, 16},
    {"poll64 base", 0, 64}, {"poll64 typed", TYPED, 64},
  };
  const int passes = set == 1 ? 2 : 3;
  for (int pass = 1; pass <= passes; ++pass)
    for (int T : {4, 16})
      for (auto& v : vs) {
        if (T == 16 && v.per == 64) continue;
        double cpu; double r = run(v.f, T, v.per, secs, cpu);
        std::printf("pass %d T=%2d %-18s %9.0f /s  cpu %5.2f\n", pass, T, v.name, r, cpu);
        std::fflush(stdout);
      }
}
