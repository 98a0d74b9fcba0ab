/* amk_attention.cuh — decode attention over cache rows [kv_start, kv_start + kv_len), shared by
 * ATTENTION_TILE (code 7; it stores the result) and ATTENTION_GEMV (code 23; it keeps the
 * result in shared memory and multiplies it by its rows of the output projection).
 *
 * Semantics (ops/attention-tile/src/reference.rs): query head h of batch b reads kv head
 * h / (n_heads / n_kv_heads); s_j = (q . k_j) * scale, m = max_j s_j, e_j = exp(s_j - m),
 * l = sum e_j, acc = sum e_j v_j; the output is acc / l, or with flags & 2 (a split-KV shard)
 * the un-normalised [acc | m | l] per head (an empty shard writes acc = 0, m = -inf, l = 0).
 * Cache [max_seq, n_kv, hd] (any rank but 4, viewed flat) or batched [B, max_seq, n_kv, hd]
 * (rank 4; the value cache is read with the key cache's geometry, as the CPU does).
 * With a position input (element 0 of an integer buffer, p) the params are a static window that
 * the position clips: kv_len becomes min(kv_len, max(0, p + 1 - kv_start)) (amk_att_pos_len,
 * through amk_att_setup), and every path below sees only that geometry.
 * fp32 throughout (the CPU is fp32), expf (never __expf), IEEE division.
 *
 * Fast path (K and V both F32, BF16 or F16, head_dim a multiple of 8 and <= 256, both caches
 * 16-byte aligned): bandwidth-bound, every K and V row read once per block.
 *  - A "segment" is one cache row of one kv head (head_dim elements). L lanes (a power of two,
 *    4..32, L * 8 >= head_dim) form a group that owns a segment: lane li holds dims
 *    8li .. 8li+7 as one 16-byte vector (two for F32). A warp has 32 / L groups.
 *  - A work unit is (batch b, kv head g, chunk of up to 4 of the rep query heads sharing g):
 *    the chunk's q vectors live in registers, so each K/V row is read once for all of them.
 *    Units are spread over the block's groups (GPU = a power of two groups per unit, a unit's
 *    groups contiguous, no more than its rows need); a unit's rows are dealt round-robin to its
 *    groups in batches of R rows per group (4, F32 2; 1 for ranges up to ATT_SHORT_KV rows:
 *    reached when the tiny path is not, e.g. head_dim 96),
 *    the next batch's loads issued before the current one is consumed, and L2 prefetches
 *    issued ATT_PF_AHEAD batches ahead (no registers held).
 *  - Scores: 4 partial dot products per lane (its q registers hold the heads in a lane-
 *    dependent order, so the reduce-scatter needs no selects), a reduce-scatter across the
 *    group's lanes leaves the full score of query head hr = 2*[li & L/2] + [li & L/4] in each
 *    lane, which runs the online softmax (m, l) of that head; e_j and the rescale factors
 *    reach the other lanes by shuffle, and every lane updates acc[4 heads][its 8 dims] (the
 *    rescale is skipped, warp-uniformly, when no lane's maximum grew).
 *  - Online softmax per group (fp32): m only grows; the rescale factor is exactly 1 when it
 *    does not, else expf(m_old - m_new). Groups of a unit are merged by the standard combine
 *    (M = max m_w, l = sum l_w exp(m_w - M), acc = sum acc_w exp(m_w - M)): by shuffles inside
 *    a warp, then (units spanning several warps) through a static shared buffer.
 *  - Rows whose score is -inf contribute e = 0 (as the CPU does whenever the final maximum is
 *    finite); when every score is -inf (or NaN) the CPU's l and acc are NaN, and so are ours.
 * Tiny path (the fast path's cases with kv_len <= ATT_TINY_KV and head_dim / 8 a power of two):
 * a group of head_dim / 8 lanes per query head, every head of the block at once (att_tiny).
 * Other cases (fp8 caches, mixed K/V dtypes, odd or > 256 head_dim, unaligned caches) take the
 * generic path: one warp per (batch, query head), rows in chunks of 32:
 *  - scores: every lane accumulates partial dot products of its dims (d = lane + 32k) for all
 *    32 rows of the chunk, then a butterfly reduce-scatter leaves row t's dot product in lane t;
 *  - online softmax over the chunks as above; acc: lanes own dims, e_t broadcast by shuffle;
 *  - head_dim > 256 runs the online pass once per 256-dim slice of acc (scores recomputed).
 */

#ifndef AMK_ATTENTION_CUH
#define AMK_ATTENTION_CUH

#define ATT_SLICE_K 8   /* generic path: acc registers per lane, 8 x 32 = 256 dims per pass */
#define ATT_RB 4        /* fast path: query heads per work unit */
#define ATT_SLOT 256    /* fast path: floats per warp in the cross-warp combine buffer */
#define ATT_PF_AHEAD 4  /* fast path: L2 prefetch distance, in batches */
#define ATT_SHORT_KV 32 /* fast path: kv_len up to this takes one row per group and batch */
#define ATT_TINY_KV 32  /* kv_len up to this takes the tiny path (a lane group per query head) */

#define ATT_FULL 0xffffffffu

/* ------------------------------------------------------------------------------------------ */
/* Fast path                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* One lane's 8 elements of a cache row: one 16-byte vector (two for F32). */
template <int DT>
struct att_vec {
  uint4 x[DT == AMK_F32 ? 2 : 1];
};

/* v = the lane's vector at byte address p, or zeros when !ok (rows past the range, idle lanes). */
template <int DT>
__device__ __forceinline__ void att_vload(att_vec<DT>& v, const char* p, bool ok) {
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  if constexpr (DT == AMK_F32) {
    v.x[0] = z;
    v.x[1] = z;
    if (ok) {
      v.x[0] = ((const uint4*)p)[0];
      v.x[1] = ((const uint4*)p)[1];
    }
  } else {
    v.x[0] = z;
    if (ok) v.x[0] = *(const uint4*)p;
  }
}

template <int DT>
__device__ __forceinline__ void att_cvt(const att_vec<DT>& v, float (&f)[8]) {
  if constexpr (DT == AMK_F32) {
    f[0] = __uint_as_float(v.x[0].x); f[1] = __uint_as_float(v.x[0].y);
    f[2] = __uint_as_float(v.x[0].z); f[3] = __uint_as_float(v.x[0].w);
    f[4] = __uint_as_float(v.x[1].x); f[5] = __uint_as_float(v.x[1].y);
    f[6] = __uint_as_float(v.x[1].z); f[7] = __uint_as_float(v.x[1].w);
  } else {
    const uint32_t w[4] = {v.x[0].x, v.x[0].y, v.x[0].z, v.x[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (DT == AMK_BF16) {
        f[2 * k] = __uint_as_float(w[k] << 16);
        f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
      } else {
        f[2 * k] = amk_f16_to_f32((uint16_t)(w[k] & 0xffffu));
        f[2 * k + 1] = amk_f16_to_f32((uint16_t)(w[k] >> 16));
      }
    }
  }
}

/* p[r] = q[r] . kf over a lane's 8 dims, for N query heads (dims in order). */
template <int N>
__device__ __forceinline__ void att_dot8(const float (&q)[N][8], const float (&kf)[8], float (&p)[N]) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    float t = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; ++d) t += q[r][d] * kf[d];
    p[r] = t;
  }
}

/* acc[r] *= x of lane src[r], for N heads (the lane holding head r's running state). */
template <int N>
__device__ __forceinline__ void att_scale8(float (&acc)[N][8], float x, const int (&src)[N]) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float xr = __shfl_sync(ATT_FULL, x, src[r]);
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[r][d] *= xr;
  }
}

/* acc[r] += e (of lane src[r]) * vf, for N heads: one V row into the heads' sums. */
template <int N>
__device__ __forceinline__ void att_axpy8(float (&acc)[N][8], float e, const float (&vf)[8],
                                          const int (&src)[N]) {
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float er = __shfl_sync(ATT_FULL, e, src[r]);
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[r][d] += er * vf[d];
  }
}

/* First two levels of a reduce-scatter of the 4 heads' partial dot products over the L lanes
 * of a group (o1 = L/2, o2 = L/4). The lane's own head is hr = 2*[li & o1] + [li & o2], and
 * its partial sums come permuted: p[r] belongs to head r ^ hr. Then the heads a lane keeps
 * at each level are always p[0], p[1] (level 1) and q0 (level 2), and its partner sends
 * exactly the same heads (the partner's hr differs in that level's bit), so no selects are
 * needed. Returns head hr's sum over the 4 lanes li ^ {0, o1, o2, o1|o2}; the remaining
 * butterfly levels (xor o2/2 .. 1) follow in the caller. */
__device__ __forceinline__ float att_rs2(const float (&p)[ATT_RB], int o1, int o2) {
  const float q0 = p[0] + __shfl_xor_sync(ATT_FULL, p[2], o1); /* head hr       */
  const float q1 = p[1] + __shfl_xor_sync(ATT_FULL, p[3], o1); /* head hr ^ 1   */
  return q0 + __shfl_xor_sync(ATT_FULL, q1, o2);              /* head hr, 4 lanes */
}

/* R scores into a running online softmax (m, l): e_j = exp(s_j - m') for the new maximum m'
 * (0 for a -inf score, also when m' is -inf), l rescaled and added to, m = m'; returns the
 * factor that rescales sums made under the old m (exactly 1 when m did not grow, also -inf to
 * -inf). expf evaluated unconditionally, then selected: no branches. */
template <int R>
__device__ __forceinline__ float att_online(const float (&sc)[R], float& m, float& l,
                                            float (&e)[R]) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  float m_new = m;
#pragma unroll
  for (int i = 0; i < R; ++i) m_new = fmaxf(m_new, sc[i]);
  const float ea = expf(m - m_new);
  const float alpha = (m_new == m) ? 1.0f : ea;
  float es = 0.0f;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float x = expf(sc[i] - m_new);
    e[i] = (sc[i] == NEG_INF) ? 0.0f : x;
    es += e[i];
  }
  l = l * alpha + es;
  m = m_new;
  return alpha;
}

/* A lane's 8 fp32 values (passed by value, in registers, to the out-of-line helpers). */
struct att_f8 {
  float v[8];
};

/* q elements qe .. qe+7 as f32, any float dtype (the rare non-vector q dtypes, or an unaligned
 * q). Out of line: keeps the instantiations small. */
__device__ __noinline__ att_f8 att_ld_q8(const amk_buffer_t* q, long long qe) {
  att_f8 r;
#pragma unroll
  for (int d = 0; d < 8; ++d) r.v[d] = amk_ldf(q, qe + d);
  return r;
}

/* q elements qe .. qe+7 into f as f32: one vector load when q is a vector dtype at a 16-byte
 * aligned base (`qvec`; qe is a multiple of 8), else att_ld_q8. */
__device__ __forceinline__ void att_q8(const amk_buffer_t* q, bool qvec, long long qe, float (&f)[8]) {
  if (qvec) {
    amk_ld8(q->ptr, q->dtype, qe >> 3, f);
  } else {
    const att_f8 t = att_ld_q8(q, qe);
#pragma unroll
    for (int d = 0; d < 8; ++d) f[d] = t.v[d];
  }
}

/* Stores 8 consecutive fp32 values at element e of out: one 16-byte store for F16/BF16, two for
 * F32, when the address is 16-byte aligned; element by element otherwise (partial outputs,
 * whose heads are hd + 2 long). The descriptor is read once, before any store. */
__device__ __forceinline__ void att_st8(const amk_buffer_t* out, long long e, const float (&v)[8]) {
  const int dt = out->dtype;
  char* const base = (char*)out->ptr;
  if (dt == AMK_BF16 || dt == AMK_F16) {
    uint16_t* const q = (uint16_t*)base + e;
    if ((((unsigned long long)q) & 15u) == 0) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t lo = AMK_BF_OF(dt) ? amk_f32_to_bf16(v[2 * k]) : amk_f32_to_f16(v[2 * k]);
        const uint32_t hi =
            AMK_BF_OF(dt) ? amk_f32_to_bf16(v[2 * k + 1]) : amk_f32_to_f16(v[2 * k + 1]);
        w[k] = lo | (hi << 16);
      }
      *(uint4*)q = make_uint4(w[0], w[1], w[2], w[3]);
      return;
    }
  } else if (dt == AMK_F32) {
    float* const q = (float*)base + e;
    if ((((unsigned long long)q) & 15u) == 0) {
      ((float4*)q)[0] = make_float4(v[0], v[1], v[2], v[3]);
      ((float4*)q)[1] = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
  }
#pragma unroll
  for (int d = 0; d < 8; ++d) amk_stf(out, e + d, v[d]);
}

/* Stores one head's result: lane li's 8 dims (when act), and m, l (lane 0, partial). Every
 * score -inf or NaN (kv_len > 0, m = -inf): the CPU's e_j are all NaN, hence l and acc.
 * Out of line (once per head and lane). */
__device__ __noinline__ void att_store_head(const amk_buffer_t* out, long long base, int hd,
                                            int li, bool act, att_f8 a, float m, float l,
                                            bool partial, int kv_len) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const bool nan = kv_len > 0 && m == NEG_INF;
  const float qnan = __int_as_float(0x7fc00000);
  if (nan) l = qnan;
  if (act) {
    float v[8];
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      const float x = nan ? qnan : a.v[d];
      v[d] = partial ? x : __fdiv_rn(x, l);
    }
    att_st8(out, base + 8 * li, v);
  }
  if (partial && li == 0) {
    amk_stf(out, base + hd, m);
    amk_stf(out, base + hd + 1, l);
  }
}

/* Cross-warp combine buffer of the fast path (one per block, shared by its instantiations). */
__shared__ __align__(16) float att_s_acc[AMK_WARPS * ATT_SLOT];
__shared__ float att_s_ml[AMK_WARPS * ATT_RB * 2];

/* The cross-warp combine of heads r0 .. min(r0 + HPR, rb) - 1 of a unit whose WU warps
 * (warp .. warp + WU - 1) left their states in att_s_acc / att_s_ml, and the store of the
 * result (lane li's dims). Out of line: one copy for every instantiation. */
__device__ __noinline__ void att_xwarp_store(const amk_buffer_t* out, int warp, int WU, int r0,
                                             int HPR, int rb, int L, int li, bool act,
                                             long long obase, long long per_head, int hd,
                                             bool partial, int kv_len) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  for (int r = r0; r < r0 + HPR && r < rb; ++r) {
    float M = NEG_INF;
    for (int w = 0; w < WU; ++w) M = fmaxf(M, att_s_ml[((warp + w) * ATT_RB + r) * 2]);
    float lt = 0.0f;
    att_f8 a;
#pragma unroll
    for (int d = 0; d < 8; ++d) a.v[d] = 0.0f;
    for (int w = 0; w < WU; ++w) {
      const float mw = att_s_ml[((warp + w) * ATT_RB + r) * 2];
      const float lw = att_s_ml[((warp + w) * ATT_RB + r) * 2 + 1];
      const float wt = (mw == M) ? 1.0f : expf(mw - M);
      lt += lw * wt;
      if (act) {
        const float* sp = att_s_acc + (warp + w) * ATT_SLOT + (r - r0) * (L * 8) + 8 * li;
#pragma unroll
        for (int d = 0; d < 8; ++d) a.v[d] += sp[d] * wt;
      }
    }
    att_store_head(out, obase + r * per_head, hd, li, act, a, M, lt, partial, kv_len);
  }
}

template <int DT, int R> /* R: rows per group per batch */
__device__ void att_fast(const amk_buffer_t* q, const amk_buffer_t* kc, const amk_buffer_t* vc,
                         const amk_buffer_t* out, int hd, int nh, int nkv, int rep,
                         long long batch, long long row, long long per_batch, long long kv_start,
                         int kv_len, float scale, bool partial) {
  float* const s_acc = att_s_acc;
  float* const s_ml = att_s_ml;

  const float NEG_INF = -__int_as_float(0x7f800000);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nv = hd >> 3; /* 8-element vectors per segment, 1..32 */
  int lg = 2;
  while ((1 << lg) < nv) ++lg;
  const int L = 1 << lg;      /* lanes per group, 4..32 */
  const int GW = 32 >> lg;    /* groups per warp */
  const int NG = AMK_WARPS * GW;
  const int li = lane & (L - 1);
  const int gw = lane >> lg;
  const int G = warp * GW + gw;
  const int o1 = L >> 1, o2 = L >> 2;
  const int hr = ((li & o1) ? 2 : 0) + ((li & o2) ? 1 : 0);
  int src[ATT_RB]; /* the lane of this group holding head r's m, l */
#pragma unroll
  for (int r = 0; r < ATT_RB; ++r) src[r] = (lane & ~(L - 1)) + ((r & 2) ? o1 : 0) + ((r & 1) ? o2 : 0);
  const bool act = li < nv;
  const int nrc = (rep + ATT_RB - 1) / ATT_RB;
  const int U = (int)(batch * nkv * nrc); /* < 2^31: checked by the caller */
  const long long per_head = partial ? (long long)hd + 2 : (long long)hd;
  const bool qvec = amk_is_vec(q->dtype) && (((unsigned long long)q->ptr) & 15u) == 0;

  for (int u0 = 0; u0 < U; u0 += NG) {
    const int UC = min(U - u0, NG);
    /* groups per unit: as many as the block has for the units, but no more than the rows
     * need (a group takes R rows a batch; an idle group would only cost merges) */
    int lgp = 0;
    while ((2 << lgp) * UC <= NG && (1 << lgp) * R < kv_len) ++lgp;
    const int GPU = 1 << lgp;
    const int ui = G >> lgp;
    const int sub = G & (GPU - 1);
    const bool gact = ui < UC;
    const int u = u0 + (gact ? ui : 0);
    const int rc = u % nrc;
    const int bg = u / nrc;
    const int g = bg % nkv;
    const long long b = bg / nkv;
    const int hq0 = g * rep + rc * ATT_RB;
    const int rb = min(ATT_RB, rep - rc * ATT_RB);
    const long long bh0 = b * nh + hq0;

    float qr[ATT_RB][8]; /* q of the unit's heads (qr[r]: head r ^ hr), this lane's dims */
    float m = NEG_INF, l = 0.0f;
    float acc[ATT_RB][8];
#pragma unroll
    for (int r = 0; r < ATT_RB; ++r)
#pragma unroll
      for (int d = 0; d < 8; ++d) acc[r][d] = 0.0f;

    /* Byte addresses: the group's row j = j0 + i*GPU + sub (i < R) of the batch at j0 lies at
     * base + (j0 + sub) * rowb + off[i]; it exists iff j0 < lim[i] (never for idle groups). */
    constexpr int ESZ = DT == AMK_F32 ? 4 : 2;
    const long long rowb = row * ESZ;
    const int step = GPU * R; /* rows per batch of the unit */
    const long long bstep = (long long)step * rowb;
    const long long e0 = b * per_batch + (kv_start + sub) * row + (long long)g * hd + 8 * li;
    const char* kld = (const char*)kc->ptr + e0 * ESZ; /* the next batch to load */
    const char* vld = (const char*)vc->ptr + e0 * ESZ;
    long long off[R];
    int lim[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      off[i] = (long long)i * GPU * rowb;
      lim[i] = gact ? kv_len - sub - i * GPU : -1;
    }
    /* L2 prefetch, ATT_PF_AHEAD batches ahead: a batch of a group is R rows x (K, V) x nl
     * 128-byte lines; lane li takes line slots li, li + L, ... (fixed per lane). */
    const int nl = (hd * ESZ + 127) >> 7;
    const int nslot = R * 2 * nl;
    int pst[2], plim[2];
    long long po[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int sl = li + k * L; /* nslot <= 2L for every fast-path shape */
      const int si = sl / (2 * nl);
      pst[k] = (sl / nl) & 1;
      plim[k] = -1;
      po[k] = (long long)ATT_PF_AHEAD * bstep + 128 * (sl % nl) - 8 * li * ESZ;
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (sl < nslot && si == i) {
          po[k] += off[i];
          plim[k] = lim[i];
        }
    }
    /* prefetch of the batch ATT_PF_AHEAD after the one at jl, whose row-0 addresses are kp, vp */
    auto prefetch = [&](int jl, const char* kp, const char* vp) {
      const int jp = jl + ATT_PF_AHEAD * step;
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (jp < plim[k]) amk_prefetch_l2((pst[k] ? vp : kp) + po[k]);
    };
    auto load = [&](att_vec<DT>(&kb)[R], att_vec<DT>(&vb)[R], int jl, const char* kp,
                    const char* vp) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const bool ok = act && jl < lim[i];
        att_vload<DT>(kb[i], kp + off[i], ok);
        att_vload<DT>(vb[i], vp + off[i], ok);
      }
    };
    auto process = [&](const att_vec<DT>(&kb)[R], const att_vec<DT>(&vb)[R], int j0) {
      float sc[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float kf[8];
        att_cvt<DT>(kb[i], kf);
        float p[ATT_RB];
        att_dot8<ATT_RB>(qr, kf, p);
        sc[i] = att_rs2(p, o1, o2);
      }
      /* the remaining butterfly levels, all R rows at once (identical sums in every lane of a
       * head: fp32 addition commutes) */
      for (int o = o2 >> 1; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < R; ++i) sc[i] += __shfl_xor_sync(ATT_FULL, sc[i], o);
      }
#pragma unroll
      for (int i = 0; i < R; ++i) sc[i] = j0 < lim[i] ? sc[i] * scale : NEG_INF;
      float e[R];
      const float alpha = att_online<R>(sc, m, l, e);
      if (__any_sync(ATT_FULL, alpha != 1.0f)) { /* warp-uniform; rare once m settles */
        att_scale8<ATT_RB>(acc, alpha, src);
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float vf[8];
        att_cvt<DT>(vb[i], vf);
        att_axpy8<ATT_RB>(acc, e[i], vf, src);
      }
    };

    /* ---- the rows: two register buffers (the next batch's loads in flight while one is
     * consumed), L2 prefetches ATT_PF_AHEAD batches ahead ---- */
    for (int t = 1; t < ATT_PF_AHEAD; ++t) /* batch 0 is loaded at once */
      prefetch((t - ATT_PF_AHEAD) * step, kld + (t - ATT_PF_AHEAD) * bstep,
               vld + (t - ATT_PF_AHEAD) * bstep);
    att_vec<DT> ka[R], va[R], kb[R], vb[R];
    int jl = 0;
    prefetch(jl, kld, vld);
    load(ka, va, jl, kld, vld);
    jl += step;
    kld += bstep;
    vld += bstep;
    /* q of the unit's heads, this lane's dims, qr[r] holding head r ^ hr (0 for absent heads
     * and idle lanes); loaded after the first batch's K/V loads are in flight */
#pragma unroll
    for (int r = 0; r < ATT_RB; ++r) {
#pragma unroll
      for (int d = 0; d < 8; ++d) qr[r][d] = 0.0f;
      const int hh = r ^ hr; /* permuted: see att_rs2 */
      if (gact && act && hh < rb) att_q8(q, qvec, (bh0 + hh) * hd + 8 * li, qr[r]);
    }
    for (int j0 = 0; j0 < kv_len;) {
      prefetch(jl, kld, vld);
      load(kb, vb, jl, kld, vld);
      jl += step;
      kld += bstep;
      vld += bstep;
      process(ka, va, j0);
      j0 += step;
      if (j0 >= kv_len) break;
      prefetch(jl, kld, vld);
      load(ka, va, jl, kld, vld);
      jl += step;
      kld += bstep;
      vld += bstep;
      process(kb, vb, j0);
      j0 += step;
    }

    /* ---- merge the unit's groups inside the warp ---- */
    const int span = GPU < GW ? GPU : GW;
#pragma unroll 1
    for (int o = L; o < span * L; o <<= 1) {
      const float mo = __shfl_xor_sync(ATT_FULL, m, o);
      const float lo = __shfl_xor_sync(ATT_FULL, l, o);
      const float M = fmaxf(m, mo);
      const float wa = (m == M) ? 1.0f : expf(m - M);
      const float wb = (mo == M) ? 1.0f : expf(mo - M);
      l = l * wa + lo * wb;
      m = M;
#pragma unroll
      for (int r = 0; r < ATT_RB; ++r) {
        const float war = __shfl_sync(ATT_FULL, wa, src[r]);
        const float wbr = __shfl_sync(ATT_FULL, wb, src[r]);
#pragma unroll
        for (int d = 0; d < 8; ++d)
          acc[r][d] = acc[r][d] * war + __shfl_xor_sync(ATT_FULL, acc[r][d], o) * wbr;
      }
    }

    if (GPU <= GW) {
      /* the unit lives in one warp: its first group writes */
      float mr[ATT_RB], lr[ATT_RB];
#pragma unroll
      for (int r = 0; r < ATT_RB; ++r) {
        mr[r] = __shfl_sync(ATT_FULL, m, src[r]);
        lr[r] = __shfl_sync(ATT_FULL, l, src[r]);
      }
      if (gact && sub == 0) {
#pragma unroll
        for (int r = 0; r < ATT_RB; ++r) {
          if (r < rb) {
            att_f8 a;
#pragma unroll
            for (int d = 0; d < 8; ++d) a.v[d] = acc[r][d];
            att_store_head(out, (bh0 + r) * per_head, hd, li, act, a, mr[r], lr[r], partial,
                           kv_len);
          }
        }
      }
    } else {
      /* the unit spans WU warps (block-uniform branch): merge their states through shared
       * memory, HPR heads per round; the unit's first warp writes */
      const int WU = GPU / GW;
      const int HPR = GW < ATT_RB ? GW : ATT_RB;
      const bool lead = gact && gw == 0 && (warp & (WU - 1)) == 0;
      for (int r0 = 0; r0 < ATT_RB; r0 += HPR) {
        __syncthreads(); /* the previous round's (or chunk's) readers are done */
        if (gw == 0) {
#pragma unroll
          for (int r = 0; r < ATT_RB; ++r)
            if (act && r >= r0 && r < r0 + HPR) {
              float* dst = s_acc + warp * ATT_SLOT + (r - r0) * (L * 8) + 8 * li;
#pragma unroll
              for (int d = 0; d < 8; ++d) dst[d] = acc[r][d];
            }
          if ((li & (o2 - 1)) == 0) { /* the lane holding head hr's m, l (= src[hr]) */
            s_ml[(warp * ATT_RB + hr) * 2] = m;
            s_ml[(warp * ATT_RB + hr) * 2 + 1] = l;
          }
        }
        __syncthreads();
        if (lead)
          att_xwarp_store(out, warp, WU, r0, HPR, rb, L, li, act, bh0 * per_head, per_head, hd,
                          partial, kv_len);
      }
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Tiny path                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* A lane's share of one group of heads on the tiny path: its query head bh (act: bh < batch *
 * nh) and the address of its dims of that head's K and V rows at kv_start. From descriptors and
 * params alone (att_tiny_at), so an ATTENTION_TILE computes it before its wait
 * (amk_att_tiny_pre). */
struct att_tiny_lane {
  const char* kp;
  const char* vp;
  long long bh;
  bool act;
};

/* The lane's share of the group of heads from w0 (w0 + lane / G is its head). `esz`: the
 * caches' element size. */
__device__ __forceinline__ att_tiny_lane att_tiny_at(const amk_buffer_t* kc, const amk_buffer_t* vc,
                                                     int esz, int hd, int nh, int rep, long long nbh,
                                                     long long row, long long per_batch,
                                                     long long kv_start, long long w0) {
  const int lane = threadIdx.x & 31;
  const int G = hd >> 3;
  att_tiny_lane L;
  L.bh = w0 + lane / G;
  L.act = L.bh < nbh;
  /* 32-bit division where the heads fit (always, in practice): a 64-bit one is a call */
  long long b = 0;
  int h = 0;
  if (L.act) {
    if (nbh <= 0x7fffffffLL) {
      const int bhi = (int)L.bh;
      const int bi = bhi / nh;
      b = bi;
      h = bhi - bi * nh;
    } else {
      b = L.bh / nh;
      h = (int)(L.bh - b * nh);
    }
  }
  const long long e0 = b * per_batch + kv_start * row + (long long)(h / rep) * hd + 8 * (lane & (G - 1));
  L.kp = (const char*)kc->ptr + e0 * esz;
  L.vp = (const char*)vc->ptr + e0 * esz;
  return L;
}

/* One group of heads on the tiny path, after the wait: the lane's K/V rows, q, the rows' loop,
 * the store (att_tiny). */
template <int DT>
__device__ __forceinline__ void att_tiny_group(const att_tiny_lane& L, const amk_buffer_t* q, bool qvec,
                                               const amk_buffer_t* out, int hd, long long row,
                                               int kv_len, float scale, bool partial) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  constexpr int ESZ = DT == AMK_F32 ? 4 : 2;
  const int lane = threadIdx.x & 31;
  const int G = hd >> 3; /* lanes per head, a power of two */
  const int li = lane & (G - 1);
  const long long per_head = partial ? (long long)hd + 2 : (long long)hd;
  const long long rowb = row * ESZ;
  const bool act = L.act;
  const char* const kp = L.kp;
  const char* const vp = L.vp;
  att_vec<DT> kb, vb;
  /* an empty range reads nothing: its kv_start may be max_seq (a trailing split-KV shard) */
  att_vload<DT>(kb, kp, act && kv_len > 0);
  att_vload<DT>(vb, vp, act && kv_len > 0);
  float qf[8];
#pragma unroll
  for (int d = 0; d < 8; ++d) qf[d] = 0.0f;
  if (act) att_q8(q, qvec, L.bh * hd + 8 * li, qf);
  float m = NEG_INF, l = 0.0f;
  att_f8 a;
#pragma unroll
  for (int d = 0; d < 8; ++d) a.v[d] = 0.0f;
  for (int j = 0; j < kv_len; ++j) {
    const bool more = j + 1 < kv_len;
    att_vec<DT> kn, vn;
    att_vload<DT>(kn, kp + (j + 1) * rowb, act && more);
    att_vload<DT>(vn, vp + (j + 1) * rowb, act && more);
    float kf[8];
    att_cvt<DT>(kb, kf);
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; ++d) s += qf[d] * kf[d];
    for (int o = G >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(ATT_FULL, s, o);
    s *= scale;
    AMK_PROBE_IF(1, 6, j == 0 && s != -1.0f); /* the first row's score: q and k have landed */
    const float m_new = fmaxf(m, s);
    const float ea = expf(m - m_new);
    const float alpha = (m_new == m) ? 1.0f : ea;
    const float x = expf(s - m_new);
    const float e = (s == NEG_INF) ? 0.0f : x;
    l = l * alpha + e;
    m = m_new;
    float vf[8];
    att_cvt<DT>(vb, vf);
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      a.v[d] *= alpha;
      a.v[d] += e * vf[d];
    }
    kb = kn;
    vb = vn;
  }
  AMK_PROBE_IF(1, 7, a.v[0] != -1.0f && l != -1.0f); /* the rows done, before the store */
  if (act) att_store_head(out, L.bh * per_head, hd, li, true, a, m, l, partial, kv_len);
}

/* The fast path's dtypes and alignment, kv_len <= ATT_TINY_KV and G = head_dim / 8 a power of
 * two (head_dim 8..256): the first positions of a decode, where the whole attention is a few
 * rows and its time is the latency of one group's chain of instructions, not bandwidth.
 * A group of G lanes owns one query head (lane li: dims 8li .. 8li+7, one 16-byte vector, two
 * for F32), so a block runs AMK_WARPS * 32 / G heads at once (8 warps: every head of a 32-head
 * model with head_dim <= 64; two passes at 128) instead of the fast path's units of 4 heads on
 * one group each (1B shape at position 0: 8 groups, 2 warps, each group 4 heads in sequence).
 * Per row: the score (8 products per lane, log2 G butterfly levels), the online softmax step
 * and the value update, the next row's K and V loads in flight meanwhile. Same semantics and fp32 operations as the
 * fast path (a -inf score contributes e = 0; every score -inf or NaN gives NaN); only the
 * order of the score's additions differs (a butterfly over the group). */
template <int DT>
__device__ void att_tiny(const amk_buffer_t* q, const amk_buffer_t* kc, const amk_buffer_t* vc,
                         const amk_buffer_t* out, int hd, int nh, int rep, long long batch,
                         long long row, long long per_batch, long long kv_start, int kv_len,
                         float scale, bool partial) {
  constexpr int ESZ = DT == AMK_F32 ? 4 : 2;
  const int GW = 32 / (hd >> 3); /* heads per warp */
  const long long nbh = batch * nh;
  const bool qvec = amk_is_vec(q->dtype) && (((unsigned long long)q->ptr) & 15u) == 0;
  /* warp-uniform loop (the butterflies need every lane): a group past the heads runs on zeros */
  for (long long w0 = (long long)(threadIdx.x >> 5) * GW; w0 < nbh; w0 += (long long)AMK_WARPS * GW)
    att_tiny_group<DT>(att_tiny_at(kc, vc, ESZ, hd, nh, rep, nbh, row, per_batch, kv_start, w0), q,
                       qvec, out, hd, row, kv_len, scale, partial);
}

/* ------------------------------------------------------------------------------------------ */
/* Generic path                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* One reduce-scatter step: lanes with bit O keep the upper half of part[0..2O), the others the
 * lower half, and add the partner's copy of the half they keep. */
template <int O>
__device__ __forceinline__ void att_rs_step(float (&part)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int t = 0; t < O; ++t) {
    const float send = upper ? part[t] : part[t + O];
    const float keep = upper ? part[t + O] : part[t];
    part[t] = keep + __shfl_xor_sync(ATT_FULL, send, O);
  }
}

__device__ void att_heads(const amk_buffer_t* q, const amk_buffer_t* kc, const amk_buffer_t* vc,
                          const amk_buffer_t* out, int hd, int nh, int rep, long long batch,
                          long long row, long long per_batch, long long kv_start, int kv_len,
                          float scale, bool partial) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float NEG_INF = -__int_as_float(0x7f800000);
  const long long n_heads_total = batch * nh;
  const long long per_head = partial ? (long long)hd + 2 : (long long)hd;

  for (long long bh = warp; bh < n_heads_total; bh += AMK_WARPS) {
    const long long b = bh / nh;
    const int h = (int)(bh - b * nh);
    const int kvh = h / rep;
    const long long qoff = bh * hd;
    /* element offset of cache row kv_start + j, kv head kvh */
    const long long kbase = b * per_batch + kv_start * row + (long long)kvh * hd;
    const long long obase = bh * per_head;

    for (int d0 = 0; d0 < hd; d0 += 32 * ATT_SLICE_K) {
      float acc[ATT_SLICE_K];
#pragma unroll
      for (int k = 0; k < ATT_SLICE_K; ++k) acc[k] = 0.0f;
      float m = NEG_INF;
      float l = 0.0f;

      for (int j0 = 0; j0 < kv_len; j0 += 32) {
        const int cnt = min(32, kv_len - j0);
        const long long cbase = kbase + (long long)j0 * row;
        /* ---- scores of the chunk's rows ---- */
        float part[32];
#pragma unroll
        for (int t = 0; t < 32; ++t) part[t] = 0.0f;
        for (int d = lane; d < hd; d += 32) {
          const float qd = amk_ldf(q, qoff + d); /* q: any float dtype */
#pragma unroll
          for (int t = 0; t < 32; ++t)
            if (t < cnt) part[t] += qd * amk_ldf(kc, cbase + (long long)t * row + d);
        }
        att_rs_step<16>(part, lane);
        att_rs_step<8>(part, lane);
        att_rs_step<4>(part, lane);
        att_rs_step<2>(part, lane);
        att_rs_step<1>(part, lane);
        const float s = lane < cnt ? part[0] * scale : NEG_INF;
        /* ---- online softmax ---- */
        const float m_new = fmaxf(m, amk_warp_max(s));
        const float alpha = (m == NEG_INF) ? 0.0f : expf(m - m_new);
        const float e = lane < cnt ? expf(s - m_new) : 0.0f;
        l = l * alpha + amk_warp_sum(e);
        m = m_new;
#pragma unroll
        for (int k = 0; k < ATT_SLICE_K; ++k) acc[k] *= alpha;
        /* ---- acc += e_t * v_t over this slice's dims ---- */
        for (int t = 0; t < cnt; ++t) {
          const float et = __shfl_sync(ATT_FULL, e, t);
          const long long vrow = cbase + (long long)t * row;
#pragma unroll
          for (int k = 0; k < ATT_SLICE_K; ++k) {
            const int d = d0 + lane + 32 * k;
            if (d < hd) acc[k] += et * amk_ldf(vc, vrow + d);
          }
        }
      }

      /* ---- write this slice ---- */
#pragma unroll
      for (int k = 0; k < ATT_SLICE_K; ++k) {
        const int d = d0 + lane + 32 * k;
        if (d < hd) amk_st_slow(out, obase + d, partial ? acc[k] : __fdiv_rn(acc[k], l));
      }
      if (partial && d0 == 0 && lane == 0) {
        amk_st_slow(out, obase + hd, m);
        amk_st_slow(out, obase + hd + 1, l);
      }
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* One attention call's geometry, from its descriptors and params (amk_att_setup). */
struct amk_att_geom {
  int hd, nh, nkv, rep;
  long long batch, row, per_batch, kv_start;
  int kv_len;
  float scale;
  bool partial;
};

/* The rows each split of a split-KV attention covers at position p
 * (op_attention_split::split_size): the smallest multiple of `chunk` with which `n_splits`
 * splits cover rows 0..=p. 32-bit arithmetic: a cache has far fewer than 2^30 rows, and a
 * 64-bit division is a call of about a hundred instructions. */
__device__ __forceinline__ int amk_split_size(long long p, int n_splits, int chunk) {
  const int q = (int)min(p, (long long)(1 << 30));
  const int per = (q + n_splits) / n_splits; /* ceil((p + 1) / n_splits) */
  return (per + chunk - 1) / chunk * chunk;
}

/* The splits with rows at position p (op_attention_split::active_splits): ceil((p + 1) /
 * size), at most n_splits. */
__device__ __forceinline__ int amk_split_active(long long p, int n_splits, int chunk) {
  const int q = (int)min(p, (long long)(1 << 30));
  const int size = amk_split_size(p, n_splits, chunk);
  return (q + size) / size;
}

/* The splits with rows at the position `pos` holds (block-uniform); -1, having failed the task,
 * for a negative position. */
__device__ __forceinline__ int amk_split_active_at(const amk_task_ctx& ctx, const amk_buffer_t* pos,
                                                   int n_splits, int chunk) {
  const long long p = amk_ldif(pos, 0);
  if (p < 0) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  return amk_split_active(p, n_splits, chunk);
}

/* A position buffer the attention can read (the validator's rule, again on the device):
 * integers, at least one element. */
__device__ __forceinline__ bool amk_att_pos_ok(const amk_buffer_t* pb) {
  return amk_is_int(pb->dtype) && pb->numel >= 1;
}

/* The rows of the window [kv_start, kv_start + kv_len) at or before the position p = element 0
 * of `pb`: min(kv_len, max(0, p + 1 - kv_start)); or -1, having failed the task (AMK_ERR_INDEX,
 * detail p), when p < 0 or when the window is empty and the task writes no split-KV partial
 * (an empty partial is a trailing shard's: acc = 0, m = -inf, l = 0). Reads data: after the
 * task's wait, or before it when nothing in the launch writes the position (its descriptor's
 * AMK_BUF_LAUNCH_CONST). Block-uniform (every thread reads the same element). Out of line and
 * on scalars: a task without a position never calls it, and its geometry stays in registers. */
__device__ __noinline__ int amk_att_pos_len(const amk_task_ctx& ctx, const amk_buffer_t* pb,
                                            long long kv_start, int kv_len, bool partial) {
  const long long p = amk_ldif(pb, 0);
  const long long n = p + 1 - kv_start;
  if (p < 0 || (n <= 0 && !partial)) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  return n <= 0 ? 0 : (n < kv_len ? (int)n : kv_len);
}

/* g's window clipped by the position in `pb` (amk_att_pos_len); false: the task failed. */
__device__ __forceinline__ bool amk_att_at_pos(const amk_task_ctx& ctx, const amk_buffer_t* pb,
                                               amk_att_geom& g) {
  const int n = amk_att_pos_len(ctx, pb, g.kv_start, g.kv_len, g.partial);
  g.kv_len = n;
  return n >= 0;
}

/* The attention's geometry from its descriptors and params (inputs 0..2 = q, k_cache,
 * v_cache; `partial`: flags bit 1, a split-KV shard). CHECK: also the checks the validator and
 * the CPU reference make, failing the task (false) on the first that fails; !CHECK: the same
 * geometry with no check, for a task amk_verify_tasks passed (a late block runs this between
 * its previous task and its wait). Reads descriptors and params only, so it may run before the
 * task's wait; except with `pos` (a position buffer, never with CHECK): then it also clips the
 * window by the position (amk_att_at_pos, false when that fails the task), which is data — the
 * caller passes it only after the wait, or before it for a position nothing in the launch
 * writes. */
template <bool CHECK>
__device__ __forceinline__ bool amk_att_setup(const amk_task_ctx& ctx, bool partial, amk_att_geom& g,
                                              const amk_buffer_t* pos = nullptr) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const int hd = p.head_dim, nh = p.n_heads, nkv = p.n_kv_heads;
  AMK_CHECK(hd > 0, AMK_ERR_PARAM, hd);
  AMK_CHECK(nh > 0, AMK_ERR_PARAM, nh);
  AMK_CHECK(nkv > 0 && nh % nkv == 0, AMK_ERR_PARAM, nkv);
  AMK_CHECK(p.kv_start >= 0, AMK_ERR_PARAM, p.kv_start);
  AMK_CHECK(p.kv_len >= 0, AMK_ERR_PARAM, p.kv_len);
  const float scale = p.scale;
  AMK_CHECK(isfinite(scale), AMK_ERR_PARAM, (long long)__float_as_int(scale));
  const long long row = (long long)nkv * hd;
  AMK_CHECK(kc->numel == vc->numel, AMK_ERR_SHAPE, vc->numel);
  long long batch, max_seq;
  if (kc->rank == 4) {
    batch = kc->shape[0];
    max_seq = kc->shape[1];
  } else {
    batch = 1;
    max_seq = amk_udiv(kc->numel, row);
  }
  const long long per_batch = max_seq * row;
  AMK_CHECK(kc->numel == batch * per_batch, AMK_ERR_SHAPE, kc->numel);
  AMK_CHECK(p.kv_len > 0 || partial, AMK_ERR_PARAM, 0);
  AMK_CHECK((long long)p.kv_start + p.kv_len <= max_seq, AMK_ERR_PARAM, (long long)p.kv_start + p.kv_len);
  AMK_CHECK(q->numel == batch * nh * (long long)hd, AMK_ERR_SHAPE, q->numel);
  AMK_CHECK(amk_is_float(q->dtype), AMK_ERR_DTYPE, q->dtype);
  g.hd = hd;
  g.nh = nh;
  g.nkv = nkv;
  g.rep = nkv > 0 ? nh / nkv : 1;
  g.batch = batch;
  g.row = row;
  g.per_batch = per_batch;
  g.kv_start = p.kv_start;
  g.kv_len = p.kv_len;
  g.scale = scale;
  g.partial = partial;
  return !pos || amk_att_at_pos(ctx, pos, g);
}

/* The fast path needs both caches in one vector dtype, whole 16-byte vectors per lane and
 * 16-byte aligned bases (then every row offset is a multiple of 8 elements). */
__device__ __forceinline__ bool amk_att_fast_ok(const amk_buffer_t* kc, const amk_buffer_t* vc,
                                                const amk_att_geom& g) {
  const int dt = (kc->dtype == vc->dtype) ? kc->dtype : -1;
  return (dt == AMK_BF16 || dt == AMK_F16 || dt == AMK_F32) && (g.hd & 7) == 0 && g.hd <= 256 &&
         ((((unsigned long long)kc->ptr) | ((unsigned long long)vc->ptr)) & 15u) == 0 &&
         g.batch * g.nkv * ((g.rep + ATT_RB - 1) / ATT_RB) < 2147483647LL;
}

/* The tiny path's own conditions, beyond the fast path's: a short range and head_dim / 8 a
 * power of two. */
__device__ __forceinline__ bool amk_att_tiny_ok(const amk_att_geom& g) {
  return g.kv_len <= ATT_TINY_KV && (((g.hd >> 3) & ((g.hd >> 3) - 1)) == 0);
}

/* AMK_ATT_TINY_PRE: device knob, defined with its default in amk_knobs.cuh. */
/* AMK_ATT_TINY_PRE_KV: device knob, defined with its default in amk_knobs.cuh. */

/* The tiny path's lane plan, from descriptors and the geometry (before the wait). */
struct amk_att_tiny_plan {
  att_tiny_lane L;
  int dt;
  bool qvec;
  bool ok;   /* the tiny path in one pass, its dtype compiled in: att_tiny_group after the wait */
  bool busy; /* this warp has a group */
};

__device__ __forceinline__ amk_att_tiny_plan amk_att_tiny_pre(const amk_buffer_t* q, const amk_buffer_t* kc,
                                                              const amk_buffer_t* vc,
                                                              const amk_att_geom& g) {
  amk_att_tiny_plan t;
  const int GW = 32 / (g.hd >> 3);
  const long long nbh = g.batch * g.nh;
  t.ok = AMK_ATT_TINY_PRE && amk_att_fast_ok(kc, vc, g) && amk_att_tiny_ok(g) &&
         g.kv_len <= AMK_ATT_TINY_PRE_KV && nbh <= (long long)AMK_WARPS * GW;
  t.dt = kc->dtype;
  t.ok = t.ok && (AMK_IS_BF16(t.dt) || AMK_IS_F16(t.dt) || AMK_IS_F32(t.dt)); /* compiled in */
  t.qvec = amk_is_vec(q->dtype) && (((unsigned long long)q->ptr) & 15u) == 0;
  const long long w0 = (long long)(threadIdx.x >> 5) * GW;
  t.busy = w0 < nbh;
  if (t.ok)
    t.L = att_tiny_at(kc, vc, t.dt == AMK_F32 ? 4 : 2, g.hd, g.nh, g.rep, nbh, g.row, g.per_batch,
                      g.kv_start, w0);
  return t;
}

/* The attention of an amk_att_tiny_pre plan (ok), after the wait. */
__device__ __forceinline__ void amk_att_tiny_run(const amk_att_tiny_plan& t, const amk_buffer_t* q,
                                                 const amk_buffer_t* out, const amk_att_geom& g) {
  if (!t.busy) return; /* warp-uniform */
#define ATT_TINY_GROUP(DT) att_tiny_group<DT>(t.L, q, t.qvec, out, g.hd, g.row, g.kv_len, g.scale, g.partial)
  if (AMK_IS_BF16(t.dt)) ATT_TINY_GROUP(AMK_BF16);
  else if (AMK_IS_F16(t.dt)) ATT_TINY_GROUP(AMK_F16);
  else if (AMK_IS_F32(t.dt)) ATT_TINY_GROUP(AMK_F32);
#undef ATT_TINY_GROUP
}

/* The attention of g over q and the caches into `out` (any float dtype; a descriptor of global
 * or shared memory: every store is a generic one), on the path the operands allow. After the
 * task's wait; block-uniform. */
__device__ __forceinline__ void amk_att_run(const amk_buffer_t* q, const amk_buffer_t* kc,
                                            const amk_buffer_t* vc, const amk_buffer_t* out,
                                            const amk_att_geom& g) {
  const int hd = g.hd, nh = g.nh, nkv = g.nkv, rep = g.rep;
  const long long batch = g.batch, row = g.row, per_batch = g.per_batch;
  const float scale = g.scale;
  const bool partial = g.partial;
  const int dt = (kc->dtype == vc->dtype) ? kc->dtype : -1;
  const bool fast = amk_att_fast_ok(kc, vc, g);
  /* Short ranges (the first positions of a decode) take one row per group and batch: four
   * times less code on the path, and no group waits on rows that are not there. */
  const bool shrt = g.kv_len <= ATT_SHORT_KV;
  /* Tiny ranges: a lane group per query head, all heads at once (see att_tiny). */
  const bool tiny = fast && amk_att_tiny_ok(g);
#define ATT_TINY(DT)                                                                            \
  att_tiny<DT>(q, kc, vc, out, hd, nh, rep, batch, row, per_batch, g.kv_start, g.kv_len, scale, \
               partial)
  if (tiny) {
    if (AMK_IS_BF16(dt)) ATT_TINY(AMK_BF16);
    else if (AMK_IS_F16(dt)) ATT_TINY(AMK_F16);
    else if (AMK_IS_F32(dt)) ATT_TINY(AMK_F32);
    else att_heads(q, kc, vc, out, hd, nh, rep, batch, row, per_batch, g.kv_start, g.kv_len,
                   scale, partial);
    return;
  }
#undef ATT_TINY
#define ATT_FAST(DT, R)                                                                        \
  att_fast<DT, R>(q, kc, vc, out, hd, nh, nkv, rep, batch, row, per_batch, g.kv_start, g.kv_len, \
                  scale, partial)
  if (fast && AMK_IS_BF16(dt)) {
    if (shrt) ATT_FAST(AMK_BF16, 1); else ATT_FAST(AMK_BF16, 4);
  } else if (fast && AMK_IS_F16(dt)) {
    if (shrt) ATT_FAST(AMK_F16, 1); else ATT_FAST(AMK_F16, 4);
  } else if (fast && AMK_IS_F32(dt)) {
    if (shrt) ATT_FAST(AMK_F32, 1); else ATT_FAST(AMK_F32, 2);
  } else
    att_heads(q, kc, vc, out, hd, nh, rep, batch, row, per_batch, g.kv_start, g.kv_len, scale,
              partial);
#undef ATT_FAST
}

#endif /* AMK_ATTENTION_CUH */
