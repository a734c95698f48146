// What every kernel file of disttensor's GPU local kernels shares (pool.cu, im2col.cu and
// pointwise.cu include it): the per-type load/store traits and the grid-stride loop.  nvcc
// finds this header next to the including file; for NVRTC, the Python loader
// (disttensor/ops/local/gpu/rawmodules.py) inlines it in place of the include line.
//
// Num<T>: T is the storage type (__half, float, double); Num<T>::acc is the arithmetic type
// (float for __half and float, double for double); load converts T -> acc, store acc -> T.
// DTK_GRID_STRIDE(i, n): `for` over i in [0, n) (long long), each thread from its global index
// in steps of the whole grid (launches are 1-D; the grid may be smaller than n);
// DTK_GRID_LOOP(I, i, n) the same with index type I (int or long long).
//
// 32-bit index math: 64-bit integer division and modulo cost several times their 32-bit forms
// on a GPU, and the kernels divide per element.  A kernel whose every index value (its
// largest array size, window coordinate, ...) is at most `extent` runs its body with int
// indices when dtk::index32_fits(extent), i.e. extent plus one grid-stride step stays at most
// DTK_INDEX32_LIMIT (2^31 - 1), and with long long indices otherwise.  The test is uniform
// over the launch (kernel arguments and grid size only), so no warp diverges on it.  The host
// build of the tests (tests/host_cuda) defines DTK_INDEX32_LIMIT as a variable, to run the
// 64-bit path on small sizes too.
//
// Define DISTTENSOR_NO_HALF to leave out cuda_fp16.h and the __half traits.

#ifndef DISTTENSOR_KERNELS_COMMON_CUH
#define DISTTENSOR_KERNELS_COMMON_CUH

#ifndef DISTTENSOR_NO_HALF
#include <cuda_fp16.h>
#endif

namespace dtk {

template <typename T> struct Num;
template <> struct Num<float> {
    typedef float acc;
    __device__ static __forceinline__ float load(float v) { return v; }
    __device__ static __forceinline__ float store(float v) { return v; }
};
template <> struct Num<double> {
    typedef double acc;
    __device__ static __forceinline__ double load(double v) { return v; }
    __device__ static __forceinline__ double store(double v) { return v; }
};
#ifndef DISTTENSOR_NO_HALF
template <> struct Num<__half> {
    typedef float acc;
    __device__ static __forceinline__ float load(__half v) { return __half2float(v); }
    __device__ static __forceinline__ __half store(float v) { return __float2half(v); }
};
#endif

#ifndef DTK_INDEX32_LIMIT
#define DTK_INDEX32_LIMIT 0x7fffffffLL
#endif

__device__ __forceinline__ bool index32_fits(long long extent) {
    return extent >= 0 &&
           extent <= (long long)(DTK_INDEX32_LIMIT) - (long long)gridDim.x * blockDim.x;
}

__device__ __forceinline__ long long max3(long long a, long long b, long long c) {
    const long long ab = a > b ? a : b;
    return ab > c ? ab : c;
}

}  // namespace dtk

#define DTK_GRID_LOOP(I, i, n)                                                       \
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (n);                  \
         i += (I)(gridDim.x * blockDim.x))

#define DTK_GRID_STRIDE(i, n)                                                        \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (long long)gridDim.x * blockDim.x)

#endif  // DISTTENSOR_KERNELS_COMMON_CUH
