/* Two real programs coupled through files, timed across: a producer (application "simulation") and a consumer
 * (application "analysis") against the same agent. The producer starts step s of the key "exchange", hands it
 * over by creating the file DIR/step-<s>, and dumps; the consumer waits for that file, works for DELAY_MS
 * milliseconds in the event "analyse", stops step s and dumps. A `latency` stream then stores each step's
 * end-to-end latency (from the producer's start to the consumer's stop) and each application's part in it.
 *
 *   canopy-frontend --listen 127.0.0.1:7000 --streams latency,stats &
 *   canopy-agent --node-id agent-0 --parent 127.0.0.1:7000 &
 *   mkdir -p /tmp/steps; ./workflow consumer /tmp/steps 100 30 & ./workflow producer /tmp/steps 100 30
 *
 * Usage: workflow producer|consumer DIR STEPS DELAY_MS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <canopy.h>

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: workflow producer|consumer DIR STEPS DELAY_MS\n");
        return 2;
    }
    int producer = strcmp(argv[1], "producer") == 0;
    const char *dir = argv[2];
    long steps = atol(argv[3]);
    long delay = atol(argv[4]);
    if (canopy_init(producer ? "simulation" : "analysis", -1, -1) != CANOPY_OK) {
        fprintf(stderr, "workflow: canopy_init: %s\n", canopy_last_error());
        return 1;
    }
    if (canopy_step_start(NULL, 0) >= 0 || canopy_step_stop("", 0) >= 0) {
        fprintf(stderr, "workflow: a NULL or empty key was accepted\n");
        return 1;
    }
    canopy_timer *work = canopy_timer_get("analyse");
    char path[4096];
    for (long s = 0; s < steps; s++) {
        snprintf(path, sizeof path, "%s/step-%ld", dir, s);
        if (producer) {
            if (canopy_step_start("exchange", (uint64_t)s) != CANOPY_OK) {
                fprintf(stderr, "workflow: canopy_step_start: %s\n", canopy_last_error());
                return 1;
            }
            FILE *f = fopen(path, "w");
            if (f == NULL) {
                perror("workflow: handing the step over");
                return 1;
            }
            fclose(f);
            sleep_ms(5);
        } else {
            while (access(path, F_OK) != 0) sleep_ms(1);
            canopy_start(work);
            sleep_ms(delay);
            canopy_stop(work);
            if (canopy_step_stop("exchange", (uint64_t)s) != CANOPY_OK) {
                fprintf(stderr, "workflow: canopy_step_stop: %s\n", canopy_last_error());
                return 1;
            }
        }
        canopy_dump();
    }
    int rc = canopy_finalize();
    if (rc != CANOPY_OK) fprintf(stderr, "workflow: canopy_finalize: %s\n", canopy_last_error());
    return rc == CANOPY_OK ? 0 : 1;
}
