/* imbalance.c: a rank whose main computation may be planted slow, beside small events whose times are mostly
 * the machine's noise, as a loaded node's ranks are: the test of what `outliers` finds with its defaults.
 *
 *   imbalance ITERATIONS PERIOD_US WORK FACTOR
 *
 * Each iteration runs "compute" (WORK units of arithmetic, FACTOR times as many on this rank), then sixteen small
 * events, "copy 0" to "copy 15" (a 1 KiB copy each, whose microsecond or so is mostly the machine's noise, as a
 * real code's many small calls are), "norm" once (a short sum) and "poll" once (a 1 us sleep, which the
 * kernel's timer slack stretches), dumps its profile and sleeps to the next period. Ranks start a fraction of a period apart (by CANOPY_RANK), so they share the cores rather than
 * all computing at once.
 */
#include <canopy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile double sink;

static void work(long units) {
    double x = 1.0;
    for (long i = 0; i < units * 1000; i++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

static void sleep_until(struct timespec *t, long add_us) {
    t->tv_nsec += add_us * 1000;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec++;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, t, NULL);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: imbalance ITERATIONS PERIOD_US WORK FACTOR\n");
        return 2;
    }
    int iterations = atoi(argv[1]);
    long period_us = atol(argv[2]), units = atol(argv[3]);
    double factor = atof(argv[4]);
    if (canopy_init(NULL, -1, -1) != CANOPY_OK) {
        fprintf(stderr, "imbalance: canopy_init: %s\n", canopy_last_error());
        return 1;
    }
    const char *r = getenv("CANOPY_RANK"), *n = getenv("CANOPY_NRANKS");
    long rank = r ? atol(r) : 0, nranks = n ? atol(n) : 1;
    canopy_timer *compute = canopy_timer_get("compute"), *norm = canopy_timer_get("norm"),
                 *poll = canopy_timer_get("poll"), *copy[16];
    for (int k = 0; k < 16; k++) {
        char name[16];
        snprintf(name, sizeof name, "copy %d", k);
        copy[k] = canopy_timer_get(name);
    }
    static char from[1024], to[1024];
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    sleep_until(&next, period_us + period_us * rank / (nranks > 0 ? nranks : 1));
    for (int it = 0; it < iterations; it++) {
        canopy_start(compute);
        work((long)(units * factor));
        canopy_stop(compute);
        for (int k = 0; k < 16; k++) {
            canopy_start(copy[k]);
            memcpy(to, from, sizeof to);
            from[k] ^= to[1023 - k];
            canopy_stop(copy[k]);
        }
        canopy_start(norm);
        work(5);
        canopy_stop(norm);
        canopy_start(poll);
        struct timespec tiny = {0, 1000};
        nanosleep(&tiny, NULL);
        canopy_stop(poll);
        canopy_dump();
        sleep_until(&next, period_us);
    }
    int rc = canopy_finalize();
    if (rc != CANOPY_OK) fprintf(stderr, "imbalance: canopy_finalize: %s\n", canopy_last_error());
    return 0;
}
