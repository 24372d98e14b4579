/* Threads with a fixed amount of CPU work per period, for the rightsizing tests: each argument is
 * one thread, NAME=BUSY/PERIOD in milliseconds ("light=10/100": 10 ms of CPU in every 100 ms;
 * "hot=100/100" spins). Each period starts at a fixed deadline (clock_nanosleep TIMER_ABSTIME), so
 * on a crowded host a thread that falls behind runs its work back to back without sleeping: what
 * it needs stays BUSY/PERIOD of a CPU while it looks, from its run and wait times alone, like a
 * spinner. The work is counted in the thread's own CPU time; the threads share no lock.
 * Prints "ready" once every thread runs; runs until killed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

struct spec { char name[16]; long busy_ns, period_ns; };
static pthread_barrier_t started;

static long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void *duty(void *arg) {
    struct spec *s = arg;
    prctl(PR_SET_NAME, s->name, 0, 0, 0);
    pthread_barrier_wait(&started);
    volatile unsigned long sink = 0;
    if (s->busy_ns >= s->period_ns)
        for (;;) sink++;
    long next = now_ns(CLOCK_MONOTONIC);
    for (;;) {
        long until = now_ns(CLOCK_THREAD_CPUTIME_ID) + s->busy_ns;
        while (now_ns(CLOCK_THREAD_CPUTIME_ID) < until)
            for (int i = 0; i < 1000; i++) sink++;
        next += s->period_ns;
        struct timespec at = {next / 1000000000L, next % 1000000000L};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_barrier_init(&started, NULL, argc);
    for (int i = 1; i < argc; i++) {
        struct spec *s = calloc(1, sizeof *s);
        char *eq = strchr(argv[i], '='), *slash = eq ? strchr(eq, '/') : NULL;
        if (!eq || !slash) { fprintf(stderr, "%s: expected NAME=BUSY/PERIOD\n", argv[i]); return 2; }
        snprintf(s->name, sizeof s->name, "%.*s", (int)(eq - argv[i]), argv[i]);
        s->busy_ns = atol(eq + 1) * 1000000L;
        s->period_ns = atol(slash + 1) * 1000000L;
        pthread_t t;
        pthread_create(&t, NULL, duty, s);
    }
    pthread_barrier_wait(&started);
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
