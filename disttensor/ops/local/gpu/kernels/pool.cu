// 3-D max / average pooling, forward and backward (the exact adjoint), for disttensor's GPU
// local kernels (disttensor/ops/local/gpu/pooling.py; gpu/rawmodules.py loads this file with
// cupy.RawModule, kernels looked up by name expression, e.g. "max_pool3d_forward<float>").
//
// Layout: x (N, C, D, H, W) C-contiguous, viewed as NC = N*C planes of D*H*W.  Every index is
// 64-bit (long long): N*C*D*H*W may exceed 2^31.  Window of output (od, oh, ow) along an axis:
// input cells [o*s - pad_lo, o*s - pad_lo + k), cells outside [0, n) are padding.
//
// Max: padding acts as -inf but never wins a tie against a real cell; y is the maximum over the
// real cells and argmax the flat window position kd*kH*kW + kh*kW + kw of the FIRST maximal
// real cell in row-major window order, NaN counting as maximal (the first NaN wins); a window
// without real cells (a pad >= k) gives -inf and argmax 0 (a padding cell: no gradient).
// (The contract of ops/local/cpu/pool.py.)
// Avg: padding counts as zero; divisor kD*kH*kW (count_include_pad) or the number of
// non-padding cells of the window (a window with none of those gives 0).
// Backward kernels gather per input cell (deterministic, no atomics; overlapping windows add).
//
// Includes only common.cuh (Num<T> load/store traits, DTK_GRID_STRIDE) and CUDA headers;
// compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to leave out the __half
// instantiations.

#include "common.cuh"

namespace dtk_pool {

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

// Cell (nc, d, h, w) of flat index i of a C-contiguous (NC, D, H, W) array.
struct Cell {
    long long nc, d, h, w;
};
__device__ __forceinline__ Cell cell_of(long long i, long long D, long long H, long long W) {
    Cell c;
    c.w = i % W; i /= W;
    c.h = i % H; i /= H;
    c.d = i % D;
    c.nc = i / D;
    return c;
}

// The outputs o along one axis (extent on) whose window [o*s - p, o*s - p + k) holds input cell
// i: ceil((i+p-k+1)/s) <= o <= floor((i+p)/s), clipped to [0, on - 1] (none when lo > hi).
struct Span {
    long long lo, hi;
};
__device__ __forceinline__ Span windows_holding(long long i, long long p, long long k,
                                                long long s, long long on) {
    Span r;
    r.lo = lmax(floordiv(i + p - k + s, s), 0);
    r.hi = lmin(floordiv(i + p, s), on - 1);
    return r;
}

}  // namespace dtk_pool

// y, argmax: (NC, oD, oH, oW); total = NC*oD*oH*oW.
template <typename T>
__global__ void max_pool3d_forward(const T* __restrict__ x, T* __restrict__ y,
                                   int* __restrict__ argmax, long long total,
                                   long long D, long long H, long long W,
                                   long long oD, long long oH, long long oW,
                                   long long kD, long long kH, long long kW,
                                   long long sD, long long sH, long long sW,
                                   long long pD, long long pH, long long pW) {
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        const dtk_pool::Cell c = dtk_pool::cell_of(i, oD, oH, oW);
        const long long nc = c.nc, od = c.d, oh = c.h, ow = c.w;
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
                    const acc v = dtk::Num<T>::load(xp[row + kw]);
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
        y[i] = dtk::Num<T>::store(best);
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
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        const dtk_pool::Cell c = dtk_pool::cell_of(i, oD, oH, oW);
        const long long nc = c.nc, od = c.d, oh = c.h, ow = c.w;
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
                    s += dtk::Num<T>::load(xp[(id * H + ih) * W + iw]);
        const long long cnt = lmax(db - da, 0) * lmax(hb - ha, 0) * lmax(wb - wa, 0);
        const long long div = count_include_pad ? kD * kH * kW : cnt;
        y[i] = dtk::Num<T>::store(div > 0 ? s / acc(div) : acc(0));
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
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_STRIDE(i, total) {
        const dtk_pool::Cell c = dtk_pool::cell_of(i, D, H, W);
        const long long nc = c.nc, id = c.d, ih = c.h, iw = c.w;
        // the windows holding cell (id, ih, iw), per axis
        const dtk_pool::Span wd = dtk_pool::windows_holding(id, pD, kD, sD, oD);
        const dtk_pool::Span wh = dtk_pool::windows_holding(ih, pH, kH, sH, oH);
        const dtk_pool::Span ww = dtk_pool::windows_holding(iw, pW, kW, sW, oW);
        acc s = acc(0);
        for (long long od = wd.lo; od <= wd.hi; ++od) {
            const long long kd = id + pD - od * sD;
            for (long long oh = wh.lo; oh <= wh.hi; ++oh) {
                const long long kh = ih + pH - oh * sH;
                for (long long ow = ww.lo; ow <= ww.hi; ++ow) {
                    const long long kw = iw + pW - ow * sW;
                    const long long o = ((nc * oD + od) * oH + oh) * oW + ow;
                    if ((long long)argmax[o] == (kd * kH + kh) * kW + kw)
                        s += dtk::Num<T>::load(dy[o]);
                }
            }
        }
        dx[i] = dtk::Num<T>::store(s);
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
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_STRIDE(i, total) {
        const dtk_pool::Cell c = dtk_pool::cell_of(i, D, H, W);
        const long long nc = c.nc, id = c.d, ih = c.h, iw = c.w;
        // the windows holding cell (id, ih, iw), per axis
        const dtk_pool::Span wd = dtk_pool::windows_holding(id, pD, kD, sD, oD);
        const dtk_pool::Span wh = dtk_pool::windows_holding(ih, pH, kH, sH, oH);
        const dtk_pool::Span ww = dtk_pool::windows_holding(iw, pW, kW, sW, oW);
        acc s = acc(0);
        for (long long od = wd.lo; od <= wd.hi; ++od) {
            const long long d0 = od * sD - pD;
            const long long cd = lmin(d0 + kD, D) - lmax(d0, 0);
            for (long long oh = wh.lo; oh <= wh.hi; ++oh) {
                const long long h0 = oh * sH - pH;
                const long long ch = lmin(h0 + kH, H) - lmax(h0, 0);
                for (long long ow = ww.lo; ow <= ww.hi; ++ow) {
                    const long long w0 = ow * sW - pW;
                    const long long cw = lmin(w0 + kW, W) - lmax(w0, 0);
                    // this cell is inside the window, so cd, ch, cw >= 1 here
                    const long long div = count_include_pad ? kD * kH * kW : cd * ch * cw;
                    const long long o = ((nc * oD + od) * oH + oh) * oW + ow;
                    s += dtk::Num<T>::load(dy[o]) / acc(div);
                }
            }
        }
        dx[i] = dtk::Num<T>::store(s);
    }
}

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
