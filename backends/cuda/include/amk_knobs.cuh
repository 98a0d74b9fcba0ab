/* amk_knobs.cuh — every compile-time knob of the kernel's shared device code (the backend's
 * runtime and the device libraries under ops/oplib-*), with its default.
 *
 * The megakernel's source begins with this file (after the defines the backend derives from
 * the program and the options, and a user's AMK_CUDA_DEFINES, which win over a default here):
 * each knob is `#ifndef NAME / #define NAME default`. The headers that use a knob say so where
 * it was; this is the one list. Ops keep their own knobs in their sources: LT_STAGES and
 * AMK_LT_256 (ops/linear-tile), AMK_AS_MIN_ROWS (ops/attention-split), AMK_AM_STEP and AMK_AM_SHARED
 * (ops/attention-merge), AMK_GU_TRIPLES (ops/gate-up-silu). docs/gpu-testing.md says how to
 * set them. */
#ifndef AMK_KNOBS_CUH
#define AMK_KNOBS_CUH

/* ---- used in amk_device.cuh ---- */

/* Code a launch does not run is not compiled (docs/perf-notes.md round 17: code the megakernel
 * carries costs time even where it never runs). The backend defines AMK_TRACE_OFF from the
 * launch: without a trace buffer (a traced session loads a kernel of its own). */
#ifndef AMK_TRACE_OFF
#define AMK_TRACE_OFF 0
#endif

/* The float dtypes the kernel's program holds: the backend defines AMK_NO_F32 / AMK_NO_F16 /
 * AMK_NO_BF16 for those none of its buffers has, and the branches that only a buffer of such
 * a dtype could take fold away (AMK_IS_*: dt is that dtype; AMK_BF_OF: a dt known to be BF16 or
 * F16 is BF16). Every such branch has a fallback that is right for any dtype (the out-of-line
 * accessors, the generic loops), so a wrong define costs speed, never results. */
#ifndef AMK_NO_F32
#define AMK_NO_F32 0
#endif
#ifndef AMK_NO_F16
#define AMK_NO_F16 0
#endif
#ifndef AMK_NO_BF16
#define AMK_NO_BF16 0
#endif

/* Threads a block (the backend defines it from the options; 8 warps by default). */
#ifndef AMK_THREADS
#define AMK_THREADS 256
#endif

/* AMK_PROBE (diagnostic builds, off by default; the traced kernel only): points inside the
 * shared tile and attention code write the clock into the running task's probe words 6 and 7
 * (amk_probe's), thread 0 only, when `cond` holds (a condition on a computed value orders the
 * point after that value). `amk bench --trace` writes them as they come (probe6_us,
 * probe7_us), `scripts/trace_phases.py --probe` summarises them; docs/gpu-testing.md lists the
 * levels. */
#ifndef AMK_PROBE
#define AMK_PROBE 0
#endif

/* Vectors of 8 elements each thread has in flight per round in amk_ew_apply: W32 (some input is
 * F32, two 16-byte loads a vector) and 16-bit inputs (one). */
#ifndef AMK_EW_UNROLL32
#define AMK_EW_UNROLL32 4
#endif
#ifndef AMK_EW_UNROLL16
#define AMK_EW_UNROLL16 8
#endif

/* RMSNORM's arithmetic type (amk_norm_t). f64 by default (AMK_NORM_F32 = 0), as the CPU
 * reference (ops/rmsnorm/src/reference.rs): the result is then independent of the reduction's
 * order in practice. AMK_NORM_F32 = 1: f32, what the reference tooling and HF compute (f32 sum
 * of squares, rsqrt, x * inv * w), within docs/ir.md's tolerances of the f64 reference but not
 * bit-equal to it. Measured (docs/perf-notes.md round 23) 0.005-0.015 ms a token faster on
 * SmolLM2, 0.012 on the 1B and 0.04 on the 8B, but the SmolLM2 bf16 greedy tokens then left
 * the f32 ones within 32 tokens on 3 of 5 reference prompts instead of 1
 * (`smollm2_bf16_greedy_matches_f32_on_most_prompts`), so it is a knob, off by default. Every
 * RMSNORM path of one kernel computes in the same type. */
#ifndef AMK_NORM_F32
#define AMK_NORM_F32 0
#endif

/* ---- used in amk_scheduler.cuh ---- */

/* The scheduler's wait on a counter: spins, then sleeps that grow (amk_scheduler.cuh). */
#ifndef AMK_SPIN_TIGHT
#define AMK_SPIN_TIGHT 64      /* spins before the first sleep */
#endif
#ifndef AMK_SPIN_SLEEP_NS
#define AMK_SPIN_SLEEP_NS 32   /* short sleeps: a late wait costs at most this much extra */
#endif
#ifndef AMK_SPIN_BACKOFF1
#define AMK_SPIN_BACKOFF1 256  /* spins before sleeping 16x longer */
#endif
#ifndef AMK_SPIN_BACKOFF2
#define AMK_SPIN_BACKOFF2 1024 /* spins before sleeping 64x longer (2 us) */
#endif
#ifndef AMK_ABORT_POLL_NS
#define AMK_ABORT_POLL_NS 100000 /* ns between reads of the host-mapped abort flag (a PCIe
                                    round trip: polled by time, not by spins, so that many
                                    idle blocks do not flood the bus) */
#endif

/* 1: LINEAR_TILE's tensor-core tiles multiply with wgmma on sm_90a (ops/linear-tile; other
 * architectures keep mma.sync). With the dispatcher inlined (below) the 1B's 512-row prompt
 * ran 6.14 ms against mma.sync's 7.52-7.73 on an H200, SmolLM2's 3.36 against 3.98
 * (docs/perf-notes.md round 49). */
#ifndef AMK_LT_WGMMA
#define AMK_LT_WGMMA 1
#endif

/* 1: the task dispatcher (generated, every op's code) inlines into the kernel's entry, and
 * the verify pass gets a dispatcher of its own holding only the ops that wait themselves: what
 * wgmma needs to run unserialized (ptxas serializes it inside any function that is called,
 * remark C7510), and the decode step saves the call (the 1B's 1.17 -> 1.13 ms, SmolLM2's
 * 0.78 -> 0.69 ms on an H200, docs/perf-notes.md round 49). The host generates the dispatchers
 * from AMK_CUDA_DEFINES alone (assemble.rs, `Knobs::dispatch_inline`, whose default is this
 * one): turn it off there with AMK_DISPATCH_INLINE=0, not by editing this default. */
#ifndef AMK_DISPATCH_INLINE
#define AMK_DISPATCH_INLINE 1
#endif

/* Alignment in bytes of the dynamic shared memory the ops use (their tiles' stages, scratch),
 * which starts after the kernel's static shared memory: the compiler pads the static part to
 * this. The 1B's 512-row prompt ran 7.7 ms with the stages 128-byte aligned, 7.9-8.3 ms at 32
 * past a 128-byte line, 8.6 at 16 and 9.0-9.3 at 48 (docs/perf-notes.md round 48). */
#ifndef AMK_SMEM_ALIGN
#if AMK_LT_WGMMA && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AMK_SMEM_ALIGN 1024 /* wgmma's swizzled stages (ops/linear-tile) */
#else
#define AMK_SMEM_ALIGN 128
#endif
#endif

/* ---- used in amk_tile.cuh (ops/oplib-tile) ---- */

/* 16-byte weight vectors in flight per lane (over the NR rows of a unit). */
#ifndef AMK_FUSED_VECS
#define AMK_FUSED_VECS 8
#endif

/* 1: every vector-path row of the program is a whole number of full passes (its vectors a
 * multiple of every pass amk_fused_fast can make of it), and the loop drops its bounds tests.
 * The backend defines it from the program (`loops::fused_exact`). */
#ifndef AMK_FUSED_EXACT
#define AMK_FUSED_EXACT 0
#endif

/* AMK_NORM_WPRE (default 1): a fused tile with a norm loads its thread's vector of the norm
 * weight before its wait (no task writes it), so that the norm after the wait waits for x
 * alone, not for w's round trip too (docs/perf-notes.md round 23). For the block norm of one
 * vector a thread (rows of at most 8 * AMK_THREADS elements). */
#ifndef AMK_NORM_WPRE
#define AMK_NORM_WPRE 1
#endif

/* Units a warp streams at once on the vector path (the template parameter P, which
 * amk_fused_run picks: 1, 2, or 4 for short rows): with 2, a warp loads the rows of its units j
 * and j + AMK_WARPS together, twice the bytes in flight a lane (a 1B projection row is one
 * batch of loads, so one DRAM round trip per unit otherwise).
 * AMK_FUSED_PAIR says which tiles may pair their units, a bit each: 1 the one-row projection
 * (GEMV_TILE's one-row path, RMSNORM_GEMV, ATTENTION_GEMV), 2 GATE_UP_SILU, 4 QKV_ROPE_APPEND;
 * amk_fused_run says when they do (docs/perf-notes.md round 14). Default 1; the backend defines
 * 7 (with AMK_FUSED_PAIR_MIN 2) for a program whose weight rows are all 4 KB or more
 * (loops::pairs: the 1B and the 8B 1-2 % faster on the H200, docs/perf-notes.md round 60): a
 * pass of 4 KB a round trip, two units' passes in flight at once; programs of shorter rows
 * (SmolLM2: a unit's rows in a pass of 1.5-3 KB) lose 1-1.5 % to the larger loops. */
#ifndef AMK_FUSED_PAIR
#define AMK_FUSED_PAIR 1
#endif

/* The vector loops compiled in, a bit per (weight, row) dtype pair: bit 2 * wk + x16, where wk
 * is the weights' AMK_TILE_W_F32/F16/BF16 and x16 is 1 for a 16-bit row (f16 and bf16 rows share
 * a loop), 0 for an f32 row. The backend defines it from the program's tasks (the pairs its
 * row-loop ops name; every pair when it cannot tell): the loops a program never runs are not in
 * its kernel, and that measured 0.011-0.023 ms a token faster on every shape
 * (docs/perf-notes.md round 16 §7, round 17). A pair left out takes the generic loop. */
#ifndef AMK_FUSED_LOOPS
#define AMK_FUSED_LOOPS 63
#endif

/* A tile pairs its units (P = 2) when a warp has at least AMK_FUSED_PAIR_MIN units, or at least
 * AMK_FUSED_PAIR_MIN_LONG units of weight rows of 8 KB or more. Measured on the H100 (round 14):
 * the LM heads gain (1B 194 -> 173 us), so do the 8B's o_proj and down tiles (4 units a warp of
 * 8-28 KB rows), while short tiles (the 1B's o_proj and down, every SmolLM2 layer tile) lose:
 * the larger loop is more code on every SM for a round trip or two. On the H200 the 1B's tiles
 * gain from 2 units a warp (round 60), which the backend defines for long-row programs. */
#ifndef AMK_FUSED_PAIR_MIN
#define AMK_FUSED_PAIR_MIN 16
#endif
#ifndef AMK_FUSED_PAIR_MIN_LONG
#define AMK_FUSED_PAIR_MIN_LONG 4
#endif

/* A one-row projection that pairs its units and whose weight rows are at most this many bytes
 * streams four units a warp at once instead of two, each with half the vectors a pass (a pass
 * of two 1,152-byte SmolLM2 LM-head rows fills 72 of a lane's 8 x 32 slots: 2.3 KB a warp in
 * flight, and that LM head streamed 1.6 TB/s against the 1B's 3.0; docs/perf-notes.md round
 * 16). 0: never. */
#ifndef AMK_FUSED_QUAD_BYTES
#define AMK_FUSED_QUAD_BYTES 2048
#endif

/* AMK_ROW_PRE: a fused tile whose rows are one pass of the vector loop loads every unit of its
 * warps into registers before its wait (the weights: no task writes them, so nothing orders
 * their loads after a counter), then waits, prepares its row and sums as amk_fdot does, in the
 * same order (a lane's vectors lane, lane + 32, ... whatever the pass size), so the results are
 * the same bits. The backend defines it from the program (docs/perf-notes.md rounds 19, 21). */
#ifndef AMK_ROW_PRE
#define AMK_ROW_PRE 0
#endif

/* Units a warp may have for a tile to take the pre path, all in registers across the wait (3:
 * the gate/up tiles of a layout whose phases alternate between halves of the SMs, round 21);
 * more (an LM head's) keep the paired and quad loops of amk_fused_run, which stream several
 * units a warp at once. */
#ifndef AMK_ROW_PRE_UNITS
#define AMK_ROW_PRE_UNITS 3
#endif

/* AMK_PRE_XREG (default 1): a pre-path tile without a norm loads its row straight into its
 * lanes' registers after the wait, instead of the block copying it into shared memory behind a
 * barrier (docs/perf-notes.md round 23). */
#ifndef AMK_PRE_XREG
#define AMK_PRE_XREG 1
#endif

/* AMK_ROW_PAIRS (default 1): the pre path takes two rows a unit for an even tile
 * (amk_row_tile, docs/perf-notes.md round 22). */
#ifndef AMK_ROW_PAIRS
#define AMK_ROW_PAIRS 1
#endif

/* ---- used in amk_attention.cuh (ops/oplib-attention) ---- */

/* AMK_ATT_TINY_PRE (default 1): an ATTENTION_TILE on the tiny path whose heads the block covers
 * in one pass works out each lane's head and addresses before its wait (amk_att_tiny_pre), so
 * that after the wait its lanes only load and compute (docs/perf-notes.md round 23). */
#ifndef AMK_ATT_TINY_PRE
#define AMK_ATT_TINY_PRE 1
#endif

/* The longest range that takes the plan (at most ATT_TINY_KV; 0: none, with the plan's code
 * compiled in all the same, which measures what the code's presence alone does). */
#ifndef AMK_ATT_TINY_PRE_KV
#define AMK_ATT_TINY_PRE_KV ATT_TINY_KV
#endif

#endif /* AMK_KNOBS_CUH */
