// llama.cpp behind small owning types for tandem-llama (docs/llama.md): the
// model (weights and vocabulary), a context (one unified KV cache over up to
// 256 sequences), batches, and the KV calls the engine's directives use.
//
// Errors come back as base::Error naming the file or the call, never as
// llama.cpp's own aborts where they can be avoided: a model file is checked
// (exists, readable, GGUF magic and version) before llama.cpp parses it, and
// llama.cpp's error log lines are kept so a failed load can say why.
//
// Thread-safety: Model is immutable once loaded; its tokenizer calls are
// safe from any thread (llama.cpp's vocabulary is read-only). A Context is
// used by one thread (the engine's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

struct llama_model;
struct llama_context;
struct llama_vocab;
struct llama_sampler;

namespace tandem::llama {

using Token = std::int32_t;  // llama_token
using SeqId = std::int32_t;  // llama_seq_id

// Once per process: loads the CPU backends of a llama.cpp built with
// dynamically loaded backends (the prebuilt libraries) and routes
// llama.cpp's log: errors and warnings to stderr prefixed with `tag`, and
// everything when `verbose`. Later calls change only `verbose`.
void init(std::string_view tag, bool verbose);
// Which llama.cpp this binary uses: "80fb11a prebuilt x86-64 CPU" and the like.
std::string_view build_info();
// The devices ggml found ("CPU", "CUDA0 (NVIDIA H100 80GB HBM3)").
std::vector<std::string> devices();

struct ModelOptions {
  std::string path;
  int gpu_layers = 0;  // layers on the GPU (-1: all); 0 on a CPU-only build
};

class Model {
 public:
  // EINVAL/ENOENT/EACCES naming the file: missing, unreadable, not GGUF, or
  // refused by llama.cpp (with its reason).
  static base::Result<std::unique_ptr<Model>> load(const ModelOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  llama_model* get() const { return model_; }
  const std::string& path() const { return path_; }
  const llama_vocab* vocab() const { return vocab_; }
  std::string description() const;  // "llama 36M F16", llama_model_desc
  std::uint32_t n_vocab() const;
  std::uint32_t n_ctx_train() const;
  std::uint32_t n_layer() const;
  // Device bytes of one token's KV (K and V, every layer) in an f16 cache.
  std::size_t kv_bytes_per_token() const { return kv_bytes_per_token_; }

  // Token ids of `text`, with the vocabulary's BOS when it adds one.
  base::Result<std::vector<Token>> tokenize(std::string_view text) const;
  // One token's text (bytes; a byte-level vocabulary's token may be part of
  // a UTF-8 sequence).
  std::string piece(Token t) const;
  bool is_eog(Token t) const;

 private:
  Model(llama_model* model, std::string path, std::size_t kv_bytes_per_token);
  llama_model* model_;
  std::string path_;
  const llama_vocab* vocab_;
  std::size_t kv_bytes_per_token_;
};

struct ContextOptions {
  std::uint32_t n_ctx = 16384;    // KV cells (tokens) of the unified cache
  std::uint32_t n_batch = 2048;   // tokens per llama_decode
  std::uint32_t n_ubatch = 512;   // tokens per compute graph
  std::uint32_t n_seq_max = 256;  // sequences (llama.cpp's maximum is 256)
  int threads = 0;                // CPU threads; 0: every CPU this process may run on
};

// One batch of tokens for llama_decode. Thread-safety: one thread.
class Batch {
 public:
  explicit Batch(std::uint32_t capacity);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  void clear();
  // Appends token `t` at position `pos` of sequence `seq`; `logits` asks for
  // its output row. Returns its index in the batch, or -1 when full.
  int add(Token t, std::int32_t pos, SeqId seq, bool logits);
  std::uint32_t size() const;
  std::uint32_t capacity() const { return capacity_; }
  struct Raw;
  Raw& raw() { return *raw_; }

 private:
  std::uint32_t capacity_;
  std::unique_ptr<Raw> raw_;
};

class Context {
 public:
  // EINVAL naming the option llama.cpp refused; ENOMEM when the cache does
  // not fit.
  static base::Result<std::unique_ptr<Context>> create(const Model& model, const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  llama_context* get() const { return ctx_; }
  const Model& model() const { return model_; }
  std::uint32_t n_ctx() const;
  std::uint32_t n_seq_max() const;
  std::uint32_t n_batch() const;
  int threads() const;

  // llama_decode: 0 ok; 1 no KV slot; 2 aborted; < 0 error.
  int decode(Batch& batch);
  // Waits for the device (the CUDA backend runs asynchronously).
  void synchronize();

  // The sequence's positions [p0, p1) removed (p1 < 0: to the end).
  bool seq_rm(SeqId seq, std::int32_t p0, std::int32_t p1 = -1);
  // Its lowest and highest position, -1 when empty.
  std::int32_t seq_pos_min(SeqId seq) const;
  std::int32_t seq_pos_max(SeqId seq) const;
  // Cells in use, from llama.cpp's own per-sequence positions:
  // Σ (pos_max − pos_min + 1) over sequences [0, n_seq). Exact while no two
  // sequences share a cell (tandem-llama never copies sequences).
  std::uint64_t cells_used(SeqId n_seq) const;

  // The sequence's KV state into `out` (resized); false on failure.
  bool state_get(SeqId seq, std::vector<std::uint8_t>& out);
  // Restores a state from state_get into `seq` (emptied first); false when
  // it does not fit (no free cells) or is not a state.
  bool state_set(SeqId seq, std::span<const std::uint8_t> state);

  // The logits row of batch index `i` of the last decode.
  const float* logits(int i) const;

 private:
  Context(const Model& model, llama_context* ctx);
  const Model& model_;
  llama_context* ctx_;
};

// A token sampler: greedy at temperature 0, else temperature then a seeded
// draw. Thread-safety: one thread.
class Sampler {
 public:
  Sampler(double temperature, std::uint64_t seed);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  Token sample(Context& ctx, int batch_index);

 private:
  llama_sampler* chain_;
};

}  // namespace tandem::llama
