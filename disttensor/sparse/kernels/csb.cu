// Compressed Sparse Blocks (CSB) products on the GPU, for disttensor.sparse.local_gpu
// (loaded through disttensor/ops/local/gpu/rawmodules.py, module "csb", kernels looked up by
// name expression, e.g. "csb_spmm_lines<float, unsigned char>").
//
// Layout (disttensor/sparse/structure.py): blocks of beta x beta, numbered block-row-major
// b = i * nbc + j; block b holds storage positions blk_ptr[b] .. blk_ptr[b + 1] - 1; L is the
// in-block index type (unsigned char for beta <= 256, unsigned short up to 65536).
//
// csb_spmm_lines: y += A x (lines = block-rows: out_loc = lrow, in_loc = lcol, the blocks of
// line l are l * nbc + t, t < nbc) or y += A^T x (lines = block-columns: out_loc = lcol,
// in_loc = lrow, blocks t * nbc + l, t < nbr), from the one structure.  x is (in_rows, k), y
// (out_rows, k), C-contiguous, y zeroed by the caller.  Work items are the chunks of
// disttensor/sparse/blocking.py's line_chunks (a range [lo, hi) of a line's nonzeros, taken
// block after block along the line): one thread per (chunk, column of x), consecutive
// threads on consecutive columns of one chunk (coalesced reads of x and writes of y when k is
// large; many chunks per warp when k is small).  A thread walks its chunk's nonzeros in
// storage order (Z-Morton inside a block).  The chunk of an unsplit line is the only writer
// of its rows, so its thread adds with plain loads and stores; the chunks of a split (heavy)
// line share rows and add with atomicAdd: atomics only where a line was split.
//
// csb_sddmm: out[q] = sum_j left[r, j] * right[c, j] for every stored nonzero q at (r, c)
// (the weight gradient of a sparse layer, dY X^T sampled at the nonzeros): one thread per
// nonzero, its block found by binary search in blk_ptr.
//
// Includes only common.cuh (Num<T>, DTK_GRID_STRIDE); compiles with `nvcc -std=c++17 -c`.
// No warp intrinsics (the host build of tests/host_cuda has none).

#include "../../ops/local/gpu/kernels/common.cuh"

namespace dtk_csb {

template <typename T>
__device__ __forceinline__ void add_to(T* p, T v, bool atomic) {
    if (atomic)
        atomicAdd(p, v);
    else
        *p = *p + v;
}

}  // namespace dtk_csb

template <typename T, typename L>
__global__ void csb_spmm_lines(const long long* __restrict__ blk_ptr,
                               const L* __restrict__ out_loc, const L* __restrict__ in_loc,
                               const T* __restrict__ vals, const T* __restrict__ x,
                               T* __restrict__ y, const long long* __restrict__ c_line,
                               const long long* __restrict__ c_lo,
                               const long long* __restrict__ c_hi,
                               const long long* __restrict__ c_slot, long long nchunks,
                               long long line_mul, long long step, long long count,
                               long long beta, long long k) {
    DTK_GRID_STRIDE(w, nchunks * k) {
        const long long c = w / k;
        const long long col = w - c * k;
        const long long line = c_line[c];
        const long long lo = c_lo[c];
        const long long hi = c_hi[c];
        const bool atomic = c_slot[c] >= 0;
        const long long base = line * line_mul;
        const long long out0 = line * beta;
        // the block holding virtual position lo, and the positions before it
        long long t = 0, cum = 0;
        while (t < count) {
            const long long b = base + t * step;
            const long long size = blk_ptr[b + 1] - blk_ptr[b];
            if (cum + size > lo) break;
            cum += size;
            ++t;
        }
        long long pos = lo;
        while (pos < hi) {
            const long long b = base + t * step;
            const long long size = blk_ptr[b + 1] - blk_ptr[b];
            const long long stop = cum + size < hi ? cum + size : hi;
            const long long q0 = blk_ptr[b] + (pos - cum);
            const long long q1 = q0 + (stop - pos);
            const long long in0 = t * beta;
            for (long long q = q0; q < q1; ++q) {
                const long long r = out0 + (long long)out_loc[q];
                const long long s = in0 + (long long)in_loc[q];
                dtk_csb::add_to(&y[r * k + col], vals[q] * x[s * k + col], atomic);
            }
            pos = stop;
            cum += size;
            ++t;
        }
    }
}

template <typename T, typename L>
__global__ void csb_sddmm(const long long* __restrict__ blk_ptr, long long nblocks,
                          const L* __restrict__ lrow, const L* __restrict__ lcol,
                          const T* __restrict__ left, const T* __restrict__ right,
                          T* __restrict__ out, long long nnz, long long nbc, long long beta,
                          long long k) {
    DTK_GRID_STRIDE(q, nnz) {
        // the last block b with blk_ptr[b] <= q (empty blocks share their start)
        long long lo = 0, hi = nblocks;      // blk_ptr[lo] <= q < blk_ptr[hi]
        while (hi - lo > 1) {
            const long long mid = lo + (hi - lo) / 2;
            if (blk_ptr[mid] <= q)
                lo = mid;
            else
                hi = mid;
        }
        const long long r = (lo / nbc) * beta + (long long)lrow[q];
        const long long c = (lo % nbc) * beta + (long long)lcol[q];
        const T* a = left + r * k;
        const T* b = right + c * k;
        T acc = 0;
        for (long long j = 0; j < k; ++j) acc += a[j] * b[j];
        out[q] = acc;
    }
}
