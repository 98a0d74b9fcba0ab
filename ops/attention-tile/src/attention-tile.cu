/* ATTENTION_TILE (code 7): GQA decode attention over cache rows [kv_start, kv_start + kv_len);
 * flags bit 1 writes the un-normalised [acc | m | l] partials of a split-KV shard. Semantics:
 * ops/attention-tile/src/reference.rs. The attention itself (its fast, tiny and generic paths)
 * is ops/oplib-attention/src/amk_attention.cuh, shared with ATTENTION_GEMV.
 *
 * A fourth input, the position (element 0 of an integer buffer), clips the params' window to
 * the rows at or before it (amk_att_pos_len, through amk_att_setup). It is data: read before the
 * task's wait only when nothing in the launch writes it (its descriptor's AMK_BUF_LAUNCH_CONST;
 * then the task runs exactly as one without a position, the tiny path's plan included), else
 * after the wait (and the plan after it too). */

/* The checks amk_verify_tasks makes once per program, out of line: run unless it passed the
 * task (ctx.verify). */
__device__ __noinline__ bool at_check(const amk_task_ctx& ctx) {
  const bool partial = (ctx.inst->params.flags & 2) != 0;
  amk_att_geom g;
  if (!amk_att_setup<true>(ctx, partial, g)) return false;
  const amk_buffer_t* out = amk_out(ctx, 0);
  const bool CHECK = true;
  AMK_CHECK(amk_is_float(out->dtype), AMK_ERR_DTYPE, out->dtype);
  const long long per_head = partial ? (long long)g.hd + 2 : (long long)g.hd;
  AMK_CHECK(out->numel == g.batch * g.nh * per_head, AMK_ERR_SHAPE, out->numel);
  AMK_CHECK(ctx.inst->n_inputs <= 3 || amk_att_pos_ok(amk_in(ctx, 3)), AMK_ERR_DTYPE,
            amk_in(ctx, 3)->dtype);
  return true;
}

__device__ void amk_op_attention_tile(const amk_task_ctx& ctx) {
  if (ctx.verify && !at_check(ctx)) return;
  /* The position, if any, is read by the setup: before the wait when it is final by then,
     else (`late`: some task of the launch writes it, or amk_verify_tasks, which reads no data)
     after it, and the tiny path's plan with it. Without a position this is the path it always
     was (`late` false): one copy of the attention for every task, whose paths are inlined
     where they are called (some 400 KB of an any-dtype kernel a call site). */
  const amk_buffer_t* pb = ctx.inst->n_inputs > 3 ? amk_in(ctx, 3) : nullptr;
  const bool late = pb && (ctx.check_only || !(pb->flags & AMK_BUF_LAUNCH_CONST));
  if (late && !amk_task_wait(ctx)) return;
  amk_att_geom g;
  if (!amk_att_setup<false>(ctx, (ctx.inst->params.flags & 2) != 0, g, pb)) return;
  /* The tiny path's lanes plan their heads and addresses before the wait (AMK_ATT_TINY_PRE;
     after it for a late position, whose window is known only then). */
  const amk_att_tiny_plan t = amk_att_tiny_pre(amk_in(ctx, 0), amk_in(ctx, 1), amk_in(ctx, 2), g);
  /* The checks read descriptors and params only: q and the caches wait from here. */
  if (!late && !amk_task_wait(ctx)) return;
  /* Trace point: the wait is met (the rest is the attention itself). */
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  if (t.ok) amk_att_tiny_run(t, amk_in(ctx, 0), amk_out(ctx, 0), g);
  else amk_att_run(amk_in(ctx, 0), amk_in(ctx, 1), amk_in(ctx, 2), amk_out(ctx, 0), g);
}
