// The C API: argument lists (aclrtKernelArgs*).
#include <future>

#include "support/acl_fixture.hpp"

namespace cora::test {
namespace {

class acl_args_test : public acl_test {
 protected:
  // add_f32's list: x, y, z, n appended in order.
  aclrtArgsHandle add_args(const add_buffers& b, aclrtParamHandle* z_handle = nullptr) {
    aclrtArgsHandle args = nullptr;
    EXPECT_EQ(aclrtKernelArgsInit(kernel("add_f32"), &args), ACL_SUCCESS);
    aclrtParamHandle ph = nullptr;
    void* x = b.x;
    void* y = b.y;
    void* z = b.z;
    uint64_t n = b.n;
    EXPECT_EQ(aclrtKernelArgsAppend(args, &x, sizeof(x), &ph), ACL_SUCCESS);
    EXPECT_EQ(aclrtKernelArgsAppend(args, &y, sizeof(y), &ph), ACL_SUCCESS);
    EXPECT_EQ(aclrtKernelArgsAppend(args, &z, sizeof(z), &ph), ACL_SUCCESS);
    if (z_handle) *z_handle = ph;
    EXPECT_EQ(aclrtKernelArgsAppend(args, &n, sizeof(n), &ph), ACL_SUCCESS);
    return args;
  }
};
CORA_ACL_SUITE(acl_args_test);

TEST_P(acl_args_test, BuildFinalizeLaunch) {
  auto b = make_add(5000);
  aclrtArgsHandle args = add_args(b);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(kernel("add_f32"), 4, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
}

TEST_P(acl_args_test, InitMisuse) {
  aclrtArgsHandle args = nullptr;
  EXPECT_EQ(aclrtKernelArgsInit(nullptr, &args), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsInit(kernel("add_f32"), nullptr), ACL_ERROR_INVALID_PARAM);
  int not_a_function = 0;
  EXPECT_EQ(aclrtKernelArgsInit(&not_a_function, &args), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtKernelArgsFinalize(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsFinalize(&not_a_function), ACL_ERROR_RT_INVALID_HANDLE);
}

TEST_P(acl_args_test, OneHandlePerThreadReusedByInit) {
  aclrtArgsHandle first = nullptr, second = nullptr, theirs = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(kernel("add_f32"), &first), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsInit(kernel("slow"), &second), ACL_SUCCESS);
  EXPECT_EQ(first, second);  // CANN's per-thread handle, reset by each Init
  aclrtFuncHandle add = kernel("add_f32");
  on_thread([&] {
    ASSERT_EQ(aclrtSetDevice(dev_), ACL_SUCCESS);
    ASSERT_EQ(aclrtKernelArgsInit(add, &theirs), ACL_SUCCESS);
    EXPECT_EQ(aclrtResetDevice(dev_), ACL_SUCCESS);
  });
  EXPECT_NE(theirs, first);
  // The other thread ended: its handle went with it.
  EXPECT_EQ(aclrtKernelArgsFinalize(theirs), ACL_ERROR_RT_INVALID_HANDLE);
  // The reset list is empty again: it now belongs to `slow` (2 parameters).
  uint64_t us = 1;
  aclrtParamHandle ph = nullptr;
  EXPECT_EQ(aclrtKernelArgsAppend(second, &us, sizeof(us), &ph), ACL_SUCCESS);
}

TEST_P(acl_args_test, AppendMisuse) {
  aclrtArgsHandle args = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(kernel("add_f32"), &args), ACL_SUCCESS);
  void* p = nullptr;
  aclrtParamHandle ph = nullptr;
  EXPECT_EQ(aclrtKernelArgsAppend(nullptr, &p, sizeof(p), &ph), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsAppend(args, nullptr, sizeof(p), &ph), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsAppend(args, &p, 0, &ph), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsAppend(args, &p, sizeof(p), nullptr), ACL_ERROR_INVALID_PARAM);
  uint32_t small = 0;
  EXPECT_EQ(aclrtKernelArgsAppend(args, &small, sizeof(small), &ph), ACL_ERROR_RT_PARAM_INVALID);  // x is 8 bytes
  int bogus = 0;
  EXPECT_EQ(aclrtKernelArgsAppend(&bogus, &p, sizeof(p), &ph), ACL_ERROR_RT_INVALID_HANDLE);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(aclrtKernelArgsAppend(args, &p, sizeof(p), &ph), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsAppend(args, &p, sizeof(p), &ph), ACL_ERROR_RT_PARAM_INVALID);  // a fifth
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  // Init again, append fewer than the kernel takes, finalize: missing parameters.
  ASSERT_EQ(aclrtKernelArgsInit(kernel("add_f32"), &args), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &p, sizeof(p), &ph), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsFinalize(args), ACL_ERROR_RT_PARAM_INVALID);
}

TEST_P(acl_args_test, AppendAfterFinalizeIsRefused) {
  auto b = make_add(16);
  aclrtArgsHandle args = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(kernel("slow"), &args), ACL_SUCCESS);
  uint64_t us = 1;
  void* flag = b.z;
  aclrtParamHandle ph = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppend(args, &us, sizeof(us), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &flag, sizeof(flag), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsAppend(args, &us, sizeof(us), &ph), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtKernelArgsAppendPlaceHolder(args, &ph), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
}

TEST_P(acl_args_test, PlaceholdersCarryTilingData) {
  // The seed's placeholder mode: add_custom(x, y, z, int32* total, int32* tiles) on fp16.
  aclrtBinHandle bin = load("add_custom_tiling.corabin");
  aclrtFuncHandle f = function(bin, "add_custom");
  const std::size_t n = 8 * 2048;
  std::vector<uint16_t> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = cora::half(static_cast<float>(i % 100)).bits;
    y[i] = cora::half(1.0f).bits;
  }
  void* dx = upload(x);
  void* dy = upload(y);
  void* dz = dmalloc(n * 2);
  aclrtArgsHandle args = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(f, &args), ACL_SUCCESS);
  aclrtParamHandle ph = nullptr, len = nullptr, tiles = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppend(args, &dx, sizeof(dx), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &dy, sizeof(dy), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &dz, sizeof(dz), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppendPlaceHolder(args, &len), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppendPlaceHolder(args, &tiles), ACL_SUCCESS);
  void* buf = nullptr;
  ASSERT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, len, sizeof(int32_t), &buf), ACL_SUCCESS);
  *static_cast<int32_t*>(buf) = static_cast<int32_t>(n);
  ASSERT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, tiles, sizeof(int32_t), &buf), ACL_SUCCESS);
  *static_cast<int32_t*>(buf) = 8;
  // Appending after a buffer was fetched is refused; so is a buffer for a normal parameter.
  EXPECT_EQ(aclrtKernelArgsAppend(args, &dx, sizeof(dx), &ph), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtKernelArgsAppendPlaceHolder(args, &ph), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, ph, 4, &buf), ACL_ERROR_RT_PARAM_INVALID);
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, len, 0, &buf), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, len, 4, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, nullptr, 4, &buf), ACL_ERROR_INVALID_PARAM);
  int elsewhere = 0;
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, &elsewhere, 4, &buf), ACL_ERROR_RT_INVALID_HANDLE);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(f, 8, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  const auto z = download<uint16_t>(dz, n);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(float(cora::half::from_bits(z[i])), static_cast<float>(i % 100) + 1.0f) << i;
}

TEST_P(acl_args_test, PlaceholderMisuse) {
  aclrtArgsHandle args = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(kernel("slow"), &args), ACL_SUCCESS);
  aclrtParamHandle ph = nullptr;
  EXPECT_EQ(aclrtKernelArgsAppendPlaceHolder(nullptr, &ph), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsAppendPlaceHolder(args, nullptr), ACL_ERROR_INVALID_PARAM);
  uint64_t us = 1;
  ASSERT_EQ(aclrtKernelArgsAppend(args, &us, sizeof(us), &ph), ACL_SUCCESS);
  aclrtParamHandle flag = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppendPlaceHolder(args, &flag), ACL_SUCCESS);
  void* buf = nullptr;
  EXPECT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, ph, 8, &buf), ACL_ERROR_RT_PARAM_INVALID);  // a normal one
  // Finalize before the placeholder's buffer exists: nothing to copy to the device.
  EXPECT_EQ(aclrtKernelArgsFinalize(args), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
  ASSERT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(args, flag, 4, &buf), ACL_SUCCESS);
  std::memset(buf, 0, 4);
  EXPECT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  // A placeholder is changed through its buffer, not by update.
  void* p = nullptr;
  EXPECT_EQ(aclrtKernelArgsParaUpdate(args, flag, &p, sizeof(p)), ACL_ERROR_RT_PARAM_INVALID);
}

TEST_P(acl_args_test, ParaUpdateThenFinalizeAgain) {
  auto b = make_add(1000);
  aclrtParamHandle z = nullptr;
  aclrtArgsHandle args = add_args(b, &z);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  aclrtFuncHandle add = kernel("add_f32");
  ASSERT_EQ(aclrtLaunchKernelWithConfig(add, 2, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  // Retarget z to a second buffer; launching before finalizing again is refused.
  void* z2 = dmalloc(b.n * sizeof(float));
  ASSERT_EQ(aclrtKernelArgsParaUpdate(args, z, &z2, sizeof(z2)), ACL_SUCCESS);
  EXPECT_EQ(aclrtLaunchKernelWithConfig(add, 2, nullptr, nullptr, args, nullptr), ACL_ERROR_RT_PARAM_INVALID);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(add, 2, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));
  const auto v = download<float>(z2, b.n);
  for (std::uint64_t i = 0; i < b.n; ++i) ASSERT_EQ(v[i], 3.0f * static_cast<float>(i));
  // Update misuse.
  EXPECT_EQ(aclrtKernelArgsParaUpdate(args, z, &z2, 4), ACL_ERROR_RT_PARAM_INVALID);  // wrong size
  EXPECT_EQ(aclrtKernelArgsParaUpdate(args, z, nullptr, 8), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsParaUpdate(args, z, &z2, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsParaUpdate(args, nullptr, &z2, 8), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsParaUpdate(nullptr, z, &z2, 8), ACL_ERROR_INVALID_PARAM);
}

TEST_P(acl_args_test, ListOfAnotherKernelIsRefused) {
  auto b = make_add(16);
  aclrtArgsHandle args = add_args(b);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  EXPECT_EQ(aclrtLaunchKernelWithConfig(kernel("iota_u32"), 1, nullptr, nullptr, args, nullptr),
            ACL_ERROR_RT_PARAM_INVALID);
}

TEST_P(acl_args_test, SizesForUserMemory) {
  aclrtFuncHandle add = kernel("add_f32");
  size_t handle_size = 0, mem = 0;
  ASSERT_EQ(aclrtKernelArgsGetHandleMemSize(add, &handle_size), ACL_SUCCESS);
  EXPECT_GE(handle_size, 16u);
  ASSERT_EQ(aclrtKernelArgsGetMemSize(add, 32, &mem), ACL_SUCCESS);
  EXPECT_EQ(mem, 32u + 64u + 4u * 8u);  // CANN's formula
  EXPECT_EQ(aclrtKernelArgsGetMemSize(nullptr, 32, &mem), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsGetMemSize(add, 32, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsGetHandleMemSize(add, nullptr), ACL_ERROR_INVALID_PARAM);
  int bogus = 0;
  EXPECT_EQ(aclrtKernelArgsGetHandleMemSize(&bogus, &handle_size), ACL_ERROR_RT_INVALID_HANDLE);
}

// Found by tests/fuzz/acl_args_fuzz under UBSan: finalizing the empty list of a kernel without
// parameters copied from a null pointer.
TEST_P(acl_args_test, InitByUserMemForAKernelWithoutParameters) {
  aclrtFuncHandle empty = kernel("empty");
  size_t handle_size = 0, mem_size = 0;
  ASSERT_EQ(aclrtKernelArgsGetHandleMemSize(empty, &handle_size), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsGetMemSize(empty, 0, &mem_size), ACL_SUCCESS);
  std::vector<unsigned char> handle_mem(handle_size), data(mem_size + 8, 0xee);
  aclrtArgsHandle args = handle_mem.data();
  ASSERT_EQ(aclrtKernelArgsInitByUserMem(empty, args, data.data(), data.size()), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  EXPECT_EQ(data[0], 0xee);  // nothing to write
  ASSERT_EQ(aclrtLaunchKernelWithConfig(empty, 2, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_args_test, InitByUserMem) {
  aclrtFuncHandle add = kernel("add_f32");
  size_t handle_size = 0, mem_size = 0;
  ASSERT_EQ(aclrtKernelArgsGetHandleMemSize(add, &handle_size), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsGetMemSize(add, 32, &mem_size), ACL_SUCCESS);
  std::vector<unsigned char> handle_mem(handle_size), data(mem_size, 0xee);
  aclrtArgsHandle args = handle_mem.data();
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(nullptr, args, data.data(), data.size()), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(add, nullptr, data.data(), data.size()), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(add, args, nullptr, data.size()), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(add, args, data.data(), 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(add, args, data.data(), 16), ACL_ERROR_INVALID_PARAM);  // < 32-byte block
  ASSERT_EQ(aclrtKernelArgsInitByUserMem(add, args, data.data(), data.size()), ACL_SUCCESS);

  auto b = make_add(777);
  aclrtParamHandle ph = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppend(args, &b.x, sizeof(void*), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &b.y, sizeof(void*), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &b.z, sizeof(void*), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppend(args, &b.n, sizeof(b.n), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(args), ACL_SUCCESS);
  // The caller's buffer holds the finalized block: CANN's 8-byte slots.
  void* slot[3];
  std::memcpy(slot, data.data(), sizeof(slot));
  EXPECT_EQ(slot[0], b.x);
  EXPECT_EQ(slot[1], b.y);
  EXPECT_EQ(slot[2], b.z);
  uint64_t n = 0;
  std::memcpy(&n, data.data() + 24, 8);
  EXPECT_EQ(n, b.n);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(add, 3, nullptr, nullptr, args, nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_TRUE(add_done(b));

  // The per-thread handle is no memory for another one.
  aclrtArgsHandle own = nullptr;
  ASSERT_EQ(aclrtKernelArgsInit(add, &own), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsInitByUserMem(add, own, data.data(), data.size()), ACL_ERROR_INVALID_PARAM);
  // Initializing the same memory again reuses it.
  ASSERT_EQ(aclrtKernelArgsInitByUserMem(add, args, data.data(), data.size()), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsFinalize(args), ACL_ERROR_RT_PARAM_INVALID);  // empty again
  // A handle whose memory was overwritten is no longer one.
  std::memset(handle_mem.data(), 0, handle_mem.size());
  EXPECT_EQ(aclrtKernelArgsFinalize(args), ACL_ERROR_RT_INVALID_HANDLE);
}

// Issue 18, item 10: each distinct handle address kept a registry entry until aclFinalize.
TEST_P(acl_args_test, HandlesInUserMemoryAreReclaimed) {
  aclrtFuncHandle empty = kernel("empty");
  size_t handle_size = 0, mem_size = 0;
  ASSERT_EQ(aclrtKernelArgsGetHandleMemSize(empty, &handle_size), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsGetMemSize(empty, 0, &mem_size), ACL_SUCCESS);
  auto entries = [] {
    auto& st = cora::acl::state::get();
    std::lock_guard lock(st.mutex);
    return st.args.size();
  };
  const auto before = entries();
  // Launched: each handle is consumed by its launch, whatever its address.
  std::vector<std::vector<unsigned char>> handles(500, std::vector<unsigned char>(handle_size));
  std::vector<unsigned char> data(mem_size + 8);
  for (auto& h : handles) {
    ASSERT_EQ(aclrtKernelArgsInitByUserMem(empty, h.data(), data.data(), data.size()), ACL_SUCCESS);
    ASSERT_EQ(aclrtKernelArgsFinalize(h.data()), ACL_SUCCESS);
    ASSERT_EQ(aclrtLaunchKernelWithConfig(empty, 1, nullptr, nullptr, h.data(), nullptr), ACL_SUCCESS);
  }
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
  EXPECT_LE(entries(), before + 1);
  // A consumed handle is no handle until initialized again.
  EXPECT_EQ(aclrtLaunchKernelWithConfig(empty, 1, nullptr, nullptr, handles[0].data(), nullptr),
            ACL_ERROR_RT_INVALID_HANDLE);
  ASSERT_EQ(aclrtKernelArgsInitByUserMem(empty, handles[0].data(), data.data(), data.size()), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsFinalize(handles[0].data()), ACL_SUCCESS);
  ASSERT_EQ(aclrtLaunchKernelWithConfig(empty, 1, nullptr, nullptr, handles[0].data(), nullptr), ACL_SUCCESS);
  // Not launched: a handle whose user buffer another one takes over is retired.
  for (auto& h : handles)
    ASSERT_EQ(aclrtKernelArgsInitByUserMem(empty, h.data(), data.data(), data.size()), ACL_SUCCESS);
  EXPECT_LE(entries(), before + 1);
  EXPECT_EQ(aclrtKernelArgsFinalize(handles[0].data()), ACL_ERROR_RT_INVALID_HANDLE);
  EXPECT_EQ(aclrtKernelArgsFinalize(handles.back().data()), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);
}

TEST_P(acl_args_test, UserMemoryTooSmallForPlaceholderData) {
  aclrtFuncHandle slow = kernel("slow");
  size_t handle_size = 0;
  ASSERT_EQ(aclrtKernelArgsGetHandleMemSize(slow, &handle_size), ACL_SUCCESS);
  std::vector<unsigned char> handle_mem(handle_size), data(16);  // the 16-byte block, no room for data
  ASSERT_EQ(aclrtKernelArgsInitByUserMem(slow, handle_mem.data(), data.data(), data.size()), ACL_SUCCESS);
  uint64_t us = 1;
  aclrtParamHandle ph = nullptr, flag = nullptr;
  ASSERT_EQ(aclrtKernelArgsAppend(handle_mem.data(), &us, sizeof(us), &ph), ACL_SUCCESS);
  ASSERT_EQ(aclrtKernelArgsAppendPlaceHolder(handle_mem.data(), &flag), ACL_SUCCESS);
  void* buf = nullptr;
  ASSERT_EQ(aclrtKernelArgsGetPlaceHolderBuffer(handle_mem.data(), flag, 64, &buf), ACL_SUCCESS);
  EXPECT_EQ(aclrtKernelArgsFinalize(handle_mem.data()), ACL_ERROR_INVALID_PARAM);
}

}  // namespace
}  // namespace cora::test
