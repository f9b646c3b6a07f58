// `tandemctl gpu` (render.h): NVML's latest sample as the daemon reports it
// (daemon/gpu_telemetry.h, docs/tandemctl.md) — a line saying where it comes
// from, a table of devices, a table of GPU processes with the tandem client
// each belongs to, and the fields NVML could not read. Pure, and as lenient
// with the daemon's JSON as the other renderers: anything missing is "-".
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "ctl/render.h"

namespace tandem::ctl {
namespace {

using nlohmann::json;

std::optional<double> num(const json& object, std::string_view key) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// Bytes as GiB ("79.6G") or, below one, MiB ("512.0M").
std::string bytes_text(double b) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return b >= kGiB ? fmt::format("{:.1f}G", b / kGiB) : fmt::format("{:.1f}M", b / (1024.0 * 1024.0));
}

std::string bytes_cell(const json& object, std::string_view key) {
  auto v = num(object, key);
  return v ? bytes_text(*v) : std::string(kMissing);
}

// "USED/TOTAL" in GiB.
std::string memory_cell(const json& device) {
  auto used = num(device, "memory_used_bytes");
  auto total = num(device, "memory_total_bytes");
  if (!used && !total) return std::string(kMissing);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  auto part = [&](const std::optional<double>& v) {
    return v ? fmt::format("{:.1f}", *v / kGiB) : std::string(kMissing);
  };
  return fmt::format("{}/{}G", part(used), part(total));
}

std::string suffixed(const json& object, std::string_view key, std::string_view suffix, double scale = 1.0) {
  auto v = num(object, key);
  return v ? fmt::format("{:.0f}{}", *v * scale, suffix) : std::string(kMissing);
}

const json* devices_of(const json& reply) {
  if (!reply.is_object()) return nullptr;
  auto it = reply.find("devices");
  return it != reply.end() && it->is_array() ? &*it : nullptr;
}

}  // namespace

base::Result<Table> gpu_devices_table(const json& reply) {
  const json* devices = devices_of(reply);
  if (devices == nullptr) return base::make_error(EBADMSG, "gpu: the daemon's reply has no \"devices\" list");
  Table t;
  t.header = {"GPU", "NAME", "UTIL%", "MEM%", "MEMORY", "SM.MHZ", "MEM.MHZ", "POWER", "TEMP"};
  t.right_aligned = {true, false, true, true, true, true, true, true, true};
  for (const json& d : *devices) {
    t.rows.push_back({cell(d, "index"), cell(d, "name"), cell(d, "utilization_gpu_percent"),
                      cell(d, "utilization_memory_percent"), memory_cell(d), cell(d, "sm_clock_mhz"),
                      cell(d, "memory_clock_mhz"), suffixed(d, "power_mw", "W", 1e-3),
                      suffixed(d, "temperature_c", "C")});
  }
  return t;
}

base::Result<Table> gpu_processes_table(const json& reply) {
  const json* devices = devices_of(reply);
  if (devices == nullptr) return base::make_error(EBADMSG, "gpu: the daemon's reply has no \"devices\" list");
  Table t;
  t.header = {"GPU", "PID", "CLIENT", "ROLE", "MEMORY"};
  t.right_aligned = {true, true, false, false, true};
  for (const json& d : *devices) {
    if (!d.is_object()) continue;
    auto it = d.find("processes");
    if (it == d.end() || !it->is_array()) continue;
    for (const json& p : *it) {
      t.rows.push_back(
          {cell(d, "index"), cell(p, "pid"), cell(p, "client"), cell(p, "role"), bytes_cell(p, "used_bytes")});
    }
  }
  return t;
}

base::Result<std::string> render_gpu(const json& reply) {
  if (!reply.is_object()) return base::make_error(EBADMSG, "gpu: the daemon's reply is not an object");
  // No driver is a normal state for tandemd, not a failure of tandemctl.
  if (!reply.value("available", false)) {
    std::string why = cell(reply, "reason");
    return fmt::format("NVML: unavailable ({})\n", why == kMissing ? "the daemon did not say why" : why);
  }
  auto age = num(reply, "age_s");
  std::string out = fmt::format("NVML: {}, every {} ms", cell(reply, "library"), cell(reply, "interval_ms"));
  out += age ? fmt::format(", sampled {} ago\n", format_age(*age)) : std::string(": no sample yet\n");
  if (std::string error = cell(reply, "error"); error != kMissing) {
    out += fmt::format("latest sample failed: {}\n", error);
  }
  if (!age) return out;
  auto devices = gpu_devices_table(reply);
  if (!devices) return base::propagate(std::move(devices.error()));
  out += "\n" + format_table(*devices);
  auto processes = gpu_processes_table(reply);
  if (!processes) return base::propagate(std::move(processes.error()));
  out += "\n" + format_table(*processes);
  if (reply.value("truncated", false)) out += "(process lists left out: too many for one reply)\n";
  // What NVML could not read, per device and field.
  std::string errors;
  for (const json& d : *devices_of(reply)) {
    if (!d.is_object()) continue;
    auto it = d.find("errors");
    if (it == d.end() || !it->is_object()) continue;
    for (const auto& [field, why] : it->items()) {
      errors += fmt::format("  gpu {} {}: {}\n", cell(d, "index"), clean(field),
                            why.is_string() ? clean(why.get_ref<const std::string&>()) : std::string(kMissing));
    }
  }
  if (!errors.empty()) out += "\nnot read:\n" + errors;
  return out;
}

}  // namespace tandem::ctl
