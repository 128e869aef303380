#include "server-kv-store.h"

#include "kv_slot.h"
#include "kv_store_loader.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

// Rows (KV cells) per chunk: two saves of prompts sharing a prefix share
// every chunk inside it, so smaller chunks deduplicate more of a prefix
// that ends mid-chunk; larger ones cost fewer backend calls.
static constexpr uint32_t CHUNK_ROWS = 256;

// The one store of this process: opened at start-up, used by the server's
// task loop (one task at a time), left open for the process's lifetime.
static const kv_store_vtable * g_vt    = nullptr;
static kv_store_v1 *           g_store = nullptr;
// libkv_store_wasm.so's optional kv_store_wasm_get_chunk_into (restores
// read each chunk straight into g_state); NULL for other backends.
static kv_slot_get_chunk_into_fn g_get_into = nullptr;
// The pieces of the state being saved (llama_state_seq_get_data_cb: tensor
// rows by pointer, the rest copied), kept for the next save.
static kv_slot_pieces          g_pieces = {};
// The state of the restore under way, kept for the next one: as large as
// the largest slot state restored so far (kv_slot.h says why a kept
// buffer).
static kv_slot_buf             g_state = { nullptr, 0 };

bool server_kv_store_is_uri(const std::string & path) {
    return path.find("://") != std::string::npos;
}

bool server_kv_store_open(const std::string & uri, std::string & err) {
    char why[4400];
    void *                  lib = nullptr;
    const kv_store_vtable * vt  = kv_store_load_lib(uri.c_str(), &lib, why, sizeof why);
    if (!vt) {
        err = why;
        return false;
    }
    // the reference consumer strips one trailing '/'
    std::string trimmed = uri;
    if (trimmed.size() > 1 && trimmed.back() == '/') {
        trimmed.pop_back();
    }
    kv_store_v1 * store = vt->open(trimmed.c_str());
    if (!store) {
        err = "the kv_store_v1 backend could not open " + trimmed + " (its reason is on stderr)";
        return false;
    }
    g_vt       = vt;
    g_store    = store;
    g_get_into = reinterpret_cast<kv_slot_get_chunk_into_fn>(dlsym(lib, KV_SLOT_GET_CHUNK_INTO_SYMBOL));
    return true;
}

bool server_kv_store_enabled() {
    return g_store != nullptr;
}

// The HTTP error a failure answers: a missing manifest is the request's
// fault (400, as upstream answers a missing file; a 404 would lose the
// message), and so is an argument the store refuses; the rest is the store's.
static error_type error_type_of(const kv_slot_error & e) {
    if (e.store_rc == -2 && std::strcmp(e.what, "get_manifest") == 0) {
        return ERROR_TYPE_INVALID_REQUEST;
    }
    switch (e.store_rc) {
        case -3:
        case -10: return ERROR_TYPE_INVALID_REQUEST;
        case -4:  return ERROR_TYPE_PERMISSION;
        case -6:
        case -8:  return ERROR_TYPE_UNAVAILABLE;
        default:  return ERROR_TYPE_SERVER;
    }
}

static bool add_piece(const void * data, size_t size, bool in_memory, void * pieces) {
    return kv_slot_pieces_add(static_cast<kv_slot_pieces *>(pieces), data, size, in_memory) == 0;
}

size_t server_kv_store_save(llama_context * ctx, llama_seq_id seq, const std::vector<char> & packed_tokens,
                            const std::string & name, std::vector<std::pair<std::string, size_t>> & counts) {
    const size_t n_tokens = packed_tokens.size() / sizeof(llama_token);
    std::vector<llama_token> tokens(n_tokens);
    if (n_tokens) {
        std::memcpy(tokens.data(), packed_tokens.data(), n_tokens * sizeof(llama_token));
    }
    std::vector<uint8_t> head(KV_SLOT_GGSQ_HEAD + sizeof(llama_token) * n_tokens);
    kv_slot_write_head(head.data(), LLAMA_STATE_SEQ_MAGIC, LLAMA_STATE_SEQ_VERSION, tokens.data(), n_tokens);
    kv_slot_pieces_clear(&g_pieces);
    if (kv_slot_pieces_add(&g_pieces, head.data(), head.size(), 0) != 0) {
        throw server_kv_store_error("Unable to save slot: no memory for its state", ERROR_TYPE_SERVER);
    }
    // the KV rows stay in the slot's tensors, unchanged until the save returns
    const double t_get    = kv_slot_now_ms();
    const size_t seq_size = llama_state_seq_get_data_cb(ctx, seq, add_piece, &g_pieces, 0);
    if (seq_size == 0) {
        throw server_kv_store_error("Unable to save slot: llama_state_seq_get_data_cb failed", ERROR_TYPE_SERVER);
    }
    if (kv_slot_tracing()) {
        fprintf(stderr, "kv_slot: llama_state_seq_get_data_cb of %zu bytes: %.2f ms\n", seq_size,
                kv_slot_now_ms() - t_get);
    }
    kv_slot_save_stats stats;
    kv_slot_error      err;
    if (kv_slot_save_pieces(g_vt, g_store, name.c_str(), &g_pieces, CHUNK_ROWS, &stats, &err) != 0) {
        throw server_kv_store_error(std::string("Unable to save slot: ") + err.msg, error_type_of(err));
    }
    counts = {
        { "n_chunks",              stats.chunks },
        { "n_chunks_stored",       stats.stored },
        { "n_chunks_deduplicated", stats.deduplicated },
        { "n_bytes_stored",        stats.bytes_stored },
    };
    return g_pieces.size;
}

server_kv_store_state server_kv_store_load(const std::string & name) {
    size_t        size = 0;
    kv_slot_error err;
    server_kv_store_state st;
    if (kv_slot_load_into(g_vt, g_get_into, g_store, name.c_str(), &g_state, &size, &st.chunks, &err) != 0) {
        throw server_kv_store_error(std::string("Unable to restore slot: ") + err.msg, error_type_of(err));
    }
    const uint8_t * bytes = g_state.data;
    st.bytes = bytes;
    st.size  = size;
    auto u32 = [&](size_t at) {
        uint32_t v;
        std::memcpy(&v, bytes + at, sizeof v);
        return v;
    };
    if (size < KV_SLOT_GGSQ_HEAD || u32(0) != LLAMA_STATE_SEQ_MAGIC || u32(4) != LLAMA_STATE_SEQ_VERSION) {
        throw server_kv_store_error("Unable to restore slot: the state has no ggsq v" +
                                    std::to_string(LLAMA_STATE_SEQ_VERSION) + " header", ERROR_TYPE_INVALID_REQUEST);
    }
    const size_t n_tokens = u32(8);
    st.head = KV_SLOT_GGSQ_HEAD + sizeof(llama_token) * n_tokens;
    if (st.head > size) {
        throw server_kv_store_error("Unable to restore slot: the state's token count exceeds its size",
                                    ERROR_TYPE_INVALID_REQUEST);
    }
    st.tokens.resize(n_tokens);
    if (n_tokens) {
        std::memcpy(st.tokens.data(), bytes + KV_SLOT_GGSQ_HEAD, n_tokens * sizeof(llama_token));
    }
    return st;
}

bool server_kv_store_apply(llama_context * ctx, llama_seq_id seq, const server_kv_store_state & state) {
    const size_t n     = state.size - state.head;
    const double t_set = kv_slot_now_ms();
    const bool   ok    = llama_state_seq_set_data(ctx, state.bytes + state.head, n, seq) == n;
    if (kv_slot_tracing()) {
        fprintf(stderr, "kv_slot: llama_state_seq_set_data of %zu bytes: %.2f ms\n", n, kv_slot_now_ms() - t_set);
    }
    return ok;
}
