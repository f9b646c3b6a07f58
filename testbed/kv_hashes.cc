// The prefix cache's block hashes for routers (testbed/kv_hashes.h).
#include "testbed/kv_hashes.h"

#include <algorithm>
#include <utility>

namespace tandem::testbed {
namespace {

bool on_device(sim::KvPlace p) {
  return p == sim::KvPlace::kHeld || p == sim::KvPlace::kPinned || p == sim::KvPlace::kCached;
}

std::size_t common_prefix(const std::vector<std::uint64_t>& a, std::span<const std::uint64_t> b) {
  return static_cast<std::size_t>(std::ranges::mismatch(a, b).in1 - a.begin());
}

}  // namespace

void KvHashReporter::set_prompt(sim::SessionId session, std::vector<std::uint64_t> chain) {
  Hashes& h = hashes_[session];
  h.prompt = std::move(chain);
  h.forgotten = false;
}

void KvHashReporter::forget(sim::SessionId session) {
  auto it = hashes_.find(session);
  if (it == hashes_.end()) return;
  it->second.forgotten = true;
  it->second.prompt.clear();
  maybe_erase(session);
}

void KvHashReporter::kv_changed(sim::SessionId session, sched::KvChange change) {
  auto it = hashes_.find(session);
  if (it == hashes_.end()) return;
  Hashes& h = it->second;
  if (change == sched::KvChange::kOffloaded) {
    if (h.gpu.empty()) return;
    // A copy made before is replaced by this one.
    report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_GPU, h.gpu, std::nullopt);
    report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_CPU, h.cpu, std::nullopt);
    report(session, TANDEM_KV_BLOCKS_STORED, TANDEM_KV_MEDIUM_CPU, h.gpu, std::nullopt);
    h.cpu = std::move(h.gpu);
    h.gpu.clear();
  } else if (change == sched::KvChange::kDropped) {
    report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_GPU, h.gpu, std::nullopt);
    report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_CPU, h.cpu, std::nullopt);
    h.gpu.clear();
    h.cpu.clear();
    maybe_erase(session);
  }
  // EVICTED and RESTORED: moved() and reloaded() saw the blocks go and come.
}

void KvHashReporter::moved(sim::SessionId session, sim::KvPlace from, sim::KvPlace to, std::uint32_t blocks) {
  if (auto it = hashes_.find(session); it != hashes_.end() && from != to) {
    Hashes& h = it->second;
    if (on_device(from)) h.device_blocks -= std::min(blocks, h.device_blocks);
    if (on_device(to)) h.device_blocks += blocks;
    // Freed blocks leave from the tail of the session's KV (an offload's
    // are moved by kv_changed).
    if (on_device(from) && to == sim::KvPlace::kFree) {
      trim_gpu(session, h, h.device_blocks);
      maybe_erase(session);
    }
  }
  inner_.moved(session, from, to, blocks);
}

void KvHashReporter::computed(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool samples) {
  inner_.computed(session, first_token, tokens, samples);
  auto it = hashes_.find(session);
  if (it == hashes_.end() || block_size_ == 0) return;
  Hashes& h = it->second;
  const std::size_t full = std::min<std::size_t>((std::size_t{first_token} + tokens) / block_size_, h.prompt.size());
  const std::size_t common = common_prefix(h.gpu, h.prompt);
  if (full <= common) return;
  // The prompt diverged from what the device held: that tail was replaced.
  trim_gpu(session, h, common);
  const std::optional<std::uint64_t> parent = h.gpu.empty() ? std::nullopt : std::optional(h.gpu.back());
  report(session, TANDEM_KV_BLOCKS_STORED, TANDEM_KV_MEDIUM_GPU,
         std::span<const std::uint64_t>(h.prompt).subspan(h.gpu.size(), full - h.gpu.size()), parent);
  h.gpu.assign(h.prompt.begin(), h.prompt.begin() + static_cast<std::ptrdiff_t>(full));
}

void KvHashReporter::reloaded(sim::SessionId session, std::uint32_t first_token, std::uint32_t tokens) {
  inner_.reloaded(session, first_token, tokens);
  auto it = hashes_.find(session);
  if (it == hashes_.end() || it->second.cpu.empty() || block_size_ == 0) return;
  Hashes& h = it->second;
  const std::size_t n = std::min<std::size_t>((std::size_t{first_token} + tokens) / block_size_, h.cpu.size());
  if (n == 0) return;
  const std::vector<std::uint64_t> back(h.cpu.begin(), h.cpu.begin() + static_cast<std::ptrdiff_t>(n));
  report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_CPU, back, std::nullopt);
  trim_gpu(session, h, common_prefix(h.gpu, back));
  if (h.gpu.size() < n) {
    const std::optional<std::uint64_t> parent = h.gpu.empty() ? std::nullopt : std::optional(h.gpu.back());
    report(session, TANDEM_KV_BLOCKS_STORED, TANDEM_KV_MEDIUM_GPU,
           std::span<const std::uint64_t>(back).subspan(h.gpu.size()), parent);
    h.gpu = back;
  }
  h.cpu.erase(h.cpu.begin(), h.cpu.begin() + static_cast<std::ptrdiff_t>(n));
}

void KvHashReporter::trim_gpu(sim::SessionId session, Hashes& h, std::size_t keep) {
  if (keep >= h.gpu.size()) return;
  report(session, TANDEM_KV_BLOCKS_REMOVED, TANDEM_KV_MEDIUM_GPU, std::span<const std::uint64_t>(h.gpu).subspan(keep),
         std::nullopt);
  h.gpu.resize(keep);
}

void KvHashReporter::maybe_erase(sim::SessionId session) {
  auto it = hashes_.find(session);
  if (it == hashes_.end()) return;
  const Hashes& h = it->second;
  if (h.forgotten && h.gpu.empty() && h.cpu.empty()) hashes_.erase(it);
}

void KvHashReporter::report(sim::SessionId session, int op, int medium, std::span<const std::uint64_t> hashes,
                            std::optional<std::uint64_t> parent) {
  if (client_ == nullptr) return;
  for (std::size_t at = 0; at < hashes.size(); at += TANDEM_KV_BLOCKS_MAX) {
    tandem_kv_blocks b{};
    b.sz = sizeof b;
    b.op = op;
    b.medium = medium;
    b.hashes = hashes.data() + at;
    b.count = static_cast<std::uint32_t>(std::min<std::size_t>(TANDEM_KV_BLOCKS_MAX, hashes.size() - at));
    b.block_size = op == TANDEM_KV_BLOCKS_STORED ? block_size_ : 0;
    if (op == TANDEM_KV_BLOCKS_STORED && (at > 0 || parent)) {
      b.has_parent = 1;
      b.parent_hash = at > 0 ? hashes[at - 1] : *parent;
    }
    if (tandem_kv_blocks_report(client_, session, &b) != 0) ++report_errors_;
  }
}

}  // namespace tandem::testbed
