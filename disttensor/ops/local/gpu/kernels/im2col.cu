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
// Every index is 64-bit (long long).
//
// Includes only common.cuh (Num<T> load/store traits, DTK_GRID_STRIDE) and CUDA headers;
// compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to leave out the __half
// instantiations.

#include "common.cuh"

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
    const long long C = G * Cg;
    const long long K = Cg * kD * kH * kW;
    const long long Q = ndp * oH * oW;
    const long long total = nb * G * K * Q;
    const T zero = dtk::Num<T>::store(typename dtk::Num<T>::acc(0));
    DTK_GRID_STRIDE(i, total) {
        long long t = i, k, q;
        if (transposed) {
            k = t % K; t /= K;
            q = t % Q; t /= Q;
        } else {
            q = t % Q; t /= Q;
            k = t % K; t /= K;
        }
        const long long g = t % G;
        const long long n = t / G;
        long long tk = k;
        const long long kw = tk % kW; tk /= kW;
        const long long kh = tk % kH; tk /= kH;
        const long long kd = tk % kD;
        const long long ci = tk / kD;
        long long tq = q;
        const long long ow = tq % oW; tq /= oW;
        const long long oh = tq % oH;
        const long long od = od0 + tq / oH;
        const long long id = od * sD - pD + kd * dD;
        const long long ih = oh * sH - pH + kh * dH;
        const long long iw = ow * sW - pW + kw * dW;
        T v = zero;
        if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = x[(((n * C + g * Cg + ci) * D + id) * H + ih) * W + iw];
        col[i] = v;
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
    typedef typename dtk::Num<T>::acc acc;
    const long long C = G * Cg;
    const long long K = Cg * kD * kH * kW;
    const long long Q = ndp * oH * oW;
    const long long total = nb * C * nid * H * W;
    DTK_GRID_STRIDE(i, total) {
        long long t = i;
        const long long iw = t % W; t /= W;
        const long long ih = t % H; t /= H;
        const long long id = id0 + t % nid; t /= nid;
        const long long c = t % C;
        const long long n = t / C;
        const long long g = c / Cg;
        const long long ci = c - g * Cg;
        const T* colp = col + (n * G + g) * K * Q;
        acc s = acc(0);
        // input cell i is tap k of output o iff o*s - p + k*dil == i, i.e. o = (i + p - k*dil)/s
        // exactly; the numerator only decreases with k, so stop once it is negative.
        for (long long kd = 0; kd < kD; ++kd) {
            const long long td = id + pD - kd * dD;
            if (td < 0) break;
            if (td % sD != 0) continue;
            const long long od = td / sD;
            if (od < od0 || od >= od0 + ndp) continue;
            for (long long kh = 0; kh < kH; ++kh) {
                const long long th = ih + pH - kh * dH;
                if (th < 0) break;
                if (th % sH != 0) continue;
                const long long oh = th / sH;
                if (oh >= oH) continue;
                for (long long kw = 0; kw < kW; ++kw) {
                    const long long tw = iw + pW - kw * dW;
                    if (tw < 0) break;
                    if (tw % sW != 0) continue;
                    const long long ow = tw / sW;
                    if (ow >= oW) continue;
                    const long long k = ((ci * kD + kd) * kH + kh) * kW + kw;
                    const long long q = ((od - od0) * oH + oh) * oW + ow;
                    s += dtk::Num<T>::load(colp[k * Q + q]);
                }
            }
        }
        const long long xi = (((n * C + c) * D + id) * H + ih) * W + iw;
        dx[xi] = dtk::Num<T>::store(dtk::Num<T>::load(dx[xi]) + s);
    }
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
