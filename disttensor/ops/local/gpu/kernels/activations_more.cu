// Activations whose derivative is a function of the input (GELU exact and tanh, SiLU,
// Softplus, Mish, Hardswish, Hardsigmoid) and PReLU, for disttensor's GPU local kernels
// (disttensor/ops/local/gpu/activations_more.py; gpu/rawmodules.py loads this file with
// cupy.RawModule, kernels looked up by name expression, e.g.
// "pointwise_activation_forward<float>").  The formulas are those of the CPU kernels,
// ops/local/cpu/activations_more.py (PyTorch 2.13's); here arithmetic is in the accumulation
// type (float for __half/float, double for double).
//
// Flat arrays, 64-bit indices, grid-stride loops.  PReLU: element i has channel (i / S) % C
// (C = 1 for a single weight); its backward writes each element's weight-gradient term
// (x * dy where x <= 0, else 0) as a double to `contrib`, summed per channel by the caller.
//
// Includes only common.cuh and CUDA headers; compiles with `nvcc -std=c++17 -c`.  Define
// DISTTENSOR_NO_HALF to leave out the __half instantiations.

#include "common.cuh"

namespace dtk_am {

__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }
__device__ __forceinline__ float l1p(float v) { return log1pf(v); }
__device__ __forceinline__ double l1p(double v) { return log1p(v); }
__device__ __forceinline__ float th(float v) { return tanhf(v); }
__device__ __forceinline__ double th(double v) { return tanh(v); }
__device__ __forceinline__ float er(float v) { return erff(v); }
__device__ __forceinline__ double er(double v) { return erf(v); }

// codes (gpu/activations_more.py _CODES, the order of cpu POINTWISE_ACTIVATIONS)
enum { GELU = 0, GELU_TANH = 1, SILU = 2, SOFTPLUS = 3, MISH = 4, HARDSWISH = 5,
       HARDSIGMOID = 6 };

template <typename A>
__device__ __forceinline__ A sigmoid(A v) {  // exp of a non-positive number only
    const A e = ex(v > A(0) ? -v : v);
    const A q = A(1) / (A(1) + e);
    return v >= A(0) ? q : e * q;
}

template <typename A>
__device__ __forceinline__ A softplus1(A v) {  // log1p(exp(v)) without overflow
    return v > A(0) ? v + l1p(ex(-v)) : l1p(ex(v));
}

template <typename A>
__device__ __forceinline__ A clip6(A v) {
    return v < A(0) ? A(0) : (v > A(6) ? A(6) : v);
}

template <typename A>
__device__ A forward_value(int op, A v, A beta, A threshold) {
    const A half = A(0.5), one = A(1);
    const A k_tanh = A(0.7978845608028654), kappa = A(0.044715), rsqrt2 = A(0.7071067811865476);
    switch (op) {
        case GELU: return half * v * (one + er(v * rsqrt2));
        case GELU_TANH: return half * v * (one + th(k_tanh * (v + kappa * v * v * v)));
        case SILU: return v * sigmoid(v);
        case SOFTPLUS: {
            const A bv = beta * v;
            return bv > threshold ? v : l1p(ex(bv)) / beta;
        }
        case MISH: return v * th(softplus1(v));
        case HARDSWISH: return v != v ? v : v * clip6(v + A(3)) / A(6);
        default: return v != v ? v : clip6(v + A(3)) / A(6);  // HARDSIGMOID
    }
}

template <typename A>
__device__ A derivative(int op, A v, A beta, A threshold) {
    const A half = A(0.5), one = A(1);
    const A k_tanh = A(0.7978845608028654), kappa = A(0.044715), rsqrt2 = A(0.7071067811865476);
    const A inv_sqrt_2pi = A(0.3989422804014327);
    switch (op) {
        case GELU:
            return half * (one + er(v * rsqrt2)) + v * inv_sqrt_2pi * ex(-half * v * v);
        case GELU_TANH: {
            const A x2 = v * v;
            const A t = th(k_tanh * (v + kappa * x2 * v));
            return half * (one + t)
                   + half * v * (one - t * t) * k_tanh * (one + A(3) * kappa * x2);
        }
        case SILU: {
            const A s = sigmoid(v);
            return s * (one + v * (one - s));
        }
        case SOFTPLUS: {
            const A bv = beta * v;
            return bv > threshold ? one : sigmoid(bv);
        }
        case MISH: {
            const A t = th(softplus1(v));
            return t + v * sigmoid(v) * (one - t * t);
        }
        case HARDSWISH:
            if (v != v) return v;
            if (v <= A(-3)) return A(0);
            return v < A(3) ? v / A(3) + half : one;
        default:  // HARDSIGMOID: 0 at NaN, as PyTorch
            return (v > A(-3) && v < A(3)) ? one / A(6) : A(0);
    }
}

}  // namespace dtk_am

template <typename T>
__global__ void pointwise_activation_forward(const T* __restrict__ x, T* __restrict__ y,
                                             long long n, int op, double beta,
                                             double threshold) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_STRIDE(i, n) {
        y[i] = dtk::Num<T>::store(dtk_am::forward_value<acc>(op, dtk::Num<T>::load(x[i]),
                                                             (acc)beta, (acc)threshold));
    }
}

template <typename T>
__global__ void pointwise_activation_backward(const T* __restrict__ dy, const T* __restrict__ x,
                                              T* __restrict__ dx, long long n, int op,
                                              double beta, double threshold) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_STRIDE(i, n) {
        const acc d = dtk_am::derivative<acc>(op, dtk::Num<T>::load(x[i]), (acc)beta,
                                              (acc)threshold);
        dx[i] = dtk::Num<T>::store(dtk::Num<T>::load(dy[i]) * d);
    }
}

template <typename T>
__global__ void prelu_forward(const T* __restrict__ x, const double* __restrict__ w,
                              T* __restrict__ y, long long C, long long S, long long n) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_STRIDE(i, n) {
        const acc v = dtk::Num<T>::load(x[i]);
        const acc a = (acc)w[(i / S) % C];
        y[i] = dtk::Num<T>::store(v > acc(0) ? v : a * v);
    }
}

template <typename T>
__global__ void prelu_backward(const T* __restrict__ dy, const T* __restrict__ x,
                               const double* __restrict__ w, T* __restrict__ dx,
                               double* __restrict__ contrib, long long C, long long S,
                               long long n) {
    typedef typename dtk::Num<T>::acc acc;
    DTK_GRID_STRIDE(i, n) {
        const acc v = dtk::Num<T>::load(x[i]);
        const acc g = dtk::Num<T>::load(dy[i]);
        if (v > acc(0)) {
            dx[i] = dtk::Num<T>::store(g);
            contrib[i] = 0.0;
        } else {
            dx[i] = dtk::Num<T>::store((acc)w[(i / S) % C] * g);
            contrib[i] = (double)v * (double)g;
        }
    }
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_AM_INSTANTIATE(T)                                                                 \
    template __global__ void pointwise_activation_forward<T>(const T*, T*, long long, int,    \
                                                             double, double);                 \
    template __global__ void pointwise_activation_backward<T>(const T*, const T*, T*,         \
                                                              long long, int, double, double); \
    template __global__ void prelu_forward<T>(const T*, const double*, T*, long long,         \
                                              long long, long long);                          \
    template __global__ void prelu_backward<T>(const T*, const T*, const double*, T*,         \
                                               double*, long long, long long, long long);

DTK_AM_INSTANTIATE(float)
DTK_AM_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_AM_INSTANTIATE(__half)
#endif
#undef DTK_AM_INSTANTIATE
