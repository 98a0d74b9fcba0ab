/* NEXT_TOKEN (code 24): the tail of one iteration of a decode loop that runs on the device.
 * Mirrors ops/next-token/src/reference.rs (semantics in src/lib.rs, the choice in
 * src/choose.rs, the random stream in src/noise.rs).
 *
 * Inputs  [logits (F32/F16/BF16, one row of V), pos (integer; element 0 = p), prompt (I32, L),
 *          stop (I32; negative = unused), limits (I32 >= 6: P, E, top_k, seed_lo, seed_hi,
 *          vocab_limit), sampling (F32 >= 2: temperature, top_p)]
 * Outputs [pos (the same buffer as input 1), token (I32), halt (I32), emitted (I32 [R, 2])]
 *
 * With q = p + 1: p < 0 fails (AMK_ERR_INDEX, detail p). When q < P the next token is
 * prompt[q] (AMK_ERR_INDEX, detail q, when q >= L) and emitted is not touched; otherwise the
 * token is chosen from the logits and emitted[q] = (token, f32 bits of its log-probability)
 * (AMK_ERR_INDEX, detail q, when q >= R). Then pos = q, token = next and halt = 1 when
 * (q >= P and next is a non-negative stop id) or q + 1 >= E. Every check comes before the
 * first write: a failing task writes nothing.
 *
 * The choice, over the valid ids (i < V' = min(vocab_limit, V) when vocab_limit > 0, else V;
 * NaN logits never take part):
 * - greedy unless the temperature T is > 0 and finite: the lowest index of the largest logit
 *   (SAMPLE_ARGMAX's rule), 0 when no id is valid;
 * - sampling: z_i = l_i / T, m = max z (= m1 / T; greedy again when m is not finite),
 *   w_i = expf(z_i - m), integer key_i = min(floor(w_i * 2^32), 2^32 - 1); top-k (0 < k <
 *   valid ids) keeps keys >= the k-th largest key; top-p (top_p < 1) keeps, within that, keys
 *   >= the largest t whose keys >= t sum to at least max(1, ceil(top_p * their total)) (f64);
 *   keys of 0 are dropped; next = the lowest index of the largest z_i + g_i over the kept ids,
 *   g_i = -ln(-ln(u_i)) with u_i = ((r >> 41) + 0.5) / 2^23 and r = mix(mix(seed ^ q *
 *   0x9E3779B97F4A7C15) ^ i) (SplitMix64's finaliser): a Gumbel-max draw, exact sampling from
 *   softmax(l / T) restricted to the kept set.
 * - log-probability of next at temperature 1 over the valid ids, in f32:
 *   (l_next - m1) - logf(sum exp(l_i - m1)); the canonical NaN 0x7FC00000 when no id is valid
 *   or m1 is infinite.
 *
 * One block does everything; every thread reads the scalars itself (so every branch is
 * block-uniform) and one barrier separates the last read of pos from thread 0's writes.
 * Greedy is two passes over the logits (nt_greedy): per thread the first-largest logit
 * (indices visited in increasing order, strict >) and the count of valid ids, merged by warp
 * shuffles and a fixed-order cross-warp merge with SAMPLE_ARGMAX's tie rule; then the sum of
 * exp(l - max) in a fixed order (the log-probability's). Sampling adds, when enabled, 4 + 4 passes of a radix select over
 * the 32-bit keys (8 bits a pass, a 256-bin shared histogram: counts for top-k, key masses for
 * top-p; the keys are recomputed from the logits each pass, no scratch of V entries; each
 * thread adds runs of equal bins locally before its atomicAdd, and integer atomics sum in any
 * order to the same value) and one pass for the Gumbel argmax. Same inputs, same token, on
 * every run.
 *
 * `emitted` may be host-mapped memory that the host polls while the kernel runs: the
 * log-probability word is stored first, then a system fence, then the token word (volatile),
 * then another fence, so a host that sees the token sees its log-probability. */

#define NT_FULL 0xffffffffu
#define NT_BINS 256

/* SplitMix64's finaliser (noise.rs `mix`). */
__device__ __forceinline__ unsigned long long nt_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The Gumbel variate of id i under the position's base (noise.rs `gumbel`): u is an odd
 * multiple of 2^-24 in (0, 1), exact in f32, so g is finite. */
__device__ __forceinline__ float nt_gumbel(unsigned long long base, long long i) {
  const unsigned long long r = nt_mix(base ^ (unsigned long long)i);
  const float u = __fdiv_rn(__fadd_rn((float)(unsigned)(r >> 41), 0.5f), 8388608.0f);
  return -logf(-logf(u));
}

__device__ __forceinline__ bool nt_finite(float x) {
  return fabsf(x) < __int_as_float(0x7f800000);
}

/* The integer key of a scaled logit z under the maximum m (choose.rs `key`): w * 2^32 is
 * exact in f32, and float-to-unsigned truncation is the floor of a non-negative value. */
__device__ __forceinline__ unsigned nt_key(float z, float m) {
  const float s = __fmul_rn(expf(__fsub_rn(z, m)), 4294967296.0f);
  return s >= 4294967296.0f ? 0xffffffffu : (unsigned)s;
}

/* Merges another thread's greedy state: the larger value wins, equal values the lower index
 * (bi < 0: none); the valid counts add. Symmetric, so both lanes of a shuffle agree. */
__device__ __forceinline__ void nt_merge_max(float& bv, long long& bi, int& n, float ov, long long oi,
                                             int on) {
  n += on;
  if (oi < 0) return;
  if (bi < 0 || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

/* The block's reductions (one at a time; a barrier before each reuse). */
struct nt_red_t {
  float v[AMK_WARPS];
  long long i[AMK_WARPS];
  float s[AMK_WARPS];
  int n[AMK_WARPS];
  float rv;
  long long ri;
  float rs;
  int rn;
};
__shared__ nt_red_t nt_red;

/* ---- pass A, as two passes (nt_greedy): the first-largest valid logit and the valid count,
 * then the sum of exp(l - max) over the valid ids. Each streams the logits in 16-byte vectors
 * of the logits' own dtype, NT_VEC a thread in flight before any is used, with no branch an
 * element (other dtypes and unaligned bases element by element). A one-pass online softmax
 * before (a dtype branch, a branch and an expf an element, each load waiting on the one
 * before) took about 80 us of a decode pass on one SM (docs/perf-notes.md round 39). */
#define NT_VEC 4

/* A thread's first-largest valid logit (bi < 0: none) and valid count (strict >: the first of
 * equal maxima, ids visited in increasing order). */
struct nt_max_state {
  float bv;
  long long bi;
  int n;
  __device__ __forceinline__ void visit(float l, long long i) {
    const bool valid = l == l;
    n += valid;
    const bool take = valid && (bi < 0 || l > bv);
    bv = take ? l : bv;
    bi = take ? i : bi;
  }
};

/* A thread's sum of expf(l - m) over its valid ids, in increasing order. */
struct nt_sum_state {
  float m, s;
  __device__ __forceinline__ void visit(float l, long long) {
    s = l == l ? __fadd_rn(s, expf(__fsub_rn(l, m))) : s;
  }
};

/* Word w's two 16-bit elements as f32 (BF16 or F16). */
__device__ __forceinline__ float nt_lo(int dt, uint32_t w) {
  return dt == AMK_BF16 ? __uint_as_float(w << 16) : amk_f16_to_f32((uint16_t)(w & 0xffffu));
}
__device__ __forceinline__ float nt_hi(int dt, uint32_t w) {
  return dt == AMK_BF16 ? __uint_as_float(w & 0xffff0000u) : amk_f16_to_f32((uint16_t)(w >> 16));
}

/* Feeds a thread's ids below vp to st.visit(l, i) in increasing order: 16-byte units t, t + T,
 * ... (4 F32 or 8 BF16/F16 elements each), then the tail's ids t, t + T, ... (every one past
 * the thread's units). By value, so the state stays in registers. */
template <class S>
__device__ __forceinline__ S nt_each(const amk_buffer_t* xb, long long vp, S st) {
  const int dt = xb->dtype;
  const uint4* q = (const uint4*)xb->ptr;
  const int per = dt == AMK_F32 ? 4 : 8;
  long long tail = 0;
  if ((dt == AMK_F32 || dt == AMK_BF16 || dt == AMK_F16) && amk_al16(q)) {
    const long long nu = vp / per;
#pragma unroll 1
    for (long long u0 = threadIdx.x; u0 < nu; u0 += NT_VEC * AMK_THREADS) {
      uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0, v2 = v0, v3 = v0;
      const long long u1 = u0 + AMK_THREADS, u2 = u1 + AMK_THREADS, u3 = u2 + AMK_THREADS;
      v0 = q[u0];
      if (u1 < nu) v1 = q[u1];
      if (u2 < nu) v2 = q[u2];
      if (u3 < nu) v3 = q[u3];
      const uint4 vs[NT_VEC] = {v0, v1, v2, v3};
      const long long us[NT_VEC] = {u0, u1, u2, u3};
#pragma unroll
      for (int k = 0; k < NT_VEC; ++k) {
        if (us[k] >= nu) break;
        const uint32_t w[4] = {vs[k].x, vs[k].y, vs[k].z, vs[k].w};
        const long long i0 = us[k] * per;
        if (dt == AMK_F32) {
#pragma unroll
          for (int j = 0; j < 4; ++j) st.visit(__uint_as_float(w[j]), i0 + j);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            st.visit(nt_lo(dt, w[j]), i0 + 2 * j);
            st.visit(nt_hi(dt, w[j]), i0 + 2 * j + 1);
          }
        }
      }
    }
    tail = nu * per;
  }
#pragma unroll 1
  for (long long i = tail + threadIdx.x; i < vp; i += AMK_THREADS) st.visit(amk_ldf(xb, i), i);
  return st;
}

/* Block merge of every thread's (bv, bi, n): the larger value wins, equal values the lower
 * index; every thread gets the result. */
__device__ __forceinline__ void nt_reduce_max(float& bv, long long& bi, int& n) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(NT_FULL, bv, o);
    const long long oi = __shfl_xor_sync(NT_FULL, bi, o);
    const int on = __shfl_xor_sync(NT_FULL, n, o);
    nt_merge_max(bv, bi, n, ov, oi, on);
  }
  __syncthreads(); /* earlier readers of nt_red are done */
  if (lane == 0) {
    nt_red.v[warp] = bv;
    nt_red.i[warp] = bi;
    nt_red.n[warp] = n;
  }
  __syncthreads();
  if (tid == 0) {
    float v = nt_red.v[0];
    long long i = nt_red.i[0];
    int c = nt_red.n[0];
    for (int w = 1; w < AMK_WARPS; ++w) nt_merge_max(v, i, c, nt_red.v[w], nt_red.i[w], nt_red.n[w]);
    nt_red.rv = v;
    nt_red.ri = i;
    nt_red.rn = c;
  }
  __syncthreads();
  bv = nt_red.rv;
  bi = nt_red.ri;
  n = nt_red.rn;
}

/* A thread's sum merged over the block in a fixed order (the warps' shuffle tree, then the
 * warps in order): the same bits on every run. Every thread gets the sum. */
__device__ __forceinline__ float nt_reduce_sum(float s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(NT_FULL, s, o));
  __syncthreads(); /* earlier readers of nt_red are done */
  if (lane == 0) nt_red.s[warp] = s;
  __syncthreads();
  if (tid == 0) {
    float t = nt_red.s[0];
    for (int w = 1; w < AMK_WARPS; ++w) t = __fadd_rn(t, nt_red.s[w]);
    nt_red.rs = t;
  }
  __syncthreads();
  return nt_red.rs;
}

/* Pass A's result: the first-largest valid logit m1 at bi (bi < 0: none), the valid count n,
 * and bs = the sum of exp(l - m1) over the valid ids (1 when there is none or m1 is not
 * finite: the log-probability is then not computed). */
struct nt_greedy_t {
  float m1, bs;
  long long bi;
  int n;
};

/* Pass A, out of line (its loads in flight would take the registers of the dispatcher it is
 * otherwise inlined into). Block-uniform. */
__device__ __noinline__ nt_greedy_t nt_greedy(const amk_buffer_t* xb, long long vp) {
  const nt_max_state st = nt_each(xb, vp, nt_max_state{-__int_as_float(0x7f800000), -1, 0});
  nt_greedy_t r;
  r.m1 = st.bv;
  r.bi = st.bi;
  r.n = st.n;
  nt_reduce_max(r.m1, r.bi, r.n);
  r.bs = 1.0f;
  if (r.bi >= 0 && nt_finite(r.m1)) r.bs = nt_reduce_sum(nt_each(xb, vp, nt_sum_state{r.m1, 0.0f}).s);
  return r;
}

/* Block argmax of (score, index) candidates (index < 0: none), lowest index on ties; every
 * thread gets the winner's index. */
__device__ __forceinline__ void nt_argmax_merge(float& bv, long long& bi, float ov, long long oi) {
  if (oi < 0) return;
  if (bi < 0 || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}
__device__ __forceinline__ long long nt_reduce_argmax(float bv, long long bi) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(NT_FULL, bv, o);
    const long long oi = __shfl_xor_sync(NT_FULL, bi, o);
    nt_argmax_merge(bv, bi, ov, oi);
  }
  __syncthreads();
  if (lane == 0) {
    nt_red.v[warp] = bv;
    nt_red.i[warp] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    float v = nt_red.v[0];
    long long i = nt_red.i[0];
    for (int w = 1; w < AMK_WARPS; ++w) nt_argmax_merge(v, i, nt_red.v[w], nt_red.i[w]);
    nt_red.ri = i;
  }
  __syncthreads();
  return nt_red.ri;
}

/* ---- radix select over the keys ---- */

struct nt_sel_t {
  unsigned long long hist[NT_BINS];
  unsigned long long above;  /* weight of the keys above the prefix's range so far */
  unsigned long long target; /* the weight to reach */
  unsigned prefix;           /* the digits chosen so far */
};
__shared__ nt_sel_t nt_sel;

/* The largest t in [0, 2^32) with F(t) >= target, where F(t) sums, over the valid ids
 * (i < vp, logit not NaN) whose key is >= `lower` and >= t, a weight of 1 (top-k: F counts)
 * or the key itself (`mass`, top-p: F is a mass, and the target is max(1, ceil(top_p * F(0)))
 * in f64, known once the first pass has summed F(0)). Most-significant digit first: each pass
 * histograms the 8-bit digit at `shift` of the keys that match the digits chosen so far, and
 * warp 0 picks the largest digit d with above + (weight of digits >= d) >= target. Every
 * thread calls it; every thread gets t. */
__device__ __noinline__ unsigned nt_select(const amk_buffer_t* xb, long long vp, float T, float m,
                                           unsigned lower, bool mass, unsigned long long target,
                                           float top_p) {
  const int tid = threadIdx.x, lane = tid & 31;
  __syncthreads(); /* earlier readers of nt_sel are done */
  if (tid == 0) {
    nt_sel.prefix = 0u;
    nt_sel.above = 0ull;
    nt_sel.target = target;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < NT_BINS; b += AMK_THREADS) nt_sel.hist[b] = 0ull;
    __syncthreads();
    const unsigned prefix = nt_sel.prefix;
    const unsigned hmask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    /* Runs of equal bins (most keys share the lowest bins) are summed before the atomic. */
    int cur = -1;
    unsigned long long acc = 0ull;
    for (long long i = tid; i < vp; i += AMK_THREADS) {
      const float l = amk_ldf(xb, i);
      if (l != l) continue;
      const unsigned key = nt_key(__fdiv_rn(l, T), m);
      if (key < lower || ((key ^ prefix) & hmask) != 0u) continue;
      const int bin = (int)((key >> shift) & 255u);
      const unsigned long long w = mass ? (unsigned long long)key : 1ull;
      if (bin == cur) {
        acc += w;
      } else {
        if (cur >= 0) atomicAdd(&nt_sel.hist[cur], acc);
        cur = bin;
        acc = w;
      }
    }
    if (cur >= 0) atomicAdd(&nt_sel.hist[cur], acc);
    __syncthreads();
    if (tid < 32) {
      /* Lane L holds bins 255 - 8L - j, j = 0..7 (descending), then an inclusive scan over
         the lanes: cum = the weight of every bin >= lane L's lowest. */
      unsigned long long h[8], own = 0ull;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        h[j] = nt_sel.hist[NT_BINS - 1 - 8 * lane - j];
        own += h[j];
      }
      unsigned long long cum = own;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long x = __shfl_up_sync(NT_FULL, cum, o);
        if (lane >= o) cum += x;
      }
      const unsigned long long above = nt_sel.above;
      unsigned long long tgt = nt_sel.target;
      if (mass && shift == 24) {
        const unsigned long long total = __shfl_sync(NT_FULL, cum, 31);
        const double c = ceil((double)top_p * (double)total);
        tgt = c < 1.0 ? 1ull : (unsigned long long)c;
      }
      const unsigned hit = __ballot_sync(NT_FULL, above + cum >= tgt);
      const int leader = hit ? __ffs(hit) - 1 : 31; /* never 0: the target is reachable */
      if (lane == leader) {
        unsigned long long run = above + cum - own;
        int digit = 0;
        for (int j = 0; j < 8; ++j) {
          if (run + h[j] >= tgt) {
            digit = NT_BINS - 1 - 8 * lane - j;
            break;
          }
          run += h[j];
        }
        nt_sel.prefix = prefix | ((unsigned)digit << shift);
        nt_sel.above = run;
        nt_sel.target = tgt;
      }
    }
    __syncthreads();
  }
  return nt_sel.prefix;
}

/* The seeded draw (sampling path): thresholds, then the Gumbel argmax over the kept ids. */
__device__ __noinline__ long long nt_sample(const amk_buffer_t* xb, long long vp, float T, float m,
                                            int n_valid, int top_k, float top_p,
                                            unsigned long long seed, long long q) {
  unsigned t_k = 0u, t_p = 0u;
  if (top_k > 0 && top_k < n_valid)
    t_k = nt_select(xb, vp, T, m, 0u, false, (unsigned long long)top_k, top_p);
  if (top_p < 1.0f) t_p = nt_select(xb, vp, T, m, t_k, true, 1ull, top_p);
  unsigned thr = t_k > t_p ? t_k : t_p;
  if (thr < 1u) thr = 1u;
  const unsigned long long base = nt_mix(seed ^ ((unsigned long long)q * 0x9E3779B97F4A7C15ull));
  float bv = 0.0f;
  long long bi = -1;
  for (long long i = threadIdx.x; i < vp; i += AMK_THREADS) {
    const float l = amk_ldf(xb, i);
    if (l != l) continue;
    const float z = __fdiv_rn(l, T);
    if (nt_key(z, m) < thr) continue;
    const float score = __fadd_rn(z, nt_gumbel(base, i));
    if (bi < 0 || score > bv) {
      bv = score;
      bi = i;
    }
  }
  const long long next = nt_reduce_argmax(bv, bi);
  return next < 0 ? 0 : next;
}

__device__ void amk_op_next_token(const amk_task_ctx& ctx) {
  if (ctx.inst->n_inputs != 6 || ctx.inst->n_outputs != 4) {
    amk_fail(ctx, AMK_ERR_SHAPE, ctx.inst->n_inputs);
    return;
  }
  const amk_buffer_t* xb = amk_in(ctx, 0);
  const amk_buffer_t* pin = amk_in(ctx, 1);
  const amk_buffer_t* prb = amk_in(ctx, 2);
  const amk_buffer_t* stb = amk_in(ctx, 3);
  const amk_buffer_t* lmb = amk_in(ctx, 4);
  const amk_buffer_t* sab = amk_in(ctx, 5);
  const amk_buffer_t* pout = amk_out(ctx, 0);
  const amk_buffer_t* tkb = amk_out(ctx, 1);
  const amk_buffer_t* hlb = amk_out(ctx, 2);
  const amk_buffer_t* emb = amk_out(ctx, 3);
  const bool separate = ctx.inst->inputs[1] != ctx.inst->outputs[0];

  /* Descriptors (the validator's rule, checked again: one task a step, the checks are cheap). */
  const int xdt = xb->dtype;
  if (xdt != AMK_F32 && xdt != AMK_F16 && xdt != AMK_BF16) { amk_fail(ctx, AMK_ERR_DTYPE, xdt); return; }
  const long long V = xb->numel;
  if (V < 1 || V != amk_last_dim(xb)) { amk_fail(ctx, AMK_ERR_SHAPE, V); return; }
  if (!amk_is_int(pin->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, pin->dtype); return; }
  if (!amk_is_int(pout->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, pout->dtype); return; }
  if (pin->numel < 1 || pout->numel != pin->numel) { amk_fail(ctx, AMK_ERR_SHAPE, pin->numel); return; }
  const amk_buffer_t* i32s[6] = {prb, stb, lmb, tkb, hlb, emb};
  const long long mins[6] = {1, 1, 6, 1, 1, 0};
#pragma unroll
  for (int b = 0; b < 6; ++b) {
    if (i32s[b]->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, i32s[b]->dtype); return; }
    if (i32s[b]->numel < mins[b]) { amk_fail(ctx, AMK_ERR_SHAPE, i32s[b]->numel); return; }
  }
  if (sab->dtype != AMK_F32) { amk_fail(ctx, AMK_ERR_DTYPE, sab->dtype); return; }
  if (sab->numel < 2) { amk_fail(ctx, AMK_ERR_SHAPE, sab->numel); return; }
  if (emb->rank != 2 || emb->shape[1] != 2) { amk_fail(ctx, AMK_ERR_SHAPE, emb->rank); return; }

  /* Data: every thread reads the same scalars (nothing writes them during the task before
     the barrier below), so every decision is block-uniform. */
  const long long p = amk_ldif(pin, 0);
  if (p < 0) { amk_fail(ctx, AMK_ERR_INDEX, p); return; }
  const long long q = p + 1;
  const int32_t* lim = (const int32_t*)lmb->ptr;
  const long long P = lim[0], E = lim[1];
  const bool forcing = q < P;
  if (forcing ? q >= prb->numel : q >= emb->shape[0]) { amk_fail(ctx, AMK_ERR_INDEX, q); return; }

  long long next;
  float lp = __int_as_float(0x7fc00000);
  if (forcing) {
    next = ((const int32_t*)prb->ptr)[q];
  } else {
    const int top_k = lim[2];
    const unsigned long long seed =
        (unsigned long long)(unsigned)lim[3] | ((unsigned long long)(unsigned)lim[4] << 32);
    const long long vl = lim[5];
    const long long vp = vl > 0 && vl < V ? vl : V;
    const float* smp = (const float*)sab->ptr;
    const float T = smp[0], top_p = smp[1];

    const nt_greedy_t gr = nt_greedy(xb, vp);
    const float m1 = gr.m1, bs = gr.bs;
    const long long bi = gr.bi;
    const int n = gr.n;
    amk_probe(ctx, 0); /* the greedy passes done */
    const float m = __fdiv_rn(m1, T);
    next = bi < 0 ? 0 : bi;
    float l_next = m1;
    if (bi >= 0 && T > 0.0f && nt_finite(T) && nt_finite(m)) {
      next = nt_sample(xb, vp, T, m, n, top_k, top_p, seed, q);
      l_next = amk_ldf(xb, next);
    }
    if (bi >= 0 && nt_finite(m1)) {
      const float v = __fsub_rn(__fsub_rn(l_next, m1), logf(bs));
      if (v == v) lp = v;
    }
    amk_probe(ctx, 1); /* the token chosen */
  }

  __syncthreads(); /* every thread has read pos before thread 0 writes it */
  if (threadIdx.x != 0) return;
  bool stops = false;
  if (!forcing) {
    const int32_t* st = (const int32_t*)stb->ptr;
    for (long long e = 0; e < stb->numel; ++e) stops |= st[e] >= 0 && st[e] == next;
    int32_t* row = (int32_t*)emb->ptr + 2 * q;
    *((volatile int32_t*)&row[1]) = __float_as_int(lp);
    __threadfence_system();
    *((volatile int32_t*)&row[0]) = (int32_t)next;
    __threadfence_system();
    amk_probe(ctx, 2); /* the emitted row fenced */
  }
  if (separate)
    for (long long e = 0; e < pin->numel; ++e) amk_stif(pout, e, amk_ldif(pin, e));
  amk_stif(pout, 0, q);
  ((int32_t*)tkb->ptr)[0] = (int32_t)next;
  ((int32_t*)hlb->ptr)[0] = (stops || q + 1 >= E) ? 1 : 0;
}
