// Microbenchmark for a cluster-synchronous decode design (perf-playbook §7 item 6: measure
// before relying on clusters). Two questions:
//  1. What does a hand-off cost: a hardware cluster barrier (barrier.cluster, C = 2..16 CTAs)
//     against the megakernel's kind, a counter in global memory (release add, acquire spin) over
//     the same CTAs and over the whole grid?
//  2. How many bytes a second can n SMs stream, each from its own contiguous slice, with TMA bulk
//     copies (cp.async.bulk into a ring of shared-memory stages, an mbarrier a stage) and with
//     plain 16-byte loads (8 in flight a thread)? A design that runs a small model on one
//     16-CTA cluster is as fast as those 16 SMs' stream.
// Every stream is gated: each CTA sums its slice's 32-bit words, and the total must equal the
// host's sum of the same random words. Every barrier loop is gated by the counts it leaves.
//
//   nvcc -arch=sm_90a -O3 -std=c++17 bench/clusterbench.cu -o clusterbench && ./clusterbench
#include <cooperative_groups.h>
#include "cudacheck.cuh"
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>
namespace cg = cooperative_groups;

// ---- 1. hand-offs ----------------------------------------------------------------------------

// `iters` cluster barriers; CTA 0 of the grid records the elapsed ns. `hits` counts arrivals.
__global__ void cluster_sync_loop(int iters, u64* ns, u32* hits) {
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const u64 t0 = gtime();
  for (int i = 0; i < iters; ++i) cl.sync();
  const u64 t1 = gtime();
  if (threadIdx.x == 0) {
    atomicAdd(hits, 1u);
    if (blockIdx.x == 0) *ns = t1 - t0;
  }
}

// `iters` barriers through one counter per group of `group` CTAs in global memory (thread 0
// adds with release, spins with acquire until the group's CTAs have all arrived).
__global__ void counter_sync_loop(int iters, int group, u32* counters, u64* ns) {
  u32* c = counters + (blockIdx.x / group) * 32;
  __syncthreads();
  const u64 t0 = gtime();
  for (int i = 0; i < iters; ++i) {
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
      const u32 want = (u32)group * (u32)(i + 1);
      u32 v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
      } while (v < want);
    }
    __syncthreads();
  }
  const u64 t1 = gtime();
  if (threadIdx.x == 0 && blockIdx.x == 0) *ns = t1 - t0;
}

// ---- 2. streaming ----------------------------------------------------------------------------

#define STAGE_BYTES (32 * 1024)
#define STAGES 6

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// Sums the 32-bit words of this CTA's slice (`bytes` from `src`), streamed through STAGES
// shared-memory stages by TMA bulk copies that thread 0 issues; the sum goes to `total`.
__global__ void __launch_bounds__(256, 1) stream_bulk(const uint4* src, long long bytes, u64* total) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) u64 full[STAGES];
  const unsigned char* base = (const unsigned char*)src + (long long)blockIdx.x * bytes;
  const long long chunks = bytes / STAGE_BYTES;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](long long c) {
    const int s = (int)(c % STAGES);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[s])),
                 "r"(STAGE_BYTES) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(smem + s * STAGE_BYTES)),
        "l"(base + c * STAGE_BYTES), "r"(STAGE_BYTES), "r"(smem_addr(&full[s]))
        : "memory");
  };
  if (threadIdx.x == 0)
    for (long long c = 0; c < STAGES && c < chunks; ++c) issue(c);
  u64 sum = 0;
  for (long long c = 0; c < chunks; ++c) {
    const int s = (int)(c % STAGES);
    const u32 parity = (u32)((c / STAGES) & 1);
    u32 done = 0;
    while (!done)
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_addr(&full[s])), "r"(parity)
          : "memory");
    const uint4* st = (const uint4*)(smem + s * STAGE_BYTES);
    for (int i = threadIdx.x; i < STAGE_BYTES / 16; i += blockDim.x) {
      const uint4 v = st[i];
      sum += (u64)v.x + v.y + v.z + v.w;
    }
    __syncthreads();  // every thread is done with stage s before it is refilled
    if (threadIdx.x == 0 && c + STAGES < chunks) issue(c + STAGES);
  }
  atomicAdd(total, sum);
}

// The same sum with plain 16-byte loads, 8 in flight a thread.
__global__ void __launch_bounds__(256, 1) stream_ldg(const uint4* src, long long bytes, u64* total) {
  const uint4* p = src + (long long)blockIdx.x * (bytes / 16);
  const long long n = bytes / 16;
  u64 sum = 0;
  for (long long i = threadIdx.x; i < n; i += 8LL * blockDim.x) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long j = i + (long long)u * blockDim.x;
      v[u] = j < n ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) sum += (u64)v[u].x + v[u].y + v[u].z + v[u].w;
  }
  atomicAdd(total, sum);
}

// ---- driver ----------------------------------------------------------------------------------

static double launch_cluster_loop(int ctas, int cluster, int iters, u64* d_ns, u32* d_hits) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(256);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CHECK(cudaMemset(d_hits, 0, 4));
  CHECK(cudaLaunchKernelEx(&cfg, cluster_sync_loop, iters, d_ns, d_hits));
  CHECK(cudaDeviceSynchronize());
  u64 ns;
  u32 hits;
  CHECK(cudaMemcpy(&ns, d_ns, 8, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&hits, d_hits, 4, cudaMemcpyDeviceToHost));
  if (hits != (u32)ctas) {
    fprintf(stderr, "GATE: cluster loop %d/%d: %u CTAs finished\n", ctas, cluster, hits);
    exit(2);
  }
  return (double)ns / iters;
}

static double launch_counter_loop(int ctas, int group, int iters, u32* d_cnt, u64* d_ns) {
  CHECK(cudaMemset(d_cnt, 0, 132 * 32 * 4));
  counter_sync_loop<<<ctas, 256, 100 * 1024>>>(iters, group, d_cnt, d_ns);
  CHECK(cudaDeviceSynchronize());
  std::vector<u32> cnt(132 * 32);
  CHECK(cudaMemcpy(cnt.data(), d_cnt, cnt.size() * 4, cudaMemcpyDeviceToHost));
  for (int g = 0; g < ctas / group; ++g)
    if (cnt[g * 32] != (u32)(group * iters)) {
      fprintf(stderr, "GATE: counter loop group %d: %u\n", g, cnt[g * 32]);
      exit(2);
    }
  u64 ns;
  CHECK(cudaMemcpy(&ns, d_ns, 8, cudaMemcpyDeviceToHost));
  return (double)ns / iters;
}

int main() {
  CHECK(cudaFuncSetAttribute(cluster_sync_loop, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK(cudaFuncSetAttribute(counter_sync_loop, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
  const int smem_bulk = STAGES * STAGE_BYTES;
  CHECK(cudaFuncSetAttribute(stream_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bulk));
  u64* d_ns;
  u32 *d_hits, *d_cnt;
  CHECK(cudaMalloc(&d_ns, 8));
  CHECK(cudaMalloc(&d_hits, 4));
  CHECK(cudaMalloc(&d_cnt, 132 * 32 * 4));

  const int iters = 20000;
  printf("## Hand-offs (ns a barrier, %d in a row, median of 5 launches)\n\n", iters);
  printf("| CTAs | cluster barrier (clusters of C) | global counter, groups of C | global counter, whole grid |\n|---|---|---|---|\n");
  const int cases[][2] = {{2, 2}, {4, 4}, {8, 8}, {16, 16}, {128, 8}, {128, 16}};
  for (auto& cs : cases) {
    const int ctas = cs[0], c = cs[1];
    std::vector<double> a, b, g;
    for (int r = 0; r < 5; ++r) {
      a.push_back(launch_cluster_loop(ctas, c, iters, d_ns, d_hits));
      b.push_back(launch_counter_loop(ctas, c, iters / 4, d_cnt, d_ns));
      g.push_back(launch_counter_loop(ctas, ctas, iters / 4, d_cnt, d_ns));
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::sort(g.begin(), g.end());
    printf("| %d (C = %d) | %.0f | %.0f | %.0f |\n", ctas, c, a[2], b[2], g[2]);
  }

  // 2 GiB of random words; each launch's slices start at a rotating offset so that no launch
  // reads what the previous one left in L2.
  const long long total_bytes = 2LL << 30;
  const long long words = total_bytes / 4;
  std::vector<u32> h(words);
  u64 x = 0x9e3779b97f4a7c15ull;
  for (long long i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h[i] = (u32)(x >> 16);
  }
  uint4* d_src;
  u64* d_sum;
  CHECK(cudaMalloc(&d_src, total_bytes));
  CHECK(cudaMalloc(&d_sum, 8));
  CHECK(cudaMemcpy(d_src, h.data(), total_bytes, cudaMemcpyHostToDevice));
  std::vector<u64> prefix(words / (STAGE_BYTES / 4) + 1, 0);  // sums a stage's worth of words
  for (long long c = 0; c + 1 < (long long)prefix.size(); ++c) {
    u64 s = 0;
    for (long long i = c * (STAGE_BYTES / 4); i < (c + 1) * (STAGE_BYTES / 4); ++i) s += h[i];
    prefix[c + 1] = prefix[c] + s;
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  printf("\n## Streaming (GB/s in all and a SM; 512 MiB a launch, median of 5 launches, gated)\n\n");
  printf("| SMs | TMA bulk, all | a SM | 16-byte loads, all | a SM |\n|---|---|---|---|---|\n");
  const long long launch_bytes = 512LL << 20;
  long long offset_chunks = 0;
  for (int n : {1, 2, 4, 8, 16, 32, 66, 132}) {
    const long long slice = launch_bytes / n / STAGE_BYTES * STAGE_BYTES;
    double med[2];
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<double> gbs;
      for (int r = 0; r < 5; ++r) {
        const long long chunks = slice / STAGE_BYTES * n;
        if ((offset_chunks + chunks) * STAGE_BYTES > total_bytes) offset_chunks = 0;
        const uint4* src = d_src + offset_chunks * (STAGE_BYTES / 16);
        CHECK(cudaMemset(d_sum, 0, 8));
        CHECK(cudaEventRecord(e0));
        if (kind == 0)
          stream_bulk<<<n, 256, smem_bulk>>>(src, slice, d_sum);
        else
          stream_ldg<<<n, 256>>>(src, slice, d_sum);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaGetLastError());
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        u64 got;
        CHECK(cudaMemcpy(&got, d_sum, 8, cudaMemcpyDeviceToHost));
        const u64 want = prefix[offset_chunks + chunks] - prefix[offset_chunks];
        if (got != want) {
          fprintf(stderr, "GATE: %s, %d SMs: sum %llu, host %llu\n", kind ? "ldg" : "bulk", n, got, want);
          return 2;
        }
        offset_chunks += chunks;
        gbs.push_back((double)slice * n / (ms * 1e-3) / 1e9);
      }
      std::sort(gbs.begin(), gbs.end());
      med[kind] = gbs[2];
    }
    printf("| %d | %.0f | %.1f | %.0f | %.1f |\n", n, med[0], med[0] / n, med[1], med[1] / n);
  }
  return 0;
}
