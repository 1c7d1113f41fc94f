/* Test support only: what libfaketime gets wrong for the clock-skew tests, preloaded before it.
 *
 * - libfaketime fakes the clocks and pthread_cond_timedwait, but not glibc's C11
 *   cnd_timedwait, which librdkafka waits with: its deadlines, computed on the faked clock,
 *   would be off by the whole skew (waits 30 s too long, or none). Routed here through the
 *   pthread_cond_timedwait that libfaketime does translate.
 * - With FAKETIME_DONT_FAKE_MONOTONIC, libfaketime's clock_nanosleep answers EINVAL to every
 *   absolute monotonic sleep (Python's time.sleep is one): monotonic clocks are real here, so
 *   those sleeps go straight to the kernel; only CLOCK_REALTIME ones go on to libfaketime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex, const struct timespec *restrict ts) {
    int r = pthread_cond_timedwait((pthread_cond_t *)cond, (pthread_mutex_t *)mutex, ts);
    return r == 0 ? thrd_success : r == ETIMEDOUT ? thrd_timedout : thrd_error;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    if (clock != CLOCK_REALTIME) {
        /* clock_nanosleep returns the error number itself, not -1 and errno */
        return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == -1 ? errno : 0;
    }
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (next == NULL) {
        next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))dlsym(
            RTLD_NEXT, "clock_nanosleep");
    }
    return next(clock, flags, req, rem);
}
