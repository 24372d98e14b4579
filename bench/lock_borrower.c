/* An owner thread that wants a lock a yielding thread of the same process holds now and then,
 * for bench/lock_borrower.py. Threads (named with prctl, so a profile can select them):
 *   lb-owner:  every 10 ms (absolute deadlines) takes the mutex, works 100 us, lets it go;
 *   lb-holder: takes the mutex, works 1 ms holding it, lets it go, works 4 ms without it.
 * Work is counted in the thread's own CPU time. Prints "ready" once both run; after SECONDS
 * prints one JSON line: the owner's wakeup lateness and lock waits (microseconds, sorted
 * percentiles), and how many times each thread went round. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES 100000
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t started;
static long late_us[MAX_SAMPLES], wait_us[MAX_SAMPLES];
static long owner_rounds, holder_rounds;
static volatile int running = 1;

static long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void work(long ns) {
    volatile unsigned long sink = 0;
    long until = now_ns(CLOCK_THREAD_CPUTIME_ID) + ns;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) < until)
        for (int i = 0; i < 200; i++) sink++;
}

static void *owner(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "lb-owner", 0, 0, 0);
    pthread_barrier_wait(&started);
    long next = now_ns(CLOCK_MONOTONIC);
    while (running && owner_rounds < MAX_SAMPLES) {
        next += 10000000L;
        struct timespec at = {next / 1000000000L, next % 1000000000L};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
        long woke = now_ns(CLOCK_MONOTONIC);
        pthread_mutex_lock(&lock);
        long got = now_ns(CLOCK_MONOTONIC);
        work(100000L);
        pthread_mutex_unlock(&lock);
        late_us[owner_rounds] = (woke - next) / 1000;
        wait_us[owner_rounds] = (got - woke) / 1000;
        owner_rounds++;
        if (now_ns(CLOCK_MONOTONIC) > next + 10000000L)  /* fell behind: the next deadline from now */
            next = now_ns(CLOCK_MONOTONIC);
    }
    return NULL;
}

static void *holder(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "lb-holder", 0, 0, 0);
    pthread_barrier_wait(&started);
    while (running) {
        pthread_mutex_lock(&lock);
        work(1000000L);
        pthread_mutex_unlock(&lock);
        work(4000000L);
        holder_rounds++;
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void print_percentiles(const char *name, long *values, long n) {
    qsort(values, n, sizeof *values, by_value);
    printf("\"%s\": {\"p50\": %ld, \"p90\": %ld, \"p99\": %ld, \"max\": %ld}", name,
           n ? values[n / 2] : 0, n ? values[n * 9 / 10] : 0, n ? values[n * 99 / 100] : 0, n ? values[n - 1] : 0);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s SECONDS\n", argv[0]); return 2; }
    pthread_t a, b;
    pthread_barrier_init(&started, NULL, 3);
    pthread_create(&a, NULL, owner, NULL);
    pthread_create(&b, NULL, holder, NULL);
    pthread_barrier_wait(&started);
    printf("ready\n");
    fflush(stdout);
    /* Measured from a line on stdin: the caller applies each arm's settings first. */
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    long base = owner_rounds;
    sleep((unsigned)atoi(argv[1]));
    running = 0;
    pthread_join(a, NULL);
    long n = owner_rounds - base;
    printf("{\"owner_rounds\": %ld, \"holder_rounds\": %ld, ", n, holder_rounds);
    print_percentiles("late_us", late_us + base, n);
    printf(", ");
    print_percentiles("lock_wait_us", wait_us + base, n);
    printf("}\n");
    return 0;
}
