// llama_state_seq_get_data_cb / llama_state_seq_set_data_cb (llama.h): a sequence's state
// streamed through callbacks, tensor data passed straight from / into host tensor memory.

#include "llama-context.h"
#include "llama-impl.h"
#include "llama-io.h"

#include "ggml-backend.h"

#include <cstdint>
#include <stdexcept>
#include <vector>

// the first word of a sequence state, as llama_context::state_seq_get_data writes it
static constexpr uint32_t state_cb_io_magic = 0xaf143cd8;

static bool tensor_in_host_memory(const ggml_tensor * tensor) {
    return tensor->buffer && ggml_backend_buffer_is_host(tensor->buffer);
}

class llama_io_write_cb : public llama_io_write_i {
public:
    llama_io_write_cb(llama_state_write_cb cb, void * user_data) : cb(cb), user_data(user_data) {}

    void write(const void * src, size_t size) override {
        pass(src, size, false);
    }

    void write_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        if (tensor_in_host_memory(tensor)) {
            pass((const uint8_t *) tensor->data + offset, size, true);
            return;
        }
        temp_buffer.resize(size);
        ggml_backend_tensor_get(tensor, temp_buffer.data(), offset, size);
        pass(temp_buffer.data(), size, false);
    }

    size_t n_bytes() override {
        return size_written;
    }

private:
    void pass(const void * src, size_t size, bool in_memory) {
        if (!cb(src, size, in_memory, user_data)) {
            throw std::runtime_error("the write callback failed");
        }
        size_written += size;
    }

    llama_state_write_cb cb;
    void *               user_data;
    size_t               size_written = 0;
    std::vector<uint8_t> temp_buffer;
};

class llama_io_read_cb : public llama_io_read_i {
public:
    llama_io_read_cb(llama_state_read_cb cb, void * user_data) : cb(cb), user_data(user_data) {}

    void read(void * dst, size_t size) override {
        if (!cb(dst, size, user_data)) {
            throw std::runtime_error("the read callback failed");
        }
        size_read += size;
    }

    void read_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        if (tensor_in_host_memory(tensor)) {
            read((uint8_t *) tensor->data + offset, size);
            return;
        }
        temp_buffer.resize(size);
        read(temp_buffer.data(), size);
        ggml_backend_tensor_set(tensor, temp_buffer.data(), offset, size);
    }

    size_t n_bytes() override {
        return size_read;
    }

private:
    llama_state_read_cb  cb;
    void *               user_data;
    size_t               size_read = 0;
    std::vector<uint8_t> temp_buffer;
};

size_t llama_state_seq_get_data_cb(
        llama_context * ctx, llama_seq_id seq_id, llama_state_write_cb write_cb, void * user_data, llama_state_seq_flags flags) {
    if (flags & LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) {
        LLAMA_LOG_ERROR("%s: LLAMA_STATE_SEQ_FLAGS_ON_DEVICE is not supported\n", __func__);
        return 0;
    }
    ctx->synchronize();

    llama_io_write_cb io(write_cb, user_data);
    try {
        io.write(&state_cb_io_magic, sizeof(state_cb_io_magic));
        io.write(&seq_id, sizeof(seq_id));

        return ctx->state_seq_write_data(io, seq_id, flags);
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: error saving state: %s\n", __func__, err.what());
        return 0;
    }
}

size_t llama_state_seq_set_data_cb(
        llama_context * ctx, llama_seq_id dest_seq_id, llama_state_read_cb read_cb, void * user_data, llama_state_seq_flags flags) {
    if (flags & LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) {
        LLAMA_LOG_ERROR("%s: LLAMA_STATE_SEQ_FLAGS_ON_DEVICE is not supported\n", __func__);
        return 0;
    }
    ctx->synchronize();

    llama_io_read_cb io(read_cb, user_data);
    try {
        uint32_t magic_read;
        io.read(&magic_read, sizeof(magic_read));
        if (magic_read != state_cb_io_magic) {
            throw std::runtime_error("wrong sequence state magic");
        }

        llama_seq_id seq_id_read;
        io.read(&seq_id_read, sizeof(seq_id_read));

        return ctx->state_seq_read_data(io, dest_seq_id, flags);
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: error loading state: %s\n", __func__, err.what());
        return 0;
    }
}
