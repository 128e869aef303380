/* Not broken, only lenient: prefetch_chunks returns 0 (an ignored hint)
 * for NULL hashes or hash_len 0 instead of an error. The spec makes
 * prefetch a non-fatal hint, so this is a SHOULD: `kvwasm check` warns
 * and passes. */
#include "broken.h"

static int prefetch_chunks(kv_store_v1 *s, const uint8_t *hashes, size_t hl, size_t n) {
    if (n > 0 && (hashes == NULL || hl == 0)) return 0;
    return real->prefetch_chunks(s, hashes, hl, n);
}

static void break_one_rule(kv_store_vtable *vt) { vt->prefetch_chunks = prefetch_chunks; }
