#!/bin/bash
# Builds the launch_kernel sample on cora's CANN-compatible C API, generates the inputs and the
# golden output, runs the sample and checks its output, as CANN's run.sh does.
#
#   run.sh [-r|--run-mode simple|placeholder] [--build-dir DIR] [--skip-build] [--work-dir DIR]
#
# The build reuses the cora project build in --build-dir (default: <repo>/build, configured
# there if missing, with the extra options of $CORA_CMAKE_ARGS). The sample runs in --work-dir
# (default: this directory) with CANN's layout: input/, output/ and
# out/fatbin/ascendc_kernels_<mode>/ascendc_kernels_<mode>.o.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
run_mode=simple
build_dir=${CORA_BUILD_DIR:-$root/build}
work_dir=$here
skip_build=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    -r | --run-mode) run_mode=${2:?missing run mode}; shift 2 ;;
    --build-dir) build_dir=${2:?missing directory}; shift 2 ;;
    --work-dir) work_dir=${2:?missing directory}; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "[ERROR] unknown option: $1"; exit 1 ;;
  esac
done
if [[ "$run_mode" != simple && "$run_mode" != placeholder ]]; then
  echo "[ERROR] run mode must be simple or placeholder, not '$run_mode'"
  exit 1
fi

# A python3 that can import numpy (the first python3 on PATH may lack it).
python=""
for candidate in python3 /usr/bin/python3 /usr/local/bin/python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import numpy" >/dev/null 2>&1; then
    python=$(command -v "$candidate")
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "[ERROR] numpy is required: no python3 here can import it (pip install numpy)"
  exit 77
fi

if [[ $skip_build -eq 0 ]]; then
  echo "Building..."
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    # shellcheck disable=SC2086  # CORA_CMAKE_ARGS holds several options
    cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CORA_CMAKE_ARGS:-}
  fi
  cmake --build "$build_dir" --target acl_launch_kernel add_custom_simple add_custom_placeholder
fi

build_dir=$(cd "$build_dir" && pwd)  # absolute: the sample runs in another directory
binary="$build_dir/examples/acl_launch_kernel"
case "$run_mode" in
  simple) kernels="$build_dir/kernels/add_custom.corabin" ;;
  placeholder) kernels="$build_dir/kernels/add_custom_tiling.corabin" ;;
esac
for f in "$binary" "$kernels"; do
  [[ -f "$f" ]] || { echo "[ERROR] $f is missing: build first (without --skip-build)"; exit 1; }
done

mkdir -p "$work_dir"
cd "$work_dir"
rm -rf input output "out/fatbin/ascendc_kernels_$run_mode"
mkdir -p input output "out/fatbin/ascendc_kernels_$run_mode"
cp "$kernels" "out/fatbin/ascendc_kernels_$run_mode/ascendc_kernels_$run_mode.o"

"$python" "$here/scripts/gen_data.py"
"$binary" "$run_mode"
md5sum output/*.bin
"$python" "$here/scripts/verify_result.py" output/output_z.bin output/golden.bin
