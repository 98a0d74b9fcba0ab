#!/usr/bin/env bash
# Build llama.cpp's llama-bench (CUDA, sm_90) from a carried source archive, without network.
#
#   bench/peers/build_llamacpp.sh [--src FILE|DIR] [--prefix DIR] [--jobs N] [--cuda-arch A]
#                                 [--cpu-only] [--force] [--detach | --status | --wait [SECONDS]]
#
# --src     the llama-cpp-python sdist (llama_cpp_python-*.tar.gz, whose vendor/llama.cpp is
#           llama.cpp's source), or the trimmed llama.cpp-src-*.tar.gz that fetch.sh also writes,
#           or an unpacked llama.cpp source folder. Default: the trimmed archive in
#           bench/peers/carry/, else the sdist there.
# --prefix  where it all goes (default $HOME/llamacpp): src/ (unpacked), build/, build.log,
#           build.done (the exit status once finished) and the binary, PREFIX/llama-bench.
# --jobs    parallel compile jobs (default: all cores, nproc).
# --cuda-arch  CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200).
# --cpu-only   configure without CUDA (GGML_CUDA=OFF): only to check the build on a machine
#              without a CUDA toolkit; such a llama-bench measures the CPU.
# --force   unpack and build from scratch, even when PREFIX/llama-bench exists from a
#           finished build (otherwise an unchanged archive is not unpacked again and the
#           build folder is reused, so a repeated or interrupted build resumes).
# --detach  start the build in the background (setsid nohup), print how to follow it, exit 0
#           at once; the log goes to PREFIX/build.log and PREFIX/build.done is written at the
#           end, so a later call can use the binary.
# --status  say whether the build is done, failed, running or not started (exit 0 built,
#           1 failed, 3 running, 4 not started).
# --wait [SECONDS]  wait for a detached build (default 3600 s); exit 0 built, 1 failed,
#           124 still running at the limit, 4 not started.
#
# Only the llama-bench target is built, with the parts it does not need switched off (tests,
# examples, server, the unified app, OpenSSL, NCCL) and static libraries, so the one binary
# can be moved. Needs cmake >= 3.18, a C/C++ compiler and (unless --cpu-only) nvcc; nvcc is
# looked for on PATH, then in /usr/local/cuda/bin.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${LLAMACPP_PREFIX:-$HOME/llamacpp}
src=""
jobs=$(nproc)
arch=90
cpu_only=0
force=0
mode=build
wait_s=3600
args=("$@")

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --src) src=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --cuda-arch) arch=$2; shift 2 ;;
    --cpu-only) cpu_only=1; shift ;;
    --force) force=1; shift ;;
    --detach) mode=detach; shift ;;
    --status) mode=status; shift ;;
    --wait)
      mode="wait"; shift
      if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then wait_s=$1; shift; fi ;;
    -h|--help) usage 0 ;;
    *) echo "build_llamacpp.sh: unknown argument '$1' (--help says more)" >&2; exit 2 ;;
  esac
done

log=$prefix/build.log
done_file=$prefix/build.done
pid_file=$prefix/build.pid
bin=$prefix/llama-bench

running_pid() {  # the pid of a build still running, else nothing
  if [ -f "$pid_file" ]; then
    local pid
    pid=$(cat "$pid_file")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
  fi
}

status() {  # prints the state; returns 0 built, 1 failed, 3 running, 4 not started
  local pid
  pid=$(running_pid)
  if [ -n "$pid" ]; then
    local started now
    started=$(stat -c %Y "$pid_file")
    now=$(date +%s)
    echo "running: pid $pid, $((now - started)) s so far; last progress line:"
    { grep -E '^\[ *[0-9]+%\]' "$log" 2>/dev/null || tail -n 1 "$log" 2>/dev/null; } \
      | tail -n 1 | cut -c1-200 || true
    return 3
  fi
  if [ -f "$done_file" ]; then
    local rc
    rc=$(cat "$done_file")
    if [ "$rc" = 0 ] && [ -x "$bin" ]; then
      echo "built: $bin ($(grep -m1 -o 'took [0-9]* s' "$log" 2>/dev/null || echo 'time unknown'))"
      return 0
    fi
    echo "failed: exit status $rc; the end of $log:"
    tail -n 30 "$log" 2>/dev/null || true
    return 1
  fi
  if [ -x "$bin" ]; then
    echo "built: $bin (no build record)"
    return 0
  fi
  echo "not started: no $bin, no build record in $prefix"
  return 4
}

case "$mode" in
  status)
    set +e; status; exit $? ;;
  wait)
    deadline=$(( $(date +%s) + wait_s ))
    while :; do
      set +e; out=$(status); rc=$?; set -e
      if [ "$rc" != 3 ]; then echo "$out"; exit "$rc"; fi
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "$out"; echo "still running after ${wait_s} s"; exit 124
      fi
      sleep 10
    done ;;
esac

# ---- build or detach ------------------------------------------------------------------------

mkdir -p "$prefix"
# One build per prefix: the lock on build.lock is held for as long as a build runs (a
# detached build inherits it from the call that started it).
if [ -z "${AMK_LLAMACPP_DETACHED:-}" ]; then
  if command -v flock > /dev/null; then
    exec 9> "$prefix/build.lock"
    if ! flock -n 9; then
      echo "a build is already running in $prefix (pid $(cat "$pid_file" 2>/dev/null ||
            echo '?')); use --status or --wait" >&2
      exit 1
    fi
  elif [ -n "$(running_pid)" ]; then
    echo "a build is already running (pid $(running_pid)); use --status or --wait" >&2
    exit 1
  fi
fi
if [ "$force" = 0 ] && [ -x "$bin" ] && [ "$(cat "$done_file" 2>/dev/null)" = 0 ]; then
  echo "already built: $bin (--force rebuilds)"
  exit 0
fi

if [ -z "$src" ]; then
  # The trimmed archive when there is one (smaller to unpack), else the sdist.
  src=$( (ls -t "$here"/carry/llama.cpp-src-*.tar.gz 2>/dev/null;
          ls -t "$here"/carry/llama_cpp_python-*.tar.gz 2>/dev/null) | head -n 1 || true)
  if [ -z "$src" ]; then
    echo "no source archive: pass --src, or run bench/peers/fetch.sh where there is network" \
         "and carry bench/peers/carry/ here" >&2
    exit 2
  fi
fi
if [ ! -e "$src" ]; then echo "--src $src: no such file or folder" >&2; exit 2; fi
src=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")

if [ "$mode" = detach ]; then
  rm -f "$done_file"
  rest=()
  for a in "${args[@]}"; do [ "$a" = --detach ] || rest+=("$a"); done
  # setsid keeps the build alive when the calling shell (or a remote session) goes away; it
  # writes the log and, at the end, the done marker. It runs a copy of this script, which an
  # edit or checkout of the repository cannot change under it.
  cp "$0" "$prefix/build_llamacpp.sh"
  AMK_LLAMACPP_DETACHED=1 setsid nohup bash "$prefix/build_llamacpp.sh" \
    "${rest[@]+"${rest[@]}"}" --src "$src" --prefix "$prefix" > "$log" 2>&1 < /dev/null &
  echo $! > "$pid_file"  # setsid runs it in place: the same pid
  echo "started the build in the background (pid $!): log $log, done marker $done_file"
  echo "follow it with: bash $0 --prefix $prefix --status   (or --wait)"
  exit 0
fi

if [ -z "${AMK_LLAMACPP_DETACHED:-}" ]; then  # in the foreground: also keep the log
  exec > >(tee "$log") 2>&1
fi
echo $$ > "$pid_file"
rm -f "$done_file"
trap 'rc=$?; echo "$rc" > "$done_file"; rm -f "$pid_file"' EXIT
started=$(date +%s)
echo "building llama-bench from $src into $prefix with $jobs jobs ($(date))"

# Unpack: the sdist holds the source under vendor/llama.cpp, the trimmed archive under
# llama.cpp/; a folder is used as it is. The same archive is not unpacked again (and the
# build folder is kept, so an interrupted or repeated build resumes), unless --force.
if [ -d "$src" ]; then
  tree=$src
else
  stamp="$src $(stat -c '%s %Y' "$src")"
  if [ "$force" = 1 ] || [ "$(cat "$prefix/src/.unpacked-from" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$prefix/src" "$prefix/build"
    mkdir -p "$prefix/src"
    tar -xzf "$src" -C "$prefix/src"
    echo "$stamp" > "$prefix/src/.unpacked-from"
  fi
  tree=$(find "$prefix/src" -maxdepth 4 -type f -path '*llama.cpp/CMakeLists.txt' -printf '%h\n' \
         | sort | head -n 1 || true)
  if [ -z "$tree" ]; then echo "no llama.cpp/CMakeLists.txt inside $src" >&2; exit 2; fi
fi
echo "source: $tree"

cuda_flags=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DGGML_CUDA_NCCL=OFF)
if [ "$cpu_only" = 1 ]; then
  cuda_flags=(-DGGML_CUDA=OFF)
elif ! command -v nvcc > /dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  else
    echo "nvcc not found (PATH, /usr/local/cuda/bin): install the CUDA toolkit or use --cpu-only" >&2
    exit 2
  fi
fi
[ "$cpu_only" = 1 ] || echo "nvcc: $(command -v nvcc), $(nvcc --version | tail -n 2 | head -n 1)"

if [ "$force" = 1 ]; then rm -rf "$prefix/build"; fi
cmake -S "$tree" -B "$prefix/build" \
  -DCMAKE_BUILD_TYPE=Release \
  "${cuda_flags[@]}" \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_COMMON=ON \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_CCACHE=OFF
cmake --build "$prefix/build" --target llama-bench -j "$jobs"

built=$(find "$prefix/build" -type f -name llama-bench -perm -u+x | head -n 1 || true)
if [ -z "$built" ]; then echo "the build finished but no llama-bench binary was found" >&2; exit 1; fi
cp "$built" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "built $bin; took $(( $(date +%s) - started )) s"
"$bin" --help > /dev/null 2>&1 || { echo "$bin --help failed" >&2; exit 1; }
