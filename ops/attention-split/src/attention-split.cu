/* ATTENTION_SPLIT (code 25): split `s` of KV head `g` of the decode attention (the task's
 * n_off / N_tile = g * n_splits + s), over the rows the position gives it
 * (op_attention_split::split_rows), written as un-normalised [acc | m | l] partials of the
 * group's query heads at n_off. Semantics: ops/attention-split/src/reference.rs.
 *
 * The attention itself is amk_attention.cuh's (amk_att_run, the paths ATTENTION_TILE takes),
 * on views of the operands narrowed to the group: q from head g * rep, the caches from
 * element g * head_dim of a row (rows keep their n_kv_heads * head_dim stride), the output
 * from n_off; the geometry is then one KV head of `rep` query heads.
 *
 * Probes (traced kernels): 0 the shape worked out, 1 the rows, 2 thread 0 through the
 * attention; the prologue point: the wait passed and the views made.
 *
 * The position is data: read before the wait when nothing in the launch writes it (its
 * descriptor's AMK_BUF_LAUNCH_CONST, as in a decode loop, whose tail writes it after every
 * reader of the pass), else after the wait. An inactive split (no rows at this position)
 * reads and writes nothing, so it does not wait: amk_task_skip_wait. */

/* Bytes of one element of a float cache or query (F32 4, F16/BF16 2, fp8 1). */
__device__ __forceinline__ long long as_esize(int dt) {
  return dt == AMK_F32 ? 4 : ((dt == AMK_F16 || dt == AMK_BF16) ? 2 : 1);
}

/* A rank-1 view of `b` from element `first`, `n` elements long. */
__device__ __forceinline__ amk_buffer_t as_view(const amk_buffer_t* b, long long first, long long n) {
  amk_buffer_t v = *b;
  v.ptr = (char*)b->ptr + first * as_esize(b->dtype);
  v.numel = n;
  v.rank = 1;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i == 0 ? n : 1;
    v.stride[i] = 1;
  }
  return v;
}

/* The task's static shape: its group, its split and the cache's rows. */
struct as_args {
  int hd, nh, nkv, rep, n_splits, chunk, kv_head, split;
  long long rows; /* cache rows */
  float scale;
};

/* The params and descriptors, checked as the validator checks them when CHECK (failing the
 * task, false, on the first that fails). Reads descriptors and params only. */
template <bool CHECK>
__device__ __forceinline__ bool as_setup(const amk_task_ctx& ctx, as_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const amk_buffer_t* out = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  a.scale = p.scale;
  AMK_CHECK(ctx.inst->n_inputs == 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  AMK_CHECK(a.hd > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nh > 0, AMK_ERR_PARAM, a.nh);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  AMK_CHECK(isfinite(a.scale), AMK_ERR_PARAM, (long long)__float_as_int(a.scale));
  a.rep = a.nh / a.nkv;
  const long long tile = (long long)a.rep * (a.hd + 2);
  const long long row = (long long)a.nkv * a.hd;
  AMK_CHECK(p.N_tile == tile, AMK_ERR_PARAM, p.N_tile);
  AMK_CHECK(p.n_off >= 0 && p.n_off % tile == 0 && p.n_off / tile < (long long)a.nkv * a.n_splits,
            AMK_ERR_PARAM, p.n_off);
  AMK_CHECK(amk_is_float(q->dtype) && amk_is_float(kc->dtype) && amk_is_float(vc->dtype),
            AMK_ERR_DTYPE, q->dtype);
  AMK_CHECK(q->numel == (long long)a.nh * a.hd, AMK_ERR_SHAPE, q->numel);
  AMK_CHECK(kc->numel == vc->numel && kc->numel % row == 0, AMK_ERR_SHAPE, kc->numel);
  AMK_CHECK(out->dtype == AMK_F32, AMK_ERR_DTYPE, out->dtype);
  AMK_CHECK(out->numel == (long long)a.nkv * a.n_splits * tile, AMK_ERR_SHAPE, out->numel);
  AMK_CHECK(amk_att_pos_ok(amk_in(ctx, 3)), AMK_ERR_DTYPE, amk_in(ctx, 3)->dtype);
  const int task = (int)p.n_off / (int)tile;
  a.kv_head = task / a.n_splits;
  a.split = task % a.n_splits;
  /* 32-bit divisions where the values allow (a 64-bit one is a call of ~100 instructions, on
   * every split's path before its wait) */
  a.rows = kc->numel < 0x7fffffffLL ? (long long)((unsigned)kc->numel / (unsigned)row) : kc->numel / row;
  return true;
}

__device__ __noinline__ bool as_check(const amk_task_ctx& ctx) {
  as_args a;
  return as_setup<true>(ctx, a);
}

/* The split's rows at the position in `pb` (block-uniform): its length, with `start` set;
 * -1, having failed the task, for a position outside the cache. */
__device__ __forceinline__ long long as_rows(const amk_task_ctx& ctx, const as_args& a,
                                             const amk_buffer_t* pb, long long& start) {
  const long long p = amk_ldif(pb, 0);
  if (p < 0 || p >= a.rows) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  const int q = (int)min(p, (long long)(1 << 30)); /* 32-bit: see as_setup */
  const int per = (q + a.n_splits) / a.n_splits;  /* ceil((p + 1) / n_splits) */
  const int size = (per + a.chunk - 1) / a.chunk * a.chunk;
  start = (long long)a.split * size;
  return start > p ? 0 : min((long long)size, p + 1 - start);
}

__device__ void amk_op_attention_split(const amk_task_ctx& ctx) {
  if (ctx.verify && !as_check(ctx)) return;
  as_args a;
  as_setup<false>(ctx, a);
  amk_probe(ctx, 0); /* the shape worked out */
  const amk_buffer_t* pb = amk_in(ctx, 3);
  const bool late = ctx.check_only || !(pb->flags & AMK_BUF_LAUNCH_CONST);
  if (late && !amk_task_wait(ctx)) return;
  long long start = 0;
  const long long len = as_rows(ctx, a, pb, start);
  amk_probe(ctx, 1); /* the rows worked out */
  if (len < 0) return;
  if (len == 0) { /* inactive: nothing read, nothing written */
    if (!late) amk_task_skip_wait(ctx);
    return;
  }
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const long long row = (long long)a.nkv * a.hd;
  const amk_buffer_t qv = as_view(q, (long long)a.kv_head * a.rep * a.hd, (long long)a.rep * a.hd);
  const amk_buffer_t kv = as_view(kc, (long long)a.kv_head * a.hd, kc->numel - (long long)a.kv_head * a.hd);
  const amk_buffer_t vv = as_view(vc, (long long)a.kv_head * a.hd, vc->numel - (long long)a.kv_head * a.hd);
  const long long tile = (long long)a.rep * (a.hd + 2);
  const amk_buffer_t ov = as_view(amk_out(ctx, 0), ctx.inst->params.n_off, tile);
  amk_att_geom g;
  g.hd = a.hd;
  g.nh = a.rep;
  g.nkv = 1;
  g.rep = a.rep;
  g.batch = 1;
  g.row = row;
  g.per_batch = a.rows * row;
  g.kv_start = start;
  g.kv_len = (int)len;
  g.scale = a.scale;
  g.partial = true;
  if (!late && !amk_task_wait(ctx)) return;
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  amk_att_run(&qv, &kv, &vv, &ov, g);
  amk_probe(ctx, 2); /* the attention run (thread 0's part: its stores issued) */
}
