// GpuTelemetry (daemon/gpu_telemetry.h): the NVML sampling thread, pid
// attribution, and the JSON and Prometheus views of its latest sample.
#include "daemon/gpu_telemetry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "base/unique_fd.h"

namespace tandem::daemon {
namespace {

using nlohmann::json;

template <class T>
json optional_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// <proc_root>/<pid>/stat, or "" when it cannot be read (the process is gone).
std::string read_stat(const std::string& proc_root, pid_t pid) {
  const std::string path = fmt::format("{}/{}/stat", proc_root, pid);
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return {};
  char buf[1024];
  ssize_t n = 0;
  do {
    n = ::read(fd.get(), buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

// ---- pid attribution -----------------------------------------------------------

std::optional<pid_t> parse_stat_ppid(std::string_view stat) {
  // "pid (comm) S ppid …": comm may hold spaces and parentheses, so the
  // fields resume after its last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = stat.substr(close + 1);
  auto field = [&rest]() -> std::string_view {
    const auto b = rest.find_first_not_of(' ');
    if (b == std::string_view::npos) return {};
    rest.remove_prefix(b);
    const auto e = rest.find(' ');
    std::string_view f = rest.substr(0, e);
    rest.remove_prefix(e == std::string_view::npos ? rest.size() : e);
    return f;
  };
  const std::string_view state = field();
  if (state.size() != 1) return std::nullopt;
  auto ppid = base::parse_int<pid_t>(field());
  if (!ppid || *ppid < 0) return std::nullopt;
  return *ppid;
}

const GpuClient* PidAttribution::find(pid_t pid) const {
  for (int depth = 0; pid > 0 && depth <= kMaxDepth; ++depth) {
    if (auto it = clients_.find(pid); it != clients_.end()) return &it->second;
    if (clients_.empty()) return nullptr;
    auto ppid = parse_stat_ppid(read_stat(proc_root_, pid));
    if (!ppid || *ppid == pid) return nullptr;
    pid = *ppid;  // 0 (the kernel) ends the walk
  }
  return nullptr;
}

// ---- the sampler -----------------------------------------------------------------

base::Result<std::unique_ptr<GpuTelemetry>> GpuTelemetry::start(const NvmlConfig& config) {
  std::unique_ptr<GpuTelemetry> t(new GpuTelemetry(config));
  Snapshot& s = t->shared_;
  s.enabled = config.enabled;
  s.library = config.library;
  s.interval = std::chrono::milliseconds(config.interval_ms);
  if (config.enabled == "off") {
    s.reason = "off in the configuration ([nvml] enabled = \"off\")";
    return t;
  }
  auto sampler = gpu::NvmlSampler::open(config.library);
  if (!sampler) {
    if (config.enabled == "on") return base::propagate(std::move(sampler.error()), "nvml");
    s.reason = sampler.error().context();
    spdlog::info("GPU telemetry off: {} ([nvml] enabled = \"off\" silences this)", s.reason);
    return t;
  }
  t->sampler_ = std::move(*sampler);
  s.available = true;
  spdlog::info("GPU telemetry: NVML from {}, {} device(s), sampled every {} ms", config.library,
               t->sampler_->device_count(), config.interval_ms);
  t->thread_ = std::thread([raw = t.get()] { raw->run(); });
  return t;
}

base::Result<std::unique_ptr<GpuTelemetry>> GpuTelemetry::prepare(const GpuTelemetry& running,
                                                                  const NvmlConfig& fresh) {
  const NvmlConfig& old = running.config_;
  if (fresh.enabled == old.enabled && fresh.library == old.library) return std::unique_ptr<GpuTelemetry>();
  return start(fresh);
}

GpuTelemetry::~GpuTelemetry() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuTelemetry::apply(const NvmlConfig& fresh) {
  config_.interval_ms = fresh.interval_ms;
  {
    std::lock_guard lock(mu_);
    shared_.interval = std::chrono::milliseconds(fresh.interval_ms);
  }
  wake_.notify_all();
}

GpuTelemetry::Snapshot GpuTelemetry::snapshot() const {
  std::lock_guard lock(mu_);
  return shared_;
}

void GpuTelemetry::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    // NVML runs without the lock: a snapshot never waits for a sample.
    const auto started = std::chrono::steady_clock::now();
    auto sample = sampler_->sample();
    lock.lock();
    if (sample) {
      shared_.sample = std::move(*sample);
      shared_.error.clear();
      ++shared_.samples;
    } else {
      shared_.error = sample.error().context();
      ++shared_.failures;
    }
    // Until the interval since the sample began is over: apply() wakes the
    // wait to look at a new interval, the destructor to stop.
    for (;;) {
      if (stop_) return;
      const auto due = started + shared_.interval;
      if (std::chrono::steady_clock::now() >= due) break;
      wake_.wait_until(lock, due);
    }
  }
}

// ---- views -----------------------------------------------------------------------

json gpu_json(const GpuTelemetry::Snapshot& snap, base::Time now, const PidAttribution& clients) {
  json j = {
      {"enabled", snap.enabled},
      {"library", snap.library},
      {"available", snap.available},
      {"reason", snap.available ? json(nullptr) : json(snap.reason)},
      {"interval_ms", snap.interval.count()},
      {"samples", snap.samples},
      {"sample_failures", snap.failures},
      {"error", snap.error.empty() ? json(nullptr) : json(snap.error)},
      {"age_s", snap.sample ? json(base::to_seconds(now - snap.sample->time)) : json(nullptr)},
  };
  json devices = json::array();
  if (snap.sample) {
    for (const gpu::NvmlDeviceSample& d : snap.sample->devices) {
      json processes = nullptr;
      if (d.processes) {
        processes = json::array();
        for (const gpu::NvmlProcess& p : *d.processes) {
          const GpuClient* c = clients.find(p.pid);
          processes.push_back({
              {"pid", p.pid},
              {"used_bytes", optional_json(p.used_bytes)},
              {"client", c != nullptr ? json(c->name) : json(nullptr)},
              {"client_id", c != nullptr ? json(c->id) : json(nullptr)},
              {"role", c != nullptr ? json(c->role) : json(nullptr)},
          });
        }
      }
      json errors = json::object();
      for (const auto& [field, why] : d.errors) errors[field] = why;
      devices.push_back({
          {"index", d.index},
          {"name", d.name},
          {"uuid", d.uuid},
          {"utilization_gpu_percent", optional_json(d.utilization_gpu_percent)},
          {"utilization_memory_percent", optional_json(d.utilization_memory_percent)},
          {"memory_total_bytes", optional_json(d.memory_total_bytes)},
          {"memory_used_bytes", optional_json(d.memory_used_bytes)},
          {"memory_free_bytes", optional_json(d.memory_free_bytes)},
          {"memory_reserved_bytes", optional_json(d.memory_reserved_bytes)},
          {"sm_clock_mhz", optional_json(d.sm_clock_mhz)},
          {"memory_clock_mhz", optional_json(d.memory_clock_mhz)},
          {"power_mw", optional_json(d.power_mw)},
          {"temperature_c", optional_json(d.temperature_c)},
          {"processes", processes},
          {"errors", errors},
      });
    }
  }
  j["devices"] = devices;
  return j;
}

void gpu_metrics(PromText& p, const GpuTelemetry::Snapshot& snap, const PidAttribution& clients) {
  const bool up = snap.available && snap.sample.has_value() && snap.error.empty();
  p.gauge("tandem_nvml_up", "1 when NVML is loaded and its latest sample succeeded", up ? 1 : 0);
  if (!snap.available) return;
  p.counter("tandem_nvml_sample_failures_total", "NVML samples that failed as a whole (device count unreadable)",
            static_cast<double>(snap.failures));
  if (!snap.sample) return;
  // Family by family, every GPU within each: the text format wants a
  // family's samples together.
  const std::vector<gpu::NvmlDeviceSample>& devices = snap.sample->devices;
  for (const gpu::NvmlDeviceSample& d : devices) {
    p.gauge("tandem_gpu_info", "each GPU's name and UUID (always 1)", 1,
            {{"gpu", std::to_string(d.index)}, {"name", d.name}, {"uuid", d.uuid}});
  }
  auto family = [&](const char* name, const char* help, auto field, double scale) {
    for (const gpu::NvmlDeviceSample& d : devices) {
      const auto& v = d.*field;
      if (v) p.gauge(name, help, static_cast<double>(*v) * scale, {{"gpu", std::to_string(d.index)}});
    }
  };
  using D = gpu::NvmlDeviceSample;
  family("tandem_gpu_utilization_ratio", "share of the last NVML sample period in which a kernel ran",
         &D::utilization_gpu_percent, 0.01);
  family("tandem_gpu_memory_utilization_ratio",
         "share of the last NVML sample period in which device memory was read or written",
         &D::utilization_memory_percent, 0.01);
  family("tandem_gpu_memory_used_bytes", "device memory allocated (with NVML v1, the driver's reserve included)",
         &D::memory_used_bytes, 1);
  family("tandem_gpu_memory_total_bytes", "device memory", &D::memory_total_bytes, 1);
  family("tandem_gpu_sm_clock_hz", "SM clock", &D::sm_clock_mhz, 1e6);
  family("tandem_gpu_memory_clock_hz", "memory clock", &D::memory_clock_mhz, 1e6);
  family("tandem_gpu_power_watts", "board power draw", &D::power_mw, 1e-3);
  family("tandem_gpu_temperature_celsius", "GPU die temperature", &D::temperature_c, 1);
  for (const gpu::NvmlDeviceSample& d : devices) {
    if (!d.processes) continue;
    for (const gpu::NvmlProcess& proc : *d.processes) {
      if (!proc.used_bytes) continue;
      const GpuClient* c = clients.find(proc.pid);
      p.gauge("tandem_gpu_process_memory_bytes",
              "device memory of each process on each GPU; client: the tandem client it belongs to, \"\" if none",
              static_cast<double>(*proc.used_bytes),
              {{"gpu", std::to_string(d.index)},
               {"pid", std::to_string(proc.pid)},
               {"client", c != nullptr ? c->name : ""}});
    }
  }
}

json gpu_status(const GpuTelemetry::Snapshot& snap) {
  json j = {{"enabled", snap.enabled}, {"available", snap.available}};
  if (!snap.available) {
    j["reason"] = snap.reason;
    return j;
  }
  j["devices"] = snap.sample ? json(snap.sample->devices.size()) : json(nullptr);
  j["samples"] = snap.samples;
  j["sample_failures"] = snap.failures;
  if (!snap.error.empty()) j["error"] = snap.error;
  return j;
}

}  // namespace tandem::daemon
