/* DEQUANT (opcode 13): [q, scales(, zeros)] -> out. q's last dim is split into groups of `group`
 * elements (groups never straddle rows), group g (row-major) uses scales[g] (and zeros[g]):
 *   out[i] = (q[i] - zeros[i / group]) * scales[i / group]   with zeros
 *   out[i] = (q[i] - o) * scales[i / group]                  without
 * in fp32, cast on store. q is read as stored (integers, or floats holding integers); I4 is the
 * raw nibble 0..15 (row-packed, low nibble first) with o = 8 in the symmetric form, o = 0 for
 * every other case. `out` is a view: it needs q's element count only.
 *
 * One block walks the whole tensor. Fast paths (the usual layouts): I4 with last dim and group
 * multiples of 8 (one 32-bit word = 8 elements per thread step), I8/U8 with last dim and group
 * multiples of 4 (one word = 4 elements), both needing 16-byte aligned storage; the packed
 * elements are contiguous across rows there, so the thread strides over words and stores 4 or
 * 8 consecutive outputs with vector stores when the output is F32/F16/BF16. Everything else:
 * one element per thread step, generic loads/stores. The scale/zero math is identical in every
 * path: (q - z) * s, q exact. */

__device__ __forceinline__ uint32_t dq_pack2(float a, float b, bool bf) {
  const uint32_t lo = bf ? amk_f32_to_bf16(a) : amk_f32_to_f16(a);
  const uint32_t hi = bf ? amk_f32_to_bf16(b) : amk_f32_to_f16(b);
  return lo | (hi << 16);
}

/* out[e .. e + NE) = v[0 .. NE), e a multiple of NE (NE = 4 or 8), cast on store. */
template <int NE>
__device__ __forceinline__ void dq_store(const amk_buffer_t* ob, long long e, const float* v) {
  const int dt = ob->dtype;
  if (dt == AMK_F32) {
    float4* o = (float4*)((float*)ob->ptr + e);
#pragma unroll
    for (int i = 0; i < NE / 4; ++i) o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  } else if (dt == AMK_BF16 || dt == AMK_F16) {
    const bool bf = dt == AMK_BF16;
    uint16_t* o = (uint16_t*)ob->ptr + e;
    if constexpr (NE == 8) {
      *(uint4*)o = make_uint4(dq_pack2(v[0], v[1], bf), dq_pack2(v[2], v[3], bf),
                              dq_pack2(v[4], v[5], bf), dq_pack2(v[6], v[7], bf));
    } else {
      *(uint2*)o = make_uint2(dq_pack2(v[0], v[1], bf), dq_pack2(v[2], v[3], bf));
    }
  } else {
#pragma unroll
    for (int i = 0; i < NE; ++i) amk_st_slow(ob, e + i, v[i]);
  }
}

__device__ void amk_op_dequant(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 2 || nin > 3 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  if (!amk_has(p, AMK_P_QDTYPE) || (p.qdtype != 6 && p.qdtype != 7)) {
    amk_fail(ctx, AMK_ERR_PARAM, p.qdtype);
    return;
  }
  if (!amk_has(p, AMK_P_GROUP) || p.group <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, p.group);
    return;
  }
  const long long group = p.group;
  const amk_buffer_t* qb = amk_in(ctx, 0);
  const amk_buffer_t* sb = amk_in(ctx, 1);
  const amk_buffer_t* zb = nin == 3 ? amk_in(ctx, 2) : nullptr;
  const amk_buffer_t* ob = amk_out(ctx, 0);
  const long long kd = amk_last_dim(qb);
  if (kd < 0 || kd % group != 0) { amk_fail(ctx, AMK_ERR_SHAPE, kd); return; }
  const long long numel = qb->numel;
  const long long groups = numel / group;
  if (sb->numel != groups) { amk_fail(ctx, AMK_ERR_SHAPE, sb->numel); return; }
  if (zb && zb->numel != groups) { amk_fail(ctx, AMK_ERR_SHAPE, zb->numel); return; }
  if (!amk_is_float(ob->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, ob->dtype); return; }
  if (ob->numel != numel) { amk_fail(ctx, AMK_ERR_SHAPE, ob->numel); return; }
  if (numel <= 0 || kd == 0) return;

  const int qdt = qb->dtype;
  const float offset = (!zb && qdt == AMK_I4) ? 8.0f : 0.0f;
  const int tid = threadIdx.x;
  const bool aligned = ((((unsigned long long)qb->ptr) | ((unsigned long long)ob->ptr)) & 15ull) == 0;

  if (qdt == AMK_I4 && aligned && kd % 8 == 0 && group % 8 == 0) {
    /* kd even: rows are kd / 2 bytes with no padding, so word w holds elements [8w, 8w + 8). */
    const uint32_t* q = (const uint32_t*)qb->ptr;
    const long long nw = numel / 8;
    for (long long w = tid; w < nw; w += AMK_THREADS) {
      const uint32_t u = q[w];
      const long long g = (8 * w) / group;
      const float s = amk_ldf(sb, g);
      const float z = zb ? amk_ldf(zb, g) : offset;
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = ((float)((u >> (4 * j)) & 0xfu) - z) * s;
      dq_store<8>(ob, 8 * w, v);
    }
    return;
  }
  if ((qdt == AMK_I8 || qdt == AMK_U8) && aligned && kd % 4 == 0 && group % 4 == 0) {
    const uint32_t* q = (const uint32_t*)qb->ptr;
    const long long nw = numel / 4;
    const bool sgn = qdt == AMK_I8;
    for (long long w = tid; w < nw; w += AMK_THREADS) {
      const uint32_t u = q[w];
      const long long g = (4 * w) / group;
      const float s = amk_ldf(sb, g);
      const float z = zb ? amk_ldf(zb, g) : offset;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b = (u >> (8 * j)) & 0xffu;
        const float qf = sgn ? (float)(int)(signed char)b : (float)b;
        v[j] = (qf - z) * s;
      }
      dq_store<4>(ob, 4 * w, v);
    }
    return;
  }
  /* Generic: one element per step. I4 addressed row-packed (rows of ceil(kd / 2) bytes). */
  const long long rb = (kd + 1) / 2;
  for (long long i = tid; i < numel; i += AMK_THREADS) {
    float qf;
    if (qdt == AMK_I4) {
      const long long row = i / kd, col = i - row * kd;
      qf = (float)((((const uint8_t*)qb->ptr)[row * rb + (col >> 1)] >> (4 * (int)(col & 1))) & 0xfu);
    } else {
      qf = amk_ldf(qb, i);
    }
    const long long g = i / group;
    const float s = amk_ldf(sb, g);
    const float z = zb ? amk_ldf(zb, g) : offset;
    const float v = (qf - z) * s;
    const int dt = ob->dtype;
    if (dt == AMK_F32) ((float*)ob->ptr)[i] = v;
    else if (dt == AMK_BF16) ((uint16_t*)ob->ptr)[i] = amk_f32_to_bf16(v);
    else if (dt == AMK_F16) ((uint16_t*)ob->ptr)[i] = amk_f32_to_f16(v);
    else amk_st_slow(ob, i, v);
  }
}
