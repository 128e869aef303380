/* Breaks thread safety: put_chunk stages the data in one buffer shared by
 * all callers, so concurrent puts overwrite each other's bytes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broken.h"

static uint8_t *staging;
static size_t staging_cap;

static int put_chunk(kv_store_v1 *s, const uint8_t *h, size_t hl, const uint8_t *d, size_t dl) {
    if (d == NULL) return real->put_chunk(s, h, hl, d, dl); /* bad input: the real checks */
    if (dl > staging_cap) {
        free(staging);
        staging = malloc(dl);
        staging_cap = staging ? dl : 0;
        if (staging == NULL) return -1;
    }
    if (dl) memcpy(staging, d, dl);
    usleep(100); /* the window another thread's put falls into */
    return real->put_chunk(s, h, hl, dl ? staging : d, dl);
}

static void break_one_rule(kv_store_vtable *vt) { vt->put_chunk = put_chunk; }
