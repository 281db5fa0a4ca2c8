/*
 * loadtest/fanout-floor/floor.c: the floor under a pass's fan-out on this
 * machine. Nothing but what the fan-out cannot avoid: one small write to
 * each of N loopback TCP connections, read in another process.
 *
 * The parent (the "server") listens on 127.0.0.1, forks the child (the
 * "crowd"), which opens N connections and reads them with READERS epoll
 * threads. Each round the parent stamps the wall clock (t0) and WRITERS
 * threads write one MSG-byte frame carrying t0 to every connection; the
 * child stamps each frame as its last byte arrives and, once it has all N,
 * prints the round's p50 / p99 / max of (arrival - t0), as the SSE
 * generator measures a pass's frames against the pass's time. Both
 * processes share the machine's cores, as waitroom and its generator do.
 *
 * usage: floor N WRITERS READERS ROUNDS   (e.g. floor 15000 2 2 8)
 * Every wait is bounded: a round that does not complete in 30 s ends the
 * run with an error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 200
#define ROUND_LIMIT_MS 30000

static int n_conns, n_writers, n_readers, n_rounds;
static int *fds;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void nodelay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
}

/* Waits up to ROUND_LIMIT_MS for one byte on fd; exits on timeout. */
static char await_byte(int fd, const char *what) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ROUND_LIMIT_MS);
    if (r <= 0) {
        fprintf(stderr, "floor: no %s within %d ms\n", what, ROUND_LIMIT_MS);
        exit(1);
    }
    char c;
    if (read(fd, &c, 1) != 1) die(what);
    return c;
}

/* ---- the crowd (child) ---- */

static char (*bufs)[MSG];
static int *filled;
static double *lat;
static atomic_int got;
static atomic_int stop_readers;
static int done_pipe[2];

static void *reader(void *arg) {
    int k = (int)(long)arg;
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    for (int i = k; i < n_conns; i += n_readers) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) < 0) die("epoll_ctl");
    }
    struct epoll_event evs[512];
    while (!atomic_load(&stop_readers)) {
        int n = epoll_wait(ep, evs, 512, 100);
        for (int e = 0; e < n; e++) {
            int i = (int)evs[e].data.u32;
            for (;;) {
                ssize_t r = read(fds[i], bufs[i] + filled[i], MSG - filled[i]);
                if (r <= 0) break;
                filled[i] += (int)r;
                if (filled[i] < MSG) continue;
                filled[i] = 0;
                double t0;
                memcpy(&t0, bufs[i], sizeof t0);
                int at = atomic_fetch_add(&got, 1);
                lat[at] = now_ms() - t0;
                if (at + 1 == n_conns && write(done_pipe[1], "d", 1) != 1) die("done pipe");
            }
        }
    }
    close(ep);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void crowd(int port, int ctrl) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < n_conns; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) die("socket");
        if (connect(fd, (struct sockaddr *)&to, sizeof to) < 0) die("connect");
        nodelay(fd);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fds[i] = fd;
    }
    bufs = calloc(n_conns, MSG);
    filled = calloc(n_conns, sizeof *filled);
    lat = calloc(n_conns, sizeof *lat);
    if (!bufs || !filled || !lat) die("calloc");
    if (pipe(done_pipe) < 0) die("pipe");
    pthread_t *threads = calloc(n_readers, sizeof *threads);
    for (long k = 0; k < n_readers; k++) pthread_create(&threads[k], NULL, reader, (void *)k);
    if (write(ctrl, "r", 1) != 1) die("ctrl");
    for (int round = 1; round <= n_rounds; round++) {
        await_byte(done_pipe[0], "complete round");
        qsort(lat, n_conns, sizeof *lat, cmp_double);
        printf("round %d: %d frames, p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", round, n_conns,
               lat[n_conns / 2], lat[(int)(n_conns * 0.99)], lat[n_conns - 1]);
        fflush(stdout);
        atomic_store(&got, 0);
        if (write(ctrl, "d", 1) != 1) die("ctrl");
    }
    atomic_store(&stop_readers, 1);
    for (int k = 0; k < n_readers; k++) pthread_join(threads[k], NULL);
    exit(0);
}

/* ---- the server (parent) ---- */

static double round_t0;

static void *writer(void *arg) {
    int k = (int)(long)arg;
    char msg[MSG];
    memset(msg, 'x', sizeof msg);
    memcpy(msg, &round_t0, sizeof round_t0);
    for (int i = k; i < n_conns; i += n_writers) {
        if (write(fds[i], msg, MSG) != MSG) die("write");
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: floor N WRITERS READERS ROUNDS\n");
        return 2;
    }
    n_conns = atoi(argv[1]);
    n_writers = atoi(argv[2]);
    n_readers = atoi(argv[3]);
    n_rounds = atoi(argv[4]);
    if (n_conns < 1 || n_writers < 1 || n_readers < 1 || n_rounds < 1) {
        fprintf(stderr, "floor: every argument must be at least 1\n");
        return 2;
    }
    fds = calloc(n_conns, sizeof *fds);
    if (!fds) die("calloc");

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) die("socket");
    struct sockaddr_in at = {.sin_family = AF_INET};
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof at;
    if (bind(listener, (struct sockaddr *)&at, sizeof at) < 0) die("bind");
    if (listen(listener, 4096) < 0) die("listen");
    if (getsockname(listener, (struct sockaddr *)&at, &len) < 0) die("getsockname");

    int ctrl[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ctrl) < 0) die("socketpair");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        close(listener);
        close(ctrl[0]);
        crowd(ntohs(at.sin_port), ctrl[1]);
    }
    close(ctrl[1]);
    for (int i = 0; i < n_conns; i++) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) die("accept");
        nodelay(fd);
        fds[i] = fd;
    }
    await_byte(ctrl[0], "crowd ready");
    pthread_t *threads = calloc(n_writers, sizeof *threads);
    for (int round = 1; round <= n_rounds; round++) {
        sleep(1);
        round_t0 = now_ms();
        for (long k = 0; k < n_writers; k++) pthread_create(&threads[k], NULL, writer, (void *)k);
        for (int k = 0; k < n_writers; k++) pthread_join(threads[k], NULL);
        fprintf(stderr, "round %d: written in %.1f ms\n", round, now_ms() - round_t0);
        await_byte(ctrl[0], "round's report");
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
