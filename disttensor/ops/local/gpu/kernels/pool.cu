// 3-D max / average pooling, forward and backward (the exact adjoint), for disttensor's GPU
// local kernels (disttensor/ops/local/gpu/pooling.py; gpu/rawmodules.py loads this file with
// cupy.RawModule, kernels looked up by name expression, e.g. "max_pool3d_forward<float>").
//
// Layout: x (N, C, D, H, W) C-contiguous, viewed as NC = N*C planes of D*H*W.  Indices are
// int where every index value fits in 32 bits (dtk::index32_fits, common.cuh), long long
// otherwise (N*C*D*H*W may exceed 2^31): each kernel dispatches to a body templated on the
// index type.  Window of output (od, oh, ow) along an axis:
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
template <typename I>
__device__ __forceinline__ I floordiv(I a, I b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}
template <typename I>
__device__ __forceinline__ I lmax(I a, I b) { return a > b ? a : b; }
template <typename I>
__device__ __forceinline__ I lmin(I a, I b) { return a < b ? a : b; }

// Cell (nc, d, h, w) of flat index i of a C-contiguous (NC, D, H, W) array.
template <typename I>
struct Cell {
    I nc, d, h, w;
};
template <typename I>
__device__ __forceinline__ Cell<I> cell_of(I i, I D, I H, I W) {
    Cell<I> c;
    c.w = i % W; i /= W;
    c.h = i % H; i /= H;
    c.d = i % D;
    c.nc = i / D;
    return c;
}

// The outputs o along one axis (extent on) whose window [o*s - p, o*s - p + k) holds input cell
// i: ceil((i+p-k+1)/s) <= o <= floor((i+p)/s), clipped to [0, on - 1] (none when lo > hi).
template <typename I>
struct Span {
    I lo, hi;
};
template <typename I>
__device__ __forceinline__ Span<I> windows_holding(I i, I p, I k, I s, I on) {
    Span<I> r;
    r.lo = lmax<I>(floordiv<I>(i + p - k + s, s), 0);
    r.hi = lmin<I>(floordiv<I>(i + p, s), on - 1);
    return r;
}

__device__ __forceinline__ long long labs_(long long v) { return v < 0 ? -v : v; }

// The largest index value of a pooling kernel (for dtk::index32_fits): the sizes of x
// (NC, D, H, W) and y (NC, oD, oH, oW), the window size, and per axis the reach of the
// windows, (o + 1)*s + |p| + k + n (windows_holding adds a stride to an input index).
__device__ __forceinline__ long long extent(long long NC, long long D, long long H, long long W,
                                            long long oD, long long oH, long long oW,
                                            long long kD, long long kH, long long kW,
                                            long long sD, long long sH, long long sW,
                                            long long pD, long long pH, long long pW) {
    const long long sizes = dtk::max3(NC * D * H * W, NC * oD * oH * oW, kD * kH * kW);
    const long long reach = dtk::max3((oD + 1) * sD + labs_(pD) + kD + D,
                                      (oH + 1) * sH + labs_(pH) + kH + H,
                                      (oW + 1) * sW + labs_(pW) + kW + W);
    return sizes > reach ? sizes : reach;
}

}  // namespace dtk_pool

// The geometry parameters every pooling kernel takes after `total`, in index type I.
#define DTK_POOL_GEOMETRY(I)                                                              \
    I D, I H, I W, I oD, I oH, I oW, I kD, I kH, I kW, I sD, I sH, I sW, I pD, I pH, I pW
#define DTK_POOL_GEOMETRY_ARGS D, H, W, oD, oH, oW, kD, kH, kW, sD, sH, sW, pD, pH, pW

// Each kernel runs its body with int indices where every index fits (dtk::index32_fits),
// long long otherwise; NC = number of (n, c) planes.
#define DTK_POOL_DISPATCH(body, NC, ...)                                                  \
    do {                                                                                  \
        const long long nc_ = (NC);                                                       \
        if (dtk::index32_fits(dtk_pool::extent(nc_, DTK_POOL_GEOMETRY_ARGS)))             \
            body<T, int>(__VA_ARGS__);                                                    \
        else                                                                              \
            body<T, long long>(__VA_ARGS__);                                              \
    } while (0)

template <typename T, typename I>
__device__ void max_pool3d_forward_body(const T* __restrict__ x, T* __restrict__ y,
                                        int* __restrict__ argmax, I total,
                                        DTK_POOL_GEOMETRY(I)) {
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_LOOP(I, i, total) {
        const dtk_pool::Cell<I> c = dtk_pool::cell_of<I>(i, oD, oH, oW);
        const I nc = c.nc, od = c.d, oh = c.h, ow = c.w;
        const T* xp = x + (long long)nc * D * H * W;
        const I d0 = od * sD - pD, h0 = oh * sH - pH, w0 = ow * sW - pW;
        // the real (non-padding) cells of the window, visited in row-major window order:
        // padding is -inf and never wins a tie against a real cell, so it can be skipped
        const I kd0 = lmax<I>(-d0, 0), kd1 = lmin<I>(kD, D - d0);
        const I kh0 = lmax<I>(-h0, 0), kh1 = lmin<I>(kH, H - h0);
        const I kw0 = lmax<I>(-w0, 0), kw1 = lmin<I>(kW, W - w0);
        acc best = dtk_pool::neg_inf(acc(0));  // a window without real cells: -inf, argmax 0
        I besti = 0;
        bool have = false;
        for (I kd = kd0; kd < kd1; ++kd) {
            for (I kh = kh0; kh < kh1; ++kh) {
                const I row = ((d0 + kd) * H + (h0 + kh)) * W + w0;
                for (I kw = kw0; kw < kw1; ++kw) {
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

// y, argmax: (NC, oD, oH, oW); total = NC*oD*oH*oW.
template <typename T>
__global__ void max_pool3d_forward(const T* __restrict__ x, T* __restrict__ y,
                                   int* __restrict__ argmax, long long total,
                                   DTK_POOL_GEOMETRY(long long)) {
    const long long per = oD * oH * oW;
    DTK_POOL_DISPATCH(max_pool3d_forward_body, per > 0 ? total / per : 0,
                      x, y, argmax, total, DTK_POOL_GEOMETRY_ARGS);
}

template <typename T, typename I>
__device__ void avg_pool3d_forward_body(const T* __restrict__ x, T* __restrict__ y, I total,
                                        DTK_POOL_GEOMETRY(I), int count_include_pad) {
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_LOOP(I, i, total) {
        const dtk_pool::Cell<I> c = dtk_pool::cell_of<I>(i, oD, oH, oW);
        const I nc = c.nc, od = c.d, oh = c.h, ow = c.w;
        const T* xp = x + (long long)nc * D * H * W;
        const I d0 = od * sD - pD, h0 = oh * sH - pH, w0 = ow * sW - pW;
        // the non-padding part of the window: [a, b) along each axis
        const I da = lmax<I>(d0, 0), db = lmin<I>(d0 + kD, D);
        const I ha = lmax<I>(h0, 0), hb = lmin<I>(h0 + kH, H);
        const I wa = lmax<I>(w0, 0), wb = lmin<I>(w0 + kW, W);
        acc s = acc(0);
        for (I id = da; id < db; ++id)
            for (I ih = ha; ih < hb; ++ih)
                for (I iw = wa; iw < wb; ++iw)
                    s += dtk::Num<T>::load(xp[(id * H + ih) * W + iw]);
        const I cnt = lmax<I>(db - da, 0) * lmax<I>(hb - ha, 0) * lmax<I>(wb - wa, 0);
        const I div = count_include_pad ? kD * kH * kW : cnt;
        y[i] = dtk::Num<T>::store(div > 0 ? s / acc(div) : acc(0));
    }
}

template <typename T>
__global__ void avg_pool3d_forward(const T* __restrict__ x, T* __restrict__ y, long long total,
                                   DTK_POOL_GEOMETRY(long long), int count_include_pad) {
    const long long per = oD * oH * oW;
    DTK_POOL_DISPATCH(avg_pool3d_forward_body, per > 0 ? total / per : 0,
                      x, y, total, DTK_POOL_GEOMETRY_ARGS, count_include_pad);
}

template <typename T, typename I>
__device__ void max_pool3d_backward_body(const T* __restrict__ dy,
                                         const int* __restrict__ argmax, T* __restrict__ dx,
                                         I total, DTK_POOL_GEOMETRY(I)) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_LOOP(I, i, total) {
        const dtk_pool::Cell<I> c = dtk_pool::cell_of<I>(i, D, H, W);
        const I nc = c.nc, id = c.d, ih = c.h, iw = c.w;
        // the windows holding cell (id, ih, iw), per axis
        const dtk_pool::Span<I> wd = dtk_pool::windows_holding<I>(id, pD, kD, sD, oD);
        const dtk_pool::Span<I> wh = dtk_pool::windows_holding<I>(ih, pH, kH, sH, oH);
        const dtk_pool::Span<I> ww = dtk_pool::windows_holding<I>(iw, pW, kW, sW, oW);
        acc s = acc(0);
        for (I od = wd.lo; od <= wd.hi; ++od) {
            const I kd = id + pD - od * sD;
            for (I oh = wh.lo; oh <= wh.hi; ++oh) {
                const I kh = ih + pH - oh * sH;
                for (I ow = ww.lo; ow <= ww.hi; ++ow) {
                    const I kw = iw + pW - ow * sW;
                    const I o = ((nc * oD + od) * oH + oh) * oW + ow;
                    if ((I)argmax[o] == (kd * kH + kh) * kW + kw)
                        s += dtk::Num<T>::load(dy[o]);
                }
            }
        }
        dx[i] = dtk::Num<T>::store(s);
    }
}

// dx: (NC, D, H, W); total = NC*D*H*W.  dy, argmax: (NC, oD, oH, oW).
template <typename T>
__global__ void max_pool3d_backward(const T* __restrict__ dy, const int* __restrict__ argmax,
                                    T* __restrict__ dx, long long total,
                                    DTK_POOL_GEOMETRY(long long)) {
    const long long per = D * H * W;
    DTK_POOL_DISPATCH(max_pool3d_backward_body, per > 0 ? total / per : 0,
                      dy, argmax, dx, total, DTK_POOL_GEOMETRY_ARGS);
}

template <typename T, typename I>
__device__ void avg_pool3d_backward_body(const T* __restrict__ dy, T* __restrict__ dx, I total,
                                         DTK_POOL_GEOMETRY(I), int count_include_pad) {
    typedef typename dtk::Num<T>::acc acc;
    using dtk_pool::lmax;
    using dtk_pool::lmin;
    DTK_GRID_LOOP(I, i, total) {
        const dtk_pool::Cell<I> c = dtk_pool::cell_of<I>(i, D, H, W);
        const I nc = c.nc, id = c.d, ih = c.h, iw = c.w;
        // the windows holding cell (id, ih, iw), per axis
        const dtk_pool::Span<I> wd = dtk_pool::windows_holding<I>(id, pD, kD, sD, oD);
        const dtk_pool::Span<I> wh = dtk_pool::windows_holding<I>(ih, pH, kH, sH, oH);
        const dtk_pool::Span<I> ww = dtk_pool::windows_holding<I>(iw, pW, kW, sW, oW);
        acc s = acc(0);
        for (I od = wd.lo; od <= wd.hi; ++od) {
            const I d0 = od * sD - pD;
            const I cd = lmin<I>(d0 + kD, D) - lmax<I>(d0, 0);
            for (I oh = wh.lo; oh <= wh.hi; ++oh) {
                const I h0 = oh * sH - pH;
                const I ch = lmin<I>(h0 + kH, H) - lmax<I>(h0, 0);
                for (I ow = ww.lo; ow <= ww.hi; ++ow) {
                    const I w0 = ow * sW - pW;
                    const I cw = lmin<I>(w0 + kW, W) - lmax<I>(w0, 0);
                    // this cell is inside the window, so cd, ch, cw >= 1 here
                    const I div = count_include_pad ? kD * kH * kW : cd * ch * cw;
                    const I o = ((nc * oD + od) * oH + oh) * oW + ow;
                    s += dtk::Num<T>::load(dy[o]) / acc(div);
                }
            }
        }
        dx[i] = dtk::Num<T>::store(s);
    }
}

template <typename T>
__global__ void avg_pool3d_backward(const T* __restrict__ dy, T* __restrict__ dx, long long total,
                                    DTK_POOL_GEOMETRY(long long), int count_include_pad) {
    const long long per = D * H * W;
    DTK_POOL_DISPATCH(avg_pool3d_backward_body, per > 0 ? total / per : 0,
                      dy, dx, total, DTK_POOL_GEOMETRY_ARGS, count_include_pad);
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
#undef DTK_POOL_DISPATCH
#undef DTK_POOL_GEOMETRY
#undef DTK_POOL_GEOMETRY_ARGS
