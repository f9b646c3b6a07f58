// Kernels for the real-GPU suite (tests/gpu/real_gpu_test.cc) and the GPU
// benchmark (bench/gpu_bench.cc). Compiled by nvcc at build time into a
// fatbin (sm_80 and sm_90 code, compute_90 PTX) that is embedded in
// tandem_gpu_testing and loaded through the driver API (cuLibraryLoadData):
// nothing links libcudart. Every kernel is extern "C" so the harness finds it
// by its plain name, and none uses dynamic parallelism (a CDP module lets
// green-context kernels spill onto 2 extra SMs on Hopper, cuda.h).
//
// Thread-safety: kernels; the host side decides what runs concurrently.
#include <cstdint>

namespace {

__device__ __forceinline__ unsigned smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Busy-waits about `cycles` SM clock cycles (clock64 counts per SM).
__device__ __forceinline__ void spin_cycles(unsigned long long cycles) {
  const long long start = clock64();
  while (static_cast<unsigned long long>(clock64() - start) < cycles) {
  }
}

}  // namespace

// Block b writes the SM it ran on to out[b], after spinning so that many
// blocks are resident at once and the scheduler spreads them over every SM
// the stream's context may use.
extern "C" __global__ void tandem_record_smid(unsigned* out, unsigned long long spin) {
  if (threadIdx.x == 0) {
    spin_cycles(spin);
    out[blockIdx.x] = smid();
  }
}

// Does nothing: the cost of a launch (and of a stream switch before it).
extern "C" __global__ void tandem_empty() {}

// A layer's "compute" for the layer-streamer test: adds up the slot's 32-bit
// words into *sum (mod 2^64, so the host can check which layer the slot held
// when the kernel ran), then runs `iters` dependent FMAs per thread so the
// kernel takes a calibrated time. `sink` keeps the FMA chain alive.
extern "C" __global__ void tandem_consume_layer(const std::uint32_t* slot, unsigned long long words,
                                                unsigned long long* sum, unsigned long long iters, float* sink) {
  unsigned long long local = 0;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    local += slot[i];
  }
  // Warp reduction, then one atomic per warp.
  for (int off = 16; off > 0; off /= 2) local += __shfl_down_sync(0xffffffffu, local, off);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(sum, local);

  float a = static_cast<float>(threadIdx.x) * 1e-7f;
  const float b = 0.999999f;
  const float c = 1e-7f;
  for (unsigned long long k = 0; k < iters; ++k) a = fmaf(a, b, c);
  if (a == -1.0f) sink[0] = a;  // never true; the compiler cannot know
}

// Memory-bound: a[i] = b[i] + s * c[i] over n floats, grid-stride. 12 bytes
// move and 2 flops happen per element.
extern "C" __global__ void tandem_triad(float* a, const float* b, const float* c, float s, unsigned long long n) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    a[i] = b[i] + s * c[i];
  }
}

// Compute-bound: 8 independent FMA chains per thread in registers, `iters`
// rounds: 16 · iters flops per thread, no memory traffic but one store that
// never happens.
extern "C" __global__ void tandem_fma(float* sink, unsigned long long iters) {
  float x[8];
  for (int j = 0; j < 8; ++j) x[j] = static_cast<float>(threadIdx.x + j) * 1e-6f;
  const float b = 0.9999f;
  const float c = 1e-6f;
  for (unsigned long long k = 0; k < iters; ++k) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = fmaf(x[j], b, c);
  }
  float acc = 0;
  for (int j = 0; j < 8; ++j) acc += x[j];
  if (acc == -1.0f) sink[blockIdx.x] = acc;
}
