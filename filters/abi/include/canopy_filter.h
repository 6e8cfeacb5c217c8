/* canopy_filter.h: the C ABI of Canopy filter plugins.
 *
 * A filter is a shared object named libcanopy_filter_<name>.so that exports one symbol,
 * canopy_filter_entry, returning a pointer to a static canopy_filter_vtable. The daemons load it from their
 * filter search path, check abi_version, and create one instance per stream per node.
 *
 * Every call receives a canopy_emitter through which it may emit packets up (toward the root) and down
 * (toward the leaves), reject an input it cannot read, or fail with a reason. Byte ranges passed in are only
 * valid for the duration of the call; bytes passed to the emitter are copied before it returns. The emitter
 * itself is valid only during the call and only on the calling thread: keep no copy of it. Calls on one
 * instance never overlap, but successive calls may come from different threads.
 *
 * At the root, finalize must emit exactly one packet up: the stored result.
 *
 * Level: where the instance runs. At the leaf, upstream inputs are single-rank canopy.v1.ProfileBatch
 * encodings; elsewhere they are packets emitted by the same filter one level down. At the root, every packet
 * a call emits up is handed to finalize, whose up-emitted packet is the stored result.
 */
#ifndef CANOPY_FILTER_H
#define CANOPY_FILTER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CANOPY_FILTER_ABI_VERSION 2u

#define CANOPY_LEVEL_LEAF 0u
#define CANOPY_LEVEL_RELAY 1u
#define CANOPY_LEVEL_ROOT 2u

#define CANOPY_UP 0u
#define CANOPY_DOWN 1u

/* Return codes of the calls that return int. */
#define CANOPY_OK 0
#define CANOPY_ERROR (-1)

typedef struct canopy_bytes {
    const uint8_t *ptr;
    size_t len;
} canopy_bytes;

typedef struct canopy_emitter {
    void *ctx;
    /* direction: CANOPY_UP or CANOPY_DOWN. */
    void (*emit)(void *ctx, uint32_t direction, uint32_t phase, const uint8_t *ptr, size_t len);
    /* The input at this index could not be read: its ranks are counted as malformed. */
    void (*reject)(void *ctx, size_t input, const char *reason);
    /* Why the call failed (before returning CANOPY_ERROR, or NULL from create). */
    void (*fail)(void *ctx, const char *reason);
} canopy_emitter;

typedef struct canopy_name {
    uint64_t id;
    canopy_bytes name;
} canopy_name;

typedef struct canopy_filter_vtable {
    uint32_t abi_version;          /* CANOPY_FILTER_ABI_VERSION */
    const char *name;              /* as in libcanopy_filter_<name>.so */
    canopy_bytes descriptors;      /* an encoded google.protobuf.FileDescriptorSet of the result messages */
    const char *result_type;       /* full name of the result message, e.g. "canopy.filters.v1.StatsResult" */
    /* Phases of a round: 1 for a filter that merges on the way up only; 3 for min/max up, range down, counts up.
     * A round is done at a node when it sends up a packet of phase (phases - 1). A filter with more than one
     * phase runs only in wait-for-all streams. */
    uint32_t phases;
    /* params: JSON text ("" or "{}" for none). Returns NULL and calls errors->fail on bad parameters. */
    void *(*create)(const uint8_t *params, size_t params_len, uint32_t level, const canopy_emitter *errors);
    int (*upstream)(void *instance, uint64_t round, uint32_t phase, const canopy_bytes *inputs, size_t n_inputs,
                    const canopy_emitter *out);
    int (*downstream)(void *instance, uint64_t round, uint32_t phase, canopy_bytes packet,
                      const canopy_emitter *out);
    /* At the root: emit the result (CANOPY_UP) for a packet the filter emitted up. */
    int (*finalize)(void *instance, uint64_t round, uint32_t phase, canopy_bytes packet, const canopy_emitter *out);
    /* Event and counter names as the node learns them (ids are xxh3-64 of the names). May be NULL. */
    void (*names)(void *instance, const canopy_name *names, size_t n);
    void (*destroy)(void *instance);
} canopy_filter_vtable;

/* The one exported symbol. */
const canopy_filter_vtable *canopy_filter_entry(void);

#define CANOPY_FILTER_ENTRY_SYMBOL "canopy_filter_entry"

#ifdef __cplusplus
}
#endif

#endif /* CANOPY_FILTER_H */
