// Loading kernels: device::load_binary of test_kernels.corabin from a file and from memory,
// against loading the device's own image by hand. Raw on a GPU: cuModuleLoadDataEx of the
// fatbin (from memory; from a file: read the fatbin file, then load it). Raw on the CPU
// device: the shared object written to a memory file and dlopen-ed (memory), or dlopen of the
// shared object on disk (file). Load latency only; unloading happens outside the timing.
// The raw GPU side loads into a context that holds no other module of the same image: a
// resident copy lets the driver share what it parsed (42 us a load instead of 149 on the H100).
// raw_eager (GPU): the memory load followed by what cora does before a load completes: every
// function loaded (the driver loads lazily by default), its parameters' layout and two
// attributes read.
//
// first_launch: the latency of the first launch of a kernel after a load (the load untimed):
// cora's lookup (which resolves the kernel lazily) + launch of `empty` + its completion, against
// cuModuleGetFunction + the first cuLaunchKernel + cuStreamSynchronize on a GPU, and dlsym + a
// call of the entry on the CPU device.
//
// Unloading happens outside the timing on both sides: raw unloads synchronously after taking its
// time; cora unloads a dropped binary on the dropping thread too when the device is idle, as
// here, and otherwise on a cora thread (on CUDA through the device's unload queue, which a timer
// of the device-wait pool drains). The benchmark waits until that queue is empty and its last
// unload has returned (drain_unloads) before the next timed load, so that a previous unload
// (dlclose, cuModuleUnload) never runs inside the next load's time.
//
// Every row loads one image over and over. The CPU device keeps the memory file of an unloaded
// image and maps it again for the same bytes, and a load of a file unchanged since a load of it
// does not read the file again (docs/architecture.md, "Binaries"): cora's CPU rows are that
// steady state. A first load writes the memory file, as the raw memory row does.
//
// raw_unload_away: the raw load with each unload made on another thread (one kept for the whole
// run). The driver loads more slowly after an unload on another thread (about 30 us more a
// load on the H100, 20-50 us on the CPU device): what cora's loads cost when the previous
// unload had to go to a cora thread. Information only; the goals read `paired`.
//
// paired: raw and cora alternately in one loop (see paired_load); the goals read its p50s, as
// the separate rows' times drift between passes by more than the goal's margin.
//
// raw_jit_log (memory only, information): the raw load with a JIT error log buffer and its size,
// the options cora's load passed on every load before it passed none (it still passes them to
// load a refused image again, for the driver's message).
//
// cora_inline (memory only, information): load_binary's own work (recognising the bytes, the
// checksums, the device load) called directly on the calling thread. load_binary itself loads
// there too while the device is idle (on a GPU: while cora's streams are idle, see
// device_state::run_when_idle), so the two differ by the pending's bookkeeping alone.
//
// Settings: CORA_BENCH_LOADS (loads per figure, default 200).
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <barrier>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include <asio/post.hpp>

#include <cora/cora.hpp>

#include "bench_support.hpp"
#include "core/binary_format.hpp"
#include "core/binary_loader.hpp"
#include "core/state.hpp"
#include "core/host_pool.hpp"
#include "cora/detail/cpu_kernel_abi.h"
#include "io/file_reader.hpp"
#if defined(CORA_HAS_CUDA)
#include "raw_cuda.hpp"
#endif

namespace {

using clk = std::chrono::steady_clock;
namespace cb = cora::bench;
namespace fs = std::filesystem;

int loads() { return static_cast<int>(cb::env_long("CORA_BENCH_LOADS", 200)); }
fs::path corabin() { return fs::path(cb::kernels_dir()) / "test_kernels.corabin"; }

std::vector<std::byte> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

/// Returns once every task queued on the device-wait pool (two threads) before it has run: one
/// task per thread, each waiting for the others, occupies every thread at once, which happens
/// only after the tasks queued before them are done. Polls rather than sleeps, as the raw
/// side's thread never sleeps between its loads: a thread that slept meets the next load on a
/// cold core (on the H100 that alone cost cora about 50 us a load).
void drain_wait_pool() {
  constexpr int threads = 2;  // device_wait_pool()'s
  auto all_there = std::make_shared<std::barrier<>>(threads);
  auto done = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < threads; ++i) {
    asio::post(cora::detail::device_wait_pool(), [all_there, done] {
      all_there->arrive_and_wait();
      done->fetch_add(1, std::memory_order_release);
    });
  }
  while (done->load(std::memory_order_acquire) < threads) std::this_thread::yield();
}

/// Returns once every unload that cora had queued for `dev` has finished. A dropped module is
/// first handed to the device-wait pool, which puts it on the device's unload queue (on CUDA);
/// a timer on the same pool unloads it later, taking it off the queue when it starts. So: the
/// hand-over done, the queue empty, and the pool drained once more (the unload that emptied the
/// queue has returned).
void drain_unloads(cora::device& dev) {
  drain_wait_pool();
  const auto st = dev.state();
  while (st->unloads_pending() > 0) std::this_thread::yield();
  drain_wait_pool();
}

/// The image of `kind` in the container, also written to a file in the temporary folder.
struct image {
  explicit image(cora::detail::binary_kind kind) {
    std::error_code ec;
    std::string message;
    const auto all = cora::detail::read_whole_file_sync(corabin(), ec, message);
    if (ec) throw std::runtime_error(message);
    const auto c = cora::detail::parse_corabin(all, ec, message);
    if (ec) throw std::runtime_error(message);
    for (const auto& img : c.images)
      if (img.kind == kind) bytes.assign(img.bytes.begin(), img.bytes.end());
    if (bytes.empty()) throw std::runtime_error("no image of that kind in the container");
    path = fs::temp_directory_path() / ("cora-load-bench-" + std::to_string(::getpid()) + "-" +
                                        cora::detail::binary_kind_name(kind));
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                static_cast<std::streamsize>(bytes.size()));
  }
  ~image() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  std::vector<std::byte> bytes;
  fs::path path;
};

/// Runs `job` on a thread of the benchmark's own, kept for the whole run, and returns once it
/// has run. The raw sides' raw_unload_away rows unload there: what a load costs when the
/// previous unload ran on another thread, as cora's do when the device was busy at the drop.
void run_on_other_thread(const std::function<void()>& job) {
  struct other_thread {
    std::mutex mutex;
    std::condition_variable cv;
    const std::function<void()>* job = nullptr;
    std::thread thread{[this] {
      std::unique_lock lock(mutex);
      for (;;) {
        cv.wait(lock, [&] { return job != nullptr; });
        (*job)();
        job = nullptr;
        cv.notify_all();
      }
    }};
  };
  static auto* t = [] {
    auto* p = new other_thread;  // lives until exit: its thread never returns
    p->thread.detach();
    return p;
  }();
  std::unique_lock lock(t->mutex);
  t->job = &job;
  t->cv.notify_all();
  t->cv.wait(lock, [&] { return t->job == nullptr; });
}

/// The raw CPU-device load: dlopen of the image file, or of a memory file holding the image.
struct raw_cpu_image {
  void* handle = nullptr;
  int fd = -1;
  void unload() const {
    ::dlclose(handle);
    if (fd >= 0) ::close(fd);
  }
};

raw_cpu_image raw_cpu_load(const image& img, bool from_file) {
  raw_cpu_image out;
  if (from_file) {
    out.handle = ::dlopen(img.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  } else {
    out.fd = ::memfd_create("raw-image", MFD_CLOEXEC);
    if (::write(out.fd, img.bytes.data(), img.bytes.size()) != static_cast<ssize_t>(img.bytes.size()))
      throw std::runtime_error("write to the memory file failed");
    out.handle = ::dlopen(("/proc/self/fd/" + std::to_string(out.fd)).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!out.handle) throw std::runtime_error(::dlerror());
  return out;
}

void raw_cpu(benchmark::State& state, bool from_file, bool unload_away) {
  image img(cora::detail::binary_kind::cpu_elf);
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      const auto t0 = clk::now();
      const raw_cpu_image loaded = raw_cpu_load(img, from_file);
      lat.add(clk::now() - t0);
      if (unload_away)
        run_on_other_thread([&] { loaded.unload(); });
      else
        loaded.unload();
    }
  }
  lat.report(state);
  state.SetLabel(std::string(from_file ? "dlopen of the file" : "memfd + dlopen") +
                 (unload_away ? ", unloaded on another thread" : ""));
}

void raw_cpu_first_launch(benchmark::State& state) {
  image img(cora::detail::binary_kind::cpu_elf);
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      const raw_cpu_image loaded = raw_cpu_load(img, false);
      void* h = loaded.handle;
      const auto t0 = clk::now();
      auto entry = reinterpret_cast<cora_cpu_entry_fn>(::dlsym(h, CORA_KERNEL_ENTRY_PREFIX "empty"));
      if (!entry) throw std::runtime_error("no entry of kernel empty");
      cora_cpu_launch launch{};
      launch.grid[0] = launch.grid[1] = launch.grid[2] = 1;
      launch.block_count = 1;
      launch.block[0] = launch.block[1] = launch.block[2] = 1;
      launch.block_threads = 1;
      char message[64];
      if (entry(&launch, 0, 1, nullptr, message, sizeof(message)) != CORA_CPU_OK) throw std::runtime_error(message);
      lat.add(clk::now() - t0);
      loaded.unload();
    }
  }
  lat.report(state);
  state.SetLabel("dlsym + a call of the entry on the calling thread");
}

#if defined(CORA_HAS_CUDA)
void raw_gpu_first_launch(benchmark::State& state, std::size_t ordinal) {
  image img(cora::detail::binary_kind::cuda_fatbin);
  cb::raw_cuda r(ordinal);
  auto& a = r.api();
  CUstream s = r.make_stream();
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      CUmodule m = nullptr;
      cb::check(a.cuModuleLoadDataEx(&m, img.bytes.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx");
      const auto t0 = clk::now();
      CUfunction f = nullptr;
      cb::check(a.cuModuleGetFunction(&f, m, "empty"), "cuModuleGetFunction");
      cb::check(a.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr), "cuLaunchKernel");
      cb::check(a.cuStreamSynchronize(s), "cuStreamSynchronize");
      lat.add(clk::now() - t0);
      a.cuModuleUnload(m);
    }
  }
  a.cuStreamDestroy(s);
  lat.report(state);
  state.SetLabel("cuModuleGetFunction + first cuLaunchKernel + cuStreamSynchronize");
}

/// Loads every function of `m` and reads its parameter layout and attributes, as an eager
/// loader must before it can check launches.
void load_functions(const cb::raw_cuda& r, CUmodule m) {
  auto& a = r.api();
  unsigned count = 0;
  cb::check(a.cuModuleGetFunctionCount(&count, m), "cuModuleGetFunctionCount");
  std::vector<CUfunction> fs(count);
  cb::check(a.cuModuleEnumerateFunctions(fs.data(), count, m), "cuModuleEnumerateFunctions");
  for (CUfunction f : fs) {
    if (a.cuFuncLoad) cb::check(a.cuFuncLoad(f), "cuFuncLoad");
    const char* name = nullptr;
    cb::check(a.cuFuncGetName(&name, f), "cuFuncGetName");
    if (a.cuFuncGetParamInfo) {
      std::size_t offset = 0, size = 0;
      for (std::size_t i = 0; a.cuFuncGetParamInfo(f, i, &offset, &size) == CUDA_SUCCESS; ++i) {
      }
    }
    int value = 0;
    a.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
    a.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f);
  }
}

/// The raw GPU load: cuModuleLoadDataEx of the fatbin, read from its file first (as cora reads:
/// open, fstat, one read) or from memory; jit_log: with an error log buffer and its size.
CUmodule raw_gpu_load(const cb::raw_cuda& r, const image& img, bool from_file, bool jit_log = false) {
  CUmodule m = nullptr;
  if (from_file) {
    std::error_code ec;
    std::string message;
    const auto bytes = cora::detail::read_whole_file_sync(img.path, ec, message);
    if (ec) throw std::runtime_error(message);
    cb::check(r.api().cuModuleLoadDataEx(&m, bytes.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx");
    return m;
  }
  if (!jit_log) {
    cb::check(r.api().cuModuleLoadDataEx(&m, img.bytes.data(), 0, nullptr, nullptr), "cuModuleLoadDataEx");
    return m;
  }
  thread_local std::vector<char> log(16 * 1024);
  CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(log.size()))};
  cb::check(r.api().cuModuleLoadDataEx(&m, img.bytes.data(), 2, options, values), "cuModuleLoadDataEx");
  return m;
}

void raw_gpu(benchmark::State& state, std::size_t ordinal, bool from_file, bool eager, bool unload_away,
             bool jit_log) {
  image img(cora::detail::binary_kind::cuda_fatbin);
  cb::raw_cuda r(ordinal);
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      const auto t0 = clk::now();
      CUmodule m = raw_gpu_load(r, img, from_file, jit_log);
      if (eager) load_functions(r, m);
      lat.add(clk::now() - t0);
      if (unload_away)
        run_on_other_thread([&] {
          r.bind();
          r.api().cuModuleUnload(m);
        });
      else
        r.api().cuModuleUnload(m);
    }
  }
  lat.report(state);
  state.SetLabel(std::string(from_file ? "read the fatbin file + cuModuleLoadDataEx" : "cuModuleLoadDataEx") +
                 (eager ? " + every function loaded and described" : "") +
                 (unload_away ? ", unloaded on another thread" : "") + (jit_log ? ", with a JIT error log" : ""));
}
#endif

void cora_load(benchmark::State& state, std::size_t index, bool from_file) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const auto bytes = read_all(corabin());
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      const auto t0 = clk::now();
      cora::binary b = from_file ? dev.load_binary(corabin()).wait() : dev.load_binary(std::span<const std::byte>(bytes)).wait();
      lat.add(clk::now() - t0);
      b = {};
      drain_unloads(dev);
    }
  }
  lat.report(state);
  state.SetLabel(from_file ? "load_binary(path)" : "load_binary(bytes)");
}

/// cora's own work of a load from memory, on the calling thread without the hand-over to a
/// cora thread that load_binary makes on a GPU: recognising the bytes, checking the metadata
/// and image checksums, and the device load. Read beside `cora` and `raw` it splits cora's
/// time into its work and its hops (information only).
void cora_load_inline(benchmark::State& state, std::size_t index) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const auto bytes = read_all(corabin());
  const auto st = dev.state();
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      std::error_code ec;
      std::string message;
      const auto t0 = clk::now();
      cora::binary b(cora::detail::load_binary_image(st, bytes, {}, ec, message));
      lat.add(clk::now() - t0);
      if (ec) throw std::runtime_error(message);
      b = {};
      drain_unloads(dev);
    }
  }
  lat.report(state);
  state.SetLabel("load_binary's work on the calling thread, no hop (information)");
}

/// paired: the raw load and cora's load_binary alternately in one loop (raw first in even
/// rounds, cora first in odd ones), each unloaded before the next load, so that both sides meet
/// the same machine: the driver's and the kernel's load times drift by tens of microseconds
/// between passes (on the H100, 40-60 us between two passes of the separate rows). Counters:
/// raw_p50_us, cora_p50_us (and p99s), and ratio = cora / raw of the p50s. The goals read it.
void paired_load(benchmark::State& state, std::size_t index, std::size_t ordinal, bool from_file) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const bool gpu = dev.properties().backend != cora::backend_kind::cpu;
  image img(gpu ? cora::detail::binary_kind::cuda_fatbin : cora::detail::binary_kind::cpu_elf);
#if defined(CORA_HAS_CUDA)
  std::unique_ptr<cb::raw_cuda> r;
  if (gpu) r = std::make_unique<cb::raw_cuda>(ordinal);
#else
  (void)ordinal;  // no GPU device without CUDA
#endif
  const auto bytes = read_all(corabin());
  cb::latencies raw_lat, cora_lat;
  auto raw_once = [&] {
#if defined(CORA_HAS_CUDA)
    if (r) {
      r->bind();
      const auto t0 = clk::now();
      CUmodule m = raw_gpu_load(*r, img, from_file);
      raw_lat.add(clk::now() - t0);
      r->api().cuModuleUnload(m);
      return;
    }
#endif
    const auto t0 = clk::now();
    const raw_cpu_image loaded = raw_cpu_load(img, from_file);
    raw_lat.add(clk::now() - t0);
    loaded.unload();
  };
  auto cora_once = [&] {
    const auto t0 = clk::now();
    cora::binary b = from_file ? dev.load_binary(corabin()).wait() : dev.load_binary(std::span<const std::byte>(bytes)).wait();
    cora_lat.add(clk::now() - t0);
    b = {};
    drain_unloads(dev);
  };
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      if (i % 2 == 0) {
        raw_once();
        cora_once();
      } else {
        cora_once();
        raw_once();
      }
    }
  }
  const double rp = raw_lat.at(0.5), cp = cora_lat.at(0.5);
  raw_lat.report(state, "raw_");
  cora_lat.report(state, "cora_");
  state.counters["ratio"] = rp > 0 ? cp / rp : 0;
  state.SetLabel(std::string(from_file ? "load_binary(path)" : "load_binary(bytes)") + " against " +
                 (gpu ? (from_file ? "reading the fatbin + cuModuleLoadDataEx" : "cuModuleLoadDataEx")
                      : (from_file ? "dlopen of the file" : "memfd + dlopen")) +
                 ", alternately");
}

void cora_first_launch(benchmark::State& state, std::size_t index) {
  auto& dev = cb::shared_runtime(cora::completion_policy::hybrid).device(index);
  const auto bytes = read_all(corabin());
  auto s = dev.make_stream();
  cb::latencies lat;
  for (auto _ : state) {
    for (int i = 0; i < loads(); ++i) {
      cora::binary b = dev.load_binary(std::span<const std::byte>(bytes)).wait();
      const auto t0 = clk::now();
      s.launch(b.kernel("empty"), {}).wait();
      lat.add(clk::now() - t0);
      b = {};
      drain_unloads(dev);
    }
  }
  lat.report(state);
  state.SetLabel("kernel() (resolved at this first lookup) + launch + wait");
}

const bool registered = cb::at_start([] {
  for (const auto& d : cb::devices()) {
    for (bool file : {false, true}) {
      const std::string base = "load/" + d.tag + "/" + (file ? "file" : "memory") + "/";
#if defined(CORA_HAS_CUDA)
      if (d.backend == cora::backend_kind::cuda) {
        cb::register_once(base + "raw", raw_gpu, d.ordinal, file, false, false, false);
        cb::register_once(base + "raw_unload_away", raw_gpu, d.ordinal, file, false, true, false);
        cb::register_once(base + "raw_eager", raw_gpu, d.ordinal, file, true, false, false);
        if (!file) cb::register_once(base + "raw_jit_log", raw_gpu, d.ordinal, file, false, false, true);
      }
#endif
      if (d.backend == cora::backend_kind::cpu) {
        cb::register_once(base + "raw", raw_cpu, file, false);
        cb::register_once(base + "raw_unload_away", raw_cpu, file, true);
      }
      cb::register_once(base + "cora", cora_load, d.index, file);
      cb::register_once(base + "paired", paired_load, d.index, d.ordinal, file);
      if (!file) cb::register_once(base + "cora_inline", cora_load_inline, d.index);
    }
    const std::string first = "load/" + d.tag + "/first_launch/";
#if defined(CORA_HAS_CUDA)
    if (d.backend == cora::backend_kind::cuda) cb::register_once(first + "raw", raw_gpu_first_launch, d.ordinal);
#endif
    if (d.backend == cora::backend_kind::cpu) cb::register_once(first + "raw", raw_cpu_first_launch);
    cb::register_once(first + "cora", cora_first_launch, d.index);
  }
});

}  // namespace
