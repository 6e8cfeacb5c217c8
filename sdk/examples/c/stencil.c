/* stencil.c: a 2-D Jacobi stencil, one process per rank, instrumented with Canopy's C SDK.
 *
 * Each iteration exchanges its halo (copies the boundary rows, as a message would), sweeps the grid and
 * computes the residual, each under its own timer inside "iteration", counts the bytes it exchanged, and
 * dumps its profile. Run it under any launcher (mpirun, srun) or alone; the rank comes from the launcher's
 * environment. Built with -DCANOPY_DISABLE it has no instrumentation at all, for comparison.
 *
 *   stencil [ITERATIONS [N [SLEEP_US]]]     defaults: 100 iterations, N = 256, no sleep
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef CANOPY_DISABLE
#include <canopy.h>
#define TIMER(var, name) canopy_timer *var = canopy_timer_get(name)
#define START(t) canopy_start(t)
#define STOP(t) canopy_stop(t)
#define COUNT(name, v) canopy_counter(name, v)
#else
#define TIMER(var, name)
#define START(t)
#define STOP(t)
#define COUNT(name, v)
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 100;
    int n = argc > 2 ? atoi(argv[2]) : 256;
    long sleep_us = argc > 3 ? atol(argv[3]) : 0;
    if (iterations < 0 || n < 4 || sleep_us < 0) {
        fprintf(stderr, "usage: stencil [ITERATIONS [N (>= 4) [SLEEP_US]]]\n");
        return 2;
    }
#ifndef CANOPY_DISABLE
    /* NULL: the application's name is CANOPY_APP's, else the program's (stencil). */
    if (canopy_init(NULL, -1, -1) != CANOPY_OK)
        fprintf(stderr, "stencil: canopy_init: %s (running without monitoring)\n", canopy_last_error());
#endif
    TIMER(t_iter, "iteration");
    TIMER(t_halo, "halo_exchange");
    TIMER(t_sweep, "sweep");
    TIMER(t_resid, "residual");

    double *a = calloc((size_t)n * n, sizeof *a), *b = calloc((size_t)n * n, sizeof *b);
    double *halo = malloc(2 * (size_t)n * sizeof *halo);
    if (!a || !b || !halo) {
        fprintf(stderr, "stencil: out of memory\n");
        return 1;
    }
    for (int j = 0; j < n; j++) a[j] = b[j] = 1.0; /* a hot top edge */

    double t0 = now_s(), residual = 0.0;
    for (int it = 0; it < iterations; it++) {
        START(t_iter);

        START(t_halo);
        memcpy(halo, a + n, n * sizeof *halo);
        memcpy(halo + n, a + (size_t)(n - 2) * n, n * sizeof *halo);
        if (sleep_us > 0) {
            struct timespec d = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
            nanosleep(&d, NULL);
        }
        COUNT("bytes_exchanged", 2.0 * n * sizeof *halo);
        STOP(t_halo);

        START(t_sweep);
        for (int i = 1; i < n - 1; i++)
            for (int j = 1; j < n - 1; j++)
                b[(size_t)i * n + j] = 0.25 * (a[(size_t)(i - 1) * n + j] + a[(size_t)(i + 1) * n + j] +
                                               a[(size_t)i * n + j - 1] + a[(size_t)i * n + j + 1]);
        STOP(t_sweep);

        START(t_resid);
        residual = 0.0;
        for (size_t k = 0; k < (size_t)n * n; k++) {
            double d = b[k] - a[k];
            residual += d * d;
        }
        double *t = a;
        a = b;
        b = t;
        STOP(t_resid);

        STOP(t_iter);
#ifndef CANOPY_DISABLE
        canopy_dump();
#endif
    }
    double elapsed = now_s() - t0;
#ifndef CANOPY_DISABLE
    int rc = canopy_finalize();
    if (rc != CANOPY_OK) fprintf(stderr, "stencil: canopy_finalize: %s\n", canopy_last_error());
#endif
    printf("stencil: %d iterations of %dx%d in %.6f s, residual %.6e\n", iterations, n, n, elapsed, residual);
    free(a);
    free(b);
    free(halo);
    return 0;
}
