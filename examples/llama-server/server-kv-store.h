// llama-server slots in a kv_store_v1 backend: `--slot-save-path
// <scheme>://...` loads libkv_store_<scheme>.so and opens one store at
// start-up; POST /slots/{id}?action=save|restore then cut the slot's
// sequence state into content-addressed xxh3-64 chunks plus a manifest
// named after the filename (kv_slot.c, shared with kvwasm's
// examples/llama-slot). A plain directory keeps upstream's files.
#pragma once

#include "kv_slot.h"
#include "llama.h"
#include "server-common.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// A failed save or restore: its message and the HTTP error it answers.
struct server_kv_store_error : std::runtime_error {
    error_type type;
    bool       slot_lost = false; // the slot could not be put back as it was: clear it
    server_kv_store_error(const std::string & msg, error_type type) : std::runtime_error(msg), type(type) {}
};

// True when --slot-save-path names a kv_store_v1 backend (`<scheme>://...`).
bool server_kv_store_is_uri(const std::string & path);

// Loads the backend and opens the store; false with `err` set if it cannot.
bool server_kv_store_open(const std::string & uri, std::string & err);

// True once server_kv_store_open succeeded.
bool server_kv_store_enabled();

// Saves sequence `seq` with its (packed) prompt tokens under manifest
// `name`. Returns the state's size; `counts` gets the chunk counts, as
// fields of the answer.
size_t server_kv_store_save(llama_context * ctx, llama_seq_id seq, const std::vector<char> & packed_tokens,
                            const std::string & name, std::vector<std::pair<std::string, size_t>> & counts);

// A restore under way: its reader (the manifest fetched, the helper
// started) and the state's ggsq header, read and checked; no slot touched.
struct server_kv_store_restore {
    kv_slot_reader * reader = nullptr;
    llama_tokens     tokens;   // the packed prompt tokens of the ggsq header
    size_t           size   = 0;
    size_t           chunks = 0;

    server_kv_store_restore() = default;
    server_kv_store_restore(const server_kv_store_restore &) = delete;
    server_kv_store_restore & operator=(const server_kv_store_restore &) = delete;
    ~server_kv_store_restore();
};

// Opens manifest `name` and reads the state's header and tokens (at most
// `max_tokens`) into `restore`; touches no slot.
void server_kv_store_begin(const std::string & name, size_t max_tokens, server_kv_store_restore & restore);

// Reads the rest of the state into sequence `seq`, each chunk checked as it
// arrives. On any failure (the store's, a chunk that does not match, or
// llama.cpp refusing the state) the sequence is put back as it was and the
// error thrown.
void server_kv_store_finish(llama_context * ctx, llama_seq_id seq, server_kv_store_restore & restore);
