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
 * The spin budget: where ranks do not outnumber cores (a 2-rank benchmark on 2 cores), a wait
 * for a partner that is a few hundred microseconds late should not end in a ~55 us sleep: every
 * such rendezvous would cost a timer wake-up.  With DISTTENSOR_MPI_IDLE_SPIN_NS > 0 an idle
 * streak polls at once, as plain MPICH does, until it has lasted that long, and only then
 * yields and sleeps as above; a rank that waits longer spends at most that much CPU per wait.
 * (Yielding within the budget was measured slower on a machine loaded by other jobs: each
 * yield hands the core to them, and the partner's message waits for the next time slice.)
 * 0 (the default) is the behaviour without a budget: sleep after DISTTENSOR_MPI_IDLE_YIELDS
 * idle polls.  The benchmarks that time 2-rank steps on 2 cores set it (bench/README.md); the
 * test suite does not (oversubscribed: a polling rank would take turns from the rank it waits
 * for).
 *
 * Environment (read once, at the first progress call: set it before MPI starts):
 *   DISTTENSOR_MPI_IDLE_YIELDS    idle polls answered with sched_yield() before sleeping (16)
 *   DISTTENSOR_MPI_IDLE_SLEEP_NS  nanoseconds to ask nanosleep for after that (1000)
 *   DISTTENSOR_MPI_IDLE_SPIN_NS   nanoseconds an idle streak polls before it yields and
 *                                 sleeps (0: no budget, the yield count alone decides)
 *
 * Build: cc -O2 -shared -fPIC -o build/libmpi_idle_sleep.so scripts/mpi_idle_sleep.c -ldl
 * Use:   mpiexec -genv LD_PRELOAD $PWD/build/libmpi_idle_sleep.so -n 4 python ...
 * (scripts/test.sh does both.)  For test runs; benchmarks that time 2-rank steps on 2 cores
 * run it with a spin budget (see above).
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
static long spin_ns = 0;
static __thread unsigned long idle;
static __thread struct timespec last;
static __thread struct timespec streak; /* when the current idle streak began */

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
    s = getenv("DISTTENSOR_MPI_IDLE_SPIN_NS");
    if (s && *s)
        spin_ns = atol(s);
    if (spin_ns < 0)
        spin_ns = 0;
}

static long elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
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
    long gap = elapsed_ns(&last, &now);
    last = now;
    if (n != 0 || gap > 200000L) /* progress, or the first poll of a new wait */
        idle = 0;
    if (n == 0) {
        if (idle++ == 0)
            streak = now;
        if (spin_ns > 0 && elapsed_ns(&streak, &now) < spin_ns) {
            /* within the spin budget: poll again at once, as MPICH does without the shim */
        } else if (idle <= (unsigned long)idle_yields || sleep_ns == 0) {
            sched_yield();
        } else {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
        }
    }
    return n;
}
