// Group, instance and layer normalization kernels of disttensor's GPU local kernels
// (disttensor/ops/local/gpu/normalization.py; gpu/rawmodules.py loads this file with
// cupy.RawModule, kernels looked up by name expression, e.g. "ln_forward_apply<float>").
//
// Every kernel takes a C-contiguous (R, L) view: R rows of L values (group norm: one row per
// sample and group for the statistics, per sample and channel for the data gradient; layer
// norm: one row per index of the leading axes).  Reductions are float64 and deterministic run
// to run: per-(row, chunk) partials written by the blocks of a 2-D grid, merged per row in
// chunk order by one thread.  Elementwise kernels compute in float64 and store T; they use int
// indices where every index fits (dtk::index32_fits, common.cuh), long long otherwise.
// Parameters (mean, invstd, coefficients, gamma, beta) arrive as float64 arrays.
//
// Includes only common.cuh; compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to
// leave out the __half instantiations.

#include "common.cuh"

namespace dtk_norm {

const int REDUCE_BLOCK = 256;  // blockDim.x of the partial kernels (normalization.py)

// sum of v over the block's threads, in a fixed tree order; every thread gets the result
__device__ __forceinline__ double block_sum(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = REDUCE_BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    const double s = sh[0];
    __syncthreads();  // sh is reused by the next reduction
    return s;
}

}  // namespace dtk_norm

// Per-(row, chunk) moments.  Grid (B, min(R, 65535)), block REDUCE_BLOCK threads; chunk b of
// row r is [b*cs, min(L, (b+1)*cs)), cs = ceil(L / B).  Writes the chunk's mean to
// pmean[r*B + b] and its sum of squared deviations from that mean to pm2[r*B + b] (two passes
// over the chunk; zeros for an empty chunk).
template <typename T>
__global__ void row_moments_partial(const T* __restrict__ x, long long R, long long L,
                                    double* __restrict__ pmean, double* __restrict__ pm2) {
    __shared__ double sh[dtk_norm::REDUCE_BLOCK];
    const long long B = gridDim.x;
    const long long cs = (L + B - 1) / B;
    const long long s0 = (long long)blockIdx.x * cs;
    const long long s1 = s0 + cs < L ? s0 + cs : L;
    for (long long r = blockIdx.y; r < R; r += gridDim.y) {
        const T* row = x + r * L;
        double s = 0.0;
        for (long long j = s0 + threadIdx.x; j < s1; j += blockDim.x)
            s += (double)dtk::Num<T>::load(row[j]);
        const long long n = s1 > s0 ? s1 - s0 : 0;
        const double tot = dtk_norm::block_sum(s, sh);
        const double m = n ? tot / (double)n : 0.0;
        double q = 0.0;
        for (long long j = s0 + threadIdx.x; j < s1; j += blockDim.x) {
            const double e = (double)dtk::Num<T>::load(row[j]) - m;
            q += e * e;
        }
        q = dtk_norm::block_sum(q, sh);
        if (threadIdx.x == 0) {
            pmean[r * B + blockIdx.x] = m;
            pm2[r * B + blockIdx.x] = q;
        }
    }
}

// Per row: the B chunk moments merged in chunk order by Chan et al.'s rule.
__global__ void row_moments_finalize(const double* __restrict__ pmean,
                                     const double* __restrict__ pm2, long long R, long long L,
                                     long long B, double* __restrict__ mean,
                                     double* __restrict__ m2) {
    const long long cs = (L + B - 1) / B;
    DTK_GRID_STRIDE(r, R) {
        double cnt = 0.0, mu = 0.0, q = 0.0;
        for (long long b = 0; b < B; ++b) {
            const long long s0 = b * cs;
            const long long s1 = s0 + cs < L ? s0 + cs : L;
            if (s1 <= s0) break;
            const double nb = (double)(s1 - s0);
            const double tot = cnt + nb;
            const double delta = pmean[r * B + b] - mu;
            mu += delta * (nb / tot);
            q += pm2[r * B + b] + delta * delta * (cnt * nb / tot);
            cnt = tot;
        }
        mean[r] = mu;
        m2[r] = q;
    }
}

// Per-(row, chunk) layer-norm backward sums: pa = sum dy*gamma[j], pb = sum dy*gamma[j]*xhat,
// xhat = (x - mean[r])*invstd[r].  Same grid and chunks as row_moments_partial; the chunks
// are added per row by pointwise.cu's channel_finalize.
template <typename T>
__global__ void ln_row_partial(const T* __restrict__ dy, const T* __restrict__ x,
                               const double* __restrict__ mean,
                               const double* __restrict__ invstd,
                               const double* __restrict__ gamma, long long R, long long L,
                               double* __restrict__ pa, double* __restrict__ pb) {
    __shared__ double sh[dtk_norm::REDUCE_BLOCK];
    const long long B = gridDim.x;
    const long long cs = (L + B - 1) / B;
    const long long s0 = (long long)blockIdx.x * cs;
    const long long s1 = s0 + cs < L ? s0 + cs : L;
    for (long long r = blockIdx.y; r < R; r += gridDim.y) {
        const double mr = mean[r], ir = invstd[r];
        double a = 0.0, b = 0.0;
        for (long long j = s0 + threadIdx.x; j < s1; j += blockDim.x) {
            const double g = (double)dtk::Num<T>::load(dy[r * L + j]) * gamma[j];
            a += g;
            b += g * (((double)dtk::Num<T>::load(x[r * L + j]) - mr) * ir);
        }
        a = dtk_norm::block_sum(a, sh);
        b = dtk_norm::block_sum(b, sh);
        if (threadIdx.x == 0) {
            pa[r * B + blockIdx.x] = a;
            pb[r * B + blockIdx.x] = b;
        }
    }
}

// Per column j: dgamma[j] = sum_r dy*xhat, dbeta[j] = sum_r dy (rows in order).
template <typename T>
__global__ void ln_col_sums(const T* __restrict__ dy, const T* __restrict__ x,
                            const double* __restrict__ mean, const double* __restrict__ invstd,
                            long long R, long long L, double* __restrict__ dgamma,
                            double* __restrict__ dbeta) {
    DTK_GRID_STRIDE(j, L) {
        double sg = 0.0, sb = 0.0;
        for (long long r = 0; r < R; ++r) {
            const double g = (double)dtk::Num<T>::load(dy[r * L + j]);
            sg += g * (((double)dtk::Num<T>::load(x[r * L + j]) - mean[r]) * invstd[r]);
            sb += g;
        }
        dgamma[j] = sg;
        dbeta[j] = sb;
    }
}

// dx = a[r]*dy + b[r]*(x - m[r]) + d[r]
template <typename T, typename I>
__device__ void rows_backward_apply_body(const T* __restrict__ dy, const T* __restrict__ x,
                                         T* __restrict__ dx, const double* __restrict__ a,
                                         const double* __restrict__ m,
                                         const double* __restrict__ b,
                                         const double* __restrict__ d, I L, I total) {
    DTK_GRID_LOOP(I, i, total) {
        const I r = i / L;
        dx[i] = dtk::Num<T>::store(a[r] * (double)dtk::Num<T>::load(dy[i]) +
                                   b[r] * ((double)dtk::Num<T>::load(x[i]) - m[r]) + d[r]);
    }
}

template <typename T>
__global__ void rows_backward_apply(const T* __restrict__ dy, const T* __restrict__ x,
                                    T* __restrict__ dx, const double* __restrict__ a,
                                    const double* __restrict__ m, const double* __restrict__ b,
                                    const double* __restrict__ d, long long L,
                                    long long total) {
    if (dtk::index32_fits(total))
        rows_backward_apply_body<T, int>(dy, x, dx, a, m, b, d, L, total);
    else
        rows_backward_apply_body<T, long long>(dy, x, dx, a, m, b, d, L, total);
}

// y = (x - mean[r]) * invstd[r] * gamma[j] + beta[j]
template <typename T, typename I>
__device__ void ln_forward_apply_body(const T* __restrict__ x, T* __restrict__ y,
                                      const double* __restrict__ mean,
                                      const double* __restrict__ invstd,
                                      const double* __restrict__ gamma,
                                      const double* __restrict__ beta, I L, I total) {
    DTK_GRID_LOOP(I, i, total) {
        const I r = i / L;
        const I j = i - r * L;
        y[i] = dtk::Num<T>::store(((double)dtk::Num<T>::load(x[i]) - mean[r]) * invstd[r] *
                                  gamma[j] + beta[j]);
    }
}

template <typename T>
__global__ void ln_forward_apply(const T* __restrict__ x, T* __restrict__ y,
                                 const double* __restrict__ mean,
                                 const double* __restrict__ invstd,
                                 const double* __restrict__ gamma,
                                 const double* __restrict__ beta, long long L, long long total) {
    if (dtk::index32_fits(total))
        ln_forward_apply_body<T, int>(x, y, mean, invstd, gamma, beta, L, total);
    else
        ln_forward_apply_body<T, long long>(x, y, mean, invstd, gamma, beta, L, total);
}

// dx = invstd[r] * (dy*gamma[j] - ma[r] - xhat*mb[r]), xhat = (x - mean[r])*invstd[r]
template <typename T, typename I>
__device__ void ln_backward_apply_body(const T* __restrict__ dy, const T* __restrict__ x,
                                       T* __restrict__ dx, const double* __restrict__ mean,
                                       const double* __restrict__ invstd,
                                       const double* __restrict__ gamma,
                                       const double* __restrict__ ma,
                                       const double* __restrict__ mb, I L, I total) {
    DTK_GRID_LOOP(I, i, total) {
        const I r = i / L;
        const I j = i - r * L;
        const double ir = invstd[r];
        const double xh = ((double)dtk::Num<T>::load(x[i]) - mean[r]) * ir;
        dx[i] = dtk::Num<T>::store(
            ir * ((double)dtk::Num<T>::load(dy[i]) * gamma[j] - ma[r] - xh * mb[r]));
    }
}

template <typename T>
__global__ void ln_backward_apply(const T* __restrict__ dy, const T* __restrict__ x,
                                  T* __restrict__ dx, const double* __restrict__ mean,
                                  const double* __restrict__ invstd,
                                  const double* __restrict__ gamma,
                                  const double* __restrict__ ma, const double* __restrict__ mb,
                                  long long L, long long total) {
    if (dtk::index32_fits(total))
        ln_backward_apply_body<T, int>(dy, x, dx, mean, invstd, gamma, ma, mb, L, total);
    else
        ln_backward_apply_body<T, long long>(dy, x, dx, mean, invstd, gamma, ma, mb, L,
                                             total);
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_NORM_INSTANTIATE(T)                                                               \
    template __global__ void row_moments_partial<T>(const T*, long long, long long, double*,  \
                                                    double*);                                 \
    template __global__ void ln_row_partial<T>(const T*, const T*, const double*,             \
                                               const double*, const double*, long long,       \
                                               long long, double*, double*);                  \
    template __global__ void ln_col_sums<T>(const T*, const T*, const double*, const double*, \
                                            long long, long long, double*, double*);          \
    template __global__ void rows_backward_apply<T>(const T*, const T*, T*, const double*,    \
                                                    const double*, const double*,             \
                                                    const double*, long long, long long);     \
    template __global__ void ln_forward_apply<T>(const T*, T*, const double*, const double*,  \
                                                 const double*, const double*, long long,     \
                                                 long long);                                  \
    template __global__ void ln_backward_apply<T>(const T*, const T*, T*, const double*,      \
                                                  const double*, const double*,               \
                                                  const double*, const double*, long long,    \
                                                  long long);

DTK_NORM_INSTANTIATE(float)
DTK_NORM_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_NORM_INSTANTIATE(__half)
#endif
#undef DTK_NORM_INSTANTIATE
