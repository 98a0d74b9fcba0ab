/* NEXT_TOKEN (code 24): the tail of one iteration of a decode loop that runs on the device.
 * Mirrors ops/next-token/src/reference.rs (semantics in src/lib.rs, the choice in
 * src/choose.rs, the random stream in src/noise.rs).
 *
 * Inputs  [logits (F32/F16/BF16, one row of V), pos (integer; element 0 = p), prompt (I32, L),
 *          stop (I32; negative = unused), limits (I32 >= 6: P, E, top_k, seed_lo, seed_hi,
 *          vocab_limit), sampling (F32 >= 2: temperature, top_p)
 *          [, stats (I32 [4, G]: LOGIT_STATS's summaries of these logits)]]
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
 * Greedy is two passes over the logits (nt_greedy, amk_logits.cuh): per thread the
 * first-largest logit (indices visited in increasing order, strict >) and the count of valid
 * ids, merged by warp shuffles and a fixed-order cross-warp merge with SAMPLE_ARGMAX's tie
 * rule; then the sum of exp(l - max) in a fixed order (the log-probability's). With the stats
 * (input 6) the same four values come from merging the slots' summaries (nt_from_stats), and a
 * greedy choice reads no logit. Sampling adds, when enabled, 4 + 4 passes of a radix select
 * over the 32-bit keys (8 bits a pass, a 256-bin shared histogram: counts for top-k, key masses for
 * top-p; the keys are recomputed from the logits each pass, no scratch of V entries; each
 * thread adds runs of equal bins locally before its atomicAdd, and integer atomics sum in any
 * order to the same value) and one pass for the Gumbel argmax. Same inputs, same token, on
 * every run.
 *
 * `emitted` may be host-mapped memory that the host polls while the kernel runs: the row
 * (token, log-probability) is one aligned 8-byte volatile store, so a host that sees the token
 * sees its log-probability; a row that is not 8-byte aligned stores the log-probability, a
 * system fence, then the token. No fence after: nothing on the device reads the row, and the
 * kernel's end makes every row visible. */

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

/* The integer key of a scaled logit z under the maximum m (choose.rs `key`): w * 2^32 is
 * exact in f32, and float-to-unsigned truncation is the floor of a non-negative value. */
__device__ __forceinline__ unsigned nt_key(float z, float m) {
  const float s = __fmul_rn(expf(__fsub_rn(z, m)), 4294967296.0f);
  return s >= 4294967296.0f ? 0xffffffffu : (unsigned)s;
}

/* Pass A's result: the first-largest valid logit m1 at bi (bi < 0: none), the valid count n,
 * and bs = the sum of exp(l - m1) over the valid ids (1 when there is none or m1 is not
 * finite: the log-probability is then not computed). */
struct nt_greedy_t {
  float m1, bs;
  long long bi;
  int n;
};

/* Pass A over the logits (amk_logits.cuh), out of line (its loads in flight would take the
 * registers of the dispatcher it is otherwise inlined into). Block-uniform. */
__device__ __noinline__ nt_greedy_t nt_greedy(const amk_buffer_t* xb, long long vp) {
  const amk_lg_max st = amk_lg_each(xb, 0, vp, amk_lg_max{-__int_as_float(0x7f800000), -1, 0});
  nt_greedy_t r;
  r.m1 = st.bv;
  r.bi = st.bi;
  r.n = st.n;
  amk_lg_reduce_max(r.m1, r.bi, r.n);
  r.bs = 1.0f;
  if (r.bi >= 0 && amk_lg_finite(r.m1))
    r.bs = amk_lg_reduce_sum(amk_lg_each(xb, 0, vp, amk_lg_sum{r.m1, 0.0f}).s);
  return r;
}

/* Pass A from LOGIT_STATS's summaries instead (input 6, I32 [4, G]: column g's largest logit
 * bits, its first id, the bits of its sum of exps, its count): a thread a slot, the slots merged
 * as the logits are (the larger maximum, then the lower id; counts added), then each finite
 * slot's sum rescaled to the merged maximum, sum_g s_g * expf(m_g - m1), in a fixed order. */
__device__ __noinline__ nt_greedy_t nt_from_stats(const amk_buffer_t* sb) {
  const int32_t* w = (const int32_t*)sb->ptr;
  const long long G = sb->shape[1];
  float bv = -__int_as_float(0x7f800000);
  long long bi = -1;
  int n = 0;
  for (long long g = threadIdx.x; g < G; g += AMK_THREADS)
    amk_lg_merge_max(bv, bi, n, __int_as_float(w[g]), w[G + g], w[3 * G + g]);
  amk_lg_reduce_max(bv, bi, n);
  nt_greedy_t r;
  r.m1 = bv;
  r.bi = bi;
  r.n = n;
  r.bs = 1.0f;
  if (bi >= 0 && amk_lg_finite(bv)) {
    float s = 0.0f;
    for (long long g = threadIdx.x; g < G; g += AMK_THREADS) {
      const float mg = __int_as_float(w[g]);
      if (w[G + g] >= 0 && amk_lg_finite(mg))
        s = __fadd_rn(s, __fmul_rn(__int_as_float(w[2 * G + g]), expf(__fsub_rn(mg, bv))));
    }
    r.bs = amk_lg_reduce_sum(s);
  }
  return r;
}

/* Block argmax of (score, index) candidates (index < 0: none), lowest index on ties; every
 * thread gets the winner's index. */
__device__ __forceinline__ long long nt_reduce_argmax(float bv, long long bi) {
  int n = 0;
  amk_lg_reduce_max(bv, bi, n);
  return bi;
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
        const unsigned long long x = __shfl_up_sync(AMK_LG_FULL, cum, o);
        if (lane >= o) cum += x;
      }
      const unsigned long long above = nt_sel.above;
      unsigned long long tgt = nt_sel.target;
      if (mass && shift == 24) {
        const unsigned long long total = __shfl_sync(AMK_LG_FULL, cum, 31);
        const double c = ceil((double)top_p * (double)total);
        tgt = c < 1.0 ? 1ull : (unsigned long long)c;
      }
      const unsigned hit = __ballot_sync(AMK_LG_FULL, above + cum >= tgt);
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

/* The operands (descriptors only: the checks before the wait). */
struct nt_args {
  const amk_buffer_t *x, *pin, *prompt, *stop, *lim, *smp, *stats, *pout, *token, *halt, *emitted;
  bool separate; /* pos is read from one buffer and written to another */
};

/* Pulls the operands and checks their descriptors (every check that reads no data). */
__device__ __forceinline__ bool nt_setup(const amk_task_ctx& ctx, nt_args& a) {
  if (ctx.inst->n_inputs < 6 || ctx.inst->n_inputs > 7 || ctx.inst->n_outputs != 4) {
    amk_fail(ctx, AMK_ERR_SHAPE, ctx.inst->n_inputs);
    return false;
  }
  a.x = amk_in(ctx, 0);
  a.pin = amk_in(ctx, 1);
  a.prompt = amk_in(ctx, 2);
  a.stop = amk_in(ctx, 3);
  a.lim = amk_in(ctx, 4);
  a.smp = amk_in(ctx, 5);
  a.stats = ctx.inst->n_inputs == 7 ? amk_in(ctx, 6) : nullptr;
  a.pout = amk_out(ctx, 0);
  a.token = amk_out(ctx, 1);
  a.halt = amk_out(ctx, 2);
  a.emitted = amk_out(ctx, 3);
  a.separate = ctx.inst->inputs[1] != ctx.inst->outputs[0];

  const int xdt = a.x->dtype;
  if (xdt != AMK_F32 && xdt != AMK_F16 && xdt != AMK_BF16) { amk_fail(ctx, AMK_ERR_DTYPE, xdt); return false; }
  const long long V = a.x->numel;
  if (V < 1 || V != amk_last_dim(a.x)) { amk_fail(ctx, AMK_ERR_SHAPE, V); return false; }
  if (!amk_is_int(a.pin->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, a.pin->dtype); return false; }
  if (!amk_is_int(a.pout->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, a.pout->dtype); return false; }
  if (a.pin->numel < 1 || a.pout->numel != a.pin->numel) { amk_fail(ctx, AMK_ERR_SHAPE, a.pin->numel); return false; }
  const amk_buffer_t* i32s[6] = {a.prompt, a.stop, a.lim, a.token, a.halt, a.emitted};
  const long long mins[6] = {1, 1, 6, 1, 1, 0};
#pragma unroll
  for (int b = 0; b < 6; ++b) {
    if (i32s[b]->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, i32s[b]->dtype); return false; }
    if (i32s[b]->numel < mins[b]) { amk_fail(ctx, AMK_ERR_SHAPE, i32s[b]->numel); return false; }
  }
  if (a.smp->dtype != AMK_F32) { amk_fail(ctx, AMK_ERR_DTYPE, a.smp->dtype); return false; }
  if (a.smp->numel < 2) { amk_fail(ctx, AMK_ERR_SHAPE, a.smp->numel); return false; }
  if (a.emitted->rank != 2 || a.emitted->shape[1] != 2) { amk_fail(ctx, AMK_ERR_SHAPE, a.emitted->rank); return false; }
  if (a.stats && a.stats->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, a.stats->dtype); return false; }
  if (a.stats && (a.stats->rank != 2 || a.stats->shape[0] != 4 || a.stats->shape[1] < 1)) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.stats->rank);
    return false;
  }
  return true;
}

/* The launch's settings: limits (prompt length P, end E, top_k, seed, vocabulary limit) and
 * sampling (temperature T, top_p). */
struct nt_consts {
  long long P, E, vl;
  int top_k;
  unsigned long long seed;
  float T, top_p;
};

__device__ __forceinline__ nt_consts nt_read_consts(const nt_args& a) {
  const int32_t* lim = (const int32_t*)a.lim->ptr;
  const float* smp = (const float*)a.smp->ptr;
  nt_consts k;
  k.P = lim[0];
  k.E = lim[1];
  k.top_k = lim[2];
  k.seed = (unsigned long long)(unsigned)lim[3] | ((unsigned long long)(unsigned)lim[4] << 32);
  k.vl = lim[5];
  k.T = smp[0];
  k.top_p = smp[1];
  return k;
}

/* The chosen (or forced) token's writes, by one thread: the emitted row (when not forcing; see
 * the top for its one store), then the position, the token and the halt flag. */
__device__ __forceinline__ void nt_finish(const amk_task_ctx& ctx, const nt_args& a, long long q, long long E,
                                          bool forcing, bool stops, long long next, float lp) {
  if (!forcing) {
    int32_t* row = (int32_t*)a.emitted->ptr + 2 * q;
    if (((unsigned long long)row & 7) == 0) {
      const unsigned long long w = (unsigned long long)(unsigned)(int32_t)next |
                                   ((unsigned long long)(unsigned)__float_as_int(lp) << 32);
      *((volatile unsigned long long*)row) = w;
    } else {
      *((volatile int32_t*)&row[1]) = __float_as_int(lp);
      __threadfence_system();
      *((volatile int32_t*)&row[0]) = (int32_t)next;
    }
    amk_probe(ctx, 2); /* the emitted row stored */
  }
  if (a.separate)
    for (long long e = 0; e < a.pin->numel; ++e) amk_stif(a.pout, e, amk_ldif(a.pin, e));
  amk_stif(a.pout, 0, q);
  ((int32_t*)a.token->ptr)[0] = (int32_t)next;
  ((int32_t*)a.halt->ptr)[0] = (stops || q + 1 >= E) ? 1 : 0;
}

/* Summaries a lane holds on the greedy warp path: stats of up to 32 * NT_SL slots (the tuned
 * schedule has at most 128, lower/mod.rs StatsLayout). */
#define NT_SL 4

/* Greedy from LOGIT_STATS's summaries by warp 0 alone (the block's other warps have returned):
 * after the wait every load of the step is in flight at once (the position, the lanes'
 * summaries, and the stop ids unless read before it), then the merges of nt_from_stats by warp
 * shuffles alone (no barrier), and lane 0's writes. The same token, and the same
 * log-probability to the sum's last bits (a different order of the slots' sums), as the block
 * path. */
__device__ __noinline__ void nt_greedy_warp(const amk_task_ctx& ctx, const nt_args& a, const nt_consts& k) {
  const int lane = threadIdx.x & 31;
  const int32_t* w = (const int32_t*)a.stats->ptr;
  const long long G = a.stats->shape[1];
  int32_t sm[NT_SL], si[NT_SL], ss[NT_SL], sn[NT_SL];
#pragma unroll
  for (int j = 0; j < NT_SL; ++j) {
    const long long g = lane + 32 * j;
    const bool in = g < G;
    sm[j] = in ? w[g] : 0;
    si[j] = in ? w[G + g] : -1;
    ss[j] = in ? w[2 * G + g] : 0;
    sn[j] = in ? w[3 * G + g] : 0;
  }
  const long long ns = a.stop->numel;
  const int32_t* st = (const int32_t*)a.stop->ptr;
  const int32_t s0 = lane < ns ? st[lane] : -1, s1 = lane + 32 < ns ? st[lane + 32] : -1;
  const long long p = amk_ldif(a.pin, 0);
  if (p < 0) { if (lane == 0) amk_fail(ctx, AMK_ERR_INDEX, p); return; }
  const long long q = p + 1;
  const bool forcing = q < k.P;
  if (forcing ? q >= a.prompt->numel : q >= a.emitted->shape[0]) {
    if (lane == 0) amk_fail(ctx, AMK_ERR_INDEX, q);
    return;
  }

  float bv = -__int_as_float(0x7f800000);
  long long bi = -1;
  int n = 0;
#pragma unroll
  for (int j = 0; j < NT_SL; ++j) amk_lg_merge_max(bv, bi, n, __int_as_float(sm[j]), si[j], sn[j]);
  amk_lg_warp_max(bv, bi, n);
  float bs = 1.0f;
  if (bi >= 0 && amk_lg_finite(bv)) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NT_SL; ++j) {
      const float mg = __int_as_float(sm[j]);
      if (si[j] >= 0 && amk_lg_finite(mg)) s = __fadd_rn(s, __fmul_rn(__int_as_float(ss[j]), expf(__fsub_rn(mg, bv))));
    }
    bs = amk_lg_warp_sum(s);
  }
  amk_probe(ctx, 0); /* the greedy merge done */
  long long next = bi < 0 ? 0 : bi;
  float lp = __int_as_float(0x7fc00000);
  if (forcing) {
    next = ((const int32_t*)a.prompt->ptr)[q];
  } else if (bi >= 0 && amk_lg_finite(bv)) {
    const float v = __fsub_rn(__fsub_rn(bv, bv), logf(bs));
    if (v == v) lp = v;
  }
  amk_probe(ctx, 1); /* the token chosen */
  bool hit = !forcing && ((s0 >= 0 && s0 == next) || (s1 >= 0 && s1 == next));
  for (long long e = 64 + lane; !forcing && e < ns; e += 32) hit |= st[e] >= 0 && st[e] == next;
  const bool stops = __any_sync(AMK_LG_FULL, hit);
  __syncwarp(); /* every lane has read pos before lane 0 writes it */
  if (lane == 0) nt_finish(ctx, a, q, k.E, forcing, stops, next, lp);
}

/* Everything else (sampling, no summaries, more of them than warp 0 holds): the whole block,
 * every thread reading the scalars itself so every branch is block-uniform. */
__device__ __noinline__ void nt_block(const amk_task_ctx& ctx, const nt_args& a, const nt_consts& k) {
  const long long V = a.x->numel;
  const long long p = amk_ldif(a.pin, 0);
  if (p < 0) { amk_fail(ctx, AMK_ERR_INDEX, p); return; }
  const long long q = p + 1;
  const bool forcing = q < k.P;
  if (forcing ? q >= a.prompt->numel : q >= a.emitted->shape[0]) { amk_fail(ctx, AMK_ERR_INDEX, q); return; }

  long long next;
  float lp = __int_as_float(0x7fc00000);
  if (forcing) {
    next = ((const int32_t*)a.prompt->ptr)[q];
  } else {
    const long long vp = k.vl > 0 && k.vl < V ? k.vl : V;
    const float T = k.T;
    const nt_greedy_t gr = a.stats ? nt_from_stats(a.stats) : nt_greedy(a.x, vp);
    const float m1 = gr.m1, bs = gr.bs;
    const long long bi = gr.bi;
    const int n = gr.n;
    amk_probe(ctx, 0); /* the greedy passes done */
    const float m = __fdiv_rn(m1, T);
    next = bi < 0 ? 0 : bi;
    float l_next = m1;
    if (bi >= 0 && T > 0.0f && amk_lg_finite(T) && amk_lg_finite(m)) {
      next = nt_sample(a.x, vp, T, m, n, k.top_k, k.top_p, k.seed, q);
      l_next = amk_ldf(a.x, next);
    }
    if (bi >= 0 && amk_lg_finite(m1)) {
      const float v = __fsub_rn(__fsub_rn(l_next, m1), logf(bs));
      if (v == v) lp = v;
    }
    amk_probe(ctx, 1); /* the token chosen */
  }

  __syncthreads(); /* every thread has read pos before thread 0 writes it */
  if (threadIdx.x != 0) return;
  bool stops = false;
  if (!forcing) {
    const int32_t* st = (const int32_t*)a.stop->ptr;
    for (long long e = 0; e < a.stop->numel; ++e) stops |= st[e] >= 0 && st[e] == next;
  }
  nt_finish(ctx, a, q, k.E, forcing, stops, next, lp);
}

/* The op waits itself: its checks, and the launch's settings when no task of the program
 * writes them (AMK_BUF_LAUNCH_CONST), come before the wait. A greedy step with summaries of at
 * most 32 * NT_SL slots takes warp 0's path (nt_greedy_warp), anything else the block's. */
__device__ void amk_op_next_token(const amk_task_ctx& ctx) {
  nt_args a;
  if (!nt_setup(ctx, a)) return;
  const bool early = !ctx.check_only && (a.lim->flags & AMK_BUF_LAUNCH_CONST) && (a.smp->flags & AMK_BUF_LAUNCH_CONST);
  nt_consts k;
  if (early) k = nt_read_consts(a);
  if (!amk_task_wait(ctx)) return;
  if (!early) k = nt_read_consts(a);
  const bool greedy = !(k.T > 0.0f && amk_lg_finite(k.T));
  if (greedy && a.stats && a.stats->shape[1] <= 32 * NT_SL) {
    if (threadIdx.x < 32) nt_greedy_warp(ctx, a, k);
    return;
  }
  nt_block(ctx, a, k);
}
