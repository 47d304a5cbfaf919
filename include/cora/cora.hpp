// cora: a C++20 coroutine runtime for loading and launching accelerator kernels.
#pragma once

#include "cora/binary.hpp"
#include "cora/device.hpp"
#include "cora/error.hpp"
#include "cora/event.hpp"
#include "cora/half.hpp"
#include "cora/kernel_args.hpp"
#include "cora/launch.hpp"
#include "cora/memory.hpp"
#include "cora/pending.hpp"
#include "cora/runtime.hpp"
#include "cora/spawn.hpp"
#include "cora/stream.hpp"
#include "cora/sync_wait.hpp"
#include "cora/task.hpp"
#include "cora/use_task.hpp"
#include "cora/when_all.hpp"
