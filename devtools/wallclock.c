/* A process whose wall clock is off (bench/scale's hosts, tests' workers): preloaded (LD_PRELOAD), it adds
 * RJS_WALL_CLOCK_OFFSET seconds (a decimal, may be negative) to CLOCK_REALTIME as
 * clock_gettime, gettimeofday and time report it, and takes them off again from an absolute
 * CLOCK_REALTIME sleep (clock_nanosleep with TIMER_ABSTIME). CLOCK_MONOTONIC and every other
 * clock are left alone, as on a real machine whose clock is wrong.
 *
 * Why not libfaketime: 0.9.10 fakes CLOCK_MONOTONIC too, and Python 3.11's timed lock waits
 * (sem_clockwait on CLOCK_MONOTONIC, which it does not intercept) then never time out; told to
 * leave CLOCK_MONOTONIC alone (FAKETIME_DONT_FAKE_MONOTONIC=1), it fails every time.sleep
 * with EINVAL.
 *
 * Not covered: absolute CLOCK_REALTIME deadlines given to sem_timedwait,
 * pthread_cond_timedwait or pthread_mutex_timedlock (Python 3.11 on glibc 2.30 or newer waits
 * on CLOCK_MONOTONIC), and programs that read the vDSO without going through libc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

#define NS_PER_S 1000000000LL

static long long offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);

static void load(void) {
    if (real_clock_gettime)
        return;
    const char *text = getenv("RJS_WALL_CLOCK_OFFSET");
    offset_ns = text ? (long long)(strtod(text, NULL) * NS_PER_S) : 0;
    real_clock_nanosleep = dlsym(RTLD_NEXT, "clock_nanosleep");
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
}

__attribute__((constructor)) static void init(void) { load(); }

static int is_wall(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

static void shift(struct timespec *ts, long long by) {
    long long ns = (long long)ts->tv_sec * NS_PER_S + ts->tv_nsec + by;
    ts->tv_sec = ns / NS_PER_S;
    ts->tv_nsec = ns % NS_PER_S;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += NS_PER_S;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    load();
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && is_wall(clock))
        shift(ts, offset_ns);
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) { /* tv: nonnull in glibc's declaration */
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request,
                    struct timespec *remain) {
    load();
    if ((flags & TIMER_ABSTIME) && is_wall(clock) && request) {
        struct timespec real = *request;
        shift(&real, -offset_ns);
        return real_clock_nanosleep(clock, flags, &real, remain);
    }
    return real_clock_nanosleep(clock, flags, request, remain);
}
