// Per-channel reductions, batch-norm apply, activations and channel softmax for disttensor's GPU
// local kernels (disttensor/ops/local/gpu/batchnorm.py and activations.py; gpu/rawmodules.py
// loads this file with cupy.RawModule, kernels looked up by name expression, e.g.
// "bn_forward_apply<float>").
//
// Layout: any (N, C, *spatial) C-contiguous array viewed as (N, C, S), S = prod(spatial)
// (S = 1 for 2-D input); element i has channel (i / S) % C.  The kernels that divide per
// element (channel sums, batch-norm apply, softmax) use int indices where every index value
// fits in 32 bits (dtk::index32_fits, common.cuh), long long otherwise; the activations,
// which only step through flat indices, and channel_finalize are 64-bit throughout.
// Arithmetic in the accumulation type (float for __half/float, double for double); the
// per-channel sums are accumulated in double, in a fixed order (two stages: per-block partial
// sums, then one thread per channel adds its partials in block order), so they are
// deterministic run to run.  Per-channel parameters arrive as float64 arrays.
//
// Includes only common.cuh (Num<T> load/store traits, DTK_GRID_STRIDE) and CUDA headers;
// compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to leave out the __half
// instantiations.

#include "common.cuh"

namespace dtk_pw {

__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }
__device__ __forceinline__ float exm1(float v) { return expm1f(v); }
__device__ __forceinline__ double exm1(double v) { return expm1(v); }
__device__ __forceinline__ float lg(float v) { return logf(v); }
__device__ __forceinline__ double lg(double v) { return log(v); }
__device__ __forceinline__ float th(float v) { return tanhf(v); }
__device__ __forceinline__ double th(double v) { return tanh(v); }

// activation codes (gpu/activations.py _ACTIVATIONS)
enum { RELU = 0, LEAKY_RELU = 1, ELU = 2, SIGMOID = 3, TANH = 4 };

const int REDUCE_BLOCK = 256;  // blockDim.x of channel_partial (gpu/batchnorm.py launches this)

}  // namespace dtk_pw

template <typename T, int MODE, typename I>
__device__ void channel_partial_body(const T* __restrict__ a, const T* __restrict__ b,
                                     const double* __restrict__ mean,
                                     const double* __restrict__ invstd, I C, I S, I M,
                                     double* __restrict__ p1, double* __restrict__ p2) {
    __shared__ double sh1[dtk_pw::REDUCE_BLOCK];
    __shared__ double sh2[dtk_pw::REDUCE_BLOCK];
    const I B = gridDim.x;
    for (I c = blockIdx.y; c < C; c += gridDim.y) {
        double s1 = 0.0, s2 = 0.0;
        double mu = 0.0, is = 0.0;
        if (MODE == 1) {
            mu = mean[c];
            is = invstd[c];
        }
        for (I j = (I)(blockIdx.x * blockDim.x + threadIdx.x); j < M; j += B * (I)blockDim.x) {
            const I n = j / S;
            const I idx = (n * C + c) * S + (j - n * S);
            const double va = (double)dtk::Num<T>::load(a[idx]);
            if (MODE == 0) {
                s1 += va;
                s2 += va * va;
            } else {
                const double xh = ((double)dtk::Num<T>::load(b[idx]) - mu) * is;
                s1 += va;
                s2 += va * xh;
            }
        }
        sh1[threadIdx.x] = s1;
        sh2[threadIdx.x] = s2;
        __syncthreads();
        for (int w = dtk_pw::REDUCE_BLOCK / 2; w > 0; w >>= 1) {
            if ((int)threadIdx.x < w) {
                sh1[threadIdx.x] += sh1[threadIdx.x + w];
                sh2[threadIdx.x] += sh2[threadIdx.x + w];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            p1[c * B + blockIdx.x] = sh1[0];
            p2[c * B + blockIdx.x] = sh2[0];
        }
        __syncthreads();  // sh1/sh2 are reused by the next channel of this block
    }
}

// Stage 1 of the per-channel sums.  Grid (B, min(C, 65535)), block REDUCE_BLOCK threads.
// Block (b, c) sums its grid-stride share of channel c's M = N*S elements and writes
// p1[c*B + b], p2[c*B + b]:
//   MODE 0: a = x             -> (sum x, sum x*x)
//   MODE 1: a = dy, b = x     -> (sum dy, sum dy*xhat), xhat = (x - mean[c]) * invstd[c]
template <typename T, int MODE>
__global__ void channel_partial(const T* __restrict__ a, const T* __restrict__ b,
                                const double* __restrict__ mean,
                                const double* __restrict__ invstd,
                                long long C, long long S, long long M,
                                double* __restrict__ p1, double* __restrict__ p2) {
    if (dtk::index32_fits(dtk::max3(M * C, C * (long long)gridDim.x, C + gridDim.y)))
        channel_partial_body<T, MODE, int>(a, b, mean, invstd, C, S, M, p1, p2);
    else
        channel_partial_body<T, MODE, long long>(a, b, mean, invstd, C, S, M, p1, p2);
}

// Stage 2: out[c] = sum_b p[c*B + b], in block order.
__global__ void channel_finalize(const double* __restrict__ p1, const double* __restrict__ p2,
                                 long long C, long long B,
                                 double* __restrict__ out1, double* __restrict__ out2) {
    DTK_GRID_STRIDE(c, C) {
        double s1 = 0.0, s2 = 0.0;
        for (long long b = 0; b < B; ++b) {
            s1 += p1[c * B + b];
            s2 += p2[c * B + b];
        }
        out1[c] = s1;
        out2[c] = s2;
    }
}

// y = x*scale[c] + shift[c]
template <typename T, typename I>
__device__ void bn_forward_apply_body(const T* __restrict__ x, T* __restrict__ y,
                                      const double* __restrict__ scale,
                                      const double* __restrict__ shift, I C, I S, I total) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_LOOP(I, i, total) {
        const I c = (i / S) % C;
        y[i] = dtk::Num<T>::store(dtk::Num<T>::load(x[i]) * (acc)scale[c] + (acc)shift[c]);
    }
}

template <typename T>
__global__ void bn_forward_apply(const T* __restrict__ x, T* __restrict__ y,
                                 const double* __restrict__ scale,
                                 const double* __restrict__ shift,
                                 long long C, long long S, long long total) {
    if (dtk::index32_fits(total))
        bn_forward_apply_body<T, int>(x, y, scale, shift, C, S, total);
    else
        bn_forward_apply_body<T, long long>(x, y, scale, shift, C, S, total);
}

// dx = gamma[c]*invstd[c]*(dy - mean_dy[c] - xhat*mean_dy_xhat[c]), xhat = (x - mean[c])*invstd[c]
template <typename T, typename I>
__device__ void bn_backward_apply_body(const T* __restrict__ dy, const T* __restrict__ x,
                                       T* __restrict__ dx, const double* __restrict__ mean,
                                       const double* __restrict__ invstd,
                                       const double* __restrict__ gamma,
                                       const double* __restrict__ mean_dy,
                                       const double* __restrict__ mean_dy_xhat,
                                       I C, I S, I total) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_LOOP(I, i, total) {
        const I c = (i / S) % C;
        const acc is = (acc)invstd[c];
        const acc xh = (dtk::Num<T>::load(x[i]) - (acc)mean[c]) * is;
        const acc g = dtk::Num<T>::load(dy[i]) - (acc)mean_dy[c] - xh * (acc)mean_dy_xhat[c];
        dx[i] = dtk::Num<T>::store((acc)gamma[c] * is * g);
    }
}

template <typename T>
__global__ void bn_backward_apply(const T* __restrict__ dy, const T* __restrict__ x,
                                  T* __restrict__ dx,
                                  const double* __restrict__ mean,
                                  const double* __restrict__ invstd,
                                  const double* __restrict__ gamma,
                                  const double* __restrict__ mean_dy,
                                  const double* __restrict__ mean_dy_xhat,
                                  long long C, long long S, long long total) {
    if (dtk::index32_fits(total))
        bn_backward_apply_body<T, int>(dy, x, dx, mean, invstd, gamma, mean_dy, mean_dy_xhat,
                                       C, S, total);
    else
        bn_backward_apply_body<T, long long>(dy, x, dx, mean, invstd, gamma, mean_dy,
                                             mean_dy_xhat, C, S, total);
}

template <typename T>
__global__ void activation_forward(const T* __restrict__ x, T* __restrict__ y, long long n,
                                   int mode, double alpha_) {
    typedef typename dtk::Num<T>::acc acc;
    const acc alpha = (acc)alpha_;
    const acc one = acc(1), zero = acc(0);
    DTK_GRID_STRIDE(i, n) {
        const acc v = dtk::Num<T>::load(x[i]);
        acc r;
        switch (mode) {
            case dtk_pw::RELU: r = (v > zero || v != v) ? v : zero; break;  // NaN propagates
            case dtk_pw::LEAKY_RELU: r = v > zero ? v : alpha * v; break;
            case dtk_pw::ELU: r = v > zero ? v : alpha * dtk_pw::exm1(v); break;
            case dtk_pw::SIGMOID: {  // exp of a non-positive number only (no overflow)
                const acc e = dtk_pw::ex(v > zero ? -v : v);
                const acc q = one / (one + e);
                r = v >= zero ? q : e * q;
                break;
            }
            default: r = dtk_pw::th(v); break;  // TANH
        }
        y[i] = dtk::Num<T>::store(r);
    }
}

// PyTorch gradient conventions: relu (x > 0), leaky_relu 1 if x > 0 else alpha, elu 1 if x > 0
// else y + alpha, sigmoid y*(1 - y), tanh 1 - y^2.  x / y are read only by the modes that use
// them.
template <typename T>
__global__ void activation_backward(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ y, T* __restrict__ dx, long long n,
                                    int mode, double alpha_) {
    typedef typename dtk::Num<T>::acc acc;
    const acc alpha = (acc)alpha_;
    const acc one = acc(1), zero = acc(0);
    DTK_GRID_STRIDE(i, n) {
        const acc g = dtk::Num<T>::load(dy[i]);
        acc r;
        switch (mode) {
            case dtk_pw::RELU:
                r = dtk::Num<T>::load(x[i]) > zero ? g : zero;
                break;
            case dtk_pw::LEAKY_RELU:
                r = dtk::Num<T>::load(x[i]) > zero ? g : alpha * g;
                break;
            case dtk_pw::ELU:
                r = dtk::Num<T>::load(x[i]) > zero ? g
                                                      : g * (dtk::Num<T>::load(y[i]) + alpha);
                break;
            case dtk_pw::SIGMOID: {
                const acc s = dtk::Num<T>::load(y[i]);
                r = g * s * (one - s);
                break;
            }
            default: {  // TANH
                const acc t = dtk::Num<T>::load(y[i]);
                r = g * (one - t * t);
                break;
            }
        }
        dx[i] = dtk::Num<T>::store(r);
    }
}

// Softmax (or log-softmax) over the channel axis: one thread per (n, s) position, P = N*S.
template <typename T, typename I>
__device__ void softmax_channels_body(const T* __restrict__ x, T* __restrict__ y, I C, I S, I P,
                                      int log_softmax) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_LOOP(I, p, P) {
        const I n = p / S;
        const I base = n * C * S + (p - n * S);
        acc m = dtk::Num<T>::load(x[base]);
        for (I c = 1; c < C; ++c) {
            const acc v = dtk::Num<T>::load(x[base + c * S]);
            if (v > m) m = v;
        }
        acc s = acc(0);
        for (I c = 0; c < C; ++c) s += dtk_pw::ex(dtk::Num<T>::load(x[base + c * S]) - m);
        if (log_softmax) {
            const acc lse = m + dtk_pw::lg(s);
            for (I c = 0; c < C; ++c)
                y[base + c * S] =
                    dtk::Num<T>::store(dtk::Num<T>::load(x[base + c * S]) - lse);
        } else {
            const acc inv = acc(1) / s;
            for (I c = 0; c < C; ++c)
                y[base + c * S] =
                    dtk::Num<T>::store(dtk_pw::ex(dtk::Num<T>::load(x[base + c * S]) - m) * inv);
        }
    }
}

template <typename T>
__global__ void softmax_channels(const T* __restrict__ x, T* __restrict__ y,
                                 long long C, long long S, long long P, int log_softmax) {
    if (dtk::index32_fits(P * C))
        softmax_channels_body<T, int>(x, y, C, S, P, log_softmax);
    else
        softmax_channels_body<T, long long>(x, y, C, S, P, log_softmax);
}

// dx = y * (dy - sum_c dy*y)
template <typename T, typename I>
__device__ void softmax_channels_backward_body(const T* __restrict__ dy,
                                               const T* __restrict__ y, T* __restrict__ dx,
                                               I C, I S, I P) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_LOOP(I, p, P) {
        const I n = p / S;
        const I base = n * C * S + (p - n * S);
        acc s = acc(0);
        for (I c = 0; c < C; ++c)
            s += dtk::Num<T>::load(dy[base + c * S]) * dtk::Num<T>::load(y[base + c * S]);
        for (I c = 0; c < C; ++c) {
            const I k = base + c * S;
            dx[k] = dtk::Num<T>::store(dtk::Num<T>::load(y[k]) *
                                          (dtk::Num<T>::load(dy[k]) - s));
        }
    }
}

template <typename T>
__global__ void softmax_channels_backward(const T* __restrict__ dy, const T* __restrict__ y,
                                          T* __restrict__ dx, long long C, long long S,
                                          long long P) {
    if (dtk::index32_fits(P * C))
        softmax_channels_backward_body<T, int>(dy, y, dx, C, S, P);
    else
        softmax_channels_backward_body<T, long long>(dy, y, dx, C, S, P);
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_PW_INSTANTIATE(T)                                                                 \
    template __global__ void channel_partial<T, 0>(const T*, const T*, const double*,         \
                                                   const double*, long long, long long,       \
                                                   long long, double*, double*);              \
    template __global__ void channel_partial<T, 1>(const T*, const T*, const double*,         \
                                                   const double*, long long, long long,       \
                                                   long long, double*, double*);              \
    template __global__ void bn_forward_apply<T>(const T*, T*, const double*, const double*,  \
                                                 long long, long long, long long);            \
    template __global__ void bn_backward_apply<T>(                                            \
        const T*, const T*, T*, const double*, const double*, const double*, const double*,   \
        const double*, long long, long long, long long);                                      \
    template __global__ void activation_forward<T>(const T*, T*, long long, int, double);     \
    template __global__ void activation_backward<T>(const T*, const T*, const T*, T*,         \
                                                    long long, int, double);                  \
    template __global__ void softmax_channels<T>(const T*, T*, long long, long long,          \
                                                 long long, int);                             \
    template __global__ void softmax_channels_backward<T>(const T*, const T*, T*, long long,  \
                                                          long long, long long);

DTK_PW_INSTANTIATE(float)
DTK_PW_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_PW_INSTANTIATE(__half)
#endif
#undef DTK_PW_INSTANTIATE
