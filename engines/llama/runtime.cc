// llama.cpp behind small owning types.
#include "engines/llama/runtime.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/core.h>
#include <ggml-backend.h>
#include <llama.h>

#include "base/unique_fd.h"

#ifndef TANDEM_LLAMA_BACKEND_DIR
#define TANDEM_LLAMA_BACKEND_DIR ""
#endif
#ifndef TANDEM_LLAMA_BUILD
#define TANDEM_LLAMA_BUILD "unknown"
#endif

namespace tandem::llama {
namespace {

std::atomic<bool> g_verbose{false};
// What the log callback uses. Never destroyed: llama.cpp's CUDA backend logs
// from static destructors, after a program's statics may be gone (seen as a
// garbage tag at exit on an H200).
struct LogState {
  std::string tag = "llama";
  std::mutex errors_mu;
  std::string errors;  // llama.cpp's error lines since the last take_errors(), for load failures
};
LogState& log_state() {
  static auto* state = new LogState;  // NOLINT(cppcoreguidelines-owning-memory): deliberately leaked
  return *state;
}

void log_cb(ggml_log_level level, const char* text, void* /*user*/) {
  if (text == nullptr) return;
  const bool error = level == GGML_LOG_LEVEL_ERROR;
  if (error) {
    std::lock_guard lock(log_state().errors_mu);
    if (log_state().errors.size() < 4096) log_state().errors += text;
  }
  if (error || level == GGML_LOG_LEVEL_WARN || g_verbose.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "%s: %s", log_state().tag.c_str(), text);
  }
}

std::string take_errors() {
  std::lock_guard lock(log_state().errors_mu);
  std::string e;
  e.swap(log_state().errors);
  while (!e.empty() && (e.back() == '\n' || e.back() == ' ')) e.pop_back();
  for (char& c : e) {
    if (c == '\n') c = ';';
  }
  return e;
}

int cpus_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)) > 0 ? static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) : 1;
}

std::string meta(const llama_model* m, const std::string& key) {
  char buf[256];
  const int n = llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1)) : std::string();
}

}  // namespace

void init(std::string_view tag, bool verbose) {
  static std::once_flag once;
  g_verbose.store(verbose, std::memory_order_relaxed);
  std::call_once(once, [&] {
    log_state().tag = std::string(tag);
    llama_log_set(log_cb, nullptr);
    // The prebuilt libraries load their backends (CPU variants, CUDA) as
    // modules from a folder: $TANDEM_LLAMA_BACKEND_DIR, else the one the
    // build found them in. A source build links its backends in ("").
    const char* env = std::getenv("TANDEM_LLAMA_BACKEND_DIR");
    const char* dir = env != nullptr && *env != '\0' ? env : TANDEM_LLAMA_BACKEND_DIR;
    if (std::strlen(dir) > 0) ggml_backend_load_all_from_path(dir);
    llama_backend_init();
  });
}

std::string_view build_info() { return TANDEM_LLAMA_BUILD; }

std::vector<std::string> devices() {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t d = ggml_backend_dev_get(i);
    const char* desc = ggml_backend_dev_description(d);
    out.push_back(fmt::format("{} ({})", ggml_backend_dev_name(d), desc != nullptr ? desc : ""));
  }
  return out;
}

// ---- Model ----------------------------------------------------------------------

base::Result<std::unique_ptr<Model>> Model::load(const ModelOptions& options) {
  const std::string& path = options.path;
  if (path.empty()) return base::make_error(EINVAL, "no model file given (--model PATH)");
  {
    base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return base::make_error(errno, fmt::format("{}: {}", path, std::strerror(errno)));
    unsigned char head[8];
    const ssize_t n = ::read(fd.get(), head, sizeof head);
    if (n != static_cast<ssize_t>(sizeof head) || std::memcmp(head, "GGUF", 4) != 0) {
      return base::make_error(EINVAL, fmt::format("{}: not a GGUF model file (no GGUF magic)", path));
    }
    std::uint32_t version = 0;
    std::memcpy(&version, head + 4, sizeof version);
    if (version < 2 || version > 3) {
      return base::make_error(EINVAL, fmt::format("{}: GGUF version {} (llama.cpp reads 2 and 3)", path, version));
    }
  }
  if (options.gpu_layers != 0) {
    // llama.cpp would quietly run every layer on the CPU instead.
    bool gpu = false;
    for (std::size_t i = 0; i < ggml_backend_dev_count(); ++i) {
      const auto type = ggml_backend_dev_type(ggml_backend_dev_get(i));
      gpu = gpu || type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
    }
    if (!gpu) {
      return base::make_error(ENODEV, fmt::format("{} layers asked for on a GPU, but llama.cpp has no GPU backend "
                                                  "(this build: {}; a prebuilt CUDA backend is libggml-cuda.so in "
                                                  "$TANDEM_LLAMA_BACKEND_DIR, and needs the NVIDIA driver)",
                                                  options.gpu_layers, TANDEM_LLAMA_BUILD));
    }
  }
  llama_model_params p = llama_model_default_params();
  p.n_gpu_layers = options.gpu_layers;
  take_errors();
  llama_model* m = llama_model_load_from_file(path.c_str(), p);
  if (m == nullptr) {
    const std::string why = take_errors();
    return base::make_error(
        EINVAL, fmt::format("{}: llama.cpp cannot load it: {}", path, why.empty() ? "no reason given" : why));
  }
  // K and V per layer: head_count_kv × key/value length, f16.
  const std::string arch = meta(m, "general.architecture");
  const auto n_head = static_cast<std::size_t>(std::max(1, llama_model_n_head(m)));
  const auto n_head_kv = static_cast<std::size_t>(std::max(1, llama_model_n_head_kv(m)));
  std::size_t k_len = static_cast<std::size_t>(llama_model_n_embd(m)) / n_head;
  std::size_t v_len = k_len;
  if (const std::string k = meta(m, arch + ".attention.key_length"); !k.empty()) k_len = std::stoul(k);
  if (const std::string v = meta(m, arch + ".attention.value_length"); !v.empty()) v_len = std::stoul(v);
  const std::size_t per_token = static_cast<std::size_t>(llama_model_n_layer(m)) * n_head_kv * (k_len + v_len) * 2;
  return std::unique_ptr<Model>(new Model(m, path, per_token));
}

Model::Model(llama_model* model, std::string path, std::size_t kv_bytes_per_token)
    : model_(model),
      path_(std::move(path)),
      vocab_(llama_model_get_vocab(model)),
      kv_bytes_per_token_(kv_bytes_per_token) {}

Model::~Model() { llama_model_free(model_); }

std::string Model::description() const {
  char buf[128];
  llama_model_desc(model_, buf, sizeof buf);
  return buf;
}

std::uint32_t Model::n_vocab() const { return static_cast<std::uint32_t>(llama_vocab_n_tokens(vocab_)); }
std::uint32_t Model::n_ctx_train() const { return static_cast<std::uint32_t>(llama_model_n_ctx_train(model_)); }
std::uint32_t Model::n_layer() const { return static_cast<std::uint32_t>(llama_model_n_layer(model_)); }

base::Result<std::vector<Token>> Model::tokenize(std::string_view text) const {
  if (text.size() > static_cast<std::size_t>(INT32_MAX) / 2) return base::make_error(E2BIG, "the text is too long");
  const auto len = static_cast<std::int32_t>(text.size());
  std::vector<Token> out(text.size() + 2);
  // llama_tokenize takes the text's length (`len`): no terminator needed.
  const auto tokenize = [&] {
    return llama_tokenize(vocab_, text.data(), len,  // NOLINT(bugprone-suspicious-stringview-data-usage)
                          out.data(), static_cast<std::int32_t>(out.size()),
                          /*add_special=*/true, /*parse_special=*/false);
  };
  std::int32_t n = tokenize();
  if (n < 0) {
    out.resize(static_cast<std::size_t>(-n));
    n = tokenize();
  }
  if (n < 0) return base::make_error(EINVAL, "llama_tokenize failed");
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string Model::piece(Token t) const {
  char buf[256];
  const std::int32_t n = llama_token_to_piece(vocab_, t, buf, sizeof buf, 0, /*special=*/false);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

bool Model::is_eog(Token t) const { return llama_vocab_is_eog(vocab_, t); }

// ---- Batch ----------------------------------------------------------------------

struct Batch::Raw {
  llama_batch b;
};

Batch::Batch(std::uint32_t capacity)
    : capacity_(capacity), raw_(new Raw{llama_batch_init(static_cast<std::int32_t>(capacity), 0, 1)}) {}

Batch::~Batch() { llama_batch_free(raw_->b); }

void Batch::clear() { raw_->b.n_tokens = 0; }

int Batch::add(Token t, std::int32_t pos, SeqId seq, bool logits) {
  llama_batch& b = raw_->b;
  if (static_cast<std::uint32_t>(b.n_tokens) >= capacity_) return -1;
  const int i = b.n_tokens++;
  b.token[i] = t;
  b.pos[i] = pos;
  b.n_seq_id[i] = 1;
  b.seq_id[i][0] = seq;
  b.logits[i] = logits ? 1 : 0;
  return i;
}

std::uint32_t Batch::size() const { return static_cast<std::uint32_t>(raw_->b.n_tokens); }

// ---- Context --------------------------------------------------------------------

base::Result<std::unique_ptr<Context>> Context::create(const Model& model, const ContextOptions& o) {
  if (o.n_seq_max == 0 || o.n_seq_max > llama_max_parallel_sequences()) {
    return base::make_error(
        EINVAL, fmt::format("{} sequences: llama.cpp takes 1 to {}", o.n_seq_max, llama_max_parallel_sequences()));
  }
  if (o.n_ctx == 0 || o.n_batch == 0 || o.n_ubatch == 0) {
    return base::make_error(EINVAL, "the context, batch and micro-batch sizes must be positive");
  }
  llama_context_params p = llama_context_default_params();
  p.n_ctx = o.n_ctx;
  p.n_batch = o.n_batch;
  p.n_ubatch = std::min(o.n_ubatch, o.n_batch);
  p.n_seq_max = o.n_seq_max;
  p.kv_unified = true;  // one sequence may use the whole cache
  const int threads = o.threads > 0 ? o.threads : cpus_allowed();
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.no_perf = true;
  take_errors();
  llama_context* ctx = llama_init_from_model(model.get(), p);
  if (ctx == nullptr) {
    const std::string why = take_errors();
    return base::make_error(ENOMEM, fmt::format("llama.cpp cannot create a context of {} cells: {}", o.n_ctx,
                                                why.empty() ? "no reason given" : why));
  }
  return std::unique_ptr<Context>(new Context(model, ctx));
}

Context::Context(const Model& model, llama_context* ctx) : model_(model), ctx_(ctx) {}

Context::~Context() { llama_free(ctx_); }

std::uint32_t Context::n_ctx() const { return llama_n_ctx(ctx_); }
std::uint32_t Context::n_seq_max() const { return llama_n_seq_max(ctx_); }
std::uint32_t Context::n_batch() const { return llama_n_batch(ctx_); }
int Context::threads() const { return llama_n_threads(ctx_); }

int Context::decode(Batch& batch) { return llama_decode(ctx_, batch.raw().b); }

void Context::synchronize() { llama_synchronize(ctx_); }

bool Context::seq_rm(SeqId seq, std::int32_t p0, std::int32_t p1) {
  return llama_memory_seq_rm(llama_get_memory(ctx_), seq, p0, p1);
}

std::int32_t Context::seq_pos_min(SeqId seq) const { return llama_memory_seq_pos_min(llama_get_memory(ctx_), seq); }
std::int32_t Context::seq_pos_max(SeqId seq) const { return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq); }

std::uint64_t Context::cells_used(SeqId n_seq) const {
  std::uint64_t used = 0;
  for (SeqId s = 0; s < n_seq; ++s) {
    const std::int32_t lo = seq_pos_min(s);
    const std::int32_t hi = seq_pos_max(s);
    if (lo >= 0 && hi >= lo) used += static_cast<std::uint64_t>(hi - lo + 1);
  }
  return used;
}

bool Context::state_get(SeqId seq, std::vector<std::uint8_t>& out) {
  const std::size_t size = llama_state_seq_get_size(ctx_, seq);
  out.resize(size);
  return size > 0 && llama_state_seq_get_data(ctx_, out.data(), out.size(), seq) == size;
}

bool Context::state_set(SeqId seq, std::span<const std::uint8_t> state) {
  seq_rm(seq, -1, -1);
  return llama_state_seq_set_data(ctx_, state.data(), state.size(), seq) != 0;
}

const float* Context::logits(int i) const { return llama_get_logits_ith(ctx_, i); }

// ---- Sampler --------------------------------------------------------------------

Sampler::Sampler(double temperature, std::uint64_t seed)
    : chain_(llama_sampler_chain_init(llama_sampler_chain_default_params())) {
  if (temperature <= 0.0) {
    llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
  } else {
    llama_sampler_chain_add(chain_, llama_sampler_init_temp(static_cast<float>(temperature)));
    llama_sampler_chain_add(chain_, llama_sampler_init_dist(static_cast<std::uint32_t>(seed ^ (seed >> 32))));
  }
}

Sampler::~Sampler() { llama_sampler_free(chain_); }

Token Sampler::sample(Context& ctx, int batch_index) { return llama_sampler_sample(chain_, ctx.get(), batch_index); }

}  // namespace tandem::llama
