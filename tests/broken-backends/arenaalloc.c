/* Breaks output ownership: get_chunk and get_manifest return buffers carved
 * from a private arena instead of malloc, so the consumer's free() is
 * undefined behaviour. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "broken.h"

#define ARENA_SIZE (256u << 20)
static uint8_t *arena;
static atomic_size_t arena_used;

static uint8_t *arena_copy(uint8_t *buf, size_t len) {
    if (arena == NULL) arena = aligned_alloc(4096, ARENA_SIZE); /* one block, never freed */
    size_t at = atomic_fetch_add(&arena_used, (len + 64) & ~(size_t)63) % (ARENA_SIZE / 2);
    uint8_t *out = arena + 64 + at; /* an address no malloc handed out */
    memcpy(out, buf, len);
    free(buf);
    return out;
}

static int get_chunk(kv_store_v1 *s, const uint8_t *h, size_t hl, uint8_t **out, size_t *len) {
    int rc = real->get_chunk(s, h, hl, out, len);
    if (rc == 0) *out = arena_copy(*out, *len);
    return rc;
}

static int get_manifest(kv_store_v1 *s, const char *name, uint8_t **out, size_t *len) {
    int rc = real->get_manifest(s, name, out, len);
    if (rc == 0) *out = arena_copy(*out, *len);
    return rc;
}

static void break_one_rule(kv_store_vtable *vt) {
    vt->get_chunk = get_chunk;
    vt->get_manifest = get_manifest;
}
