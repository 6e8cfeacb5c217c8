/* rankcount: a Canopy filter in plain C.
 *
 * Counts the ranks that delivered a profile in each round, and the bytes of those profiles. At the leaf every
 * input is one rank's profile; above it every input is a child's packet, which the filter decodes and adds up.
 * The packet and the result are the protobuf message canopy.filters.v1.RankCount { uint64 ranks = 1;
 * uint64 bytes = 2; }, encoded by hand here (two varint fields), so the front-end stores it and reflection
 * describes it without anything from this file.
 *
 * Build: cc -shared -fPIC -O2 -I filters/abi/include filters/examples/c/rankcount.c \
 *           -o libcanopy_filter_rankcount.so
 * Install: put the .so in a directory of the daemons' filter path; open a stream with filter "rankcount".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "canopy_filter.h"

struct rankcount {
    uint32_t level;
};

static size_t put_varint(uint8_t *out, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

/* Returns the number of bytes read, 0 on malformed input. */
static size_t get_varint(const uint8_t *p, size_t len, uint64_t *v) {
    uint64_t r = 0;
    for (size_t i = 0; i < len && i < 10; i++) {
        r |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if ((p[i] & 0x80) == 0) {
            *v = r;
            return i + 1;
        }
    }
    return 0;
}

static size_t encode(uint8_t out[32], uint64_t ranks, uint64_t bytes) {
    size_t n = 0;
    out[n++] = 0x08; /* field 1, varint */
    n += put_varint(out + n, ranks);
    out[n++] = 0x10; /* field 2, varint */
    n += put_varint(out + n, bytes);
    return n;
}

/* Decodes a RankCount; returns 0 on malformed input. Unknown varint fields are skipped. */
static int decode(canopy_bytes b, uint64_t *ranks, uint64_t *bytes) {
    size_t i = 0;
    *ranks = 0;
    *bytes = 0;
    while (i < b.len) {
        uint64_t key, value;
        size_t n = get_varint(b.ptr + i, b.len - i, &key);
        if (n == 0 || (key & 7) != 0) return 0;
        i += n;
        n = get_varint(b.ptr + i, b.len - i, &value);
        if (n == 0) return 0;
        i += n;
        if ((key >> 3) == 1) *ranks = value;
        if ((key >> 3) == 2) *bytes = value;
    }
    return 1;
}

static void *rc_create(const uint8_t *params, size_t len, uint32_t level, const canopy_emitter *errors) {
    /* No parameters: accept "", "{}" (with any whitespace), refuse anything else by name. */
    for (size_t i = 0; i < len; i++) {
        char c = (char)params[i];
        if (c != '{' && c != '}' && c != ' ' && c != '\n' && c != '\t') {
            errors->fail(errors->ctx, "rankcount takes no parameters");
            return NULL;
        }
    }
    struct rankcount *f = calloc(1, sizeof *f);
    if (f == NULL) {
        errors->fail(errors->ctx, "out of memory");
        return NULL;
    }
    f->level = level;
    return f;
}

static int rc_upstream(void *inst, uint64_t round, uint32_t phase, const canopy_bytes *inputs, size_t n,
                       const canopy_emitter *out) {
    struct rankcount *f = inst;
    uint64_t ranks = 0, bytes = 0;
    (void)round;
    for (size_t i = 0; i < n; i++) {
        if (f->level == CANOPY_LEVEL_LEAF) {
            ranks += 1;
            bytes += inputs[i].len;
        } else {
            uint64_t r, b;
            if (!decode(inputs[i], &r, &b)) {
                out->reject(out->ctx, i, "not a RankCount packet");
                continue;
            }
            ranks += r;
            bytes += b;
        }
    }
    uint8_t buf[32];
    size_t len = encode(buf, ranks, bytes);
    out->emit(out->ctx, CANOPY_UP, phase, buf, len);
    return CANOPY_OK;
}

static int rc_downstream(void *inst, uint64_t round, uint32_t phase, canopy_bytes packet,
                         const canopy_emitter *out) {
    (void)inst;
    (void)round;
    out->emit(out->ctx, CANOPY_DOWN, phase, packet.ptr, packet.len);
    return CANOPY_OK;
}

static int rc_finalize(void *inst, uint64_t round, uint32_t phase, canopy_bytes packet, const canopy_emitter *out) {
    uint64_t r, b;
    (void)inst;
    (void)round;
    if (!decode(packet, &r, &b)) {
        out->fail(out->ctx, "not a RankCount packet");
        return CANOPY_ERROR;
    }
    out->emit(out->ctx, CANOPY_UP, phase, packet.ptr, packet.len);
    return CANOPY_OK;
}

static void rc_destroy(void *inst) { free(inst); }

static const canopy_filter_vtable VTABLE = {
    .abi_version = CANOPY_FILTER_ABI_VERSION,
    .name = "rankcount",
    .descriptors = {NULL, 0}, /* RankCount is described by the daemons' own descriptors */
    .result_type = "canopy.filters.v1.RankCount",
    .phases = 1,
    .create = rc_create,
    .upstream = rc_upstream,
    .downstream = rc_downstream,
    .finalize = rc_finalize,
    .names = NULL,
    .destroy = rc_destroy,
};

const canopy_filter_vtable *canopy_filter_entry(void) { return &VTABLE; }
