// cuda_host.h: just enough of CUDA's device-side language to run disttensor's RawKernels
// (disttensor/ops/local/gpu/kernels/*.cu) on the host, for the tests of tests/host_cuda/.
// Force-included (g++ -include cuda_host.h) ahead of a kernel file; the kernel sources are not
// edited for it.
//
// Execution model (hostcuda::run_grid):
//  * blocks run one after another, in order blockIdx = (0,0,0), (1,0,0), ... (x fastest);
//  * the threads of a block are real threads (std::thread, one per threadIdx, kept in a pool
//    from launch to launch); __syncthreads() is a barrier over them (BlockBarrier: a
//    divergent __syncthreads fails the launch instead of hanging), and every block ends with
//    one more barrier, so block b+1 starts after all of block b has finished;
//  * threadIdx/blockIdx/blockDim/gridDim are thread_local;
//  * a kernel's `__shared__ T a[n]` is a `static` variable: one copy for the whole process,
//    which is exactly per-block shared memory because one block runs at a time and launches
//    are serialized (a mutex);
//  * no warp: the warp intrinsics are left undefined (the kernels use none; a kernel that
//    does fails to compile here);
//  * __half is a 16-bit IEEE binary16 with round-to-nearest-even conversions written here;
//  * atomicAdd on int/unsigned/long long/float/double through std::atomic_ref.
// Launches come from the extern "C" trampolines that tests/host_cuda/host_build.py appends to the
// kernel file: hostcuda::launch(kernel pointer, grid, block, void** args), args as
// cuLaunchKernel's kernelParams (args[i] points at the value of parameter i).
#ifndef DISTTENSOR_CUDA_HOST_H
#define DISTTENSOR_CUDA_HOST_H

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <latch>
#include <math.h>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static
#define __constant__ static const
// __restrict__ is a g++ keyword already.

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1)
        : x(a), y(b), z(c) {}
};

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};

namespace hostcuda {

// The size below which the kernels take their 32-bit index path (common.cuh's
// DTK_INDEX32_LIMIT; the host build defines that macro as this variable, which the tests set
// to 0 to run the 64-bit path on small sizes).  Defined by the generated trampolines.
extern long long index32_limit;

// What a thread's barrier wait throws once the threads of a block were found at different
// barriers (run_grid then reports the launch as failed instead of hanging).
struct DivergentBarrier {};

// The barrier of a block's threads.  Each arrival says where it comes from (a __syncthreads
// or the end of the block); a phase that mixes the two is a divergent __syncthreads
// (undefined behaviour on a GPU, typically a hang): the barrier is then poisoned and every
// wait on it, now or later, throws DivergentBarrier.
class BlockBarrier {
  public:
    enum Kind { SYNC = 1, BLOCK_END = 2 };
    explicit BlockBarrier(long long n) : n_(n) {}
    void arrive_and_wait(Kind kind) {
        if (poisoned_.load()) throw DivergentBarrier{};
        const unsigned long long gen = gen_.load();  // read before arriving
        kinds_.fetch_or(kind);
        if (arrived_.fetch_add(1) + 1 == n_) {  // the last of this phase
            const bool mixed = kinds_.exchange(0) == (SYNC | BLOCK_END);
            arrived_.store(0);
            if (mixed) poisoned_.store(true);
            gen_.fetch_add(1);
            gen_.notify_all();
            if (mixed) throw DivergentBarrier{};
            return;
        }
        gen_.wait(gen);  // until the phase's last arrival moves the generation on
        if (poisoned_.load()) throw DivergentBarrier{};
    }

  private:
    const long long n_;
    std::atomic<long long> arrived_{0};
    std::atomic<int> kinds_{0};
    std::atomic<unsigned long long> gen_{0};
    std::atomic<bool> poisoned_{false};
};

inline thread_local BlockBarrier* block_barrier = nullptr;

template <typename To, typename From>
inline To bits_as(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}

// binary16 <-> binary32, round to nearest even, subnormals, inf and NaN included.
inline float half_bits_to_float(std::uint16_t h) {
    const std::uint32_t sign = (std::uint32_t)(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_as<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN
    if (exp != 0) return bits_as<float>(sign | ((exp + 112u) << 23) | (man << 13));
    // zero or subnormal: man * 2^-24, exact in float
    const float mag = (float)man * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
}

inline std::uint16_t float_to_half_bits(float f) {
    const std::uint32_t x = bits_as<std::uint32_t>(f);
    const std::uint16_t sign = (std::uint16_t)((x >> 16) & 0x8000u);
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | (std::uint16_t)((ax >> 13) & 0x3ffu);  // NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (rounds past the max) and inf
    if (ax >= 0x38800000u) {  // normal half: exponent >= -14
        const std::uint32_t mant = ax & 0x7fffffu;
        std::uint32_t h = ((ax >> 23) - 112u) << 10 | (mant >> 13);
        const std::uint32_t rest = mant & 0x1fffu;  // the 13 bits dropped
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent
        return sign | (std::uint16_t)h;
    }
    if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself: tie -> 0)
    // subnormal half: value = m * 2^-24, m = round(ax_value * 2^24)
    const std::uint32_t e = ax >> 23;                  // biased float exponent, 102..112
    const std::uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;              // 14..24 bits dropped
    std::uint32_t m = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (m & 1u))) ++m;
    return sign | (std::uint16_t)m;
}

}  // namespace hostcuda

struct __half {
    std::uint16_t bits;
};
static_assert(sizeof(__half) == 2);
inline float __half2float(__half h) { return hostcuda::half_bits_to_float(h.bits); }
inline __half __float2half(float f) { return __half{hostcuda::float_to_half_bits(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }

inline float __int_as_float(int v) { return hostcuda::bits_as<float>(v); }
inline int __float_as_int(float v) { return hostcuda::bits_as<int>(v); }
inline double __longlong_as_double(long long v) { return hostcuda::bits_as<double>(v); }
inline long long __double_as_longlong(double v) { return hostcuda::bits_as<long long>(v); }

template <typename T>
inline T __ldg(const T* p) { return *p; }

inline void __syncthreads() {
    hostcuda::block_barrier->arrive_and_wait(hostcuda::BlockBarrier::SYNC);
}

template <typename T>
inline T hostcuda_atomic_add(T* p, T v) {
    return std::atomic_ref<T>(*p).fetch_add(v);
}
inline int atomicAdd(int* p, int v) { return hostcuda_atomic_add(p, v); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    return hostcuda_atomic_add(p, v);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return hostcuda_atomic_add(p, v);
}
inline float atomicAdd(float* p, float v) { return hostcuda_atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return hostcuda_atomic_add(p, v); }

namespace hostcuda {

// The threads that run the threads of a block: created on first need and kept for the rest
// of the process (creating 256 threads per launch costs more than most test launches).  The
// launching thread is thread 0 of every block; worker w (1, 2, ...) is thread w.
class ThreadPool {
  public:
    // Run job(t) on threads t = 0 .. n-1 at once (t = 0 on the caller); returns when all
    // are done.
    template <typename Job>
    void run(long long n, Job& job) {
        grow(n - 1);
        std::latch done((std::ptrdiff_t)(n - 1));
        {
            std::lock_guard<std::mutex> lock(mutex_);
            task_ = [&job](long long t) { job(t); };
            active_ = n;
            done_ = &done;
            ++generation_;
        }
        wake_.notify_all();
        job(0);
        done.wait();
    }

  private:
    void grow(long long want) {
        while ((long long)workers_ < want) {
            const long long w = (long long)++workers_;
            std::thread([this, w] { loop(w); }).detach();
        }
    }
    void loop(long long w) {
        unsigned long long seen = 0;
        for (;;) {
            std::function<void(long long)> task;
            std::latch* done;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return generation_ != seen && w < active_; });
                seen = generation_;
                task = task_;
                done = done_;
            }
            task(w);
            done->count_down();
        }
    }
    std::mutex mutex_;
    std::condition_variable wake_;
    std::function<void(long long)> task_;
    std::latch* done_ = nullptr;
    long long active_ = 0;
    unsigned long long generation_ = 0;
    std::size_t workers_ = 0;
};

inline ThreadPool& pool() {
    static ThreadPool* p = new ThreadPool;  // never destroyed: its threads outlive main
    return *p;
}

// Run `body` (the kernel call of one thread) over the grid, blocks one after another, the
// threads of a block as real threads.  Returns 0, or -1 when the threads of a block met at
// different barriers (a divergent __syncthreads; see BlockBarrier).
template <typename Body>
int run_grid(dim3 grid, dim3 block, Body body) {
    static std::mutex one_launch_at_a_time;
    std::lock_guard<std::mutex> lock(one_launch_at_a_time);
    const long long nthreads = (long long)block.x * block.y * block.z;
    const long long nblocks = (long long)grid.x * grid.y * grid.z;
    if (nthreads <= 0 || nblocks <= 0) return 0;
    BlockBarrier bar(nthreads);
    std::atomic<bool> divergent{false};
    auto worker = [&](long long t) {
        threadIdx = uint3{(unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                          (unsigned)(t / block.x / block.y)};
        blockDim = block;
        gridDim = grid;
        block_barrier = &bar;
        try {
            for (long long b = 0; b < nblocks; ++b) {
                blockIdx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                                 (unsigned)(b / grid.x / grid.y)};
                body();
                bar.arrive_and_wait(BlockBarrier::BLOCK_END);  // the block is done
            }
        } catch (const DivergentBarrier&) {
            divergent = true;
        }
        block_barrier = nullptr;
    };
    pool().run(nthreads, worker);
    return divergent ? -1 : 0;
}

// One kernel parameter type as a code for the Python side's argument check:
// "p:<code of the element>" for pointers ("cp:" to const); f32 f64 f16 i32 i64 u32 u64 for
// scalars (u8 u16 too: the in-block indices of the CSB kernels).
template <typename T> struct code { static constexpr const char* s = "?"; };
template <> struct code<float> { static constexpr const char* s = "f32"; };
template <> struct code<double> { static constexpr const char* s = "f64"; };
template <> struct code<__half> { static constexpr const char* s = "f16"; };
template <> struct code<int> { static constexpr const char* s = "i32"; };
template <> struct code<long long> { static constexpr const char* s = "i64"; };
template <> struct code<unsigned int> { static constexpr const char* s = "u32"; };
template <> struct code<unsigned long long> { static constexpr const char* s = "u64"; };
template <> struct code<unsigned char> { static constexpr const char* s = "u8"; };
template <> struct code<unsigned short> { static constexpr const char* s = "u16"; };

template <typename T>
std::string param_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        using E = std::remove_pointer_t<U>;
        return std::string(std::is_const_v<E> ? "cp:" : "p:") + code<std::remove_cv_t<E>>::s;
    }
    else
        return code<U>::s;
}

// "code,code,..." of kernel `f`'s parameters.
template <typename... A>
std::string signature(void (*)(A...)) {
    std::string s;
    ((s += (s.empty() ? "" : ","), s += param_code<A>()), ...);
    return s;
}

template <typename... A, std::size_t... I>
inline void call_packed(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

// cuLaunchKernel's convention: args[i] points at parameter i's value.
template <typename... A>
int launch(void (*f)(A...), unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
           unsigned bz, void** args) {
    return run_grid(dim3(gx, gy, gz), dim3(bx, by, bz),
                    [&] { call_packed(f, args, std::index_sequence_for<A...>{}); });
}

}  // namespace hostcuda

#endif  // DISTTENSOR_CUDA_HOST_H
