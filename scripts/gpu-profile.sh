#!/usr/bin/env bash
# Profiles one `amk bench` point with Nsight Compute on a CUDA machine: where the megakernel's
# warps spend their time, per source file, line and device function (PC sampling mapped onto
# the cached cubin's SASS and its line info).
#
#   scripts/gpu-profile.sh SHAPE POS OUTDIR   # with amk in $AMK_HOME (scripts/gpu-check.sh puts it there)
#   BENCH_ARGS="--config my.json" scripts/gpu-profile.sh ...   # extra `amk bench` arguments
#
# Writes OUTDIR/stalls.txt (per-function sample counts and top stall reasons, from
# scripts/ncu_by_function.py), OUTDIR/source.csv.gz (the sampled SASS lines), OUTDIR/details.csv
# (the WarpStateStats section) and the cubin that ran (OUTDIR/kernel.cubin.xz).
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:?usage: gpu-profile.sh SHAPE POS OUTDIR}
pos=${2:?usage: gpu-profile.sh SHAPE POS OUTDIR}
out=${3:?usage: gpu-profile.sh SHAPE POS OUTDIR}
AMK_HOME=${AMK_HOME:-$HOME/amk-gpu}
export AMK_CUDA_CACHE=${AMK_CUDA_CACHE:-$AMK_HOME/cubin}
mkdir -p "$out"
# One run without the profiler first: compiles (and caches) the megakernel, the largest cubin
# in the cache (the others are small helper modules).
# shellcheck disable=SC2086 # BENCH_ARGS: words for amk
"$AMK_HOME/amk" bench --shape "$shape" --pos "$pos" --iters 50 ${BENCH_ARGS:-} > "$out/bench.md" 2> "$out/bench.err"
cubin=$(ls -S "$AMK_CUDA_CACHE"/*.cubin | head -1)
# Launch 31 of the megakernel: past the f32 reference, the gated run and the first warm-ups.
ncu --clock-control none -k regex:amk_megakernel --launch-skip 30 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --warp-sampling-interval 0 \
    -f -o "$out/prof" "$AMK_HOME/amk" bench --shape "$shape" --pos "$pos" --iters 40 ${BENCH_ARGS:-} \
    > "$out/ncu.log" 2>&1 || { tail -30 "$out/ncu.log"; exit 1; }
ncu -i "$out/prof.ncu-rep" --page details --csv > "$out/details.csv" 2>&1 || true
ncu -i "$out/prof.ncu-rep" --page source --csv --print-source sass > "$out/source.csv" 2> "$out/source.err" || true
nvdisasm -c -g "$cubin" > "$out/kernel.dis" 2> "$out/nvdisasm.err" || true
python3 scripts/ncu_by_function.py "$out/source.csv" "$out/kernel.dis" 40 > "$out/stalls.txt" 2>&1 || true
head -70 "$out/stalls.txt"
gzip -9 -f "$out/source.csv"
xz -9 -c "$cubin" > "$out/kernel.cubin.xz"
rm -f "$out/kernel.dis"
