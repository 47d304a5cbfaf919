# Imported targets for what cora builds on. Every one comes from a Debian 12 package
# (scripts/install-deps installs them).
include_guard(GLOBAL)

set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

# Standalone Asio (libasio-dev) is header-only and ships no CMake package.
if(NOT TARGET cora_asio)
  find_path(CORA_ASIO_INCLUDE_DIR asio.hpp)
  if(NOT CORA_ASIO_INCLUDE_DIR)
    message(FATAL_ERROR "Standalone Asio not found: install libasio-dev (scripts/install-deps)")
  endif()
  add_library(cora_asio INTERFACE)
  target_include_directories(cora_asio SYSTEM INTERFACE ${CORA_ASIO_INCLUDE_DIR})
  # ASIO_HAS_STD_ALIGNED_ALLOC: Asio 1.22 decides between aligned_alloc and operator new from a
  # macro of libstdc++ that a translation unit has seen only if it included a standard header
  # before Asio. Units that differ then allocate a handler's memory one way and free it the
  # other (its inline functions are merged at link time). cora's headers include standard
  # headers first, so this fixes the choice they make for every unit.
  target_compile_definitions(cora_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED ASIO_HAS_STD_ALIGNED_ALLOC=1)
  # Asio 1.22 looks for clang's pre-C++20 coroutines TS only; clang has C++20 coroutines too.
  target_compile_definitions(cora_asio INTERFACE $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>)
  target_link_libraries(cora_asio INTERFACE Threads::Threads)
endif()

# liburing (liburing-dev). Linked statically where the archive exists, so a build can be
# copied to a machine that lacks the package.
if(NOT TARGET cora_uring)
  find_path(CORA_URING_INCLUDE_DIR liburing.h)
  find_library(CORA_URING_STATIC NAMES liburing.a)
  find_library(CORA_URING_SHARED NAMES uring)
  if(NOT CORA_URING_INCLUDE_DIR OR NOT (CORA_URING_STATIC OR CORA_URING_SHARED))
    message(FATAL_ERROR "liburing not found: install liburing-dev (scripts/install-deps)")
  endif()
  add_library(cora_uring INTERFACE)
  target_include_directories(cora_uring SYSTEM INTERFACE ${CORA_URING_INCLUDE_DIR})
  if(CORA_URING_STATIC)
    target_link_libraries(cora_uring INTERFACE ${CORA_URING_STATIC})
  else()
    target_link_libraries(cora_uring INTERFACE ${CORA_URING_SHARED})
  endif()
endif()
