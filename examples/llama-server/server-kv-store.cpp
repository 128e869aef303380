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
// read each chunk straight into the slot's tensors); NULL for other
// backends.
static kv_slot_get_chunk_into_fn g_get_into = nullptr;
// The pieces of the state being saved (llama_state_seq_get_data_cb: tensor
// rows by pointer, the rest copied), kept for the next save.
static kv_slot_pieces          g_pieces = {};
// A restore's copy of the slot it replaces, to put back if the restore
// fails; kept for the next one (kv_slot.h says why a kept buffer).
static kv_slot_buf             g_undo = { nullptr, 0 };

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
    g_get_into = reinterpret_cast<kv_slot_get_chunk_into_fn>(kv_store_backend_symbol(lib, vt, KV_SLOT_GET_CHUNK_INTO_SYMBOL));
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

server_kv_store_restore::~server_kv_store_restore() {
    kv_slot_error ignored;
    kv_slot_reader_close(reader, &ignored);
}

// Throws the reader's failure (its first, in chunk order).
[[noreturn]] static void throw_read_failure(server_kv_store_restore & restore) {
    kv_slot_error err;
    kv_slot_reader_close(restore.reader, &err);
    restore.reader = nullptr;
    throw server_kv_store_error(std::string("Unable to restore slot: ") + err.msg, error_type_of(err));
}

void server_kv_store_begin(const std::string & name, size_t max_tokens, server_kv_store_restore & restore) {
    kv_slot_error err;
    if (kv_slot_reader_open(g_vt, g_get_into, g_store, name.c_str(), &restore.reader, &err) != 0) {
        throw server_kv_store_error(std::string("Unable to restore slot: ") + err.msg, error_type_of(err));
    }
    restore.size   = kv_slot_reader_size(restore.reader);
    restore.chunks = kv_slot_reader_chunks(restore.reader);
    uint8_t head[KV_SLOT_GGSQ_HEAD];
    auto    u32 = [&](size_t at) {
        uint32_t v;
        std::memcpy(&v, head + at, sizeof v);
        return v;
    };
    if (restore.size < KV_SLOT_GGSQ_HEAD) {
        throw server_kv_store_error("Unable to restore slot: the state has no ggsq header", ERROR_TYPE_INVALID_REQUEST);
    }
    if (kv_slot_read(restore.reader, head, sizeof head) != 0) {
        throw_read_failure(restore);
    }
    if (u32(0) != LLAMA_STATE_SEQ_MAGIC || u32(4) != LLAMA_STATE_SEQ_VERSION) {
        throw server_kv_store_error("Unable to restore slot: the state has no ggsq v" +
                                    std::to_string(LLAMA_STATE_SEQ_VERSION) + " header", ERROR_TYPE_INVALID_REQUEST);
    }
    // (the state's size is only the manifest's claim until its bytes arrive)
    const size_t n_tokens = u32(8);
    if (n_tokens > max_tokens) {
        throw server_kv_store_error("Restored prompt does not fit in the slot context", ERROR_TYPE_INVALID_REQUEST);
    }
    if (n_tokens > (restore.size - KV_SLOT_GGSQ_HEAD) / sizeof(llama_token)) {
        throw server_kv_store_error("Unable to restore slot: the state's token count exceeds its size",
                                    ERROR_TYPE_INVALID_REQUEST);
    }
    restore.tokens.resize(n_tokens);
    if (n_tokens && kv_slot_read(restore.reader, restore.tokens.data(), n_tokens * sizeof(llama_token)) != 0) {
        throw_read_failure(restore);
    }
}

static bool read_state(void * dst, size_t size, void * reader) {
    return kv_slot_read(static_cast<kv_slot_reader *>(reader), dst, size) == 0;
}

void server_kv_store_finish(llama_context * ctx, llama_seq_id seq, server_kv_store_restore & restore) {
    // The slot's cells are written as the chunks arrive, so a failure part
    // way through is undone from a copy; an empty slot needs none.
    llama_memory_t mem      = llama_get_memory(ctx);
    const bool     occupied = llama_memory_seq_pos_max(mem, seq) >= 0;
    const double   t_undo   = kv_slot_now_ms();
    size_t         undo     = 0;
    if (occupied) {
        const size_t    size = llama_state_seq_get_size(ctx, seq);
        uint8_t * const into = kv_slot_buf_reserve(&g_undo, size);
        undo                 = into ? llama_state_seq_get_data(ctx, into, size, seq) : 0;
        if (undo == 0) {
            throw server_kv_store_error("Unable to restore slot: no copy of the slot it replaces could be made",
                                        ERROR_TYPE_SERVER);
        }
    }
    const double t_set = kv_slot_now_ms();
    const size_t want  = restore.size - KV_SLOT_GGSQ_HEAD - sizeof(llama_token) * restore.tokens.size();
    const size_t got   = llama_state_seq_set_data_cb(ctx, seq, read_state, restore.reader, 0);
    kv_slot_error err;
    const int     read_rc = kv_slot_reader_close(restore.reader, &err);
    restore.reader        = nullptr;
    if (kv_slot_tracing()) {
        fprintf(stderr, "kv_slot: llama_state_seq_set_data_cb of %zu bytes: %.2f ms (copy of the slot it replaces: %.2f ms)\n",
                got, kv_slot_now_ms() - t_set, t_set - t_undo);
    }
    if (read_rc == 0 && got == want) {
        return;
    }
    // put the slot back as it was
    llama_memory_seq_rm(mem, seq, -1, -1);
    if (occupied && llama_state_seq_set_data(ctx, g_undo.data, undo, seq) != undo) {
        llama_memory_seq_rm(mem, seq, -1, -1);
        server_kv_store_error lost("Unable to restore slot, and its previous state could not be put back",
                                   ERROR_TYPE_SERVER);
        lost.slot_lost = true;
        throw lost;
    }
    // llama.cpp stops reading where it refuses a state: the store is not at fault then
    if (read_rc != 0 && std::strcmp(err.what, "read") != 0) {
        throw server_kv_store_error(std::string("Unable to restore slot: ") + err.msg, error_type_of(err));
    }
    throw server_kv_store_error("Unable to restore slot: llama.cpp refused the stored state", ERROR_TYPE_INVALID_REQUEST);
}
