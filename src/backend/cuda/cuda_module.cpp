#include "backend/cuda/cuda_module.hpp"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_image.hpp"

namespace cora::backend::cuda {

namespace {

constexpr std::size_t jit_log_bytes = 16 * 1024;
constexpr std::size_t max_params = 4096;

const char* kind_name(image_kind kind) {
  switch (kind) {
    case image_kind::cuda_cubin: return "cubin";
    case image_kind::cuda_fatbin: return "fatbin";
    case image_kind::cuda_ptx: return "PTX";
    case image_kind::cpu_elf: break;
  }
  return "CPU";
}

std::string arch_name(unsigned arch) {
  return "sm_" + std::to_string(arch);
}

}  // namespace

std::uint32_t guess_alignment(std::size_t offset, std::size_t size) noexcept {
  std::size_t a = size ? (size & (~size + 1)) : 1;  // lowest set bit
  if (offset) a = std::min(a, offset & (~offset + 1));
  return static_cast<std::uint32_t>(std::clamp<std::size_t>(a, 1, 16));
}

std::unique_ptr<cuda_module> cuda_module::load(std::shared_ptr<context> ctx,
                                               std::span<const std::byte> image, image_kind kind,
                                               const std::string& device_label, int cc_major,
                                               int cc_minor, std::error_code& ec,
                                               std::string& message) {
  const driver_api& api = ctx->api;
  const std::string what = std::string("cannot load the ") + kind_name(kind) + " image on " + device_label;
  if (kind == image_kind::cpu_elf || image.empty()) {
    ec = make_error_code(errc::invalid_binary);
    message = what + ": CUDA devices run cubin, fatbin and PTX images";
    return nullptr;
  }
  std::string why;
  if (!image_in_bounds(image, kind, why)) {
    ec = make_error_code(errc::invalid_binary);
    message = what + ": " + why;
    return nullptr;
  }
  if (ctx->lost()) {
    ec = make_error_code(errc::device_lost);
    message = what + ": the device is unusable after an earlier fault (" + ctx->lost_message() + ")";
    return nullptr;
  }

  // PTX is text the driver reads up to a NUL; binary images are read through their headers,
  // from an 8-byte aligned copy if need be.
  std::string text;
  std::vector<std::uint64_t> aligned;
  const void* data = image.data();
  if (kind == image_kind::cuda_ptx) {
    text.assign(reinterpret_cast<const char*>(image.data()), image.size());
    data = text.c_str();
  } else if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) {
    aligned.resize((image.size() + 7) / 8);
    std::memcpy(aligned.data(), image.data(), image.size());
    data = aligned.data();
  }

  std::unique_ptr<char[]> log;
  std::unique_ptr<cuda_module> m(new cuda_module(ctx));
  auto fail = [&](CUresult r, const std::string& step) {
    if (ctx->note(r)) {
      ec = make_error_code(errc::device_lost);
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      ec = make_error_code(errc::out_of_memory);
    } else if (r == CUDA_ERROR_NOT_SUPPORTED) {
      ec = make_error_code(errc::not_supported);
    } else {
      // Whatever else makes the driver refuse the bytes, they are no image for this device.
      ec = make_error_code(errc::invalid_binary);
    }
    message = what + ": " + step + describe(r);
    const bool about_image = ec == make_error_code(errc::invalid_binary);
    if (about_image && kind == image_kind::cuda_cubin) {
      if (const unsigned arch = cubin_arch(image))
        message += " (the cubin holds code for " + arch_name(arch) + "; the device needs " +
                   arch_name(static_cast<unsigned>(cc_major * 10 + cc_minor)) + " code or PTX)";
    } else if (about_image && kind == image_kind::cuda_fatbin && r == CUDA_ERROR_NO_BINARY_FOR_GPU) {
      message += " (the fatbin has neither " +
                 arch_name(static_cast<unsigned>(cc_major * 10 + cc_minor)) +
                 " code nor PTX the driver can compile)";
    }
    if (log) {
      log[jit_log_bytes - 1] = '\0';
      if (log[0] != '\0') message += "\nJIT log:\n" + std::string(log.get());
    }
    m.reset();
  };

  current_context cur(*ctx);
  if (!cur) {
    fail(cur.result, "cannot make its context current: ");
    return nullptr;
  }
  // Loaded without options, as the driver loads fastest; a refused image is loaded again with
  // an error log, for the driver's own account of what it refused (whatever that load's
  // result, it stands).
  CUresult r = api.cuModuleLoadDataEx(&m->module_, data, 0, nullptr, nullptr);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && !ctx->note(r)) {
    m->module_ = nullptr;
    try {
      // Not cleared: the driver writes a terminated log, and only its first byte is read unwritten.
      log.reset(new char[jit_log_bytes]);
      log[0] = '\0';
      CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
      void* values[] = {log.get(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(jit_log_bytes))};
      r = api.cuModuleLoadDataEx(&m->module_, data, 2, options, values);
    } catch (const std::bad_alloc&) {
      log.reset();  // no room for a log: the first result alone
    }
  }
  if (r != CUDA_SUCCESS) {
    m->module_ = nullptr;
    fail(r, "");
    return nullptr;
  }

  m->label_ = kind_name(kind) + std::string(" image on ") + device_label;
  ec.clear();
  return m;
}

void cuda_module::fail(CUresult r, const std::string& step, std::error_code& ec, std::string& message) {
  ec = ctx_->note(r) ? make_error_code(errc::device_lost)
       : r == CUDA_ERROR_OUT_OF_MEMORY ? make_error_code(errc::out_of_memory)
       : r == CUDA_ERROR_NOT_SUPPORTED ? make_error_code(errc::not_supported)
                                       : make_error_code(errc::invalid_binary);
  message = "the " + label_ + ": " + step + describe(r);
}

cuda_function* cuda_module::add(CUfunction f, const char* name, std::error_code& ec, std::string& message) {
  const driver_api& api = ctx_->api;
  auto fn = std::make_unique<cuda_function>();
  fn->handle = f;
  fn->name = name;
  CUresult r = CUDA_SUCCESS;
  // Under lazy loading (the driver's default) a kernel's code is loaded on first use; load it
  // now, at the lookup, so that code the device cannot run is refused here, not by a launch.
  if (api.cuFuncIsLoaded && api.cuFuncLoad) {
    CUfunctionLoadingState state = CU_FUNCTION_LOADING_STATE_LOADED;
    r = api.cuFuncIsLoaded(&state, f);
    if (r == CUDA_SUCCESS && state != CU_FUNCTION_LOADING_STATE_LOADED) r = api.cuFuncLoad(f);
    if (r != CUDA_SUCCESS) {
      fail(r, "cannot load the code of kernel '" + fn->name + "': ", ec, message);
      return nullptr;
    }
  }
  kernel_desc desc;
  desc.name = fn->name;
  if (api.cuFuncGetParamInfo) {
    for (std::size_t i = 0; i < max_params; ++i) {
      std::size_t offset = 0, size = 0;
      r = api.cuFuncGetParamInfo(f, i, &offset, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
      if (r != CUDA_SUCCESS) {
        fail(r, "cannot read the parameters of kernel '" + fn->name + "': ", ec, message);
        return nullptr;
      }
      fn->sizes.push_back(static_cast<std::uint32_t>(size));
      desc.params.push_back({static_cast<std::uint32_t>(size), guess_alignment(offset, size)});
    }
  } else {
    desc.params_known = false;
  }
  int value = 0;
  if (api.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f) == CUDA_SUCCESS)
    fn->static_shared = value;
  value = 0;
  if (api.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f) == CUDA_SUCCESS)
    fn->dynamic_shared_limit.store(static_cast<std::uint32_t>(std::max(value, 0)), std::memory_order_relaxed);
  kernels_.push_back(std::move(desc));
  functions_.push_back(std::move(fn));
  ec.clear();
  return functions_.back().get();
}

bool cuda_module::list_kernels(std::error_code& ec, std::string& message) {
  const driver_api& api = ctx_->api;
  std::lock_guard lock(mutex_);
  if (listed_) {
    ec.clear();
    return true;
  }
  if (!api.cuModuleGetFunctionCount || !api.cuModuleEnumerateFunctions || !api.cuFuncGetName ||
      !api.cuFuncGetParamInfo) {
    ec = make_error_code(errc::not_supported);
    message = "the " + label_ + ": listing its kernels needs a CUDA 12.4 driver or newer (this one is CUDA " +
              std::to_string(api.version / 1000) + "." + std::to_string(api.version % 1000 / 10) +
              "); a .corabin container lists them itself";
    return false;
  }
  current_context cur(*ctx_);
  if (!cur) {
    fail(cur.result, "cannot make its context current: ", ec, message);
    return false;
  }
  unsigned count = 0;
  CUresult r = api.cuModuleGetFunctionCount(&count, module_);
  std::vector<CUfunction> handles(count);
  if (r == CUDA_SUCCESS && count) r = api.cuModuleEnumerateFunctions(handles.data(), count, module_);
  if (r != CUDA_SUCCESS) {
    fail(r, "cannot list its kernels: ", ec, message);
    return false;
  }
  for (CUfunction f : handles) {
    const char* name = nullptr;
    r = api.cuFuncGetName(&name, f);
    if (r != CUDA_SUCCESS || !name) {
      fail(r, "cannot read a kernel's name: ", ec, message);
      return false;
    }
    bool known = false;
    for (const auto& fn : functions_) known = known || fn->name == name;
    if (!known && !add(f, name, ec, message)) return false;
  }
  listed_ = true;
  ec.clear();
  return true;
}

void* cuda_module::find(const std::string& name, kernel_desc& layout, std::error_code& ec,
                        std::string& message) {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < functions_.size(); ++i)
    if (functions_[i]->name == name) {
      layout = kernels_[i];
      ec.clear();
      return functions_[i].get();
    }
  if (listed_) {
    ec = make_error_code(errc::kernel_not_found);
    message = "kernel '" + name + "' is not in the loaded image";
    return nullptr;
  }
  current_context cur(*ctx_);
  if (!cur) {
    fail(cur.result, "cannot make its context current: ", ec, message);
    return nullptr;
  }
  CUfunction f = nullptr;
  const CUresult r = ctx_->api.cuModuleGetFunction(&f, module_, name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    ec = make_error_code(errc::kernel_not_found);
    message = "kernel '" + name + "' is not in the loaded image";
    return nullptr;
  }
  if (r != CUDA_SUCCESS) {
    fail(r, "cannot find kernel '" + name + "': ", ec, message);
    return nullptr;
  }
  cuda_function* fn = add(f, name.c_str(), ec, message);
  if (!fn) return nullptr;
  layout = kernels_.back();
  return fn;
}

void* cuda_module::global(const std::string& name, std::size_t& size, std::error_code& ec,
                          std::string& message) {
  size = 0;
  current_context cur(*ctx_);
  if (!cur) {
    fail(cur.result, "cannot make its context current: ", ec, message);
    return nullptr;
  }
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  const CUresult r = ctx_->api.cuModuleGetGlobal(&address, &bytes, module_, name.c_str());
  // The driver answers a name the image lacks with CUDA_ERROR_NOT_FOUND or, as the H200's
  // driver 580 does, CUDA_ERROR_INVALID_VALUE (the other arguments are valid here).
  if (r == CUDA_ERROR_NOT_FOUND || (r == CUDA_ERROR_INVALID_VALUE && !name.empty())) {
    ec = make_error_code(errc::kernel_not_found);
    message = "no global '" + name + "' in the loaded image (declare it with CORA_GLOBAL)";
    return nullptr;
  }
  if (r != CUDA_SUCCESS) {
    fail(r, "cannot find global '" + name + "': ", ec, message);
    return nullptr;
  }
  ec.clear();
  size = bytes;
  return reinterpret_cast<void*>(address);
}

cuda_module::~cuda_module() {
  if (!module_) return;
  // Fails harmlessly when the context was lost or the driver is shutting down.
  current_context cur(*ctx_);
  ctx_->api.cuModuleUnload(module_);
}

void* cuda_module::function(std::size_t index, std::error_code& ec, std::string& message) {
  std::lock_guard lock(mutex_);
  if (index >= functions_.size()) {
    ec = make_error_code(errc::kernel_not_found);
    message = "no kernel " + std::to_string(index) + " in the CUDA image";
    return nullptr;
  }
  ec.clear();
  return functions_[index].get();
}

}  // namespace cora::backend::cuda
