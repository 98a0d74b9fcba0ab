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
 * cache rows in blocks of AC_MKB keys through an ac_mstages<HD>-deep cp.async pipeline (one
 * barrier a block). Warp w owns pairs 16 (w % 4) .. + 15 (one m16 tile) and key half w / 4 of
 * every block (32 keys): the eight warps all work on each block, each keeping an online softmax
 * of its half, and the two halves of a tile merge once at the end. A warp: S = Q K^T by
 * mma.sync (f32), the mask and the scale, an online softmax over its 32 keys (quad shuffles,
 * in base 2), P rounded to the 16-bit type as the A operand of O += P V (V through
 * ldmatrix.trans). Rows are 2 * head_dim bytes, 16-byte chunks XOR-swizzled by the row's low 3
 * bits (conflict-free ldmatrix). Everything the loop reads lives in registers (ac_mplan):
 * the op's arguments and the buffers' descriptors would otherwise be re-read after every
 * copy's memory clobber. P's rounding and exp2's approximation are the path's departures from
 * the reference's arithmetic (the bf16 bound covers them); f32 programs take the CUDA-core
 * path. Probes (traced kernel; the last group's stamps win): 2 the rows' positions checked
 * (every path), 3 the group's positions read and its queries' copies issued, 0 the queries
 * and the first key block landed, 1 every key block done. */

#define AC_MPAIRS 64
#define AC_MKB 64
#define AC_LOG2E 1.4426950408889634f

/* Pipeline depth: three stages where they fit the op's shared memory (head_dim 64), else two. */
template <int HD>
struct ac_mstages {
  static constexpr int N = HD <= 64 ? 3 : 2;
};

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

/* What the tensor-core group reads, in registers: the operands' element pointers (the caches
 * already at KV head g), their strides, the scale in base 2. */
struct ac_mplan {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* out;    /* null: the output takes amk_stf (another dtype or alignment) */
  const amk_buffer_t* outb;
  long long width;  /* q's and the output's row */
  long long row;    /* a cache row */
  long long m_off;
  int nhg, h_first;
  float scale2;     /* scale * log2(e) */
};

/* Issues the copies of keys [key0, key0 + AC_MKB) (zeros past `top`). */
template <int HD>
__device__ __forceinline__ void ac_stage_kv(const ac_mplan& pl, long long key0, long long top,
                                            uint32_t ks, uint32_t vs) {
  constexpr int CH = HD / 8;
#pragma unroll
  for (int i = 0; i < AC_MKB * CH / AMK_THREADS; ++i) {
    const int c = threadIdx.x + i * AMK_THREADS;
    const int r = c / CH, ch = c % CH;
    const long long j = key0 + r;
    const bool ok = j <= top;
    const long long at = ok ? j * pl.row + ch * 8 : 0;
    amk_cp_async16_zfill(ks + ac_swz(r, ch, HD), pl.k + at, ok);
    amk_cp_async16_zfill(vs + ac_swz(r, ch, HD), pl.v + at, ok);
  }
  amk_cp_async_commit();
}

/* The positions of the group's pairs `lane` and `lane + 32` (-1 past np), and the largest
 * position of the group (every warp works it out: two loads a lane, one round trip). */
struct ac_mpos {
  long long lo, hi, top;
};
__device__ __forceinline__ ac_mpos ac_group_positions(const ac_args& a, int pg0, int np) {
  const int lane = threadIdx.x & 31;
  ac_mpos r;
  r.lo = lane < np ? (long long)amk_ldif(a.pos, a.m_off + (pg0 + lane) / a.nhg) : -1;
  r.hi = lane + 32 < np ? (long long)amk_ldif(a.pos, a.m_off + (pg0 + lane + 32) / a.nhg) : -1;
  long long t = max(r.lo, r.hi);
#pragma unroll
  for (int o2 = 1; o2 < 32; o2 <<= 1) t = max(t, (long long)__shfl_xor_sync(0xffffffffu, t, o2));
  r.top = t;
  return r;
}

/* Pair p's position from the lanes' ac_mpos (p < 64; every lane must call it). */
__device__ __forceinline__ long long ac_pair_pos(const ac_mpos& ps, int p) {
  const long long lo = __shfl_sync(0xffffffffu, ps.lo, p & 31);
  const long long hi = __shfl_sync(0xffffffffu, ps.hi, p & 31);
  return p < 32 ? lo : hi;
}

/* The two key halves of each query tile merged (warps 4..7 hand their running max, sum and
 * values to warps 0..3 through shared memory, laid out [field][lane of the 128] so the
 * accesses are conflict-free), then the rows stored: two 16-bit values a 4-byte store when the
 * output has the caches' dtype, else amk_stf. `smem` is free (the stages are consumed). */
template <bool BF, int HD>
__device__ __forceinline__ void ac_merge_store(const ac_mplan& pl, int pg0, int np,
                                               unsigned char* smem, bool active, int p0, int p1,
                                               float m0, float m1, float l0, float l1,
                                               float (&o)[HD / 8][4]) {
  constexpr int NF = HD / 2 + 4; /* floats a lane hands over */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = (warp & 3) * 32 + lane, kh = warp >> 2;
  float* x = (float*)smem;
  if (active && kh == 1) {
    x[0 * 128 + slot] = m0;
    x[1 * 128 + slot] = m1;
    x[2 * 128 + slot] = l0;
    x[3 * 128 + slot] = l1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[(4 + n * 4 + e) * 128 + slot] = o[n][e];
  }
  __syncthreads();
  if (!active || kh == 1) return;
  const float NEG = AC_NEG_INF;
  const float bm0 = x[0 * 128 + slot], bm1 = x[1 * 128 + slot];
  const float M0 = fmaxf(m0, bm0), M1 = fmaxf(m1, bm1);
  const float z0 = M0 == NEG ? 0.f : M0, z1 = M1 == NEG ? 0.f : M1;
  const float fa0 = exp2f(m0 - z0), fb0 = exp2f(bm0 - z0);
  const float fa1 = exp2f(m1 - z1), fb1 = exp2f(bm1 - z1);
  const float inv0 = 1.0f / (l0 * fa0 + x[2 * 128 + slot] * fb0);
  const float inv1 = 1.0f / (l1 * fa1 + x[3 * 128 + slot] * fb1);
  const int t = lane & 3;
  static_assert(NF * 128 * 4 <= AC_MPAIRS * HD * 2 + 2 * AC_MKB * HD * 2 * 2, "merge area");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int p = half ? p1 : p0;
    if (p >= np) continue;
    const float fa = half ? fa1 : fa0, fb = half ? fb1 : fb0, inv = half ? inv1 : inv0;
    const long long r = pl.m_off + (pg0 + p) / pl.nhg, h = pl.h_first + (pg0 + p) % pl.nhg;
    const long long base = r * pl.width + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + t * 2, e0 = half * 2;
      const float v0 = (o[n][e0] * fa + x[(4 + n * 4 + e0) * 128 + slot] * fb) * inv;
      const float v1 = (o[n][e0 + 1] * fa + x[(4 + n * 4 + e0 + 1) * 128 + slot] * fb) * inv;
      if (pl.out) *(uint32_t*)(pl.out + base + d) = ac_pack2<BF>(v0, v1);
      else {
        amk_stf(pl.outb, base + d, v0);
        amk_stf(pl.outb, base + d + 1, v1);
      }
    }
  }
}

template <bool BF, int HD>
__device__ __noinline__ void ac_group_mma(const amk_task_ctx& ctx, const ac_args& a, int pg0,
                                          int np, unsigned char* smem) {
  constexpr int CH = HD / 8, RB = HD * 2, ST = ac_mstages<HD>::N;
  constexpr int KV_BYTES = AC_MKB * RB; /* one block of K (or V) */
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int qw = warp & 3, kh = warp >> 2; /* query tile, key half */
  const float NEG = AC_NEG_INF;
  ac_mplan pl;
  pl.q = (const uint16_t*)a.q->ptr;
  pl.k = (const uint16_t*)a.kc->ptr + (long long)a.g * HD;
  pl.v = (const uint16_t*)a.vc->ptr + (long long)a.g * HD;
  pl.out = a.out->dtype == a.kc->dtype && amk_al16(a.out->ptr) ? (uint16_t*)a.out->ptr : nullptr;
  pl.outb = a.out;
  pl.width = a.width;
  pl.row = a.row;
  pl.m_off = a.m_off;
  pl.nhg = a.nhg;
  pl.h_first = a.h_first;
  pl.scale2 = a.scale * AC_LOG2E;
  const ac_mpos ps = ac_group_positions(a, pg0, np);
  const long long top = ps.top;
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t qs = s0, kv0 = s0 + AC_MPAIRS * RB; /* stage s: K at kv0 + 2 s KV_BYTES, V after */
  for (int c = threadIdx.x; c < AC_MPAIRS * CH; c += AMK_THREADS) {
    const int p = c / CH, ch = c % CH;
    const bool ok = p < np;
    const long long r = pl.m_off + (pg0 + p) / pl.nhg, h = pl.h_first + (pg0 + p) % pl.nhg;
    amk_cp_async16_zfill(qs + ac_swz(p, ch, HD), pl.q + (ok ? r * pl.width + h * HD + ch * 8 : 0), ok);
  }
  amk_cp_async_commit();
  const int nb = (int)(top / AC_MKB) + 1;
  amk_probe(ctx, 3); /* the group's positions read, its queries' copies issued */
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < nb) ac_stage_kv<HD>(pl, (long long)s * AC_MKB, top, kv0 + 2 * s * KV_BYTES,
                                kv0 + (2 * s + 1) * KV_BYTES);
    else amk_cp_async_commit();
  }
  const int g = lane >> 2, t = lane & 3;
  const int p0 = qw * 16 + g, p1 = p0 + 8;
  const long long pos0 = ac_pair_pos(ps, p0), pos1 = ac_pair_pos(ps, p1);
  const bool active = qw * 16 < np; /* warp-uniform */
  /* The warp's largest position: a half block past it is skipped by the whole warp (the mma
   * and shuffles below need every lane; rows before a half block are masked inside it). */
  long long wtop = max(pos0, pos1);
#pragma unroll
  for (int o2 = 1; o2 < 32; o2 <<= 1) wtop = max(wtop, (long long)__shfl_xor_sync(0xffffffffu, wtop, o2));
  uint32_t qf[HD / 16][4];
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = NEG, m1 = NEG, l0 = 0.f, l1 = 0.f; /* running max (base-2 scores) and sum */
  for (int b = 0; b < nb; ++b) {
    const int st = b % ST;
    amk_cp_async_wait_group<ST - 2>();
    __syncthreads(); /* block b landed for everyone; block b - 1 is consumed */
    {
      const int nx = b + ST - 1, sn = nx % ST;
      if (nx < nb) ac_stage_kv<HD>(pl, (long long)nx * AC_MKB, top, kv0 + 2 * sn * KV_BYTES,
                                   kv0 + (2 * sn + 1) * KV_BYTES);
      else amk_cp_async_commit();
    }
    if (b == 0) amk_probe(ctx, 0); /* the queries and the first key block landed */
    if (b == 0 && active) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        amk_ldmatrix_x4(qs + ac_swz(qw * 16 + (lane & 15), kk * 2 + (lane >> 4), HD), qf[kk]);
    }
    const long long key0 = (long long)b * AC_MKB + 32 * kh;
    if (!active || key0 > wtop) continue;
    const uint32_t ks = kv0 + 2 * st * KV_BYTES, vs = ks + KV_BYTES;
    float sc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        uint32_t r[4];
        amk_ldmatrix_x4(ks + ac_swz(32 * kh + (j + (lane >> 4)) * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1), HD), r);
        amk_mma_16816<BF>(sc[j], qf[kk], r[0], r[1]);
        amk_mma_16816<BF>(sc[j + 1], qf[kk], r[2], r[3]);
      }
    }
    /* Keys past a row's position masked (32-bit offsets from key0: a half block spans 32). */
    const int lim0 = (int)min(max(pos0 - key0, -1LL), 64LL), lim1 = (int)min(max(pos1 - key0, -1LL), 64LL);
    float mx0 = NEG, mx1 = NEG;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * 8 + t * 2 + (e & 1);
        const float v = key <= (e < 2 ? lim0 : lim1) ? sc[j][e] * pl.scale2 : NEG;
        sc[j][e] = v;
        if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
      }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    /* A row with no key yet keeps max -inf: subtract 0 instead (exp2(-inf) = 0, no NaN). */
    const float z0 = n0 == NEG ? 0.f : n0, z1 = n1 == NEG ? 0.f : n1;
    const float a0 = exp2f(m0 - z0), a1 = exp2f(m1 - z1);
    float s0r = 0.f, s1r = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2f(sc[j][e] - (e < 2 ? z0 : z1));
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
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t pa[4];
      pa[0] = ac_pack2<BF>(sc[2 * kk][0], sc[2 * kk][1]);
      pa[1] = ac_pack2<BF>(sc[2 * kk][2], sc[2 * kk][3]);
      pa[2] = ac_pack2<BF>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[3] = ac_pack2<BF>(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < HD / 8; n += 2) {
        uint32_t r[4];
        amk_ldmatrix_x4_trans(vs + ac_swz(32 * kh + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, n + (lane >> 4), HD), r);
        amk_mma_16816<BF>(o[n], pa, r[0], r[1]);
        amk_mma_16816<BF>(o[n + 1], pa, r[2], r[3]);
      }
    }
  }
  amk_cp_async_wait_all();
  __syncthreads(); /* every warp is past its last read of the stages */
  amk_probe(ctx, 1); /* every key block done */
  ac_merge_store<BF, HD>(pl, pg0, np, smem, active, p0, p1, m0, m1, l0, l1, o);
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
  /* Every row's position checked, a thread a row (one round trip); on a bad one, thread 0
   * reports the first, as a row-by-row check would. */
  const long long max_seq = a.kc->numel / a.row;
  bool bad = false;
  for (long long r = p.m_off + threadIdx.x; r < p.m_off + p.M_tile; r += AMK_THREADS) {
    const long long pr = amk_ldif(a.pos, r);
    bad |= pr < 0 || pr >= max_seq;
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0)
      for (long long r = p.m_off; r < p.m_off + p.M_tile; ++r) {
        const long long pr = amk_ldif(a.pos, r);
        if (pr < 0 || pr >= max_seq) {
          amk_fail(ctx, AMK_ERR_INDEX, pr);
          break;
        }
      }
    return;
  }
  amk_probe(ctx, 2); /* the rows' positions checked */
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
