// The losses of disttensor's GPU local kernels (disttensor/ops/local/gpu/losses.py; the CPU
// twins are ops/local/cpu/losses.py, whose contracts these follow): cross-entropy / NLL with
// class labels (weights, ignore_index, label smoothing) or class probabilities, the
// elementwise losses (mse, l1, smooth_l1, huber, bce_with_logits, bce) and the soft Dice sums,
// each forward beside its backward.
//
// Layout: (N, C, *spatial) C-contiguous viewed as (N, C, S); labels (N, S) int64; one thread
// per position p = n*S + s (P = N*S) for the channel kernels, per element for the elementwise
// ones.  All arithmetic in double (float / __half inputs are widened on load; results stored
// in the input's type, losses and sums in double), as the CPU kernels do, so the two agree to
// float64 rounding.  Per-class weights arrive as double arrays; the incoming gradient of a
// backward is gscale * gvox[p] (per_voxel != 0) or gscale.  Labels outside [0, C) that are not
// the ignore index contribute nothing (the caller counts and rejects them).  Indices are
// 64-bit throughout.  The Dice sums are deterministic: dice_partial writes one partial per
// (sample, block, class), summed by the caller in block order.
//
// Includes only common.cuh and CUDA headers; compiles with `nvcc -std=c++17 -c`.  Define
// DISTTENSOR_NO_HALF to leave out the __half instantiations.

#include "common.cuh"

namespace dtk_loss {

const int REDUCE_BLOCK = 256;  // blockDim.x of dice_partial (gpu/losses.py launches this)

__device__ __forceinline__ double neg_inf() { return -__longlong_as_double(0x7ff0000000000000LL); }

template <typename T>
__device__ __forceinline__ double ld(const T* a, long long i) {
    return (double)dtk::Num<T>::load(a[i]);
}

// max_c x (a NaN wins) + log(sum_c exp(x - max)) at the position whose channel 0 is `base`
template <typename T>
__device__ double log_sum_exp(const T* __restrict__ x, long long base, long long C,
                              long long S) {
    double m = neg_inf();
    for (long long c = 0; c < C; ++c) {
        const double v = ld(x, base + c * S);
        if (v > m || v != v) m = v;
    }
    double tot = 0.0;
    for (long long c = 0; c < C; ++c) tot += exp(ld(x, base + c * S) - m);
    return m + log(tot);
}

__device__ __forceinline__ double sign_of(double d) {
    return d > 0 ? 1.0 : (d < 0 ? -1.0 : (d == 0 ? 0.0 : d));
}

// one element of an elementwise loss (op codes: POINTWISE_LOSSES of cpu/losses.py) and its
// derivative in x, before the weight
__device__ void pointwise(int op, double x, double t, double param, double pw, double* v,
                          double* dv) {
    const double d = x - t;
    if (op == 0) {
        *v = d * d;
        *dv = 2.0 * d;
    } else if (op == 1) {
        *v = fabs(d);
        *dv = sign_of(d);
    } else if (op == 2 || op == 3) {
        const double a = fabs(d);
        if (a < param) {
            *v = op == 2 ? 0.5 * d * d / param : 0.5 * d * d;
            *dv = op == 2 ? d / param : d;
        } else {
            *v = op == 2 ? a - 0.5 * param : param * (a - 0.5 * param);
            *dv = op == 2 ? sign_of(d) : param * sign_of(d);
        }
    } else if (op == 4) {
        const double lw = 1.0 + (pw - 1.0) * t;
        const double sp = log1p(exp(-fabs(x))) + (x < 0 ? -x : 0.0);
        const double sig = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
        *v = (1.0 - t) * x + lw * sp;
        *dv = lw * sig - pw * t;
    } else {
        const double lx = x > 0 ? fmax(log(x), -100.0) : -100.0;
        const double l1x = x < 1 ? fmax(log1p(-x), -100.0) : -100.0;
        *v = -(t * lx + (1.0 - t) * l1x);
        *dv = (x - t) / fmax((1.0 - x) * x, 1e-12);
    }
}

// the activation (0 none, 1 softmax with log-sum-exp `lse`, 2 sigmoid) of one value
__device__ __forceinline__ double activate(int act, double v, double lse) {
    if (act == 1) return exp(v - lse);
    if (act == 2) return v >= 0 ? 1.0 / (1.0 + exp(-v)) : exp(v) / (1.0 + exp(v));
    return v;
}

}  // namespace dtk_loss

// Cross-entropy (log_input = 0) or NLL (1) with class labels: per position the loss and the
// denominator term w[y] (both 0 where ignored / out of range).
template <typename T>
__global__ void class_ce_forward(const T* __restrict__ x, const long long* __restrict__ lab,
                                 const double* __restrict__ w, double* __restrict__ loss,
                                 double* __restrict__ den, long long C, long long S,
                                 long long P, long long ignore, double eps, int log_input) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        const long long base = n * C * S + (p - n * S);
        const long long y = lab[p];
        if (y == ignore || y < 0 || y >= C) {
            loss[p] = 0.0;
            den[p] = 0.0;
            continue;
        }
        const double lse = log_input ? 0.0 : dtk_loss::log_sum_exp(x, base, C, S);
        double v = -w[y] * (dtk_loss::ld(x, base + y * S) - lse);
        if (eps != 0.0) {
            double sm = 0.0;
            for (long long c = 0; c < C; ++c) sm -= w[c] * (dtk_loss::ld(x, base + c * S) - lse);
            v = (1.0 - eps) * v + eps / C * sm;
        }
        loss[p] = v;
        den[p] = w[y];
    }
}

template <typename T>
__global__ void class_ce_backward(const T* __restrict__ x, const long long* __restrict__ lab,
                                  const double* __restrict__ w, const double* __restrict__ gvox,
                                  int per_voxel, double gscale, T* __restrict__ dx, long long C,
                                  long long S, long long P, long long ignore, double eps,
                                  int log_input) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        const long long base = n * C * S + (p - n * S);
        const long long y = lab[p];
        const double g = per_voxel ? gscale * gvox[p] : gscale;
        if (y == ignore || y < 0 || y >= C) {
            for (long long c = 0; c < C; ++c) dx[base + c * S] = dtk::Num<T>::store(0.0);
            continue;
        }
        const double wy = w[y];
        if (log_input) {
            for (long long c = 0; c < C; ++c)
                dx[base + c * S] = dtk::Num<T>::store(c == y ? -g * wy : 0.0);
            continue;
        }
        double wsum = 0.0;
        for (long long c = 0; c < C; ++c) wsum += w[c];
        const double lse = dtk_loss::log_sum_exp(x, base, C, S);
        const double a = (1.0 - eps) * wy + eps / C * wsum;
        for (long long c = 0; c < C; ++c) {
            const double pc = exp(dtk_loss::ld(x, base + c * S) - lse);
            double b = eps / C * w[c];
            if (c == y) b += (1.0 - eps) * wy;
            dx[base + c * S] = dtk::Num<T>::store(g * (a * pc - b));
        }
    }
}

// Cross-entropy with class probabilities tg (double, x's layout), smoothed t' = (1-eps)t + eps/C
template <typename T>
__global__ void prob_ce_forward(const T* __restrict__ x, const double* __restrict__ tg,
                                const double* __restrict__ w, double* __restrict__ loss,
                                long long C, long long S, long long P, double eps) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        const long long base = n * C * S + (p - n * S);
        const double lse = dtk_loss::log_sum_exp(x, base, C, S);
        double v = 0.0;
        for (long long c = 0; c < C; ++c) {
            const double tc = (1.0 - eps) * tg[base + c * S] + eps / C;
            v -= w[c] * tc * (dtk_loss::ld(x, base + c * S) - lse);
        }
        loss[p] = v;
    }
}

template <typename T>
__global__ void prob_ce_backward(const T* __restrict__ x, const double* __restrict__ tg,
                                 const double* __restrict__ w, const double* __restrict__ gvox,
                                 int per_voxel, double gscale, T* __restrict__ dx, long long C,
                                 long long S, long long P, double eps) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        const long long base = n * C * S + (p - n * S);
        const double g = per_voxel ? gscale * gvox[p] : gscale;
        const double lse = dtk_loss::log_sum_exp(x, base, C, S);
        double wt = 0.0;
        for (long long c = 0; c < C; ++c) wt += w[c] * ((1.0 - eps) * tg[base + c * S] + eps / C);
        for (long long c = 0; c < C; ++c) {
            const double tc = (1.0 - eps) * tg[base + c * S] + eps / C;
            const double pc = exp(dtk_loss::ld(x, base + c * S) - lse);
            dx[base + c * S] = dtk::Num<T>::store(g * (pc * wt - w[c] * tc));
        }
    }
}

// Elementwise losses: out[i] = loss(x[i], t[i]) * w[i] (has_w), pos_weight pw[i] (has_pw)
template <typename T>
__global__ void pointwise_loss_forward(const T* __restrict__ x, const double* __restrict__ t,
                                       const double* __restrict__ w,
                                       const double* __restrict__ pw, double* __restrict__ out,
                                       long long n, int op, double param, int has_w,
                                       int has_pw) {
    DTK_GRID_STRIDE(i, n) {
        double v, dv;
        dtk_loss::pointwise(op, dtk_loss::ld(x, i), t[i], param, has_pw ? pw[i] : 1.0, &v, &dv);
        out[i] = has_w ? v * w[i] : v;
    }
}

template <typename T>
__global__ void pointwise_loss_backward(const T* __restrict__ x, const double* __restrict__ t,
                                        const double* __restrict__ w,
                                        const double* __restrict__ pw,
                                        const double* __restrict__ gvox, int per_voxel,
                                        double gscale, T* __restrict__ dx, long long n, int op,
                                        double param, int has_w, int has_pw) {
    DTK_GRID_STRIDE(i, n) {
        double v, dv;
        dtk_loss::pointwise(op, dtk_loss::ld(x, i), t[i], param, has_pw ? pw[i] : 1.0, &v, &dv);
        double g = per_voxel ? gscale * gvox[i] : gscale;
        if (has_w) g *= w[i];
        dx[i] = dtk::Num<T>::store(dv * g);
    }
}

// Channel log-sum-exp per position (the softmax of the Dice sums reads it)
template <typename T>
__global__ void channel_lse(const T* __restrict__ x, double* __restrict__ lse, long long C,
                            long long S, long long P) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        lse[p] = dtk_loss::log_sum_exp(x, n * C * S + (p - n * S), C, S);
    }
}

// Soft Dice partial sums.  Grid (B, min(N, 65535)), block REDUCE_BLOCK threads: block (b, n)
// sums its grid-stride share of sample n's S positions, per class c, of [p*t, p (or p^2),
// t (or t^2)] and writes part[((n*B + b)*C + c)*3 + k].  t: the one-hot of lab (use_lab) or
// tg (double, x's layout); p: the activation act of x (softmax reads lse).
template <typename T>
__global__ void dice_partial(const T* __restrict__ x, const double* __restrict__ tg,
                             const long long* __restrict__ lab, const double* __restrict__ lse,
                             int use_lab, int act, int squared, double* __restrict__ part,
                             long long N, long long C, long long S) {
    __shared__ double sh[3][dtk_loss::REDUCE_BLOCK];
    const long long B = gridDim.x;
    for (long long n = blockIdx.y; n < N; n += gridDim.y) {
        for (long long c = 0; c < C; ++c) {
            double si = 0.0, sp = 0.0, sg = 0.0;
            for (long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x; s < S;
                 s += B * (long long)blockDim.x) {
                const long long k = (n * C + c) * S + s;
                const double pv = dtk_loss::activate(act, dtk_loss::ld(x, k),
                                                     act == 1 ? lse[n * S + s] : 0.0);
                const double tv = use_lab ? (lab[n * S + s] == c ? 1.0 : 0.0) : tg[k];
                si += pv * tv;
                sp += squared ? pv * pv : pv;
                sg += squared ? tv * tv : tv;
            }
            sh[0][threadIdx.x] = si;
            sh[1][threadIdx.x] = sp;
            sh[2][threadIdx.x] = sg;
            __syncthreads();
            for (int h = dtk_loss::REDUCE_BLOCK / 2; h > 0; h >>= 1) {
                if ((int)threadIdx.x < h)
                    for (int q = 0; q < 3; ++q) sh[q][threadIdx.x] += sh[q][threadIdx.x + h];
                __syncthreads();
            }
            if (threadIdx.x == 0)
                for (int q = 0; q < 3; ++q)
                    part[((n * B + blockIdx.x) * C + c) * 3 + q] = sh[q][0];
            __syncthreads();  // sh is reused by the next class
        }
    }
}

// Soft Dice backward: dL/dp = alpha[n, c] t + beta[n, c] (2p or 1), back through the activation
template <typename T>
__global__ void dice_backward(const T* __restrict__ x, const double* __restrict__ tg,
                              const long long* __restrict__ lab, int use_lab, int act,
                              int squared, const double* __restrict__ alpha,
                              const double* __restrict__ beta, T* __restrict__ dx, long long C,
                              long long S, long long P) {
    DTK_GRID_STRIDE(p, P) {
        const long long n = p / S;
        const long long base = n * C * S + (p - n * S);
        const double lse = act == 1 ? dtk_loss::log_sum_exp(x, base, C, S) : 0.0;
        double dot = 0.0;
        for (int pass = 0; pass < (act == 1 ? 2 : 1); ++pass) {
            for (long long c = 0; c < C; ++c) {
                const long long k = base + c * S;
                const double pv = dtk_loss::activate(act, dtk_loss::ld(x, k), lse);
                const double tv = use_lab ? (lab[p] == c ? 1.0 : 0.0) : tg[k];
                const double dp =
                    alpha[n * C + c] * tv + beta[n * C + c] * (squared ? 2.0 * pv : 1.0);
                if (act == 1 && pass == 0) {
                    dot += dp * pv;
                } else {
                    const double g = act == 1   ? pv * (dp - dot)
                                      : act == 2 ? dp * pv * (1.0 - pv)
                                                 : dp;
                    dx[k] = dtk::Num<T>::store(g);
                }
            }
        }
    }
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_LOSS_INSTANTIATE(T)                                                                \
    template __global__ void class_ce_forward<T>(const T*, const long long*, const double*,    \
                                                 double*, double*, long long, long long,       \
                                                 long long, long long, double, int);           \
    template __global__ void class_ce_backward<T>(const T*, const long long*, const double*,   \
                                                  const double*, int, double, T*, long long,   \
                                                  long long, long long, long long, double,     \
                                                  int);                                        \
    template __global__ void prob_ce_forward<T>(const T*, const double*, const double*,        \
                                                double*, long long, long long, long long,      \
                                                double);                                       \
    template __global__ void prob_ce_backward<T>(const T*, const double*, const double*,       \
                                                 const double*, int, double, T*, long long,    \
                                                 long long, long long, double);                \
    template __global__ void pointwise_loss_forward<T>(const T*, const double*, const double*, \
                                                       const double*, double*, long long, int, \
                                                       double, int, int);                      \
    template __global__ void pointwise_loss_backward<T>(                                       \
        const T*, const double*, const double*, const double*, const double*, int, double, T*, \
        long long, int, double, int, int);                                                     \
    template __global__ void channel_lse<T>(const T*, double*, long long, long long,           \
                                            long long);                                        \
    template __global__ void dice_partial<T>(const T*, const double*, const long long*,        \
                                             const double*, int, int, int, double*, long long, \
                                             long long, long long);                            \
    template __global__ void dice_backward<T>(const T*, const double*, const long long*, int,  \
                                              int, int, const double*, const double*, T*,      \
                                              long long, long long, long long);

DTK_LOSS_INSTANTIATE(float)
DTK_LOSS_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_LOSS_INSTANTIATE(__half)
#endif
#undef DTK_LOSS_INSTANTIATE
