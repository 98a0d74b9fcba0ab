/* amk_logits.cuh — one block's passes over a run of one logits row, for the ops that reduce
 * logits where they are (NEXT_TOKEN, LOGIT_STATS): the first-largest valid logit with the count
 * of valid ids, and the sum of exp(l - max), each merged over the block in a fixed order.
 *
 * Valid ids are those whose logit is not NaN. Ties between equal maxima go to the lower id,
 * in every merge, so any split of a row into runs gives the same (max, first id, count).
 *
 * The passes stream the run in 16-byte vectors of the logits' own dtype, AMK_LG_VEC a thread
 * in flight before any is used, with no branch an element (other dtypes and unaligned runs
 * element by element): on one SM a pass with a dtype branch, a data branch and an expf an
 * element, each load waiting on the one before, took about 80 us for 49,152 logits
 * (docs/perf-notes.md round 39). After amk_device.cuh. */

#define AMK_LG_FULL 0xffffffffu
#define AMK_LG_VEC 4

/* A thread's first-largest valid logit (bi < 0: none) and valid count (strict >: the first of
 * equal maxima, ids visited in increasing order). */
struct amk_lg_max {
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
struct amk_lg_sum {
  float m, s;
  __device__ __forceinline__ void visit(float l, long long) {
    s = l == l ? __fadd_rn(s, expf(__fsub_rn(l, m))) : s;
  }
};

/* Word w's two 16-bit elements as f32 (BF16 or F16). */
__device__ __forceinline__ float amk_lg_lo(int dt, uint32_t w) {
  return dt == AMK_BF16 ? __uint_as_float(w << 16) : amk_f16_to_f32((uint16_t)(w & 0xffffu));
}
__device__ __forceinline__ float amk_lg_hi(int dt, uint32_t w) {
  return dt == AMK_BF16 ? __uint_as_float(w & 0xffff0000u) : amk_f16_to_f32((uint16_t)(w >> 16));
}

/* Feeds this thread's ids of [lo, hi) to st.visit(l, i) in increasing order: 16-byte units t,
 * t + T, ... from id lo (4 F32 or 8 BF16/F16 elements each) when lo's address is 16-byte
 * aligned, then the tail's ids (every one past the units) t, t + T, ... By value, so the state
 * stays in registers. Block-uniform arguments. */
template <class S>
__device__ __forceinline__ S amk_lg_each(const amk_buffer_t* xb, long long lo, long long hi, S st) {
  const int dt = xb->dtype;
  const int per = dt == AMK_F32 ? 4 : 8;
  const char* base = (const char*)xb->ptr + lo * (dt == AMK_F32 ? 4 : 2);
  long long tail = lo;
  if ((dt == AMK_F32 || dt == AMK_BF16 || dt == AMK_F16) && amk_al16(base)) {
    const uint4* q = (const uint4*)base;
    const long long nu = (hi - lo) / per;
#pragma unroll 1
    for (long long u0 = threadIdx.x; u0 < nu; u0 += AMK_LG_VEC * AMK_THREADS) {
      uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0, v2 = v0, v3 = v0;
      const long long u1 = u0 + AMK_THREADS, u2 = u1 + AMK_THREADS, u3 = u2 + AMK_THREADS;
      v0 = q[u0];
      if (u1 < nu) v1 = q[u1];
      if (u2 < nu) v2 = q[u2];
      if (u3 < nu) v3 = q[u3];
      const uint4 vs[AMK_LG_VEC] = {v0, v1, v2, v3};
      const long long us[AMK_LG_VEC] = {u0, u1, u2, u3};
#pragma unroll
      for (int k = 0; k < AMK_LG_VEC; ++k) {
        if (us[k] >= nu) break;
        const uint32_t w[4] = {vs[k].x, vs[k].y, vs[k].z, vs[k].w};
        const long long i0 = lo + us[k] * per;
        if (dt == AMK_F32) {
#pragma unroll
          for (int j = 0; j < 4; ++j) st.visit(__uint_as_float(w[j]), i0 + j);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            st.visit(amk_lg_lo(dt, w[j]), i0 + 2 * j);
            st.visit(amk_lg_hi(dt, w[j]), i0 + 2 * j + 1);
          }
        }
      }
    }
    tail = lo + nu * per;
  }
#pragma unroll 1
  for (long long i = tail + threadIdx.x; i < hi; i += AMK_THREADS) st.visit(amk_ldf(xb, i), i);
  return st;
}

/* Merges another thread's (or run's) greedy state: the larger value wins, equal values the
 * lower index (oi < 0: none); the valid counts add. Symmetric, so both lanes of a shuffle
 * agree. */
__device__ __forceinline__ void amk_lg_merge_max(float& bv, long long& bi, int& n, float ov,
                                                 long long oi, int on) {
  n += on;
  if (oi < 0) return;
  if (bi < 0 || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

/* The block's reductions (one at a time; a barrier before each reuse). */
struct amk_lg_red_t {
  float v[AMK_WARPS];
  long long i[AMK_WARPS];
  float s[AMK_WARPS];
  int n[AMK_WARPS];
  float rv;
  long long ri;
  float rs;
  int rn;
};
__shared__ amk_lg_red_t amk_lg_red;

/* Warp merge of every lane's (bv, bi, n) (amk_lg_merge_max over a shuffle tree); every lane
 * gets the warp's. */
__device__ __forceinline__ void amk_lg_warp_max(float& bv, long long& bi, int& n) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(AMK_LG_FULL, bv, o);
    const long long oi = __shfl_xor_sync(AMK_LG_FULL, bi, o);
    const int on = __shfl_xor_sync(AMK_LG_FULL, n, o);
    amk_lg_merge_max(bv, bi, n, ov, oi, on);
  }
}

/* Every lane's s summed over the warp in a fixed tree; every lane gets the same bits. */
__device__ __forceinline__ float amk_lg_warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(AMK_LG_FULL, s, o));
  return s;
}

/* Block merge of every thread's (bv, bi, n) (amk_lg_merge_max: the warps' shuffle tree, then
 * the warps in order); every thread gets the result. */
__device__ __forceinline__ void amk_lg_reduce_max(float& bv, long long& bi, int& n) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  amk_lg_warp_max(bv, bi, n);
  __syncthreads(); /* earlier readers of amk_lg_red are done */
  if (lane == 0) {
    amk_lg_red.v[warp] = bv;
    amk_lg_red.i[warp] = bi;
    amk_lg_red.n[warp] = n;
  }
  __syncthreads();
  if (tid == 0) {
    float v = amk_lg_red.v[0];
    long long i = amk_lg_red.i[0];
    int c = amk_lg_red.n[0];
    for (int w = 1; w < AMK_WARPS; ++w)
      amk_lg_merge_max(v, i, c, amk_lg_red.v[w], amk_lg_red.i[w], amk_lg_red.n[w]);
    amk_lg_red.rv = v;
    amk_lg_red.ri = i;
    amk_lg_red.rn = c;
  }
  __syncthreads();
  bv = amk_lg_red.rv;
  bi = amk_lg_red.ri;
  n = amk_lg_red.rn;
}

/* A thread's sum merged over the block in a fixed order (the warps' shuffle tree, then the
 * warps in order): the same bits on every run. Every thread gets the sum. */
__device__ __forceinline__ float amk_lg_reduce_sum(float s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  s = amk_lg_warp_sum(s);
  __syncthreads(); /* earlier readers of amk_lg_red are done */
  if (lane == 0) amk_lg_red.s[warp] = s;
  __syncthreads();
  if (tid == 0) {
    float t = amk_lg_red.s[0];
    for (int w = 1; w < AMK_WARPS; ++w) t = __fadd_rn(t, amk_lg_red.s[w]);
    amk_lg_red.rs = t;
  }
  __syncthreads();
  return amk_lg_red.rs;
}

__device__ __forceinline__ bool amk_lg_finite(float x) {
  return fabsf(x) < __int_as_float(0x7f800000);
}
