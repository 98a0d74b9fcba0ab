/* GEMV_TILE (opcode 5): columns [n_off, n_off + N_tile) of y = x @ W^T (+ bias), for every
 * row of x (viewed as [M, K]); W is [N, K] (torch Linear layout). Float weights (+ optional
 * float bias of N), or weight-only quantised ones (qdtype 6 = int8: I8 without zeros, U8 with;
 * qdtype 7 = row-packed int4, low nibble first) with float group scales (and zeros) of
 * N * ceil(K / group) elements: w = (q - z) * s, z = zeros[..] or 8 (int4) / 0 (int8).
 *
 * The tile machinery (validation, fp/int8/int4 weight streaming, scalar fallback) is
 * ops/oplib-tile/src/amk_tile.cuh: here one row of x per pass over a weight row (MAXR = 1),
 * 8 16-byte weight vectors in flight per lane (a whole 2048-wide bf16 row per warp: 4 KB; 32 KB
 * per block), every row of x. */

__device__ void amk_op_gemv_tile(const amk_task_ctx& ctx) { amk_tile_run<1, 8>(ctx, false); }
