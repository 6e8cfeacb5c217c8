/* canopy.h: the C interface of Canopy's application SDK.
 *
 * A rank times regions and counts things, and offloads a profile to its node's leaf agent at every dump (or
 * every period), while the application runs. Link with -lcanopy (pkg-config canopy).
 *
 * No call aborts or blocks the application on I/O: a dump copies a snapshot into a bounded queue and returns;
 * a background thread ships it over the agent's Unix socket. When the agent is absent, dead or slow, the SDK
 * counts the dumps it drops, reconnects when the agent is back, and reports the count in the next profile that
 * gets through. Control from the tree (start and stop collection, events to include or exclude, a metric
 * subset, the dump period, rank sampling) takes effect at the next dump.
 *
 * Environment:
 *   CANOPY_AGENT_SOCKET         the agent's socket (default /run/canopy/agent.sock when /run/canopy exists,
 *                               else $XDG_RUNTIME_DIR/canopy/agent.sock, else /tmp/canopy-UID/agent.sock)
 *   CANOPY_DUMP_PERIOD_MS       dump from a background thread at this period; canopy_dump() then does nothing, and
 *                               canopy_finalize takes a last dump of what ran since the last tick
 *   CANOPY_QUEUE_DUMPS          dumps queued while the agent is absent or slow (default 64)
 *   CANOPY_FINALIZE_TIMEOUT_MS  how long canopy_finalize waits for the agent's FINACK (default 5000)
 *   CANOPY_RANK, CANOPY_NRANKS  override the launcher's rank and size
 *   CANOPY_MODULES              the measurement modules in force: profile, trace, null (default profile)
 *   CANOPY_TRACE_EVENTS         events each thread's trace ring holds (default 16384)
 */
#ifndef CANOPY_H
#define CANOPY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: 0 on success, one of these on failure (canopy_last_error() says more). */
#define CANOPY_OK 0
#define CANOPY_EINVAL (-1)     /* a bad argument or environment variable */
#define CANOPY_ESTATE (-2)     /* not initialized, initialized twice, or finalized */
#define CANOPY_EDROPPED (-3)   /* the dump was dropped (queue full: the agent is absent or slow); it is counted */
#define CANOPY_EUNDELIVERED (-4) /* finalize: some dumps never reached an agent */
#define CANOPY_ETIMEOUT (-5)   /* finalize: no FINACK from the agent in time */

/* A timer's handle; valid until the process exits. */
typedef struct canopy_timer canopy_timer;

/* Starts the SDK. app: the application's name (NULL or "": the program's name). rank, nranks < 0: read from
 * the launcher's environment (CANOPY_RANK, PMI_RANK, PMIX_RANK, OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK,
 * SLURM_PROCID, and the matching sizes); a process with none is rank 0 of 1. Returns at once. */
int canopy_init(const char *app, int rank, int nranks);

/* The timer of this name, made on first use; the same name gives the same handle. NULL on error. Timers work
 * before canopy_init. */
canopy_timer *canopy_timer_get(const char *name);

/* Start and stop a timer on the calling thread. Timers nest: a stop must match the timer started last on the
 * thread (another stop is ignored). Inclusive time counts once for recursive calls. NULL is ignored. */
void canopy_start(canopy_timer *t);
void canopy_stop(canopy_timer *t);

/* Adds value to the counter of this name (bytes sent, cache misses...). */
void canopy_counter(const char *name, double value);

/* The event interface. Every timer and counter call above is an event too; the measurement modules in force
 * (CANOPY_MODULES, or the tree's options) receive them: "profile" (the profile of each dump), "trace" (a bounded
 * event trace, shipped by the ranks the options name in trace_ranks) and "null" (takes every event, does
 * nothing). No event blocks, and none allocates once its thread has seen the names it uses. */

/* The id (>= 0) of the activity of this name, made on first use: the same name gives the same id, and the
 * timer of that name is the same activity. < 0 on error (canopy_last_error() says why). */
int canopy_activity(const char *name);

/* The activity begins or ends on the calling thread; an end must match the activity begun last on the thread
 * (another is ignored and counted). Ids that were not handed out are ignored. */
void canopy_begin(int activity);
void canopy_end(int activity);

/* A message of `bytes` bytes was sent to rank `dest`. The profile module adds it to the counters
 * "messages_sent" and "bytes_sent"; the trace module records it. */
void canopy_send(int dest, uint64_t bytes);

/* The calling thread becomes idle, and busy again: the profile module times it as the activity "Idle". */
void canopy_idle_begin(void);
void canopy_idle_end(void);

/* Step marks: the start or the stop of step `step` of the workflow key `key` (say "exchange"), now, on this
 * rank. Any rank of any application may start or stop a step, in any round; the latency filter pairs the
 * earliest start with the latest stop of each (key, step) over the tree: the step's end-to-end latency. A mark
 * ships with the next dump (at most 4096 per dump; more are counted as lost). 0, or < 0 when the key is NULL,
 * empty or not UTF-8. They work before canopy_init. */
int canopy_step_start(const char *key, uint64_t step);
int canopy_step_stop(const char *key, uint64_t step);

/* The id (>= 0) of the counter of this name, made on first use; < 0 on error. */
int canopy_counter_id(const char *name);

/* Adds value to the counter of this id, on the calling thread (cheaper than canopy_counter: no name lookup).
 * Ids that were not handed out, and values that are not finite, are ignored. */
void canopy_count(int counter, double value);

/* Offloads this round's profile (ToM's TAU_DB_DUMP): round k is the rank's k-th dump. Never blocks. */
int canopy_dump(void);

/* Ships what is queued, sends FIN and waits for the agent's FINACK up to CANOPY_FINALIZE_TIMEOUT_MS. Without an
 * agent it returns CANOPY_EUNDELIVERED at once. */
int canopy_finalize(void);

/* The message of the last failed call on this thread ("" if none); valid until the next failed call. */
const char *canopy_last_error(void);

/* The SDK's counts: dumps taken, dumps dropped, dumps delivered to an agent (each pointer may be NULL).
 * Returns 1 while connected to an agent, else 0. */
int canopy_stats(uint64_t *dumps, uint64_t *dropped, uint64_t *delivered);

#ifdef __cplusplus
}
#endif

#endif /* CANOPY_H */
