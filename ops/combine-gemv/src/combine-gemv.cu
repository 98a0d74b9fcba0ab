/* combine-gemv.cu — CUDA device function of COMBINE_GEMV (amk_op_combine_gemv); semantics:
 * ops/combine-gemv/src/reference.rs. Columns [n_off, n_off + N_tile) of
 * y = combine(partials at pos) @ W^T (+ bias), the merged row rounded to W's dtype.
 *
 * A tile merges the whole attention row into shared memory (cg_merge): it copies the active
 * splits' partials into its shared memory with asynchronous copies (every copy of a batch in
 * flight at once, no register waiting on a load), works out every head's merge weights from
 * their m and l meanwhile, then sums the staged partials in split order and normalises them;
 * then it multiplies its weight rows by the row as ATTENTION_GEMV does (amk_row_tile_run, or
 * with AMK_ROW_PRE the weight rows loaded into registers before the wait, amk_pre_run).
 * Loading the partials straight into registers instead was measured much slower: L2 round
 * trips in series, where the stage has one (docs/perf-notes.md round 32).
 *
 * The position says which splits are active (op_attention_split::active_splits). It is data:
 * read before the wait only when nothing in the launch writes it (AMK_BUF_LAUNCH_CONST), else
 * after it. */

/* The tile's operands and params. */
struct cg_args {
  const amk_buffer_t *parts, *w, *bias, *pos, *y;
  int hd, nh, nkv, rep, n_splits, chunk, n_tile, n_off;
  long long K;
};

/* The merge's scratch in shared memory, after the row (16-byte aligned): the row's
 * un-normalised sums at acc[k] (K floats), split s of head h's m at m[h * n_splits + s] (then
 * its merge weight), its l at l[...], the head's denominator at den[h]; then, 16-byte aligned,
 * the stage: the rest of the tile's shared memory, into which the partials are copied
 * (cg_stage_*). cg_scratch_bytes: the scratch without the stage. */
struct cg_scratch {
  float *acc, *m, *l, *den;
  unsigned char* stage;
  int stage_bytes;
};
__device__ __forceinline__ long long cg_row_bytes(const cg_args& a) {
  return (a.K * (a.w->dtype == AMK_F32 ? 4 : 2) + 15) / 16 * 16;
}
__device__ __forceinline__ long long cg_scratch_bytes(const cg_args& a) {
  return (4LL * (a.nh * (2LL * a.n_splits + 1) + a.K) + 15) / 16 * 16;
}
/* Bytes of one split's partials of one KV head (rep heads of head_dim + 2 floats). */
__device__ __forceinline__ int cg_split_bytes(const cg_args& a) {
  return 4 * a.rep * (a.hd + 2);
}
/* The block's dynamic shared memory (ctx.smem), declared here so that the scratch's accesses
 * are shared-memory ones. */
extern __shared__ __align__(AMK_SMEM_ALIGN) unsigned char cg_dsmem[];
__device__ __forceinline__ cg_scratch cg_scratch_at(const amk_task_ctx& ctx, const cg_args& a) {
  cg_scratch s;
  s.acc = (float*)(cg_dsmem + cg_row_bytes(a));
  s.m = s.acc + a.K;
  s.l = s.m + (long long)a.nh * a.n_splits;
  s.den = s.l + (long long)a.nh * a.n_splits;
  const long long off = cg_row_bytes(a) + cg_scratch_bytes(a);
  s.stage = cg_dsmem + off;
  s.stage_bytes = ctx.smem_bytes - (int)off;
  return s;
}

template <bool CHECK>
__device__ __forceinline__ bool cg_setup(const amk_task_ctx& ctx, cg_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 3 && nin <= 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  a.parts = amk_in(ctx, 0);
  a.w = amk_in(ctx, 1);
  a.bias = nin == 4 ? amk_in(ctx, 2) : nullptr;
  a.pos = amk_in(ctx, nin - 1);
  a.y = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  AMK_CHECK(a.hd > 0 && a.nh > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  a.rep = a.nh / a.nkv;
  if (CHECK) {
    const long long K = a.K;
    AMK_CHECK(K > 0 && K == (long long)a.nh * a.hd, AMK_ERR_PARAM, K);
    AMK_CHECK(a.parts->dtype == AMK_F32, AMK_ERR_DTYPE, a.parts->dtype);
    AMK_CHECK(a.parts->numel == (long long)a.nkv * a.n_splits * a.rep * (a.hd + 2), AMK_ERR_SHAPE,
              a.parts->numel);
    AMK_CHECK(amk_is_vec(a.w->dtype), AMK_ERR_DTYPE, a.w->dtype);
    AMK_CHECK(cg_row_bytes(a) + cg_scratch_bytes(a) + (cg_split_bytes(a) + 15) / 16 * 16 <= ctx.smem_bytes,
              AMK_ERR_SHAPE, K);
    AMK_CHECK(amk_last_dim(a.w) == K, AMK_ERR_SHAPE, amk_last_dim(a.w));
    if (!amk_row_tile_check(ctx, a.w, K, a.n_tile, a.n_off, a.y, a.bias)) return false;
    AMK_CHECK(amk_att_pos_ok(a.pos), AMK_ERR_DTYPE, a.pos->dtype);
  }
  return true;
}

__device__ __noinline__ bool cg_check(const amk_task_ctx& ctx) {
  cg_args a;
  return cg_setup<true>(ctx, a);
}

/* Every head's merge weights into the scratch: the active splits' m and l loaded at once (a
 * thread per split and head), then a thread per head works out its weights and denominator in
 * split order, the reference's arithmetic. Block-wide: the scratch is ready for every thread
 * when it returns. */
__device__ __forceinline__ void cg_weights(const cg_args& a, const float* parts, int active,
                                           const cg_scratch& sc) {
  const long long stride = (long long)a.hd + 2;
  const int n = a.nh * active;
#pragma unroll 1
  for (int i0 = threadIdx.x; i0 < n; i0 += 2 * AMK_THREADS) {
    float mv[2], lv[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) { /* both loads in flight before either is used */
      const int i = i0 + k * AMK_THREADS, h = i / active, s = i - (i / active) * active;
      const int g = h / a.rep, r = h - g * a.rep;
      const float* ml = parts + (((long long)g * a.n_splits + s) * a.rep + r) * stride + a.hd;
      mv[k] = i < n ? __ldcg(ml) : 0.0f;
      lv[k] = i < n ? __ldcg(ml + 1) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = i0 + k * AMK_THREADS, h = i / active, s = i - (i / active) * active;
      if (i < n) {
        sc.m[h * a.n_splits + s] = mv[k];
        sc.l[h * a.n_splits + s] = lv[k];
      }
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int h = threadIdx.x; h < a.nh; h += AMK_THREADS) {
    float* m = sc.m + h * a.n_splits;
    const float* l = sc.l + h * a.n_splits;
    float M = -__int_as_float(0x7f800000);
    for (int s = 0; s < active; ++s) M = fmaxf(M, m[s]);
    float sum = 0.0f;
#pragma unroll 1
    for (int s = 0; s < active; ++s) {
      const float w = l[s] > 0.0f ? expf(__fsub_rn(m[s], M)) : 0.0f;
      sum = __fadd_rn(sum, __fmul_rn(l[s], w));
      m[s] = w;
    }
    sc.den[h] = fmaxf(sum, 1e-20f);
  }
  __syncthreads();
}

/* The stage's plan: the active splits of each KV head in pieces of `per` splits (as many as
 * the stage holds, at most all of them), piece c being KV head c / pieces_per_head's splits
 * from (c % pieces_per_head) * per; each piece's bytes are contiguous in the partials. Pieces
 * are copied in batches (as many as the stage holds), every copy of a batch in flight at once:
 * a batch costs one L2 round trip plus its bytes, and no register waits on a load. */
struct cg_plan {
  int per, pieces_per_head, n_pieces, split_bytes;
  int gran; /* copy granularity: 16, 8 or 4 bytes (what the partials' alignment allows) */
};

__device__ __forceinline__ cg_plan cg_plan_make(const cg_args& a, const cg_scratch& sc, int active) {
  cg_plan p;
  p.split_bytes = cg_split_bytes(a);
  p.per = min(active, (sc.stage_bytes - 15) / p.split_bytes);
  p.pieces_per_head = (active + p.per - 1) / p.per;
  p.n_pieces = a.nkv * p.pieces_per_head;
  const unsigned long long base = (unsigned long long)a.parts->ptr;
  p.gran = (p.split_bytes % 16 == 0 && base % 16 == 0) ? 16 : (p.split_bytes % 8 == 0 && base % 8 == 0) ? 8 : 4;
  return p;
}

/* Piece c: its KV head, first split and split count. */
struct cg_piece {
  int g, s0, n;
};
__device__ __forceinline__ cg_piece cg_piece_at(const cg_plan& p, int active, int c) {
  cg_piece q;
  q.g = c / p.pieces_per_head;
  q.s0 = (c - q.g * p.pieces_per_head) * p.per;
  q.n = min(p.per, active - q.s0);
  return q;
}
/* The piece after q: the next splits of its KV head, or the next head's first. */
__device__ __forceinline__ void cg_piece_next(const cg_plan& p, int active, cg_piece& q) {
  q.s0 += p.per;
  if (q.s0 >= active) {
    q.s0 = 0;
    ++q.g;
  }
  q.n = min(p.per, active - q.s0);
}
__device__ __forceinline__ int cg_piece_bytes(const cg_plan& p, const cg_piece& q) {
  return (q.n * p.split_bytes + 15) / 16 * 16;
}

/* Copies the pieces from c0 that fit the stage (at least one), asynchronously; returns the end
 * of the batch. Block-uniform. */
__device__ __forceinline__ int cg_stage_issue(const cg_args& a, const cg_scratch& sc, const cg_plan& p,
                                              int active, int c0) {
  int off = 0, c = c0;
#pragma unroll 1
  for (cg_piece q = cg_piece_at(p, active, c0); c < p.n_pieces; ++c, cg_piece_next(p, active, q)) {
    if (c > c0 && off + cg_piece_bytes(p, q) > sc.stage_bytes) break;
    const char* src = (const char*)a.parts->ptr + ((long long)q.g * a.n_splits + q.s0) * p.split_bytes;
    unsigned char* dst = sc.stage + off;
    const int bytes = q.n * p.split_bytes;
#pragma unroll 1
    for (int i = threadIdx.x * p.gran; i < bytes; i += AMK_THREADS * p.gran) {
      if (p.gran == 16) amk_cp_async16(dst + i, src + i);
      else if (p.gran == 8) amk_cp_async8(dst + i, src + i);
      else amk_cp_async4(dst + i, src + i);
    }
    off += cg_piece_bytes(p, q);
  }
  amk_cp_async_commit();
  return c;
}

/* Pieces [c0, c1) of the stage (landed) into the sums: thread t takes elements t, t + threads,
 * .. of each piece's heads (element e: head e / head_dim of the piece's KV head, dim
 * e % head_dim, stepped without a division); a piece that ends its heads' splits also
 * normalises them into the row (rounded to its dtype). Sums in split order, as the reference. */
__device__ __forceinline__ void cg_stage_merge(const cg_args& a, const cg_scratch& sc, const cg_plan& p,
                                               int active, int c0, int c1, const amk_buffer_t* row) {
  const int per_head = a.rep * a.hd, rstride = a.hd + 2;
  const int sstride = a.rep * rstride; /* floats from split s to split s + 1 in a piece */
  const int r0 = threadIdx.x / a.hd, d0 = threadIdx.x - r0 * a.hd;
  const int dr = AMK_THREADS / a.hd, dd = AMK_THREADS - dr * a.hd;
  /* the row's dtype and address in registers (row is a descriptor in local memory) */
  const int rdt = row->dtype;
  void* const rp = row->ptr;
  int off = 0;
  cg_piece q = cg_piece_at(p, active, c0);
#pragma unroll 1
  for (int c = c0; c < c1; ++c) {
    const float* x0 = (const float*)(sc.stage + off);
    off += cg_piece_bytes(p, q);
    int r = r0, d = d0;
#pragma unroll 2
    for (int e = threadIdx.x; e < per_head; e += AMK_THREADS) {
      const int h = q.g * a.rep + r, k = h * a.hd + d;
      const float* w = sc.m + h * a.n_splits + q.s0;
      const float* x = x0 + r * rstride + d;
      float acc = q.s0 == 0 ? 0.0f : sc.acc[k];
      /* branch-free (a zero weight keeps acc, as the reference skips it), so the loads of 8
         splits issue before their sums: the chain is the adds alone */
#pragma unroll 8
      for (int j = 0; j < q.n; ++j) {
        const float wj = w[j], t = __fadd_rn(acc, __fmul_rn(x[j * sstride], wj));
        acc = wj != 0.0f ? t : acc;
      }
      if (q.s0 + q.n < active) {
        sc.acc[k] = acc;
      } else {
        const float v = __fdiv_rn(acc, sc.den[h]);
        if (AMK_IS_F32(rdt)) ((float*)rp)[k] = v;
        else ((uint16_t*)rp)[k] = AMK_IS_BF16(rdt) ? amk_f32_to_bf16(v) : amk_f32_to_f16(v);
      }
      r += dr;
      d += dd;
      if (d >= a.hd) {
        d -= a.hd;
        ++r;
      }
    }
    cg_piece_next(p, active, q);
  }
}

/* The merged row into `row` (shared memory, rounded to its dtype): the first batch of partials
 * is copied while the weights are worked out (cg_weights), then batch by batch. Probes (traced
 * kernels): 1 the first batch issued, 2 the weights ready, 3 the first batch landed, 4 the
 * last batch summed. */
__device__ __forceinline__ void cg_merge_staged(const amk_task_ctx& ctx, const cg_args& a,
                                                const float* parts, int active,
                                                const cg_scratch& sc, const amk_buffer_t* row) {
  const cg_plan p = cg_plan_make(a, sc, active);
#pragma unroll 1
  for (int c0 = 0;;) {
    const int c1 = cg_stage_issue(a, sc, p, active, c0);
    if (c0 == 0) { /* the weights while the first batch is in flight */
      amk_probe(ctx, 1);
      cg_weights(a, parts, active, sc);
      amk_probe(ctx, 2);
    }
    amk_cp_async_wait_all();
    __syncthreads();
    if (c0 == 0) amk_probe(ctx, 3);
    cg_stage_merge(a, sc, p, active, c0, c1, row);
    if (c1 >= p.n_pieces) break;
    __syncthreads(); /* the stage is read: the next batch may overwrite it */
    c0 = c1;
  }
  amk_probe(ctx, 4);
}

/* The merged row into shared memory, rounded to W's dtype (cg_merge_staged). Every warp sees it
 * after the barrier at the end. Then the trace point: the row is ready. */
__device__ __noinline__ amk_frow cg_merge(const amk_task_ctx& ctx, const cg_args& args, int active,
                                          const amk_buffer_t* row, unsigned long long pol) {
  /* The args by value: read through the caller's reference, every field would be read again
     from local memory after each store through a generic pointer (the row), which may alias it. */
  const cg_args a = args;
  cg_merge_staged(ctx, a, (const float*)a.parts->ptr, active, cg_scratch_at(ctx, a), row);
  __syncthreads();
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  return amk_smem_frow(ctx, row, pol);
}

/* The tile's weight rows to L2 (thread 0, one bulk prefetch), before the merge: where it is
 * issued (before the wait, before or after the merge) made no measurable difference
 * (docs/perf-notes.md round 29). */
__device__ __forceinline__ void cg_prefetch_w(const cg_args& a, unsigned long long pol) {
  if (threadIdx.x != 0) return;
  const long long wsz = a.w->dtype == AMK_F32 ? 4 : 2;
  amk_prefetch_l2_bulk((uint64_t)a.w->ptr + (uint64_t)((long long)a.n_off * a.K * wsz),
                       (uint64_t)((long long)a.n_tile * a.K * wsz), pol);
}

/* Everything after the wait, out of line (ATTENTION_GEMV's ag_run says why): the weight rows to
 * L2 first, then the merged row, then the projection. */
__device__ __noinline__ void cg_run(const amk_task_ctx& ctx) {
  cg_args a;
  cg_setup<false>(ctx, a);
  const int active = amk_split_active_at(ctx, a.pos, a.n_splits, a.chunk);
  if (active < 0) return;
  amk_probe(ctx, 0); /* the position read */
  const amk_buffer_t* w = a.w;
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  cg_prefetch_w(a, pol);
  const amk_buffer_t row = amk_smem_row(ctx, a.K, a.w->dtype); /* the merged row */
  const amk_frow r = cg_merge(ctx, a, active, &row, pol);
  amk_row_tile_run(r, a.K, w, amk_al16(w->ptr), a.n_tile, a.n_off, a.y, a.bias);
}

#if AMK_ROW_PRE
/* The pre path (ATTENTION_GEMV's ag_pre says how): weight rows into registers before the wait
 * when the position is final by then; false, having done nothing, otherwise. */
__device__ __noinline__ bool cg_pre(const amk_task_ctx& ctx) {
  cg_args a;
  cg_setup<false>(ctx, a);
  const amk_buffer_t* w = a.w;
  const bool al = amk_al16(w->ptr);
  if (!amk_pre_row_ok<1>(ctx, w->dtype, true, a.K, w->dtype, al, a.n_tile)) return false;
  if (!(a.pos->flags & AMK_BUF_LAUNCH_CONST)) return false;
  const int active = amk_split_active_at(ctx, a.pos, a.n_splits, a.chunk);
  if (active < 0) return true; /* the task failed: nothing more */
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  const amk_buffer_t row = amk_smem_row(ctx, a.K, w->dtype);
  return amk_row_tile_pre(ctx, a.K, w, a.n_tile, a.n_off, a.y, a.bias,
                          [&] { return cg_merge(ctx, a, active, &row, pol); });
}
#endif

__device__ __forceinline__ void amk_op_combine_gemv(const amk_task_ctx& ctx) {
  if (ctx.verify && !cg_check(ctx)) return;
#if AMK_ROW_PRE
  if (cg_pre(ctx)) return;
#endif
  if (!amk_task_wait(ctx)) return;
  cg_run(ctx);
}
