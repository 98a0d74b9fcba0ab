/* GEMM_TILE (opcode 6): GEMV_TILE's linear tile over a row range. Columns [n_off, n_off + N_tile)
 * of out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for rows [m_off, m_off + M_tile) when
 * m_off is given, every row of x otherwise (M_tile must fit either way). W is [N, K]. Float
 * weights (+ optional float bias of N), or weight-only quantised ones (qdtype 6 = int8: I8
 * without zeros, U8 with; qdtype 7 = row-packed int4, low nibble first) with float group
 * scales (and zeros) of N * ceil(K / group) elements: w = (q - z) * s, z = zeros[..] or
 * 8 (int4) / 0 (int8).
 *
 * The tile machinery is ops/oplib-tile/src/amk_tile.cuh (shared with GEMV_TILE): here up to
 * four rows of x share one pass over each weight row (MAXR = 4), 2 16-byte weight vectors in
 * flight per lane (code size), and the GEMM row range from M_tile / m_off. */

__device__ void amk_op_gemm_tile(const amk_task_ctx& ctx) { amk_tile_run<4, 2>(ctx, true); }
