// Microbenchmark: how long a counter poll that is already satisfied takes when the block has
// DRAM weight loads in flight, by poll flavour. nvcc -arch=sm_90a -O3 pollbench.cu
#include "membench.cuh"
__device__ __forceinline__ void cpa4(u32* dst, const u32* src){ asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"((u32)__cvta_generic_to_shared(dst)), "l"(src) : "memory"); }
__device__ __forceinline__ u32 ld_vol(const u32* p){u32 v; asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;}
__device__ __forceinline__ u32 atom_or(u32* p){u32 v; asm volatile("atom.relaxed.gpu.global.or.b32 %0, [%1], 0;" : "=r"(v) : "l"(p) : "memory"); return v;}
__device__ __forceinline__ u32 ld_cg(const u32* p){u32 v; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;}
__device__ __forceinline__ void fence_ar(){ asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__global__ void __launch_bounds__(256,1) k(const uint4* w, long long wstride, u32* cnt, u32 target, int mode, long long* out, uint4* sink) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint4* wb = w + (long long)blockIdx.x * wstride + warp * 32 * U;
  u32* c = cnt + blockIdx.x * 32;
  __syncthreads();
  long long t0 = clk();
  uint4 a[U];
  bool load = mode != 0 && !((mode == 2 || mode == 7) && warp == 0);
  u32 pre = 0;
  __shared__ u32 sc;
  if (mode == 5 && threadIdx.x == 0) pre = ld_rlx(c);
  if (mode == 10 && threadIdx.x == 0) pre = ld_acq(c);
  if (mode == 11 && threadIdx.x == 0) pre = ld_rlx(c);
  if (mode >= 10) {
#pragma unroll
    for (int u = 0; u < U; ++u) a[u] = load ? ldwm(wb + u * 32 + lane) : make_uint4(0,0,0,0);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) a[u] = load ? ldw(wb + u * 32 + lane) : make_uint4(0,0,0,0);
  }
  long long t1 = clk(), t2 = 0;
  if (threadIdx.x == 0) {
    u32 v;
    switch (mode) {
      case 0: case 1: case 2: while ((v = ld_acq(c)) < target) {} break;
      case 3: while ((v = ld_rlx(c)) < target) {} break;
      case 4: while ((v = ld_vol(c)) < target) {} break;
      case 5: v = pre; while (v < target) v = ld_rlx(c); break;
      case 6: while ((v = atom_or(c)) < target) {} break;
      case 7: case 8: while ((v = ld_rlx(c)) < target) {} fence_ar(); break;
      case 9: while ((v = ld_cg(c)) < target) {} break;
      case 10: case 11: v = pre; while (v < target) v = ld_acq(c); break;
      case 12: do { cpa4(&sc, c); asm volatile("cp.async.wait_all;" ::: "memory"); v = *(volatile u32*)&sc; } while (v < target); break;
    }
    t2 = clk();
    if (v == 12345678u) sink[blockIdx.x] = make_uint4(v,0,0,0);
  }
  __syncthreads();
  uint4 s = make_uint4(0,0,0,0);
#pragma unroll
  for (int u = 0; u < U; ++u) { s.x ^= a[u].x; s.y ^= a[u].y; s.z ^= a[u].z; s.w ^= a[u].w; }
  if (s.x == 0xdeadbeef) sink[blockIdx.x * 256 + threadIdx.x] = s;
  long long t3 = clk();
  if (threadIdx.x == 0) { out[blockIdx.x * 3] = t2 - t1; out[blockIdx.x * 3 + 1] = t3 - t1; out[blockIdx.x*3+2] = t1 - t0; }
}
int main() {
  const int B = MB_BLOCKS;
  mb_weights w;
  u32* cnt; cudaMalloc(&cnt, B * 32 * 4); std::vector<u32> h(B * 32, 7); cudaMemcpy(cnt, h.data(), B*32*4, cudaMemcpyHostToDevice);
  long long* out; cudaMalloc(&out, B * 3 * 8); uint4* sink; cudaMalloc(&sink, B * 256 * 16);
  const char* names[] = {"no weight loads, ld.acquire", "all warps load, ld.acquire", "warp 0 no loads, ld.acquire",
    "all load, ld.relaxed.gpu", "all load, ld.volatile", "all load, relaxed poll before loads (compiler may reorder)",
    "all load, atom.or 0", "warp 0 no loads, relaxed + fence.acq_rel", "all load, relaxed + fence.acq_rel", "all load, ld.cg", "acquire poll issued before loads", "relaxed poll before loads (ordered)", "all load, cp.async poll"};
  for (int mode = 0; mode < 13; ++mode) {
    std::vector<long long> p, wl, iss;
    for (int r = 0; r < 200; ++r) {
      k<<<B, 256>>>(w.next(), MB_BLOCK_VECS, cnt, 7, mode, out, sink);
      std::vector<long long> o(B * 3); cudaMemcpy(o.data(), out, B*3*8, cudaMemcpyDeviceToHost);
      if (r >= 10) for (int b = 0; b < B; ++b) { p.push_back(o[b*3]); wl.push_back(o[b*3+1]); iss.push_back(o[b*3+2]); }
    }
    printf("mode %d %-45s poll p50 %5lld p90 %5lld | weights p50 %5lld p90 %5lld | issue p50 %4lld cycles\n", mode, names[mode],
           mb_pct(p,.5), mb_pct(p,.9), mb_pct(wl,.5), mb_pct(wl,.9), mb_pct(iss,.5));
  }
  cudaError_t e = cudaDeviceSynchronize(); printf("%s\n", cudaGetErrorString(e));
}
