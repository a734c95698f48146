// Kernels that exercise tests/host_cuda/cuda_host.h itself (test_cuda_host_header.py): shared
// memory and __syncthreads across the real threads of a block, atomicAdd, 2-D/3-D grids and
// blocks.  Host-only (never given to NVRTC).

// out[b] = sum of block b's values (tree in shared memory); *total += each value and *count += 1
// per element through atomics.
template <typename T>
__global__ void block_sum(const T* __restrict__ x, long long n, T* __restrict__ out,
                          T* total, int* count) {
    __shared__ T sh[256];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const T v = i < n ? x[i] : T(0);
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
    if (i < n) {
        atomicAdd(total, v);
        atomicAdd(count, 1);
    }
}

// Each block reverses its blockDim.x elements through shared memory (every read of sh comes
// after every thread's write: the barrier is what makes it right).
__global__ void block_reverse(const double* __restrict__ x, double* __restrict__ y) {
    __shared__ double sh[1024];
    const long long base = (long long)blockIdx.x * blockDim.x;
    sh[threadIdx.x] = x[base + threadIdx.x];
    __syncthreads();
    y[base + threadIdx.x] = sh[blockDim.x - 1 - threadIdx.x];
}

// out[flat thread id] = the thread's blockIdx, threadIdx, gridDim and blockDim.x packed in one
// long long, 6 bits per coordinate.
__global__ void coordinates(long long* __restrict__ out) {
    const long long b = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const long long t = ((long long)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x +
                        threadIdx.x;
    const long long nt = (long long)blockDim.x * blockDim.y * blockDim.z;
    long long v = 0;
    const unsigned parts[10] = {blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                                threadIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x};
    for (int k = 0; k < 10; ++k) v = v * 64 + parts[k];
    out[b * nt + t] = v;
}

template __global__ void block_sum<float>(const float*, long long, float*, float*, int*);
template __global__ void block_sum<double>(const double*, long long, double*, double*, int*);
template __global__ void block_sum<int>(const int*, long long, int*, int*, int*);

// A divergent __syncthreads: only the even threads of a block wait (undefined behaviour on a
// GPU); the host launch must fail, not hang.
__global__ void divergent_sync(int* __restrict__ out) {
    if (threadIdx.x % 2 == 0) __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}
