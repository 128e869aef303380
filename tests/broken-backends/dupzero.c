/* Breaks idempotency reporting: put_chunk returns 0 ("stored") for a chunk
 * that already existed, so the consumer's dedup counts are wrong. */
#include "broken.h"

static int put_chunk(kv_store_v1 *s, const uint8_t *h, size_t hl, const uint8_t *d, size_t dl) {
    int rc = real->put_chunk(s, h, hl, d, dl);
    return rc == 1 ? 0 : rc;
}

static void break_one_rule(kv_store_vtable *vt) { vt->put_chunk = put_chunk; }
