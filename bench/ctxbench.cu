// What a task's first loads after a counter acquire cost: the task context in local memory
// (the stack) or in shared memory, with or without the warp's weight loads in flight.
// nvcc -arch=sm_90a -O3 ctxbench.cu
#include "membench.cuh"
struct Ctx { int next[16]; };
// A chain of 4 dependent reads through a context, by a noinline function (so the context is
// reached through a pointer: local memory for the stack copy, shared for the shared one).
__device__ __noinline__ int chase(const Ctx* c, int i) {
  i = c->next[i]; i = c->next[i]; i = c->next[i]; i = c->next[i]; return i;
}
__global__ void __launch_bounds__(256,1) k(const uint4* w, long long wstride, u32* cnt, int mode, long long* out, uint4* sink, int seed) {
  __shared__ Ctx sctx;
  Ctx lctx;
  for (int j = 0; j < 16; ++j) lctx.next[j] = (j * 7 + seed) & 15;
  if (threadIdx.x < 16) sctx.next[threadIdx.x] = (threadIdx.x * 7 + seed) & 15;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool shared = mode & 1, acquire = mode & 2, loads = mode & 4;
  const Ctx* c = shared ? &sctx : &lctx;
  volatile int warm = chase(c, seed & 15); (void)warm; // the context's lines in L1 first
  __syncthreads();
  const u32 v = acquire ? ld_acq(cnt) : ld_rlx(cnt);  // satisfied counter (7)
  if (v != 7) sink[0] = make_uint4(v, 0, 0, 0);
  uint4 a[U];
  const uint4* wb = w + (long long)blockIdx.x * wstride + warp * 32 * U;
#pragma unroll
  for (int u = 0; u < U; ++u) a[u] = loads ? ldwm(wb + u * 32 + lane) : make_uint4(0,0,0,0);
  long long t1 = clk();
  int r = chase(c, (seed + v) & 15);
  long long t2 = clk();
  uint4 s = make_uint4(r,0,0,0);
#pragma unroll
  for (int u = 0; u < U; ++u) { s.x ^= a[u].x; s.y ^= a[u].y; }
  if (s.x == 0xdeadbeef) sink[blockIdx.x * 256 + threadIdx.x] = s;
  if (threadIdx.x == 0) out[blockIdx.x] = t2 - t1;
}
int main() {
  const int B = MB_BLOCKS;
  mb_weights w;
  u32* cnt; cudaMalloc(&cnt, 4); u32 seven = 7; cudaMemcpy(cnt, &seven, 4, cudaMemcpyHostToDevice);
  long long* out; cudaMalloc(&out, B * 8); uint4* sink; cudaMalloc(&sink, B * 256 * 16);
  for (int mode = 0; mode < 8; ++mode) {
    std::vector<long long> p;
    for (int r = 0; r < 200; ++r) {
      k<<<B, 256>>>(w.next(), MB_BLOCK_VECS, cnt, mode, out, sink, r);
      std::vector<long long> o(B); cudaMemcpy(o.data(), out, B * 8, cudaMemcpyDeviceToHost);
      if (r >= 10) p.insert(p.end(), o.begin(), o.end());
    }
    printf("context in %-6s after %-7s load, %-18s: 4 dependent reads p50 %5lld p90 %5lld cycles\n",
           mode & 1 ? "shared" : "local", mode & 2 ? "acquire" : "relaxed",
           mode & 4 ? "weights in flight" : "no weights", mb_pct(p, .5), mb_pct(p, .9));
  }
  printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
