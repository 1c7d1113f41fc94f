/*
 * One load process of `python -m bench watch`: many SSE watchers on one epoll loop.
 *
 * watch_load HOST PORT KEYS FIRST COUNT SECONDS SLOW SLOW_SPAN
 *
 * Opens COUNT watches /v1/tables/quotes/watch?key=k... (watcher i follows key
 * (FIRST + i) mod KEYS), waits for every `ready`, prints {"ready": N, "seconds": S},
 * then, on a line on stdin, measures for SECONDS: each change's value carries the
 * producer's send time "t", so now - t is the delivery latency produce -> client.
 * Prints one JSON line: the latency histogram (0.1 ms buckets below 100 ms, 1 ms
 * ones above, as bench/watch_load.py's `bucket`), events, streams the node ended.
 * The last SLOW watchers are slow consumers: a 1 KiB receive buffer, a range of
 * SLOW_SPAN keys, and nothing read after the response headers.
 *
 * Written in C because the load core must not be what delays events: a Python
 * process parsing tens of thousands of events a second over 20,000 sockets kept
 * that core saturated, and its own queueing showed up as delivery latency.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FINE_MS 100.0
#define BUCKETS (1000 + 600000) /* up to ten minutes late */
#define TAIL 64
#define INFLIGHT 256 /* connections opened but not ready at once */

enum { CONNECTING, HEADERS, LIVE, PAUSED, DONE };

struct watcher {
    int fd;
    int state;
    int slow;
    int taillen;
    char tail[TAIL];
};

static long hist[BUCKETS];
static long events, ended;
static int measuring;

static double now_s(int clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int bucket(double seconds) {
    double ms = seconds * 1000;
    long b;
    if (ms < FINE_MS) {
        b = ms < 0 ? 0 : (long)(ms * 10);
    } else {
        b = (long)(FINE_MS * 10) + (long)(ms - FINE_MS);
    }
    return b >= BUCKETS ? BUCKETS - 1 : (int)b;
}

static void die(const char *what) {
    fprintf(stderr, "watch_load: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Count the `"t":<number>,` stamps in buf[0..len); keep what may continue in the next read. */
static void scan(struct watcher *w, char *buf, int len, double now) {
    int at = 0, keep_from = len > 3 ? len - 3 : 0;
    for (;;) {
        char *i = memmem(buf + at, len - at, "\"t\":", 4);
        if (i == NULL) break;
        char *j = memchr(i + 4, ',', buf + len - (i + 4));
        if (j == NULL) {
            keep_from = (int)(i - buf);
            break;
        }
        char num[40];
        int n = (int)(j - (i + 4));
        if (n > 0 && n < (int)sizeof num) {
            memcpy(num, i + 4, n);
            num[n] = 0;
            char *end;
            double t = strtod(num, &end);
            if (end != num && measuring) {
                hist[bucket(now - t)]++;
                events++;
            }
        }
        at = (int)(j - buf);
        keep_from = len > 3 ? len - 3 : 0;
        if (keep_from < at) keep_from = at;
    }
    int tl = len - keep_from;
    if (tl > TAIL) tl = TAIL, keep_from = len - TAIL;
    memcpy(w->tail, buf + keep_from, tl);
    w->taillen = tl;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: watch_load HOST PORT KEYS FIRST COUNT SECONDS SLOW SLOW_SPAN\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), keys = atoi(argv[3]), first = atoi(argv[4]);
    int count = atoi(argv[5]), slow = atoi(argv[7]), span = atoi(argv[8]);
    double seconds = atof(argv[6]);

    struct rlimit rl;  /* one process holds every watcher: as many files as allowed */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "watch_load: not an IPv4 address: %s\n", host);
        return 2;
    }
    struct watcher *ws = calloc(count, sizeof *ws);
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)-1};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev); /* stdin: the driver's "go" */

    static char buf[65536 + TAIL];
    struct epoll_event got[1024];
    int opened = 0, ready = 0, pending = 0;
    double started = now_s(CLOCK_MONOTONIC), stop_at = 0;
    int go = 0;
    for (;;) {
        while (opened < count && pending < INFLIGHT) {
            struct watcher *w = &ws[opened];
            w->slow = opened >= count - slow;
            w->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (w->fd < 0) die("socket");
            if (w->slow) {
                int small = 1024;
                setsockopt(w->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
            }
            if (connect(w->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS)
                die("connect");
            w->state = CONNECTING;
            ev.events = EPOLLOUT | EPOLLIN;
            ev.data.u64 = opened;
            epoll_ctl(ep, EPOLL_CTL_ADD, w->fd, &ev);
            opened++, pending++;
        }
        int timeout = -1;
        if (go) {
            double left = stop_at - now_s(CLOCK_MONOTONIC);
            if (left <= 0) break;
            timeout = (int)(left * 1000) + 1;
        }
        int n = epoll_wait(ep, got, 1024, timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        double now = now_s(CLOCK_REALTIME);
        for (int k = 0; k < n; k++) {
            if (got[k].data.u64 == (uint64_t)-1) {
                char line[64];
                if (read(0, line, sizeof line) <= 0 && !go) return 1; /* the driver left */
                if (!go) {
                    go = 1, measuring = 1;
                    stop_at = now_s(CLOCK_MONOTONIC) + seconds;
                }
                epoll_ctl(ep, EPOLL_CTL_DEL, 0, NULL);
                continue;
            }
            struct watcher *w = &ws[got[k].data.u64];
            if (w->state == CONNECTING) {
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err) {
                    errno = err;
                    die("connect");
                }
                int i = (int)got[k].data.u64, len;
                char req[256];
                if (w->slow) {
                    int start = (first + i) % (keys - span > 1 ? keys - span : 1);
                    len = snprintf(req, sizeof req,
                                   "GET /v1/tables/quotes/watch?from=k%07d&to=k%07d HTTP/1.1\r\n"
                                   "host: bench\r\naccept: text/event-stream\r\n\r\n",
                                   start, start + span);
                } else {
                    len = snprintf(req, sizeof req,
                                   "GET /v1/tables/quotes/watch?key=k%07d HTTP/1.1\r\n"
                                   "host: bench\r\naccept: text/event-stream\r\n\r\n",
                                   (first + i) % keys);
                }
                if (write(w->fd, req, len) != len) die("write");
                w->state = HEADERS;
                ev.events = EPOLLIN;
                ev.data.u64 = got[k].data.u64;
                epoll_ctl(ep, EPOLL_CTL_MOD, w->fd, &ev);
                continue;
            }
            memcpy(buf, w->tail, w->taillen);
            ssize_t r = read(w->fd, buf + w->taillen, sizeof buf - TAIL);
            if (r <= 0) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                if (w->state == HEADERS) {
                    fprintf(stderr, "watch_load: closed before ready\n");
                    return 1;
                }
                if (measuring) ended++;
                epoll_ctl(ep, EPOLL_CTL_DEL, w->fd, NULL);
                close(w->fd);
                w->state = DONE;
                continue;
            }
            int len = w->taillen + (int)r;
            if (w->state == HEADERS) {
                if (len >= 12 && memcmp(buf, "HTTP/1.1", 8) == 0 && memcmp(buf, "HTTP/1.1 200", 12) != 0) {
                    fprintf(stderr, "watch_load: %.*s\n", len < 200 ? len : 200, buf);
                    return 1;
                }
                int done = w->slow ? memmem(buf, len, "\r\n\r\n", 4) != NULL
                                   : memmem(buf, len, "event: ready", 12) != NULL;
                if (done) {
                    ready++, pending--;
                    w->taillen = 0;
                    if (w->slow) { /* a consumer that stops reading */
                        epoll_ctl(ep, EPOLL_CTL_DEL, w->fd, NULL);
                        w->state = PAUSED;
                    } else {
                        w->state = LIVE;
                    }
                    if (ready == count) {
                        printf("{\"ready\": %d, \"seconds\": %.3f}\n", ready,
                               now_s(CLOCK_MONOTONIC) - started);
                        fflush(stdout);
                    }
                } else { /* keep the end: "event: ready" may be split over two reads */
                    int tl = len < TAIL ? len : TAIL;
                    memmove(w->tail, buf + len - tl, tl);
                    w->taillen = tl;
                }
                continue;
            }
            scan(w, buf, len, now);
        }
    }
    printf("{\"hist\": {");
    int sep = 0;
    for (int b = 0; b < BUCKETS; b++) {
        if (hist[b]) {
            printf("%s\"%d\": %ld", sep ? ", " : "", b, hist[b]);
            sep = 1;
        }
    }
    printf("}, \"events\": %ld, \"ended\": %ld, \"open\": %d}\n", events, ended, ready);
    fflush(stdout);
    return 0;
}
