// im2col / col2im for 3-D grouped, strided, dilated, (asymmetrically) padded convolution: the
// column transforms behind disttensor's im2col + cuBLAS convolution fallback
// (disttensor/ops/local/gpu/im2col_conv.py; gpu/rawmodules.py loads this file with
// cupy.RawModule, kernels looked up by name expression, e.g. "im2col3d<float>").
//
// x: (nb, C, D, H, W) C-contiguous, C = G*Cg (the caller passes a pointer to the first sample
// of a batch chunk).  The column matrix covers the output-depth planes [od0, od0 + ndp) of
// those nb samples (chunking bounds the workspace):
//   K = Cg*kD*kH*kW  (row k = ((ci*kD + kd)*kH + kh)*kW + kw)
//   Q = ndp*oH*oW    (col q = ((od - od0)*oH + oh)*oW + ow)
//   layout (nb, G, K, Q) or, transposed, (nb, G, Q, K)
//   col[n, g, k, q] = x[n, g*Cg + ci, od*sD - pD + kd*dD, oh*sH - pH + kh*dH, ow*sW - pW + kw*dW]
// (zero outside the input: zero padding; pD may be negative, which crops).
// col2im is the adjoint of im2col (non-transposed layout), gathered per input cell
// (deterministic, no atomics) and ADDED into dx, so chunks over output planes accumulate.
// Indices are int where every index value fits in 32 bits (dtk::index32_fits, common.cuh),
// long long otherwise: each kernel dispatches to a body templated on the index type.
//
// Includes only common.cuh (Num<T> load/store traits, DTK_GRID_STRIDE) and CUDA headers;
// compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to leave out the __half
// instantiations.

#include "common.cuh"

namespace dtk_col {

__device__ __forceinline__ long long labs_(long long v) { return v < 0 ? -v : v; }

// The largest index value of im2col3d / col2im3d (for dtk::index32_fits): the sizes of x, of
// the column chunk and of the threads' range, and per axis the reach of the last window.
__device__ __forceinline__ long long extent(long long nb, long long G, long long Cg,
                                            long long D, long long H, long long W,
                                            long long kD, long long kH, long long kW,
                                            long long oH, long long oW, long long od0,
                                            long long ndp, long long sD, long long sH,
                                            long long sW, long long dD, long long dH,
                                            long long dW, long long pD, long long pH,
                                            long long pW) {
    const long long K = Cg * kD * kH * kW;
    const long long Q = ndp * oH * oW;
    const long long sizes = dtk::max3(nb * G * K * Q, nb * G * Cg * D * H * W, K * Q);
    const long long reach = dtk::max3((od0 + ndp) * sD + labs_(pD) + kD * dD + D,
                                      oH * sH + labs_(pH) + kH * dH + H,
                                      oW * sW + labs_(pW) + kW * dW + W);
    return sizes > reach ? sizes : reach;
}

}  // namespace dtk_col

// The geometry parameters of both kernels, in index type I (col2im3d adds id0, nid).
#define DTK_COL_GEOMETRY(I)                                                               \
    I nb, I G, I Cg, I D, I H, I W, I kD, I kH, I kW, I oH, I oW, I od0, I ndp
#define DTK_COL_STEPS(I) I sD, I sH, I sW, I dD, I dH, I dW, I pD, I pH, I pW
#define DTK_COL_ARGS                                                                      \
    nb, G, Cg, D, H, W, kD, kH, kW, oH, oW, od0, ndp, sD, sH, sW, dD, dH, dW, pD, pH, pW

template <typename T, typename I>
__device__ void im2col3d_body(const T* __restrict__ x, T* __restrict__ col,
                              DTK_COL_GEOMETRY(I), DTK_COL_STEPS(I), int transposed) {
    const I C = G * Cg;
    const I K = Cg * kD * kH * kW;
    const I Q = ndp * oH * oW;
    const I total = nb * G * K * Q;
    const T zero = dtk::Num<T>::store(typename dtk::Num<T>::acc(0));
    DTK_GRID_LOOP(I, i, total) {
        I t = i, k, q;
        if (transposed) {
            k = t % K; t /= K;
            q = t % Q; t /= Q;
        } else {
            q = t % Q; t /= Q;
            k = t % K; t /= K;
        }
        const I g = t % G;
        const I n = t / G;
        I tk = k;
        const I kw = tk % kW; tk /= kW;
        const I kh = tk % kH; tk /= kH;
        const I kd = tk % kD;
        const I ci = tk / kD;
        I tq = q;
        const I ow = tq % oW; tq /= oW;
        const I oh = tq % oH;
        const I od = od0 + tq / oH;
        const I id = od * sD - pD + kd * dD;
        const I ih = oh * sH - pH + kh * dH;
        const I iw = ow * sW - pW + kw * dW;
        T v = zero;
        if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = x[(((n * C + g * Cg + ci) * D + id) * H + ih) * W + iw];
        col[i] = v;
    }
}

template <typename T>
__global__ void im2col3d(const T* __restrict__ x, T* __restrict__ col,
                         long long nb, long long G, long long Cg,
                         long long D, long long H, long long W,
                         long long kD, long long kH, long long kW,
                         long long oH, long long oW, long long od0, long long ndp,
                         long long sD, long long sH, long long sW,
                         long long dD, long long dH, long long dW,
                         long long pD, long long pH, long long pW,
                         int transposed) {
    if (dtk::index32_fits(dtk_col::extent(DTK_COL_ARGS)))
        im2col3d_body<T, int>(x, col, DTK_COL_ARGS, transposed);
    else
        im2col3d_body<T, long long>(x, col, DTK_COL_ARGS, transposed);
}

template <typename T, typename I>
__device__ void col2im3d_body(const T* __restrict__ col, T* __restrict__ dx,
                              DTK_COL_GEOMETRY(I), I id0, I nid, DTK_COL_STEPS(I)) {
    typedef typename dtk::Num<T>::acc acc;
    const I C = G * Cg;
    const I K = Cg * kD * kH * kW;
    const I Q = ndp * oH * oW;
    const I total = nb * C * nid * H * W;
    DTK_GRID_LOOP(I, i, total) {
        I t = i;
        const I iw = t % W; t /= W;
        const I ih = t % H; t /= H;
        const I id = id0 + t % nid; t /= nid;
        const I c = t % C;
        const I n = t / C;
        const I g = c / Cg;
        const I ci = c - g * Cg;
        const T* colp = col + (long long)(n * G + g) * K * Q;
        acc s = acc(0);
        // input cell i is tap k of output o iff o*s - p + k*dil == i, i.e. o = (i + p - k*dil)/s
        // exactly; the numerator only decreases with k, so stop once it is negative.
        for (I kd = 0; kd < kD; ++kd) {
            const I td = id + pD - kd * dD;
            if (td < 0) break;
            if (td % sD != 0) continue;
            const I od = td / sD;
            if (od < od0 || od >= od0 + ndp) continue;
            for (I kh = 0; kh < kH; ++kh) {
                const I th = ih + pH - kh * dH;
                if (th < 0) break;
                if (th % sH != 0) continue;
                const I oh = th / sH;
                if (oh >= oH) continue;
                for (I kw = 0; kw < kW; ++kw) {
                    const I tw = iw + pW - kw * dW;
                    if (tw < 0) break;
                    if (tw % sW != 0) continue;
                    const I ow = tw / sW;
                    if (ow >= oW) continue;
                    const I k = ((ci * kD + kd) * kH + kh) * kW + kw;
                    const I q = ((od - od0) * oH + oh) * oW + ow;
                    s += dtk::Num<T>::load(colp[k * Q + q]);
                }
            }
        }
        const I xi = (((n * C + c) * D + id) * H + ih) * W + iw;
        dx[xi] = dtk::Num<T>::store(dtk::Num<T>::load(dx[xi]) + s);
    }
}

// dx (nb, C, D, H, W) += col2im(col); col in the (nb, G, K, Q) layout.  Threads cover the input
// depth rows [id0, id0 + nid) only: the rows the planes [od0, od0 + ndp) can reach (the caller
// computes them; rows outside get nothing from this chunk).
template <typename T>
__global__ void col2im3d(const T* __restrict__ col, T* __restrict__ dx,
                         long long nb, long long G, long long Cg,
                         long long D, long long H, long long W,
                         long long kD, long long kH, long long kW,
                         long long oH, long long oW, long long od0, long long ndp,
                         long long id0, long long nid,
                         long long sD, long long sH, long long sW,
                         long long dD, long long dH, long long dW,
                         long long pD, long long pH, long long pW) {
    if (dtk::index32_fits(dtk_col::extent(DTK_COL_ARGS)))
        col2im3d_body<T, int>(col, dx, nb, G, Cg, D, H, W, kD, kH, kW, oH, oW, od0, ndp, id0,
                              nid, sD, sH, sW, dD, dH, dW, pD, pH, pW);
    else
        col2im3d_body<T, long long>(col, dx, nb, G, Cg, D, H, W, kD, kH, kW, oH, oW, od0, ndp,
                                    id0, nid, sD, sH, sW, dD, dH, dW, pD, pH, pW);
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_COL_INSTANTIATE(T)                                                               \
    template __global__ void im2col3d<T>(                                                    \
        const T*, T*, long long, long long, long long, long long, long long, long long,      \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, int);                                                          \
    template __global__ void col2im3d<T>(                                                    \
        const T*, T*, long long, long long, long long, long long, long long, long long,      \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, long long, long long, long long, long long,         \
        long long, long long, long long, long long);

DTK_COL_INSTANTIATE(float)
DTK_COL_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_COL_INSTANTIATE(__half)
#endif
#undef DTK_COL_INSTANTIATE
#undef DTK_COL_GEOMETRY
#undef DTK_COL_STEPS
#undef DTK_COL_ARGS
