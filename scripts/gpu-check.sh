#!/usr/bin/env bash
# Builds the GPU test archive on a machine without CUDA, and runs it on a machine with it.
# docs/gpu-testing.md explains each step.
#
#   scripts/gpu-check.sh build            # here: archive + cargo-nextest + amk binary (+ the
#                                         #   megakernel's cubin when NVRTC is here) → gpu-carry/a
#   scripts/gpu-check.sh bundle           # here: amk + cubins in one tarball → gpu-carry/d
#   scripts/gpu-check.sh unbundle         # there: gpu-carry/d → $AMK_HOME/amk, $AMK_HOME/cubin
#   scripts/gpu-check.sh split-model F    # here: the GGUF in two parts → gpu-carry/b, gpu-carry/c
#   scripts/gpu-check.sh run [FILTER]     # there: keep gpu-carry/a in $AMK_HOME, run the tests (-j 1)
#   scripts/gpu-check.sh join-model       # there: gpu-carry/b + gpu-carry/c → $AMK_HOME/model.gguf
#   scripts/gpu-check.sh bench [SHAPE..]  # there: amk bench per shape (POS, BENCH_ARGS, BENCH_OUT)
#   scripts/gpu-check.sh compare [SHAPE..] # there: amk bench + the PyTorch baseline, ratio table
#   scripts/gpu-check.sh ab [SHAPE..]     # there: the builds in AB_BUILDS (amk + cubin/) in turn
#   scripts/gpu-check.sh abcfg [SHAPE..]  # there: one build, the schedules in AB_CONFIGS in turn
#   scripts/gpu-check.sh abdef [SHAPE..]  # there: one build, the device-code variants in
#                                         #   AB_DEFINES (';'-separated AMK_CUDA_DEFINES) in turn
#   scripts/gpu-check.sh abenv [SHAPE..]  # there: one build, the run-time knob settings in
#                                         #   AB_ENVS (';'-separated KEY=VALUE lists) in turn
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=gpu-carry
AMK_HOME=${AMK_HOME:-$HOME/amk-gpu}

# Keep what gpu-carry/a brought outside the checkout, so later runs need only the model.
install() {
    mkdir -p "$AMK_HOME/x"
    if [ -d "$CARRY/a" ]; then
        # Whatever of the build this copy carries (a call may carry only some of it).
        for f in gpu.tar.zst amk libamk_plugin_example_gelu_tanh.so; do
            if [ -f "$CARRY/a/$f" ]; then cp "$CARRY/a/$f" "$AMK_HOME/"; fi
        done
        if [ -f "$CARRY/a/cargo-nextest.gz" ]; then
            gunzip -c "$CARRY/a/cargo-nextest.gz" > "$AMK_HOME/cargo-nextest"
            chmod +x "$AMK_HOME/cargo-nextest"
        fi
        if [ -d "$CARRY/a/cubin" ]; then
            mkdir -p "$AMK_HOME/cubin"
            cp "$CARRY/a/cubin"/*.cubin "$AMK_HOME/cubin/" 2>/dev/null || true
        fi
    fi
    export AMK_CUDA_CACHE="$AMK_HOME/cubin"
    # nvJitLink links the kernels with the FUSED op: the CUDA toolkit's if the loader finds it,
    # else PyPI's nvidia-nvjitlink where Python has it.
    if ! ldconfig -p 2>/dev/null | grep -q 'libnvJitLink\.so\.13'; then
        local d
        d=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
        if [ -n "$d" ] && [ -f "$d/libnvJitLink.so.13" ]; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        fi
    fi
}

# bench_shape AMK SHAPE POS OUT [LABEL]: `AMK bench` of SHAPE at POS (plus BENCH_ARGS) into
# OUT.md and OUT.err; prints the result row, a failed gate or an error, each after LABEL.
# Returns amk's status.
bench_shape() {
    local rc=0
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
    "$1" bench --shape "$2" --pos "$3" ${BENCH_ARGS:-} > "$4.md" 2> "$4.err" || rc=$?
    grep -h "^| $2\|GATE\|^error" "$4.md" "$4.err" | sed "s/^/${5:-}/" || true
    return $rc
}

# ab_rounds OUT SHAPE..: every variant (0 .. ${#variants[@]} - 1) on every shape (default:
# SmolLM2, 1B, 8B), in turn, twice over: machines of one kind differ by a few percent, so only
# a same-machine comparison measures a change of that size. The mode defines
# `ab_one OUT VARIANT SHAPE ROUND`, which benchmarks one point. Returns the worst status.
ab_rounds() {
    local out=$1 status=0 round i s
    shift
    mkdir -p "$out"
    for round in 1 2; do
        for i in "${!variants[@]}"; do
            for s in ${*:-smollm2-135m llama-3.2-1b llama-3.1-8b}; do
                ab_one "$out" "$i" "$s" "$round" || status=$?
            done
        done
    done
    return $status
}

case "${1:-}" in
build)
    mkdir -p "$CARRY/a"
    cargo nextest archive -p amk-backend-cuda --features amk-backend-cuda/testing \
        --cargo-profile gpu --zstd-level 19 --archive-file "$CARRY/a/gpu.tar.zst"
    cp target/gpu/deps/libamk_plugin_example_gelu_tanh.so "$CARRY/a/"
    cargo build -p amk --features cuda --profile gpu
    cp target/gpu/amk "$CARRY/a/amk"
    gzip -9 -c "$(command -v cargo-nextest)" > "$CARRY/a/cargo-nextest.gz"
    # The megakernel compiled ahead of time for the GPU that will run it (PRECOMPILE=sm_90a by
    # default, empty to skip): NVRTC takes minutes there otherwise. Needs libnvrtc here.
    rm -rf "$CARRY/a/cubin"
    # `amk ops compile`'s default kernels: every op's, and the Llama decode programs' in f32,
    # f16 and bf16 (a program's kernel holds only its ops, so the op-level tests' small kernels
    # compile on the GPU machine, in seconds). PRECOMPILE_DEFINES (';'-separated
    # AMK_CUDA_DEFINES values) adds device-code variants for `abdef`; PRECOMPILE_ARGS narrows or
    # widens each compile (`amk ops compile` flags, e.g. "--dtype bf16 --shape smollm2-135m
    # --config tuned --traced": minutes instead of tens of minutes on a small machine).
    for arch in ${PRECOMPILE-sm_90a}; do
        IFS=';' read -ra variants <<< "${PRECOMPILE_DEFINES-}"
        for defs in "" "${variants[@]}"; do
            # shellcheck disable=SC2086 # PRECOMPILE_ARGS is a list of flags
            AMK_CUDA_DEFINES="$defs" "$CARRY/a/amk" ops compile --arch "$arch" \
                --cache-dir "$CARRY/a/cubin" ${PRECOMPILE_ARGS:-} ||
                echo "no precompiled cubin for $arch ($defs): the GPU machine will compile it"
        done
    done
    du -sh "$CARRY/a"/*
    ;;
bundle)
    # here: the amk binary and every precompiled cubin in one gzip tarball (cubins compress
    # about five to one), for a copy that must stay small → gpu-carry/d/amk-bundle.tar.gz
    mkdir -p "$CARRY/d"
    tar -C "$CARRY/a" -czf "$CARRY/d/amk-bundle.tar.gz" amk cubin
    du -sh "$CARRY/d"/*
    ;;
unbundle)
    # there: gpu-carry/d/amk-bundle.tar.gz → $AMK_HOME/amk and $AMK_HOME/cubin/
    mkdir -p "$AMK_HOME"
    tar -C "$AMK_HOME" -xzf "$CARRY/d/amk-bundle.tar.gz"
    ls -la "$AMK_HOME" | head
    ;;
split-model)
    model=${2:?usage: gpu-check.sh split-model FILE.gguf}
    mkdir -p "$CARRY/b" "$CARRY/c"
    half=$(( ($(stat -c %s "$model") + 1) / 2 ))
    head -c "$half" "$model" > "$CARRY/b/model.part0"
    tail -c +$((half + 1)) "$model" > "$CARRY/c/model.part1"
    sha256sum "$model" | cut -d' ' -f1 > "$CARRY/b/model.sha256"
    du -sh "$CARRY/b"/* "$CARRY/c"/*
    ;;
stage-part0)
    mkdir -p "$AMK_HOME"
    cp "$CARRY/b/model.part0" "$CARRY/b/model.sha256" "$AMK_HOME/"
    ;;
join-model)
    cat "$AMK_HOME/model.part0" "$CARRY/c/model.part1" > "$AMK_HOME/model.gguf"
    echo "$(cat "$AMK_HOME/model.sha256")  $AMK_HOME/model.gguf" | sha256sum -c -
    ;;
run)
    install
    export AMK_REQUIRE_GPU=1
    export AMK_TEST_PLUGIN="$AMK_HOME/libamk_plugin_example_gelu_tanh.so"
    if [ -f "$AMK_HOME/model.gguf" ]; then export AMK_TEST_GGUF="$AMK_HOME/model.gguf"; fi
    nvidia-smi -L || true
    filter=${2:-all()}
    # RUN_IGNORED=only runs the ignored performance report.
    ignored=${RUN_IGNORED:-default}
    nextest() {
        "$AMK_HOME/cargo-nextest" nextest run --archive-file "$AMK_HOME/gpu.tar.zst" \
            --workspace-remap . --extract-to "$AMK_HOME/x" --extract-overwrite "$@"
    }
    # First the suite's kernels, compiled on every core (the tests below load them from the
    # cache instead of compiling them one after another); SUITE_KERNELS=0 skips the pass.
    if [ "${SUITE_KERNELS:-1}" = 1 ]; then
        nextest --run-ignored only --success-output final -E 'binary(suite_kernels)' ||
            echo "the compile pass failed: each test compiles the kernels it needs itself"
    fi
    # One GPU: one test process at a time (cooperative launches from parallel processes
    # would time-slice the device and trip the watchdog).
    nextest -j 1 --no-fail-fast --success-output final --failure-output final \
        --run-ignored "$ignored" -E "$filter - binary(suite_kernels)"
    ;;
bench)
    install
    shift
    out=${BENCH_OUT:-$AMK_HOME/bench}
    mkdir -p "$out"
    status=0
    for s in ${*:-smollm2-135m llama-3.2-1b llama-3.1-8b}; do
        bench_shape "$AMK_HOME/amk" "$s" "${POS:-0,511}" "$out/$s" || status=$?
    done
    exit $status
    ;;
ab)
    # Builds, each a folder holding an `amk` binary and its precompiled `cubin/` (AB_BUILDS,
    # space-separated).
    shift
    read -ra variants <<< "${AB_BUILDS:?folders of the builds to compare}"
    ab_one() {
        local v=${variants[$2]}
        local name
        name=$(basename "$v")
        # A folder may hold an `env` file (KEY=VALUE lines) for a run-time knob: two folders of
        # one build then compare the knob's settings (abenv does it with one folder).
        (
            if [ -f "$v/env" ]; then set -a; . "$v/env"; set +a; fi
            AMK_CUDA_CACHE="$v/cubin" bench_shape "$v/amk" "$3" "${POS:-0}" \
                "$1/$name-$3-$4" "$name round $4: "
        )
    }
    ab_rounds "${BENCH_OUT:-$AMK_HOME/ab}" "$@"
    ;;
abcfg)
    # Schedules (AB_CONFIGS: `tuned`, `default` or ScheduleConfig JSON files, space-separated)
    # with one build: a lowering knob needs no second binary. TRACE=1 also writes one traced
    # step per point (FILE.csv beside each).
    install
    shift
    read -ra variants <<< "${AB_CONFIGS:?schedules to compare}"
    ab_one() {
        local c=${variants[$2]}
        local name extra=""
        name=$(basename "$c" .json)
        if [ "${TRACE:-0}" = 1 ] && [ "$4" = 1 ]; then
            # amk appends to a trace file: start it afresh for this run
            rm -f "$1/$name-$3.csv"
            extra="--trace --trace-out $1/$name-$3.csv"
        fi
        BENCH_ARGS="${BENCH_ARGS:-} --config $c $extra" bench_shape "$AMK_HOME/amk" "$3" \
            "${POS:-0}" "$1/$name-$3-$4" "$name round $4: "
    }
    ab_rounds "${BENCH_OUT:-$AMK_HOME/abcfg}" "$@"
    ;;
abdef | abenv)
    # abdef: device-code variants (AB_DEFINES: AMK_CUDA_DEFINES values separated by ';', an
    # empty one for the plain kernel) with one binary; each variant is its own cubin
    # (precompile them with PRECOMPILE_DEFINES at build time). abenv: run-time knob settings
    # (AB_ENVS: space-separated KEY=VALUE lists separated by ';', an empty one for the
    # defaults) with one build and one cubin.
    install
    mode=$1
    shift
    if [ "$mode" = abdef ]; then
        IFS=';' read -ra variants <<< "${AB_DEFINES:?device-code variants to compare}"
    else
        IFS=';' read -ra variants <<< "${AB_ENVS:?knob settings to compare}"
    fi
    ab_one() {
        local v=${variants[$2]} none=defaults
        (
            if [ "$mode" = abdef ]; then
                export AMK_CUDA_DEFINES="$v"
                none=plain
            else
                # shellcheck disable=SC2086 # a list of KEY=VALUE words
                for kv in $v; do export "${kv?}"; done
            fi
            bench_shape "$AMK_HOME/amk" "$3" "${POS:-0}" "$1/v$2-$3-$4" "[${v:-$none}] round $4: "
        )
    }
    ab_rounds "${BENCH_OUT:-$AMK_HOME/$mode}" "$@"
    ;;
compare)
    install
    shift
    shapes=$(echo "${*:-smollm2-135m llama-3.2-1b llama-3.1-8b}" | tr ' ' ',')
    mkdir -p "${BENCH_OUT:-$AMK_HOME/bench}"
    # COMPARE_ARGS: more bench/compare.py flags (e.g. --cache-per-position for a long-context
    # sweep with the PyTorch cache as long as each position's).
    # shellcheck disable=SC2086 # COMPARE_ARGS is a list of flags
    python3 bench/compare.py --amk "$AMK_HOME/amk" --shapes "$shapes" --pos "${POS:-0,511}" \
        --json-out "${BENCH_OUT:-$AMK_HOME/bench}/compare.json" ${COMPARE_ARGS:-}
    ;;
*)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
