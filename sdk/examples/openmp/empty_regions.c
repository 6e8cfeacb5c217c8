/* The cost of OpenMP's own constructs, for canopy-bench ompt: N parallel regions, each with a worksharing loop
 * of one iteration per thread and an explicit barrier, and no work. It prints the time per region, which the
 * bench compares with and without Canopy's OMPT tool loaded.
 *
 *   clang -O2 -fopenmp empty_regions.c -o empty_regions && OMP_NUM_THREADS=2 ./empty_regions 100000
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int threads = 0;
    double start = omp_get_wtime();
    for (long r = 0; r < n; r++) {
#pragma omp parallel
        {
#pragma omp for
            for (int i = 0; i < omp_get_num_threads(); i++)
                threads = omp_get_num_threads();
#pragma omp barrier
        }
    }
    double elapsed = omp_get_wtime() - start;
    printf("empty_regions: %ld regions of %d threads, %.1f ns per region\n", n, threads, elapsed * 1e9 / n);
    return 0;
}
