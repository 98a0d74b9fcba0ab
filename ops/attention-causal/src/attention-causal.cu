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
#define AC_PW ((AC_PAIRS + AMK_WARPS - 1) / AMK_WARPS)
#define AC_NEG_INF (-__int_as_float(0x7f800000))

struct ac_args {
  const amk_buffer_t *q, *kc, *vc, *pos, *out;
  int hd, nhg, h_first, g;
  bool vec; /* the caches take 16-byte loads */
  bool mma; /* the tensor-core path: 16-bit q and caches of one dtype, head_dim 64 or 128 */
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


/* ---- the tensor-core path (16-bit q and caches, head_dim 64 or 128) ----
 * Up to AC_MPAIRS pairs: the group's queries to shared memory (16-bit), then the KV head's
 * cache rows in blocks of AC_MKB keys through a two-stage cp.async pipeline. Warp w owns pairs
 * 16 w .. 16 w + 15 (one m16 tile): S = Q K^T by mma.sync (f32), the mask and scale, an online
 * softmax over the block (quad shuffles), P rounded to the 16-bit type as the A operand of
 * O += P V (V through ldmatrix.trans). Rows are 2 * head_dim bytes, 16-byte chunks XOR-swizzled
 * by the row's low 3 bits (conflict-free ldmatrix). P's rounding is the path's only departure
 * from the reference's arithmetic (the bf16 bound covers it); f32 programs take the CUDA-core
 * path. Probes (traced kernel; the last group's stamps win): 0 the queries and the first key
 * block landed, 1 every key block done. */

#define AC_MPAIRS 64
#define AC_MKB 64

__device__ __forceinline__ uint32_t ac_swz(int row, int ch, int hd) {
  return (uint32_t)(row * hd * 2 + ((ch ^ (row & 7)) << 4));
}

/* Two f32 as two 16-bit values of the path's type (element 0 low), rounded as amk_st. */
template <bool BF>
__device__ __forceinline__ uint32_t ac_pack2(float x, float y) {
  const uint16_t lo = BF ? amk_f32_to_bf16(x) : amk_f32_to_f16(x);
  const uint16_t hi = BF ? amk_f32_to_bf16(y) : amk_f32_to_f16(y);
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

/* Issues the copies of keys [key0, key0 + AC_MKB) of KV head a.g (zeros past `top`). */
template <int HD>
__device__ __forceinline__ void ac_stage_kv(const ac_args& a, long long key0, long long top,
                                            uint32_t ks, uint32_t vs) {
  constexpr int CH = HD / 8;
  const uint16_t* kp = (const uint16_t*)a.kc->ptr;
  const uint16_t* vp = (const uint16_t*)a.vc->ptr;
  for (int c = threadIdx.x; c < AC_MKB * CH; c += AMK_THREADS) {
    const int r = c / CH, ch = c % CH;
    const long long j = key0 + r;
    const bool ok = j <= top;
    const long long at = ok ? j * a.row + (long long)a.g * HD + ch * 8 : 0;
    amk_cp_async16_zfill(ks + ac_swz(r, ch, HD), kp + at, ok);
    amk_cp_async16_zfill(vs + ac_swz(r, ch, HD), vp + at, ok);
  }
  amk_cp_async_commit();
}

template <bool BF, int HD>
__device__ __noinline__ void ac_group_mma(const amk_task_ctx& ctx, const ac_args& a, int pg0,
                                          int np, unsigned char* smem) {
  constexpr int CH = HD / 8, RB = HD * 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t qs = s0;
  const uint32_t ks[2] = {s0 + AC_MPAIRS * RB, s0 + AC_MPAIRS * RB + AC_MKB * RB};
  const uint32_t vs[2] = {s0 + AC_MPAIRS * RB + 2 * AC_MKB * RB,
                          s0 + AC_MPAIRS * RB + 3 * AC_MKB * RB};
  const float NEG = AC_NEG_INF;
  long long top = 0;
  for (int p = 0; p < np; ++p)
    top = max(top, (long long)amk_ldif(a.pos, a.m_off + (pg0 + p) / a.nhg));
  {
    const uint16_t* qp = (const uint16_t*)a.q->ptr;
    for (int c = threadIdx.x; c < AC_MPAIRS * CH; c += AMK_THREADS) {
      const int p = c / CH, ch = c % CH;
      const bool ok = p < np;
      const long long r = a.m_off + (pg0 + p) / a.nhg, h = a.h_first + (pg0 + p) % a.nhg;
      amk_cp_async16_zfill(qs + ac_swz(p, ch, HD), qp + (ok ? r * a.width + h * HD + ch * 8 : 0), ok);
    }
    amk_cp_async_commit();
  }
  const int nb = (int)(top / AC_MKB) + 1;
  ac_stage_kv<HD>(a, 0, top, ks[0], vs[0]);
  const int g = lane >> 2, t = lane & 3;
  const int p0 = warp * 16 + g, p1 = p0 + 8;
  const long long pos0 = p0 < np ? (long long)amk_ldif(a.pos, a.m_off + (pg0 + p0) / a.nhg) : -1;
  const long long pos1 = p1 < np ? (long long)amk_ldif(a.pos, a.m_off + (pg0 + p1) / a.nhg) : -1;
  const bool active = warp * 16 < np; /* warp-uniform */
  /* The warp's largest position: a block past it is skipped by the whole warp (the mma and
   * shuffles below need every lane; rows before a block are masked inside it). */
  long long wtop = max(pos0, pos1);
#pragma unroll
  for (int o2 = 1; o2 < 32; o2 <<= 1) {
    const long long other = __shfl_xor_sync(0xffffffffu, wtop, o2);
    wtop = max(wtop, other);
  }
  uint32_t qf[HD / 16][4];
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = NEG, m1 = NEG, l0 = 0.f, l1 = 0.f;
  for (int b = 0; b < nb; ++b) {
    const int st = b & 1;
    if (b + 1 < nb) {
      ac_stage_kv<HD>(a, (long long)(b + 1) * AC_MKB, top, ks[st ^ 1], vs[st ^ 1]);
      amk_cp_async_wait_group<1>();
    } else {
      amk_cp_async_wait_all();
    }
    __syncthreads();
    if (b == 0) amk_probe(ctx, 0); /* the queries and the first key block landed */
    if (b == 0 && active) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        amk_ldmatrix_x4(qs + ac_swz(warp * 16 + (lane & 15), kk * 2 + (lane >> 4), HD), qf[kk]);
    }
    const long long key0 = (long long)b * AC_MKB;
    if (active && key0 <= wtop) {
      float sc[AC_MKB / 8][4];
#pragma unroll
      for (int j = 0; j < AC_MKB / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < AC_MKB / 8; j += 2) {
          uint32_t r[4];
          amk_ldmatrix_x4(ks[st] + ac_swz((j + (lane >> 4)) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1), HD), r);
          amk_mma_16816<BF>(sc[j], qf[kk], r[0], r[1]);
          amk_mma_16816<BF>(sc[j + 1], qf[kk], r[2], r[3]);
        }
      }
      float mx0 = NEG, mx1 = NEG;
#pragma unroll
      for (int j = 0; j < AC_MKB / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const long long key = key0 + j * 8 + t * 2 + (e & 1);
          const long long lim = e < 2 ? pos0 : pos1;
          const float v = key <= lim ? sc[j][e] * a.scale : NEG;
          sc[j][e] = v;
          if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
        }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
      }
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      const float a0 = m0 == NEG ? 0.f : expf(m0 - n0), a1 = m1 == NEG ? 0.f : expf(m1 - n1);
      float s0r = 0.f, s1r = 0.f;
#pragma unroll
      for (int j = 0; j < AC_MKB / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float nn = e < 2 ? n0 : n1;
          const float pv = sc[j][e] == NEG ? 0.f : expf(sc[j][e] - nn);
          sc[j][e] = pv;
          if (e < 2) s0r += pv; else s1r += pv;
        }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        s0r += __shfl_xor_sync(0xffffffffu, s0r, o2);
        s1r += __shfl_xor_sync(0xffffffffu, s1r, o2);
      }
      l0 = l0 * a0 + s0r;
      l1 = l1 * a1 + s1r;
      m0 = n0;
      m1 = n1;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[n][0] *= a0; o[n][1] *= a0; o[n][2] *= a1; o[n][3] *= a1;
      }
#pragma unroll
      for (int kk = 0; kk < AC_MKB / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = ac_pack2<BF>(sc[2 * kk][0], sc[2 * kk][1]);
        pa[1] = ac_pack2<BF>(sc[2 * kk][2], sc[2 * kk][3]);
        pa[2] = ac_pack2<BF>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[3] = ac_pack2<BF>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
          uint32_t r[4];
          amk_ldmatrix_x4_trans(vs[st] + ac_swz(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, n + (lane >> 4), HD), r);
          amk_mma_16816<BF>(o[n], pa, r[0], r[1]);
          amk_mma_16816<BF>(o[n + 1], pa, r[2], r[3]);
        }
      }
    }
    __syncthreads(); /* stage st is consumed before iteration b + 1 refills it */
  }
  amk_probe(ctx, 1); /* every key block done */
  if (!active) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int p = half ? p1 : p0;
    if (p >= np) continue;
    const float inv = 1.0f / (half ? l1 : l0);
    const long long r = a.m_off + (pg0 + p) / a.nhg, h = a.h_first + (pg0 + p) % a.nhg;
    const long long base = r * a.width + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + t * 2;
      amk_stf(a.out, base + d, o[n][half * 2] * inv);
      amk_stf(a.out, base + d + 1, o[n][half * 2 + 1] * inv);
    }
  }
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
  if (a.pos->numel < (long long)p.m_off + p.M_tile) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.pos->numel);
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
  /* The tensor-core path gives each warp 16 of its 64 pairs: it needs at least 4 warps. */
  a.mma = AMK_WARPS >= 4 && a.vec && (kdt == AMK_BF16 || kdt == AMK_F16) && a.q->dtype == kdt &&
          (a.hd == 64 || a.hd == 128) && ((unsigned long long)a.q->ptr & 15) == 0;
  const int rep = nh / nkv, h0 = p.n_off / a.hd, h1 = (p.n_off + p.N_tile) / a.hd;
  for (int g = h0 / rep; g * rep < h1; ++g) {
    a.g = g;
    a.h_first = max(h0, g * rep);
    a.nhg = min(h1, (g + 1) * rep) - a.h_first;
    const int npairs = p.M_tile * a.nhg;
    if (a.mma) {
      for (int pg0 = 0; pg0 < npairs; pg0 += AC_MPAIRS) {
        const int np = min(AC_MPAIRS, npairs - pg0);
        const bool bf = a.kc->dtype == AMK_BF16;
        if (a.hd == 64 && bf) ac_group_mma<true, 64>(ctx, a, pg0, np, ctx.smem);
        else if (a.hd == 64) ac_group_mma<false, 64>(ctx, a, pg0, np, ctx.smem);
        else if (bf) ac_group_mma<true, 128>(ctx, a, pg0, np, ctx.smem);
        else ac_group_mma<false, 128>(ctx, a, pg0, np, ctx.smem);
        __syncthreads();
      }
      continue;
    }
    for (int pg0 = 0; pg0 < npairs; pg0 += AC_PAIRS)
      ac_group(a, pg0, min(AC_PAIRS, npairs - pg0), (float*)ctx.smem);
  }
}
