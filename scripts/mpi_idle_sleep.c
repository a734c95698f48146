/* LD_PRELOAD shim: make MPICH (ch4:ucx) stop busy-polling when it has nothing to do.
 *
 * Why: Debian's MPICH 4.0 is built as ch4:ucx.  Its progress loop (MPI_Wait, collectives)
 * spins without ever yielding the CPU (strace shows no sched_yield at all), and no CVAR changes
 * that: MPIR_CVAR_POLLS_BEFORE_YIELD exists only in ch3:nemesis.  With more ranks than cores
 * (the test suite runs 4 ranks on 2 cores) a waiting rank burns the time slice the rank it
 * waits for needs, so every message costs a scheduler time slice: an 8-byte MPI_Allreduce at
 * -n 4 took 10-20 ms instead of tens of microseconds (see scripts/test.sh for the numbers).
 *
 * How: every turn of MPICH's progress loop calls ucp_worker_progress() (UCX netmod progress,
 * even when the message itself moves through MPICH's shared-memory path).  This wrapper calls
 * the real function and, when it reports no UCX progress, yields the CPU a few times and then
 * sleeps briefly (nanosleep; the kernel's default timer slack makes that ~50-60 us).  The
 * idle count restarts when UCX made progress or when the previous call was long ago (the rank
 * did other work in between, i.e. this is a new wait).  Latency goes up by at most one short
 * sleep per wait; a waiting rank then uses almost no CPU.
 *
 * Environment (read once):
 *   DISTTENSOR_MPI_IDLE_YIELDS    idle polls answered with sched_yield() before sleeping (16)
 *   DISTTENSOR_MPI_IDLE_SLEEP_NS  nanoseconds to ask nanosleep for after that (1000)
 *
 * Build: cc -O2 -shared -fPIC -o build/libmpi_idle_sleep.so scripts/mpi_idle_sleep.c -ldl
 * Use:   mpiexec -genv LD_PRELOAD $PWD/build/libmpi_idle_sleep.so -n 4 python ...
 * (scripts/test.sh does both.)  For test runs only, not for benchmarks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

typedef unsigned (*progress_fn)(void *worker);

static progress_fn real_progress;
static long idle_yields = 16;
static long sleep_ns = 1000;
static __thread unsigned long idle;
static __thread struct timespec last;

static void init(void)
{
    /* libucp comes in as a dependency of libmpich, which Python loads with RTLD_LOCAL, so
     * RTLD_NEXT cannot see it: look it up through the already loaded library instead. */
    void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (h)
        real_progress = (progress_fn)dlsym(h, "ucp_worker_progress");
    if (!real_progress)
        real_progress = (progress_fn)dlsym(RTLD_NEXT, "ucp_worker_progress");
    const char *s = getenv("DISTTENSOR_MPI_IDLE_YIELDS");
    if (s && *s)
        idle_yields = atol(s);
    s = getenv("DISTTENSOR_MPI_IDLE_SLEEP_NS");
    if (s && *s)
        sleep_ns = atol(s);
    if (sleep_ns < 0 || sleep_ns > 999999999L)
        sleep_ns = 1000;
}

unsigned ucp_worker_progress(void *worker)
{
    if (!real_progress) {
        init();
        if (!real_progress)
            return 0;
    }
    unsigned n = real_progress(worker);

    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long gap = (now.tv_sec - last.tv_sec) * 1000000000L + (now.tv_nsec - last.tv_nsec);
    last = now;
    if (n != 0 || gap > 200000L) /* progress, or the first poll of a new wait */
        idle = 0;
    if (n == 0) {
        if (++idle <= (unsigned long)idle_yields || sleep_ns == 0) {
            sched_yield();
        } else {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
    return n;
}
