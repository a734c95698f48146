// 3-D max / average pooling, forward and backward (the exact adjoint), for disttensor's GPU
// local kernels (disttensor/ops/local/gpu.py loads this file with cupy.RawModule and looks the
// kernels up by name expression, e.g. "max_pool3d_forward<float>").
//
// Layout: x (N, C, D, H, W) C-contiguous, viewed as NC = N*C planes of D*H*W.  Every index is
// 64-bit (long long): N*C*D*H*W may exceed 2^31.  Window of output (od, oh, ow) along an axis:
// input cells [o*s - pad_lo, o*s - pad_lo + k), cells outside [0, n) are padding.
//
// Max: padding acts as -inf but never wins a tie against a real cell; y is the maximum over the
// real cells and argmax the flat window position kd*kH*kW + kh*kW + kw of the FIRST maximal
// real cell in row-major window order, NaN counting as maximal (the first NaN wins); a window
// without real cells (a pad >= k) gives -inf and argmax 0 (a padding cell: no gradient).
// (The contract of cpu_pool.)
// Avg: padding counts as zero; divisor kD*kH*kW (count_include_pad) or the number of
// non-padding cells of the window (a window with none of those gives 0).
// Backward kernels gather per input cell (deterministic, no atomics; overlapping windows add).
//
// Standalone: includes only CUDA headers; compiles with `nvcc -std=c++17 -c`.  Define
// DISTTENSOR_NO_HALF to leave out the __half instantiations.

#ifndef DISTTENSOR_NO_HALF
#include <cuda_fp16.h>
#endif

namespace dtk_pool {

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

__device__ __forceinline__ float neg_inf(float) { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ double neg_inf(double) {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

// floor(a / b) for b > 0 and any sign of a (C++ '/' truncates toward zero).
__device__ __forceinline__ long long floordiv(long long a, long long b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}
__device__ __forceinline__ long long lmax(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long lmin(long long a, long long b) { return a < b ? a : b; }

}  // namespace dtk_pool

#define DTK_GRID_STRIDE(i, n)                                                        \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (long long)gridDim.x * blockDim.x)

// y, argmax: (NC, oD, oH, oW); total = NC*oD*oH*oW.
template <typename T>
__global__ void max_pool3d_forward(const T* __restrict__ x, T* __restrict__ y,
                                   int* __restrict__ argmax, long long total,
                                   long long D, long long H, long long W,
                                   long long oD, long long oH, long long oW,
                                   long long kD, long long kH, long long kW,
                                   long long sD, long long sH, long long sW,
                                   long long pD, long long pH, long long pW) {
    typedef typename dtk_pool::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        long long t = i;
        const long long ow = t % oW; t /= oW;
        const long long oh = t % oH; t /= oH;
        const long long od = t % oD;
        const long long nc = t / oD;
        const T* xp = x + nc * D * H * W;
        const long long d0 = od * sD - pD, h0 = oh * sH - pH, w0 = ow * sW - pW;
        // the real (non-padding) cells of the window, visited in row-major window order:
        // padding is -inf and never wins a tie against a real cell, so it can be skipped
        const long long kd0 = lmax(-d0, 0), kd1 = lmin(kD, D - d0);
        const long long kh0 = lmax(-h0, 0), kh1 = lmin(kH, H - h0);
        const long long kw0 = lmax(-w0, 0), kw1 = lmin(kW, W - w0);
        acc best = dtk_pool::neg_inf(acc(0));  // a window without real cells: -inf, argmax 0
        long long besti = 0;
        bool have = false;
        for (long long kd = kd0; kd < kd1; ++kd) {
            for (long long kh = kh0; kh < kh1; ++kh) {
                const long long row = ((d0 + kd) * H + (h0 + kh)) * W + w0;
                for (long long kw = kw0; kw < kw1; ++kw) {
                    const acc v = dtk_pool::Num<T>::load(xp[row + kw]);
                    if (!have) {
                        best = v;
                        besti = (kd * kH + kh) * kW + kw;
                        have = true;
                    } else if (!(best != best) && (v > best || v != v)) {
                        // strictly greater (ties keep the first), or the first NaN (which
                        // nothing replaces)
                        best = v;
                        besti = (kd * kH + kh) * kW + kw;
                    }
                }
            }
        }
        y[i] = dtk_pool::Num<T>::store(best);
        argmax[i] = (int)besti;
    }
}

template <typename T>
__global__ void avg_pool3d_forward(const T* __restrict__ x, T* __restrict__ y, long long total,
                                   long long D, long long H, long long W,
                                   long long oD, long long oH, long long oW,
                                   long long kD, long long kH, long long kW,
                                   long long sD, long long sH, long long sW,
                                   long long pD, long long pH, long long pW,
                                   int count_include_pad) {
    typedef typename dtk_pool::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        long long t = i;
        const long long ow = t % oW; t /= oW;
        const long long oh = t % oH; t /= oH;
        const long long od = t % oD;
        const long long nc = t / oD;
        const T* xp = x + nc * D * H * W;
        const long long d0 = od * sD - pD, h0 = oh * sH - pH, w0 = ow * sW - pW;
        // the non-padding part of the window: [a, b) along each axis
        const long long da = lmax(d0, 0), db = lmin(d0 + kD, D);
        const long long ha = lmax(h0, 0), hb = lmin(h0 + kH, H);
        const long long wa = lmax(w0, 0), wb = lmin(w0 + kW, W);
        acc s = acc(0);
        for (long long id = da; id < db; ++id)
            for (long long ih = ha; ih < hb; ++ih)
                for (long long iw = wa; iw < wb; ++iw)
                    s += dtk_pool::Num<T>::load(xp[(id * H + ih) * W + iw]);
        const long long cnt = lmax(db - da, 0) * lmax(hb - ha, 0) * lmax(wb - wa, 0);
        const long long div = count_include_pad ? kD * kH * kW : cnt;
        y[i] = dtk_pool::Num<T>::store(div > 0 ? s / acc(div) : acc(0));
    }
}

// dx: (NC, D, H, W); total = NC*D*H*W.  dy, argmax: (NC, oD, oH, oW).
template <typename T>
__global__ void max_pool3d_backward(const T* __restrict__ dy, const int* __restrict__ argmax,
                                    T* __restrict__ dx, long long total,
                                    long long D, long long H, long long W,
                                    long long oD, long long oH, long long oW,
                                    long long kD, long long kH, long long kW,
                                    long long sD, long long sH, long long sW,
                                    long long pD, long long pH, long long pW) {
    typedef typename dtk_pool::Num<T>::acc acc;
    using dtk_pool::floordiv;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        long long t = i;
        const long long iw = t % W; t /= W;
        const long long ih = t % H; t /= H;
        const long long id = t % D;
        const long long nc = t / D;
        // windows o with o*s - p <= i <= o*s - p + k - 1, i.e. ceil((i+p-k+1)/s) <= o <= floor((i+p)/s)
        const long long od0 = lmax(floordiv(id + pD - kD + sD, sD), 0);
        const long long od1 = lmin(floordiv(id + pD, sD), oD - 1);
        const long long oh0 = lmax(floordiv(ih + pH - kH + sH, sH), 0);
        const long long oh1 = lmin(floordiv(ih + pH, sH), oH - 1);
        const long long ow0 = lmax(floordiv(iw + pW - kW + sW, sW), 0);
        const long long ow1 = lmin(floordiv(iw + pW, sW), oW - 1);
        acc s = acc(0);
        for (long long od = od0; od <= od1; ++od) {
            const long long kd = id + pD - od * sD;
            for (long long oh = oh0; oh <= oh1; ++oh) {
                const long long kh = ih + pH - oh * sH;
                for (long long ow = ow0; ow <= ow1; ++ow) {
                    const long long kw = iw + pW - ow * sW;
                    const long long o = ((nc * oD + od) * oH + oh) * oW + ow;
                    if ((long long)argmax[o] == (kd * kH + kh) * kW + kw)
                        s += dtk_pool::Num<T>::load(dy[o]);
                }
            }
        }
        dx[i] = dtk_pool::Num<T>::store(s);
    }
}

template <typename T>
__global__ void avg_pool3d_backward(const T* __restrict__ dy, T* __restrict__ dx, long long total,
                                    long long D, long long H, long long W,
                                    long long oD, long long oH, long long oW,
                                    long long kD, long long kH, long long kW,
                                    long long sD, long long sH, long long sW,
                                    long long pD, long long pH, long long pW,
                                    int count_include_pad) {
    typedef typename dtk_pool::Num<T>::acc acc;
    using dtk_pool::floordiv;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        long long t = i;
        const long long iw = t % W; t /= W;
        const long long ih = t % H; t /= H;
        const long long id = t % D;
        const long long nc = t / D;
        const long long od0 = lmax(floordiv(id + pD - kD + sD, sD), 0);
        const long long od1 = lmin(floordiv(id + pD, sD), oD - 1);
        const long long oh0 = lmax(floordiv(ih + pH - kH + sH, sH), 0);
        const long long oh1 = lmin(floordiv(ih + pH, sH), oH - 1);
        const long long ow0 = lmax(floordiv(iw + pW - kW + sW, sW), 0);
        const long long ow1 = lmin(floordiv(iw + pW, sW), oW - 1);
        acc s = acc(0);
        for (long long od = od0; od <= od1; ++od) {
            const long long d0 = od * sD - pD;
            const long long cd = lmin(d0 + kD, D) - lmax(d0, 0);
            for (long long oh = oh0; oh <= oh1; ++oh) {
                const long long h0 = oh * sH - pH;
                const long long ch = lmin(h0 + kH, H) - lmax(h0, 0);
                for (long long ow = ow0; ow <= ow1; ++ow) {
                    const long long w0 = ow * sW - pW;
                    const long long cw = lmin(w0 + kW, W) - lmax(w0, 0);
                    // this cell is inside the window, so cd, ch, cw >= 1 here
                    const long long div = count_include_pad ? kD * kH * kW : cd * ch * cw;
                    const long long o = ((nc * oD + od) * oH + oh) * oW + ow;
                    s += dtk_pool::Num<T>::load(dy[o]) / acc(div);
                }
            }
        }
        dx[i] = dtk_pool::Num<T>::store(s);
    }
}

#undef DTK_GRID_STRIDE

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_POOL_INSTANTIATE(T)                                                              \
    template __global__ void max_pool3d_forward<T>(                                          \
        const T*, T*, int*, long long, long long, long long, long long, long long, long long, \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long);                                                    \
    template __global__ void avg_pool3d_forward<T>(                                          \
        const T*, T*, long long, long long, long long, long long, long long, long long,      \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, int);                                               \
    template __global__ void max_pool3d_backward<T>(                                         \
        const T*, const int*, T*, long long, long long, long long, long long, long long,     \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, long long);                                         \
    template __global__ void avg_pool3d_backward<T>(                                         \
        const T*, T*, long long, long long, long long, long long, long long, long long,      \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, int);

DTK_POOL_INSTANTIATE(float)
DTK_POOL_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_POOL_INSTANTIATE(__half)
#endif
#undef DTK_POOL_INSTANTIATE
