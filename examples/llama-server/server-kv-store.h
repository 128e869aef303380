// llama-server slots in a kv_store_v1 backend: `--slot-save-path
// <scheme>://...` loads libkv_store_<scheme>.so and opens one store at
// start-up; POST /slots/{id}?action=save|restore then cut the slot's
// sequence state into content-addressed xxh3-64 chunks plus a manifest
// named after the filename (kv_slot.c, shared with kvwasm's
// examples/llama-slot). A plain directory keeps upstream's files.
#pragma once

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

// A state fetched and verified, not yet applied to any slot. Its bytes live
// in the store's one state buffer, valid until the next save or restore.
struct server_kv_store_state {
    const uint8_t * bytes = nullptr;
    size_t       size   = 0;
    llama_tokens tokens;     // the packed prompt tokens of the ggsq header
    size_t       head   = 0; // where llama_state_seq_get_data's bytes begin
    size_t       chunks = 0;
};

// Fetches manifest `name` and its chunks, checking each; touches no slot.
server_kv_store_state server_kv_store_load(const std::string & name);

// Applies a loaded state to sequence `seq`; false if llama.cpp refuses it.
bool server_kv_store_apply(llama_context * ctx, llama_seq_id seq, const server_kv_store_state & state);
