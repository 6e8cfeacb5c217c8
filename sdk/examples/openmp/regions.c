/* An OpenMP program with no Canopy call: parallel regions, a worksharing loop with a reduction, an explicit
 * barrier, a single that creates tasks, tied and untied, and waits for them. Its last line says how many of each it made, for
 * the tests to compare with what Canopy's OMPT tool stored.
 *
 *   clang -g -O2 -fopenmp regions.c -o regions
 *   OMP_NUM_THREADS=4 canopy run --openmp -- ./regions 20
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1 << 16)
#define TASKS 8
#define UNTIED 4

static double a[N];

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 20;
    double sum = 0;
    int threads = 0;
    for (int it = 0; it < iterations; it++) {
#pragma omp parallel
        {
#pragma omp for reduction(+ : sum)
            for (int i = 0; i < N; i++) {
                a[i] += i * 0.5;
                sum += a[i];
            }
#pragma omp barrier
#pragma omp single
            {
                threads = omp_get_num_threads();
                for (int t = 0; t < TASKS; t++) {
#pragma omp task
                    a[t] += 1;
                }
                for (int t = 0; t < UNTIED; t++) {
#pragma omp task untied
                    a[TASKS + t] += 1;
                }
#pragma omp taskwait
            }
        }
    }
    printf("sum %g\n", sum);
    printf("regions: iterations %d threads %d tasks %d untied %d\n", iterations, threads, TASKS, UNTIED);
    return 0;
}
