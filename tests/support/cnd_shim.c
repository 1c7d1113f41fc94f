/* libfaketime fakes the clocks and pthread_cond_timedwait, but not glibc's C11
 * cnd_timedwait, which librdkafka waits with: its deadlines, computed on the
 * faked clock, would be off by the whole skew (waits 30 s too long, or none).
 * Preloaded before libfaketime, this routes cnd_timedwait through the
 * pthread_cond_timedwait that libfaketime does translate. Test support only. */
#include <errno.h>
#include <pthread.h>
#include <threads.h>

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex, const struct timespec *restrict ts) {
    int r = pthread_cond_timedwait((pthread_cond_t *)cond, (pthread_mutex_t *)mutex, ts);
    return r == 0 ? thrd_success : r == ETIMEDOUT ? thrd_timedout : thrd_error;
}
