/* ATTENTION_CAUSAL (code 28): causal GQA attention of query rows [m_off, m_off + M_tile) and
 * the heads of columns [n_off, n_off + N_tile), each row r over cache rows 0..=pos[r].
 * Mirrors ops/attention-causal/src/reference.rs (f32 arithmetic, cast on store); the softmax
 * is computed online (a running max and sum), so sums differ from the reference's in rounding
 * only.
 *
 * For each KV head the task's heads use, its (row, head) pairs go in groups of AC_PAIRS: the
 * group's queries to shared memory (f32), then the KV head's cache rows up to the group's
 * largest position, AC_KB rows at a time, K and V staged in shared memory as f32 (rows padded
 * by one element, so a lane per key reads its row without bank conflicts). Each warp owns
 * AC_PAIRS / AMK_WARPS pairs: a lane per key computes the scores, a warp max and sum update the
 * running softmax, then each lane accumulates its dims (lane + 32 i) of the values, the block's
 * weights broadcast by shuffles. A pair whose position is before the block skips it. */

#define AC_KB 32
#define AC_PAIRS 32
#define AC_HMAX 128
#define AC_ND (AC_HMAX / 32)
#define AC_PW (AC_PAIRS / AMK_WARPS)
#define AC_NEG_INF (-__int_as_float(0x7f800000))

struct ac_args {
  const amk_buffer_t *q, *kc, *vc, *pos, *out;
  int hd, nhg, h_first, g;
  bool vec; /* the caches take 16-byte loads */
  long long width, row, m_off, L;
  float scale;
};

/* The online softmax of one warp's pairs over one staged block of keys [j0, j0 + AC_KB). */
__device__ __forceinline__ void ac_block(const ac_args& a, const float* qs, const float* ks,
                                         const float* vs, long long j0, int np, const long long* plim,
                                         float* m, float* l, float (*acc)[AC_ND]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = a.hd, ld = hd + 1;
#pragma unroll
  for (int u = 0; u < AC_PW; ++u) {
    const int pi = warp + u * AMK_WARPS;
    if (pi >= np || j0 > plim[u]) continue; /* warp-uniform */
    const long long j = j0 + lane;
    float s = AC_NEG_INF;
    if (j <= plim[u]) {
      float dot = 0.f;
      const float* qp = qs + pi * hd;
      const float* kp = ks + lane * ld;
      for (int d = 0; d < hd; ++d) dot = fmaf(qp[d], kp[d], dot);
      s = dot * a.scale;
    }
    const float mn = fmaxf(m[u], amk_warp_max(s));
    const float corr = m[u] == AC_NEG_INF ? 0.f : expf(m[u] - mn);
    const float e = s == AC_NEG_INF ? 0.f : expf(s - mn);
    l[u] = l[u] * corr + amk_warp_sum(e);
#pragma unroll
    for (int i = 0; i < AC_ND; ++i) acc[u][i] *= corr;
    const int nk = (int)min((long long)AC_KB, plim[u] - j0 + 1);
    for (int jj = 0; jj < nk; ++jj) {
      const float ej = __shfl_sync(0xffffffffu, e, jj);
      const float* vp = vs + jj * ld;
#pragma unroll
      for (int i = 0; i < AC_ND; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[u][i] = fmaf(ej, vp[d], acc[u][i]);
      }
    }
    m[u] = mn;
  }
}

/* Pairs [pg0, pg0 + np) of KV head a.g: pair p is row m_off + p / nhg, head h_first + p % nhg. */
__device__ void ac_group(const ac_args& a, int pg0, int np, float* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = a.hd, ld = hd + 1;
  float* qs = smem;
  float* ks = qs + AC_PAIRS * AC_HMAX;
  float* vs = ks + AC_KB * (AC_HMAX + 1);
  long long top = 0; /* the group's largest position */
  for (int p = 0; p < np; ++p)
    top = max(top, (long long)amk_ldif(a.pos, a.m_off + (pg0 + p) / a.nhg));
  for (int i = threadIdx.x; i < np * hd; i += AMK_THREADS) {
    const int p = i / hd, d = i % hd;
    const long long r = a.m_off + (pg0 + p) / a.nhg, h = a.h_first + (pg0 + p) % a.nhg;
    qs[i] = amk_ldf(a.q, r * a.width + h * hd + d);
  }
  long long plim[AC_PW];
  float m[AC_PW], l[AC_PW], acc[AC_PW][AC_ND];
#pragma unroll
  for (int u = 0; u < AC_PW; ++u) {
    const int pi = warp + u * AMK_WARPS;
    plim[u] = pi < np ? (long long)amk_ldif(a.pos, a.m_off + (pg0 + pi) / a.nhg) : -1;
    m[u] = AC_NEG_INF;
    l[u] = 0.f;
#pragma unroll
    for (int i = 0; i < AC_ND; ++i) acc[u][i] = 0.f;
  }
  for (long long j0 = 0; j0 <= top; j0 += AC_KB) {
    __syncthreads(); /* the queries are staged; the previous block is consumed */
    if (a.vec) {
      /* 8 elements a 16-byte load (head_dim % 8 == 0, 16-byte aligned caches). */
      const int hv = hd >> 3;
      for (int i = threadIdx.x; i < AC_KB * hv; i += AMK_THREADS) {
        const int jj = i / hv, d = (i % hv) * 8;
        const long long j = j0 + jj;
        float kf[8], vf[8];
        if (j <= top) {
          const long long u = (j * a.row + (long long)a.g * hd + d) >> 3;
          amk_ld8(a.kc->ptr, a.kc->dtype, u, kf);
          amk_ld8(a.vc->ptr, a.vc->dtype, u, vf);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) kf[e] = vf[e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ks[jj * ld + d + e] = kf[e];
          vs[jj * ld + d + e] = vf[e];
        }
      }
    } else {
      for (int i = threadIdx.x; i < AC_KB * hd; i += AMK_THREADS) {
        const int jj = i / hd, d = i % hd;
        const long long j = j0 + jj;
        const long long at = j * a.row + (long long)a.g * hd + d;
        ks[jj * ld + d] = j <= top ? amk_ldf(a.kc, at) : 0.f;
        vs[jj * ld + d] = j <= top ? amk_ldf(a.vc, at) : 0.f;
      }
    }
    __syncthreads();
    ac_block(a, qs, ks, vs, j0, np, plim, m, l, acc);
  }
#pragma unroll
  for (int u = 0; u < AC_PW; ++u) {
    const int pi = warp + u * AMK_WARPS;
    if (pi >= np) continue;
    const long long r = a.m_off + (pg0 + pi) / a.nhg, h = a.h_first + (pg0 + pi) % a.nhg;
#pragma unroll
    for (int i = 0; i < AC_ND; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) amk_stf(a.out, r * a.width + h * hd + d, acc[u][i] / l[u]);
    }
  }
  __syncthreads(); /* qs is free for the next group */
}

__device__ void amk_op_attention_causal(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  ac_args a;
  a.q = amk_in(ctx, 0);
  a.kc = amk_in(ctx, 1);
  a.vc = amk_in(ctx, 2);
  a.pos = amk_in(ctx, 3);
  a.out = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.scale = p.scale;
  a.m_off = p.m_off;
  const int nh = p.n_heads, nkv = p.n_kv_heads;
  a.width = (long long)nh * a.hd;
  a.row = (long long)nkv * a.hd;
  if (a.hd <= 0 || a.hd > AC_HMAX || nkv <= 0 || nh % nkv != 0 || a.row <= 0 ||
      a.kc->numel % a.row != 0 || a.vc->numel != a.kc->numel || a.out->numel != a.q->numel ||
      (long long)(p.m_off + p.M_tile) * a.width > a.q->numel || p.n_off % a.hd != 0 ||
      p.N_tile % a.hd != 0 || p.n_off + p.N_tile > a.width) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.hd);
    return;
  }
  if (!amk_is_int(a.pos->dtype)) {
    amk_fail(ctx, AMK_ERR_DTYPE, a.pos->dtype);
    return;
  }
  const long long max_seq = a.kc->numel / a.row;
  for (long long r = p.m_off; r < p.m_off + p.M_tile; ++r) {
    const long long pr = amk_ldif(a.pos, r);
    if (pr < 0 || pr >= max_seq) {
      amk_fail(ctx, AMK_ERR_INDEX, pr);
      return;
    }
  }
  const int kdt = a.kc->dtype;
  const bool half_or_f32 =
      (kdt == AMK_F32 || kdt == AMK_BF16 || kdt == AMK_F16) && kdt == a.vc->dtype;
  a.vec = half_or_f32 && a.hd % 8 == 0 && ((unsigned long long)a.kc->ptr & 15) == 0 &&
          ((unsigned long long)a.vc->ptr & 15) == 0;
  const int rep = nh / nkv, h0 = p.n_off / a.hd, h1 = (p.n_off + p.N_tile) / a.hd;
  for (int g = h0 / rep; g * rep < h1; ++g) {
    a.g = g;
    a.h_first = max(h0, g * rep);
    a.nhg = min(h1, (g + 1) * rep) - a.h_first;
    const int npairs = p.M_tile * a.nhg;
    for (int pg0 = 0; pg0 < npairs; pg0 += AC_PAIRS)
      ac_group(a, pg0, min(AC_PAIRS, npairs - pg0), (float*)ctx.smem);
  }
}
