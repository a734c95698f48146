// Resampling kernels of disttensor's GPU local kernels (disttensor/ops/local/gpu/resample.py;
// gpu/rawmodules.py loads this file with cupy.RawModule, kernels looked up by name expression,
// e.g. "csr_apply<float>"): the contracts of ops/local/cpu/resample.py.
//
// csr_apply: a sparse matrix in CSR form (indptr, idx, w: long long, long long, double) applied
// along the middle axis of a C-contiguous (P, L, Q) array: out[p, o, q] = sum over k in
// [indptr[o], indptr[o+1]) of w[k] * a[p, idx[k], q], accumulated in double, one thread per
// output element (interpolation, adaptive average pooling and their adjoints).
//
// adaptive_max_forward: (NC, D, H, W) input, per-axis bins [lo, hi) (long long arrays, one
// entry per output along the axis); y the maximum of each bin (a strictly larger value or a
// NaN replaces the current one: the first of equal maxima, the last NaN, PyTorch's rule) and
// argmax its flat index (d*H + h)*W + w; one thread per output.
// adaptive_max_backward: dx (NC, D*H*W) zeroed by the caller; dy's outputs added into their
// argmax cells (argmax < 0: none), one thread per (n, c) slab looping over its outputs in
// order, so bins sharing a cell add deterministically without atomics.
//
// Includes only common.cuh; compiles with `nvcc -std=c++17 -c`.  Define DISTTENSOR_NO_HALF to
// leave out the __half instantiations.

#include "common.cuh"

template <typename T>
__global__ void csr_apply(const T* __restrict__ a, const long long* __restrict__ indptr,
                          const long long* __restrict__ idx, const double* __restrict__ w,
                          T* __restrict__ out, long long P, long long L, long long O,
                          long long Q) {
    const long long n = P * O * Q;
    DTK_GRID_STRIDE(i, n) {
        const long long q = i % Q;
        const long long po = i / Q;
        const long long o = po % O;
        const long long p = po / O;
        double acc = 0.0;
        for (long long k = indptr[o]; k < indptr[o + 1]; ++k) {
            acc += w[k] * (double)dtk::Num<T>::load(a[(p * L + idx[k]) * Q + q]);
        }
        out[i] = dtk::Num<T>::store((typename dtk::Num<T>::acc)acc);
    }
}

template <typename T>
__global__ void adaptive_max_forward(const T* __restrict__ x, T* __restrict__ y,
                                     long long* __restrict__ am,
                                     const long long* __restrict__ dlo,
                                     const long long* __restrict__ dhi,
                                     const long long* __restrict__ hlo,
                                     const long long* __restrict__ hhi,
                                     const long long* __restrict__ wlo,
                                     const long long* __restrict__ whi, long long NC,
                                     long long D, long long H, long long W, long long OD,
                                     long long OH, long long OW) {
    const long long n = NC * OD * OH * OW;
    DTK_GRID_STRIDE(i, n) {
        const long long ow = i % OW;
        const long long oh = (i / OW) % OH;
        const long long od = (i / (OW * OH)) % OD;
        const long long nc = i / (OW * OH * OD);
        const T* plane = x + nc * D * H * W;
        typename dtk::Num<T>::acc best = 0;
        long long arg = -1;
        for (long long d = dlo[od]; d < dhi[od]; ++d) {
            for (long long h = hlo[oh]; h < hhi[oh]; ++h) {
                for (long long c = wlo[ow]; c < whi[ow]; ++c) {
                    const long long at = (d * H + h) * W + c;
                    const typename dtk::Num<T>::acc v = dtk::Num<T>::load(plane[at]);
                    if (arg < 0 || v > best || v != v) {
                        best = v;
                        arg = at;
                    }
                }
            }
        }
        y[i] = dtk::Num<T>::store(best);
        am[i] = arg;
    }
}

template <typename T>
__global__ void adaptive_max_backward(const T* __restrict__ dy, const long long* __restrict__ am,
                                      T* __restrict__ dx, long long NC, long long M,
                                      long long S) {
    DTK_GRID_STRIDE(nc, NC) {
        for (long long k = 0; k < M; ++k) {
            const long long at = am[nc * M + k];
            if (at >= 0) {
                T* cell = dx + nc * S + at;
                *cell = dtk::Num<T>::store(dtk::Num<T>::load(*cell) +
                                           dtk::Num<T>::load(dy[nc * M + k]));
            }
        }
    }
}

// Explicit instantiations: `nvcc -c` then checks every kernel body, and NVRTC finds the same
// instances through RawModule's name_expressions.
#define DTK_RESAMPLE_INSTANTIATE(T)                                                          \
    template __global__ void csr_apply<T>(const T*, const long long*, const long long*,     \
                                          const double*, T*, long long, long long,          \
                                          long long, long long);                            \
    template __global__ void adaptive_max_forward<T>(                                        \
        const T*, T*, long long*, const long long*, const long long*, const long long*,     \
        const long long*, const long long*, const long long*, long long, long long,         \
        long long, long long, long long, long long, long long);                             \
    template __global__ void adaptive_max_backward<T>(const T*, const long long*, T*,        \
                                                      long long, long long, long long);

DTK_RESAMPLE_INSTANTIATE(float)
DTK_RESAMPLE_INSTANTIATE(double)
#ifndef DISTTENSOR_NO_HALF
DTK_RESAMPLE_INSTANTIATE(__half)
#endif
#undef DTK_RESAMPLE_INSTANTIATE
