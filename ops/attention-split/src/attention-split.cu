/* ATTENTION_SPLIT (code 25): split `s` of KV head `g` of the decode attention (the task's
 * n_off / N_tile = g * n_splits + s), over the rows the position gives it
 * (op_attention_split::split_rows), written as un-normalised [acc | m | l] partials of the
 * group's query heads at n_off; with flags bit 0 (one split a KV head) the heads' rows
 * normalised, acc / l, at n_off of the attention row in its dtype. Semantics:
 * ops/attention-split/src/reference.rs.
 *
 * Direct path (ad_attend, the default; K and V of one vector dtype, head_dim a multiple of 8
 * up to 256, 16-byte aligned caches): the rows straight from the caches into registers, a
 * lane group a row, each group an online softmax of its own, the groups merged once at the
 * end (the section "Direct path" below). Faster than the staged path on splits of 128 rows and
 * more, about even at 64 (docs/perf-notes.md round 43); AMK_AS_DIRECT=0 compiles the staged
 * one instead, for measurements.
 *
 * Staged path (as_attend; K and V of one vector dtype, head_dim a multiple of 8 up to 256,
 * 16-byte aligned caches, rep <= AMK_WARPS, the chunk of rows fitting the task's shared
 * memory): the split's rows go through shared memory a chunk at a time, copied with cp.async
 * (every copy of the chunk in flight at once, the next chunk prefetched into L2), then:
 *  - scores: one cache row a thread, for every query head of the group (q in shared memory,
 *    f32), dims in order;
 *  - softmax: one warp a query head, the chunk's maximum, the rescale factor of the running
 *    (m, l), e_j = exp(s_j - m) in place of the scores;
 *  - values: one pair of dims of one head a thread (a row group of threads each when the pairs
 *    leave threads idle), rows in order, the running sums rescaled once a chunk.
 * Why not the general attention (amk_attention.cuh's amk_att_run, which every other case
 * takes): a split runs once a layer on an SM whose instruction cache holds the projections'
 * code, so its time is the fetch of the code it executes once (docs/perf-notes.md rounds 14
 * and 30). The staged path is a few rolled loops; the general one unrolls rows and heads into
 * thousands of instructions.
 *
 * Probes (traced kernels): 0 the shape worked out, 1 the rows, 2 thread 0 through the
 * attention, 3 (staged path) the first chunk landed; the prologue point: the wait passed.
 *
 * The position is data: read before the wait when nothing in the launch writes it (its
 * descriptor's AMK_BUF_LAUNCH_CONST, as in a decode loop, whose tail writes it after every
 * reader of the pass), else after the wait. An inactive split (no rows at this position)
 * reads and writes nothing, so it does not wait: amk_task_skip_wait. */

/* The staged path on (1, the default) or off (0: every split takes the general path; for
 * measurements). */
#ifndef AMK_AS_STAGED
#define AMK_AS_STAGED 1
#endif
/* The direct path (1, the default: rows straight into registers, ad_attend) before the staged
 * one (0: the staged path, or the general one with AMK_AS_STAGED=0). */
#ifndef AMK_AS_DIRECT
#define AMK_AS_DIRECT 1
#endif
/* Diagnostic probes inside the staged attention's first chunk (4 the scores, 5 the softmax and
 * V landed, 6 the values); off by default (AMK_AS_PROBES=1 turns them on). */
#ifndef AMK_AS_PROBES
#define AMK_AS_PROBES 0
#endif
#if AMK_AS_PROBES
#define AS_PROBE(cond, k) do { if (cond) amk_probe(ctx, k); } while (0)
#else
#define AS_PROBE(cond, k) do { } while (0)
#endif
/* Tasks of up to this many rows take the general path's tiny path (a lane group a head, no
 * staging). On the staged path: every such task (its first chunk lands after the tiny path has
 * finished; docs/perf-notes.md round 30). On the direct path: only the normalised tasks (one
 * split a KV head: the first positions), measured faster there on SmolLM2; a split of partials
 * takes the direct path at every length, as the general path cost the split program 0.03-0.05
 * ms a step at the positions whose last split holds a few rows (round 44). */
#ifndef AMK_AS_MIN_ROWS
#define AMK_AS_MIN_ROWS 8
#endif

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
  bool norm; /* flags bit 0: normalised rows, not partials */
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
  a.norm = (p.flags & 1) != 0;
  AMK_CHECK((p.flags & ~1) == 0 && (!a.norm || a.n_splits == 1), AMK_ERR_PARAM, p.flags);
  AMK_CHECK(ctx.inst->n_inputs == 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  AMK_CHECK(a.hd > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nh > 0, AMK_ERR_PARAM, a.nh);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  AMK_CHECK(isfinite(a.scale), AMK_ERR_PARAM, (long long)__float_as_int(a.scale));
  a.rep = a.nh / a.nkv;
  const long long tile = (long long)a.rep * (a.norm ? a.hd : a.hd + 2);
  const long long row = (long long)a.nkv * a.hd;
  AMK_CHECK(p.N_tile == tile, AMK_ERR_PARAM, p.N_tile);
  AMK_CHECK(p.n_off >= 0 && p.n_off % tile == 0 && p.n_off / tile < (long long)a.nkv * a.n_splits,
            AMK_ERR_PARAM, p.n_off);
  AMK_CHECK(amk_is_float(q->dtype) && amk_is_float(kc->dtype) && amk_is_float(vc->dtype),
            AMK_ERR_DTYPE, q->dtype);
  AMK_CHECK(q->numel == (long long)a.nh * a.hd, AMK_ERR_SHAPE, q->numel);
  AMK_CHECK(kc->numel == vc->numel && kc->numel % row == 0, AMK_ERR_SHAPE, kc->numel);
  AMK_CHECK(a.norm ? amk_is_float(out->dtype) : out->dtype == AMK_F32, AMK_ERR_DTYPE, out->dtype);
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
  const int size = amk_split_size(p, a.n_splits, a.chunk);
  start = (long long)a.split * size;
  return start > p ? 0 : min((long long)size, p + 1 - start);
}

/* ------------------------------------------------------------------------------------------ */
/* Staged path                                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define AS_MAXREP 8 /* query heads a KV head may have on the staged path (score registers) */
#define AS_MAXPP 2  /* (head, dim pair)s a thread may own on the staged path (acc registers) */

/* Where the staged path keeps things in the task's shared memory, and how many rows a chunk
 * takes (every part 16-byte aligned): q (rep x hd f32), the scores (rep x ch f32), the rescale
 * factors and the final maxima (AS_MAXREP f32 each), the row groups' sums (rg - 1 groups x
 * rep x hd f32), the chunk's K rows (`kstride` bytes apart: 16 bytes of padding keep one row
 * a thread free of bank conflicts) and V rows (`vstride` apart). Also this thread's share of
 * the work, worked out once (before the wait when the position allows): the 16-byte piece
 * `kp` of rows `jt`, `jt + rps`, ... of a chunk's copies (jt < 0: none), and the (head, dim
 * pair)s `vr[k]`, `vd[k]` of its value sums (vr < 0: none) over the rows `grp`, `grp + rg`, ...
 * of a chunk. */
struct as_plan {
  int esz, kstride, vstride, ch, rg, pairs;
  int kp, jt, rps, grp;
  int vr[AS_MAXPP], vd[AS_MAXPP];
  float *q, *e, *alpha, *m, *red;
  unsigned char *k, *v;
};

__device__ __forceinline__ int as_al16(int b) { return (b + 15) & ~15; }

/* This thread's share of the copies and of the value sums (as_plan). */
__device__ __forceinline__ void as_plan_thread(const as_args& a, as_plan& s) {
  const int t = threadIdx.x;
  const int pr = s.vstride >> 4; /* 16-byte pieces a row, <= 64 */
  s.rps = AMK_THREADS / pr;
  s.jt = t < s.rps * pr ? t / pr : -1;
  s.kp = t - (t / pr) * pr;
  s.grp = s.rg > 1 ? t / s.pairs : 0;
  const int p0 = t - s.grp * s.pairs;
  const int hp = a.hd >> 1;
#pragma unroll
  for (int k = 0; k < AS_MAXPP; ++k) {
    const int P = p0 + k * AMK_THREADS;
    const bool own = s.grp < s.rg && P < s.pairs && (k == 0 || s.rg == 1);
    s.vr[k] = own ? P / hp : -1;
    s.vd[k] = own ? P - (P / hp) * hp : 0;
  }
}

/* The staged path's plan for the task, or false (the general path then): its dtypes, the
 * alignment, the heads and a chunk of at least 32 rows in ctx.smem_bytes. Descriptors and
 * params only, block-uniform. */
__device__ __forceinline__ bool as_plan_for(const amk_task_ctx& ctx, const as_args& a,
                                            as_plan& s) {
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  if (kc->dtype != vc->dtype || !amk_is_vec(kc->dtype)) return false;
  if ((a.hd & 7) != 0 || a.hd > 256 || a.rep > AS_MAXREP || a.rep > AMK_WARPS) return false;
  if (!amk_al16(kc->ptr) || !amk_al16(vc->ptr)) return false;
  s.pairs = a.rep * (a.hd >> 1);
  if (s.pairs > AS_MAXPP * AMK_THREADS) return false;
  s.rg = s.pairs * 2 <= AMK_THREADS ? min(AMK_THREADS / s.pairs, 4) : 1;
  s.esz = kc->dtype == AMK_F32 ? 4 : 2;
  s.vstride = a.hd * s.esz;
  s.kstride = s.vstride + 16;
  /* the dynamic shared memory by its symbol (ctx.smem is the same bytes): pointers the compiler
   * knows to be shared get shared-memory loads, not generic ones; the fixed parts first, then
   * as many rows a chunk as the rest holds */
  extern __shared__ __align__(16) unsigned char amk_smem[];
  unsigned char* p = amk_smem;
  s.q = (float*)p;
  p += as_al16(a.rep * a.hd * 4);
  s.alpha = (float*)p;
  p += as_al16(AS_MAXREP * 4);
  s.m = (float*)p;
  p += as_al16(AS_MAXREP * 4);
  s.red = (float*)p;
  p += as_al16((s.rg - 1) * a.rep * a.hd * 4);
  const int per_row = s.kstride + s.vstride + 4 * a.rep;
  const int ch = min(((ctx.smem_bytes - (int)(p - amk_smem)) / per_row) & ~31, AMK_THREADS);
  if (ch < 32) return false;
  s.ch = ch;
  s.k = p;
  p += ch * s.kstride;
  s.v = p;
  p += ch * s.vstride;
  s.e = (float*)p;
  as_plan_thread(a, s);
  return true;
}

/* Element i of q as f32 (the activation dtypes inline, others through amk_ldf). */
__device__ __forceinline__ float as_ldq(const amk_buffer_t* q, long long i) {
  if (q->dtype == AMK_BF16) return __uint_as_float((uint32_t)((const uint16_t*)q->ptr)[i] << 16);
  if (q->dtype == AMK_F32) return ((const float*)q->ptr)[i];
  return amk_ldf(q, i);
}

/* Copies rows [j0, j0 + n) of one cache of the split (byte address `b` of its row 0, rows
 * `gstride` bytes apart) into `dst` (rows `stride` bytes apart), 16 bytes a copy, as one
 * group of asynchronous copies (every thread commits one, empty or not, so that the groups
 * count alike in every thread). */
__device__ __forceinline__ void as_stage(const as_plan& s, unsigned char* dst, int stride,
                                         const char* b, long long gstride, int j0, int n) {
  if (s.jt >= 0) {
    const char* src = b + (long long)(j0 + s.jt) * gstride + 16 * s.kp;
    unsigned char* d = dst + s.jt * stride + 16 * s.kp;
    const long long sstep = (long long)s.rps * gstride;
    const int dstep = s.rps * stride;
    for (int j = s.jt; j < n; j += s.rps) {
      amk_cp_async16(d, src);
      src += sstep;
      d += dstep;
    }
  }
  amk_cp_async_commit();
}

/* Prefetches rows [j0, j0 + n) of both caches into L2 (one row a thread). */
__device__ __forceinline__ void as_prefetch(const as_plan& s, const char* kb, const char* vb,
                                            long long gstride, int j0, int n) {
  if ((int)threadIdx.x < n) {
    const long long g = (long long)(j0 + threadIdx.x) * gstride;
    for (int b = 0; b < s.vstride; b += 128) {
      amk_prefetch_l2(kb + g + b);
      amk_prefetch_l2(vb + g + b);
    }
  }
}

/* t + q[d0 .. d0+8) . k[d0 .. d0+8) in order (k: a K row in shared memory, elements of `esz`
 * bytes; q: f32 in shared memory). */
template <int DT>
__device__ __forceinline__ float as_dot8(const unsigned char* kr, const float* qr, int d0, int esz,
                                         float t) {
  att_vec<DT> kv;
#pragma unroll
  for (int x = 0; x < (DT == AMK_F32 ? 2 : 1); ++x) kv.x[x] = ((const uint4*)(kr + d0 * esz))[x];
  float kf[8];
  att_cvt<DT>(kv, kf);
  const float4 q0 = *(const float4*)(qr + d0);
  const float4 q1 = *(const float4*)(qr + d0 + 4);
  t += q0.x * kf[0]; t += q0.y * kf[1]; t += q0.z * kf[2]; t += q0.w * kf[3];
  t += q1.x * kf[4]; t += q1.y * kf[5]; t += q1.z * kf[6]; t += q1.w * kf[7];
  return t;
}

/* The chunk's scores, scaled, into e: item i = r * n + j (head r, row j; consecutive threads
 * take consecutive rows of one head, so their K reads hit distinct banks and their q reads are
 * one broadcast), items i = threadIdx.x, + AMK_THREADS, ...; two partial sums a row (even and
 * odd pieces of 8 dims) halve the chain of dependent adds. */
template <int DT>
__device__ __forceinline__ void as_scores(const as_plan& s, const as_args& a, int n) {
  const int items = n * a.rep;
  for (int i = threadIdx.x; i < items; i += AMK_THREADS) {
    const int r = i / n, j = i - r * n;
    const unsigned char* kr = s.k + j * s.kstride;
    const float* qr = s.q + r * a.hd;
    float t0 = 0.0f, t1 = 0.0f;
    int d0 = 0;
    for (; d0 + 16 <= a.hd; d0 += 16) {
      t0 = as_dot8<DT>(kr, qr, d0, s.esz, t0);
      t1 = as_dot8<DT>(kr, qr, d0 + 8, s.esz, t1);
    }
    if (d0 < a.hd) t0 = as_dot8<DT>(kr, qr, d0, s.esz, t0);
    s.e[r * s.ch + j] = (t0 + t1) * a.scale;
  }
}

/* Warp r's query head: the chunk's scores become e_j = exp(s_j - m) (0 for a -inf score)
 * with m the running maximum, (m, l) updated, and the factor that rescales the running sums
 * (exactly 1 when m did not grow) left in s.alpha[r]. */
__device__ __forceinline__ void as_softmax(const as_plan& s, int n, float& m, float& l) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int lane = threadIdx.x & 31;
  const int r = threadIdx.x >> 5;
  float* e = s.e + r * s.ch;
  float cm = NEG_INF;
  for (int j = lane; j < n; j += 32) cm = fmaxf(cm, e[j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
  const float mn = fmaxf(m, cm);
  const float alpha = mn == m ? 1.0f : expf(m - mn);
  float sum = 0.0f;
  for (int j = lane; j < n; j += 32) {
    const float x = e[j];
    const float v = x == NEG_INF ? 0.0f : expf(x - mn);
    e[j] = v;
    sum += v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  l = l * alpha + sum;
  m = mn;
  if (lane == 0) s.alpha[r] = alpha;
}

/* One row's V pair for a thread (dims 2d, 2d + 1 at `p`) as f32. */
template <int DT>
__device__ __forceinline__ float2 as_v2(const unsigned char* p) {
  if constexpr (DT == AMK_F32) {
    return *(const float2*)p;
  } else {
    const uint32_t w = *(const uint32_t*)p;
    if constexpr (DT == AMK_BF16)
      return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    else
      return make_float2(amk_f16_to_f32((uint16_t)(w & 0xffffu)), amk_f16_to_f32((uint16_t)(w >> 16)));
  }
}

/* This thread's value sums (as_plan's vr, vd): rescaled by the chunk's factor, then its row
 * group's rows of the chunk (group g: a contiguous g-th of them) in order, even and odd rows
 * into two partial sums (added at the end) so that two rows' products are in flight. */
template <int DT>
__device__ __forceinline__ void as_values(const as_plan& s, int n, float (&acc)[AS_MAXPP][2]) {
  const int per = (n + s.rg - 1) / s.rg;
  const int lo = s.grp * per, hi = min(n, lo + per);
#pragma unroll
  for (int k = 0; k < AS_MAXPP; ++k) {
    const int r = s.vr[k];
    if (r < 0) continue;
    const float al = s.alpha[r];
    float a0 = acc[k][0] * al, a1 = acc[k][1] * al, b0 = 0.0f, b1 = 0.0f;
    const float* e = s.e + r * s.ch;
    const unsigned char* vp = s.v + s.vd[k] * 2 * s.esz;
    int j = lo;
#pragma unroll 2
    for (; j + 1 < hi; j += 2) {
      const float e0 = e[j], e1 = e[j + 1];
      const float2 v = as_v2<DT>(vp + j * s.vstride);
      const float2 w = as_v2<DT>(vp + (j + 1) * s.vstride);
      a0 += e0 * v.x;
      a1 += e0 * v.y;
      b0 += e1 * w.x;
      b1 += e1 * w.y;
    }
    if (j < hi) {
      const float2 v = as_v2<DT>(vp + j * s.vstride);
      a0 += e[j] * v.x;
      a1 += e[j] * v.y;
    }
    acc[k][0] = a0 + b0;
    acc[k][1] = a1 + b1;
  }
}

/* The partials: the row groups' sums added in group order, acc (NaN when every score was -inf
 * or NaN, s.m[r] = -inf: the CPU's e_j are NaN then) at n_off + r * (hd + 2) + dims, m and l
 * after them (lane 0 of warp r). The caller has written s.m and passed a barrier. */
__device__ __forceinline__ void as_store(const amk_task_ctx& ctx, const as_plan& s,
                                         const as_args& a, float (&acc)[AS_MAXPP][2], float m,
                                         float l) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const float qnan = __int_as_float(0x7fc00000);
  const int hd = a.hd;
  if (s.rg > 1) { /* one (head, pair) a thread: k = 0 */
    const int at = (s.vr[0] * (hd >> 1) + s.vd[0]) * 2; /* the pair's place in a group's sums */
    if (s.grp > 0 && s.vr[0] >= 0) {
      s.red[(s.grp - 1) * s.pairs * 2 + at] = acc[0][0];
      s.red[(s.grp - 1) * s.pairs * 2 + at + 1] = acc[0][1];
    }
    __syncthreads();
    if (s.grp == 0 && s.vr[0] >= 0)
      for (int g = 1; g < s.rg; ++g) {
        acc[0][0] += s.red[(g - 1) * s.pairs * 2 + at];
        acc[0][1] += s.red[(g - 1) * s.pairs * 2 + at + 1];
      }
  }
  if (a.norm) { /* acc / l into the row's dtype; s.alpha holds each head's l */
    const amk_buffer_t* ob = amk_out(ctx, 0);
    const long long o0 = ctx.inst->params.n_off;
    if (s.grp == 0) {
#pragma unroll
      for (int k = 0; k < AS_MAXPP; ++k) {
        const int r = s.vr[k];
        if (r < 0) continue;
        const bool nan = s.m[r] == NEG_INF;
        const float l = s.alpha[r];
        const long long at = o0 + (long long)r * hd + 2 * s.vd[k];
        amk_stf(ob, at, nan ? qnan : __fdiv_rn(acc[k][0], l));
        amk_stf(ob, at + 1, nan ? qnan : __fdiv_rn(acc[k][1], l));
      }
    }
    return;
  }
  float* out = (float*)amk_out(ctx, 0)->ptr + ctx.inst->params.n_off;
  const int per = hd + 2;
  if (s.grp == 0) {
#pragma unroll
    for (int k = 0; k < AS_MAXPP; ++k) {
      const int r = s.vr[k];
      if (r < 0) continue;
      const bool nan = s.m[r] == NEG_INF;
      out[r * per + 2 * s.vd[k]] = nan ? qnan : acc[k][0];
      out[r * per + 2 * s.vd[k] + 1] = nan ? qnan : acc[k][1];
    }
  }
  const int w = threadIdx.x >> 5;
  if (w < a.rep && (threadIdx.x & 31) == 0) {
    out[w * per + hd] = m;
    out[w * per + hd + 1] = m == NEG_INF ? qnan : l;
  }
}

/* The split's attention on the staged path (as_plan_for passed): rows [start, start + len)
 * of KV head a.kv_head, a chunk of s.ch rows at a time, after the task's wait. K and V are
 * separate copy groups, so a chunk's scores need only its K, and the next chunk's K is in
 * flight while this chunk's softmax and values run (its V while the next scores run); the
 * chunk after that is prefetched into L2. */
template <int DT>
__device__ void as_attend(const amk_task_ctx& ctx, const as_args& a, const as_plan& s,
                          long long start, int len) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const long long gstride = (long long)a.nkv * a.hd * s.esz;
  const long long first = start * gstride + (long long)a.kv_head * a.hd * s.esz;
  const char* kb = (const char*)amk_in(ctx, 1)->ptr + first;
  const char* vb = (const char*)amk_in(ctx, 2)->ptr + first;
  int n = min(len, s.ch);
  as_stage(s, s.k, s.kstride, kb, gstride, 0, n);
  as_stage(s, s.v, s.vstride, vb, gstride, 0, n);
  as_prefetch(s, kb, vb, gstride, n, min(len - n, s.ch));
  const amk_buffer_t* q = amk_in(ctx, 0);
  const long long q0 = (long long)a.kv_head * a.rep * a.hd;
  for (int i = threadIdx.x; i < a.rep * a.hd; i += AMK_THREADS) s.q[i] = as_ldq(q, q0 + i);
  float m = NEG_INF, l = 0.0f; /* warp r's head r */
  float acc[AS_MAXPP][2];
#pragma unroll
  for (int k = 0; k < AS_MAXPP; ++k) acc[k][0] = acc[k][1] = 0.0f;
  for (int j0 = 0; j0 < len; j0 += n) {
    n = min(s.ch, len - j0);
    const int nx = min(s.ch, len - j0 - n); /* the next chunk's rows */
    amk_cp_async_wait_group<1>(); /* this chunk's K (its V may still be in flight) */
    __syncthreads();
    if (j0 == 0) amk_probe(ctx, 3);
    as_scores<DT>(s, a, n);
    __syncthreads(); /* the K rows are read */
    AS_PROBE(j0 == 0, 4);
    if (nx > 0) {
      as_stage(s, s.k, s.kstride, kb, gstride, j0 + n, nx);
      as_prefetch(s, kb, vb, gstride, j0 + n + nx, min(len - j0 - n - nx, s.ch));
    }
    if ((int)(threadIdx.x >> 5) < a.rep) as_softmax(s, n, m, l);
    if (nx > 0) amk_cp_async_wait_group<1>(); /* this chunk's V */
    else amk_cp_async_wait_all();
    __syncthreads();
    AS_PROBE(j0 == 0, 5);
    as_values<DT>(s, n, acc);
    __syncthreads(); /* the V rows and e are read */
    AS_PROBE(j0 == 0, 6);
    if (nx > 0) as_stage(s, s.v, s.vstride, vb, gstride, j0 + n, nx);
  }
  if ((int)(threadIdx.x >> 5) < a.rep && (threadIdx.x & 31) == 0) {
    s.m[threadIdx.x >> 5] = m;
    s.alpha[threadIdx.x >> 5] = l; /* the rescale factors are read: the normalised store's l */
  }
  __syncthreads();
  as_store(ctx, s, a, acc, m, l);
}

/* ------------------------------------------------------------------------------------------ */
/* Direct path                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Query heads a pass over the split's rows takes (their q and acc in registers; more heads
 * would take more passes, the rows then read again from L2): a row group's lanes, 4. A pass
 * costs nearly the same with 4, 2 or 1 heads (the 1B's short program at 256 rows: +0.045 ms a
 * step a pass more, docs/perf-notes.md round 46), so a KV head's query heads stay in one task. */
#define AD_HB 4
/* Rows a lane group takes a batch (4 was slower: docs/perf-notes.md round 44), and how many
 * batches ahead the L2 prefetches run. */
#define AD_B 2
#define AD_PF 4

/* The direct path's layout (ad_plan_for): L lanes a cache row (a power of two, 4..32, L * 8 >=
 * head_dim; lane li holds dims 8li .. 8li+7, idle when li >= head_dim / 8), GW = 32 / L groups
 * a warp, NG groups a block; this thread's group `grp` (global) and its first lane `gbase`;
 * the cross-warp sums `red` (AMK_WARPS x AD_HB x head_dim f32) and maxima/sums `ml` in the
 * task's shared memory. */
struct ad_plan {
  int L, NG, li, grp, gbase, wfirst;
  float *red, *ml;
};

/* The direct path's plan, or false (another path then): K and V of one vector dtype, 16-byte
 * aligned, head_dim a multiple of 8 up to 256, the cross-warp buffers in ctx.smem_bytes.
 * Descriptors and params only, block-uniform but for the lane's own fields. */
__device__ __forceinline__ bool ad_plan_for(const amk_task_ctx& ctx, const as_args& a,
                                            ad_plan& s) {
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  if (kc->dtype != vc->dtype || !amk_is_vec(kc->dtype)) return false;
  if ((a.hd & 7) != 0 || a.hd > 256) return false;
  if (!amk_al16(kc->ptr) || !amk_al16(vc->ptr)) return false;
  if (AMK_WARPS * AD_HB * (a.hd + 2) * 4 > ctx.smem_bytes) return false;
  int L = 4;
  while (L * 8 < a.hd) L <<= 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s.L = L;
  s.NG = AMK_WARPS * (32 / L);
  s.li = lane & (L - 1);
  s.gbase = lane & ~(L - 1);
  s.grp = warp * (32 / L) + lane / L;
  s.wfirst = warp * (32 / L);
  extern __shared__ __align__(16) unsigned char amk_smem[];
  s.red = (float*)amk_smem;
  s.ml = s.red + AMK_WARPS * AD_HB * a.hd;
  return true;
}

/* The lane's pieces of the group's rows of the batch at `base` (row base + i * NG + grp), zero
 * for rows past `len` and idle lanes; `kb`, `vb` the lane's piece of the split's row 0. */
template <int DT>
__device__ __forceinline__ void ad_load(const ad_plan& s, bool act, const char* kb,
                                        const char* vb, long long gstride, int base, int len,
                                        att_vec<DT> (&k)[AD_B], att_vec<DT> (&v)[AD_B]) {
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    const int row = base + i * s.NG + s.grp;
    const bool ok = act && row < len;
    att_vload<DT>(k[i], kb + (long long)row * gstride, ok);
    att_vload<DT>(v[i], vb + (long long)row * gstride, ok);
  }
}

/* L2 prefetches of the group's rows of the batch at `base`: a lane a 128-byte line. */
__device__ __forceinline__ void ad_prefetch(const ad_plan& s, bool line, const char* kb,
                                            const char* vb, long long gstride, int base, int len) {
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    const int row = base + i * s.NG + s.grp;
    if (line && row < len) {
      amk_prefetch_l2(kb + (long long)row * gstride);
      amk_prefetch_l2(vb + (long long)row * gstride);
    }
  }
}

/* One batch into the group's online softmax: the scores of its AD_B rows for the pass's AD_HB
 * heads (dot products over the lane's dims, then a butterfly over the group's lanes, which
 * leaves the same sums in every lane), the running (m, l) of head `hs` = li mod AD_HB in this
 * lane, and acc[head][the lane's dims] rescaled and summed with e_j of each head shuffled from
 * the group's lane holding it (amk_attention.cuh's att_dot8, att_scale8, att_axpy8, which the
 * general path's batches use too). */
template <int DT>
__device__ __forceinline__ void ad_batch(const ad_plan& s, const as_args& a,
                                         const att_vec<DT> (&k)[AD_B], const att_vec<DT> (&v)[AD_B],
                                         const float (&q)[AD_HB][8], int base, int len, float& m,
                                         float& l, float (&acc)[AD_HB][8]) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int hs = s.li & (AD_HB - 1);
  float sc[AD_B];
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    float kf[8];
    att_cvt<DT>(k[i], kf);
    float p[AD_HB];
    att_dot8<AD_HB>(q, kf, p);
    for (int o = 1; o < s.L; o <<= 1) {
#pragma unroll
      for (int r = 0; r < AD_HB; ++r) p[r] += __shfl_xor_sync(ATT_FULL, p[r], o);
    }
#if AD_HB == 4
    const float x = hs == 0 ? p[0] : hs == 1 ? p[1] : hs == 2 ? p[2] : p[3];
#else
    float x = p[0];
#pragma unroll
    for (int r = 1; r < AD_HB; ++r)
      if (hs == r) x = p[r];
#endif
    sc[i] = base + i * s.NG + s.grp < len ? x * a.scale : NEG_INF;
  }
  float e[AD_B];
  const float alpha = att_online<AD_B>(sc, m, l, e);
  int src[AD_HB]; /* the group's lane holding head r's (m, l) */
#pragma unroll
  for (int r = 0; r < AD_HB; ++r) src[r] = s.gbase + r;
  if (__any_sync(ATT_FULL, alpha != 1.0f)) /* warp-uniform; rare once m settles */
    att_scale8<AD_HB>(acc, alpha, src);
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    float vf[8];
    att_cvt<DT>(v[i], vf);
    att_axpy8<AD_HB>(acc, e[i], vf, src);
  }
}

/* The warp's groups merged into its first (M = max m, l = sum l exp(m - M), acc likewise),
 * by shuffles, then left in the task's shared memory for the cross-warp merge. */
__device__ __forceinline__ void ad_warp_merge(const ad_plan& s, const as_args& a, bool act,
                                              float m, float l, float (&acc)[AD_HB][8]) {
#pragma unroll 1
  for (int o = s.L; o < 32; o <<= 1) {
    const float mo = __shfl_xor_sync(ATT_FULL, m, o);
    const float lo = __shfl_xor_sync(ATT_FULL, l, o);
    const float M = fmaxf(m, mo);
    const float wa = m == M ? 1.0f : expf(m - M);
    const float wb = mo == M ? 1.0f : expf(mo - M);
    l = l * wa + lo * wb;
    m = M;
#pragma unroll
    for (int r = 0; r < AD_HB; ++r) {
      const float war = __shfl_sync(ATT_FULL, wa, s.gbase + r);
      const float wbr = __shfl_sync(ATT_FULL, wb, s.gbase + r);
#pragma unroll
      for (int d = 0; d < 8; ++d)
        acc[r][d] = acc[r][d] * war + __shfl_xor_sync(ATT_FULL, acc[r][d], o) * wbr;
    }
  }
  const int warp = threadIdx.x >> 5;
  if (s.gbase == 0) {
    if (act) {
#pragma unroll
      for (int r = 0; r < AD_HB; ++r) {
        float4* p = (float4*)(s.red + (warp * AD_HB + r) * a.hd + 8 * s.li);
        p[0] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        p[1] = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
      }
    }
    if (s.li < AD_HB) {
      s.ml[(warp * AD_HB + s.li) * 2] = m;
      s.ml[(warp * AD_HB + s.li) * 2 + 1] = l;
    }
  }
}

/* The warps' states merged, an element a thread, and stored for heads h0 .. h0 + rb - 1 of the
 * group: partials [acc | m | l] (acc NaN and l NaN when every score was -inf or NaN, m = -inf,
 * as the CPU's e_j are NaN then), or with a.norm the rows acc / l in the row's dtype. */
__device__ __noinline__ void ad_store(const amk_task_ctx& ctx, const ad_plan& s,
                                      const as_args& a, int h0, int rb) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const float qnan = __int_as_float(0x7fc00000);
  const amk_buffer_t* ob = amk_out(ctx, 0);
  const long long o0 = ctx.inst->params.n_off;
  for (int t = threadIdx.x; t < rb * a.hd; t += AMK_THREADS) {
    const int r = t / a.hd, d = t - r * a.hd;
    float M = NEG_INF;
    for (int w = 0; w < AMK_WARPS; ++w) M = fmaxf(M, s.ml[(w * AD_HB + r) * 2]);
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < AMK_WARPS; ++w) {
      const float mw = s.ml[(w * AD_HB + r) * 2];
      const float wt = mw == M ? 1.0f : expf(mw - M);
      L += s.ml[(w * AD_HB + r) * 2 + 1] * wt;
      A += s.red[(w * AD_HB + r) * a.hd + d] * wt;
    }
    const bool nan = M == NEG_INF;
    const int h = h0 + r;
    if (a.norm) {
      amk_stf(ob, o0 + (long long)h * a.hd + d, nan ? qnan : __fdiv_rn(A, L));
    } else {
      float* out = (float*)ob->ptr + o0 + (long long)h * (a.hd + 2);
      out[d] = nan ? qnan : A;
      if (d == 0) {
        out[a.hd] = M;
        out[a.hd + 1] = nan ? qnan : L;
      }
    }
  }
}

/* The split's attention on the direct path (ad_plan_for passed), after the task's wait: rows
 * [start, start + len) of KV head a.kv_head straight from the caches into registers, lane
 * groups of L lanes a row; each group an online softmax over rows grp, grp + NG, ... (AD_B of
 * them a batch, the next batch's loads in flight while one is consumed, L2 prefetches AD_PF
 * batches ahead); then the groups merged (shuffles, then shared memory) and stored. AD_HB query
 * heads a pass. No barrier but the cross-warp merge's: each warp runs at its own pace. */
template <int DT>
__device__ void ad_attend(const amk_task_ctx& ctx, const as_args& a, const ad_plan& s,
                          long long start, int len) {
  constexpr int ESZ = DT == AMK_F32 ? 4 : 2;
  const bool act = s.li < (a.hd >> 3);
  const bool line = act && ((8 * s.li * ESZ) & 127) == 0;
  const long long gstride = (long long)a.nkv * a.hd * ESZ;
  const long long first = start * gstride + ((long long)a.kv_head * a.hd + 8 * s.li) * ESZ;
  const char* kb = (const char*)amk_in(ctx, 1)->ptr + first;
  const char* vb = (const char*)amk_in(ctx, 2)->ptr + first;
  const int step = s.NG * AD_B;
  const amk_buffer_t* qb = amk_in(ctx, 0);
  const bool qvec = amk_is_vec(qb->dtype) && amk_al16(qb->ptr);
  for (int t = 1; t < AD_PF; ++t) ad_prefetch(s, line, kb, vb, gstride, t * step, len);
  for (int h0 = 0; h0 < a.rep; h0 += AD_HB) {
    att_vec<DT> kc[AD_B], vc[AD_B], kn[AD_B], vn[AD_B];
    ad_load<DT>(s, act, kb, vb, gstride, 0, len, kc, vc);
    float q[AD_HB][8], acc[AD_HB][8];
#pragma unroll
    for (int r = 0; r < AD_HB; ++r) {
#pragma unroll
      for (int d = 0; d < 8; ++d) q[r][d] = acc[r][d] = 0.0f;
      if (act && h0 + r < a.rep)
        att_q8(qb, qvec, ((long long)a.kv_head * a.rep + h0 + r) * a.hd + 8 * s.li, q[r]);
    }
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    for (int base = 0; base + s.wfirst < len; base += step) {
      ad_load<DT>(s, act, kb, vb, gstride, base + step, len, kn, vn);
      if (h0 == 0) ad_prefetch(s, line, kb, vb, gstride, base + AD_PF * step, len);
      ad_batch<DT>(s, a, kc, vc, q, base, len, m, l, acc);
#pragma unroll
      for (int i = 0; i < AD_B; ++i) {
        kc[i] = kn[i];
        vc[i] = vn[i];
      }
    }
    if (h0 > 0) __syncthreads(); /* the previous pass's ad_store read the buffers */
    ad_warp_merge(s, a, act, m, l, acc);
    __syncthreads();
    ad_store(ctx, s, a, h0, min(AD_HB, a.rep - h0));
  }
}

/* The general path: amk_att_run on views of the operands narrowed to the group (q from head
 * g * rep, the caches from element g * head_dim of a row, which keep their n_kv_heads *
 * head_dim stride, the output from n_off): one KV head of `rep` query heads. */
__device__ __noinline__ void as_general(const amk_task_ctx& ctx, const as_args& a,
                                        long long start, int len) {
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const long long row = (long long)a.nkv * a.hd;
  const amk_buffer_t qv = as_view(q, (long long)a.kv_head * a.rep * a.hd, (long long)a.rep * a.hd);
  const amk_buffer_t kv = as_view(kc, (long long)a.kv_head * a.hd, kc->numel - (long long)a.kv_head * a.hd);
  const amk_buffer_t vv = as_view(vc, (long long)a.kv_head * a.hd, vc->numel - (long long)a.kv_head * a.hd);
  const long long tile = (long long)a.rep * (a.norm ? a.hd : a.hd + 2);
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
  g.kv_len = len;
  g.scale = a.scale;
  g.partial = !a.norm;
  amk_att_run(&qv, &kv, &vv, &ov, g);
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
  const int dt = amk_in(ctx, 1)->dtype;
#if AMK_AS_DIRECT
  ad_plan s;
  const bool fast = (!a.norm || len > AMK_AS_MIN_ROWS) && ad_plan_for(ctx, a, s);
#elif AMK_AS_STAGED
  as_plan s;
  const bool fast = len > AMK_AS_MIN_ROWS && as_plan_for(ctx, a, s);
#endif
  if (!late && !amk_task_wait(ctx)) return;
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
#if AMK_AS_DIRECT
  if (fast && AMK_IS_BF16(dt)) ad_attend<AMK_BF16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F16(dt)) ad_attend<AMK_F16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F32(dt)) ad_attend<AMK_F32>(ctx, a, s, start, (int)len);
  else
#elif AMK_AS_STAGED
  if (fast && AMK_IS_BF16(dt)) as_attend<AMK_BF16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F16(dt)) as_attend<AMK_F16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F32(dt)) as_attend<AMK_F32>(ctx, a, s, start, (int)len);
  else
#endif
    as_general(ctx, a, start, (int)len);
  amk_probe(ctx, 2); /* the attention run (thread 0's part: its stores issued) */
}
