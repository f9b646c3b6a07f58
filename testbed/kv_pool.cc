// The KV block pool: block ids per session and place, filler writes, host copies.
#include "testbed/kv_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

namespace tandem::testbed {
namespace {

constexpr std::size_t kMaxPoolBytes = std::size_t{1} << 40;

std::size_t index(KvPlace p) { return static_cast<std::size_t>(p); }

}  // namespace

base::Result<std::unique_ptr<BlockPool>> BlockPool::create(std::uint32_t total_blocks, std::uint32_t block_size,
                                                           std::size_t block_bytes) {
  if (total_blocks == 0 || block_size == 0) return base::make_error(EINVAL, "KV pool: no blocks");
  if (block_bytes < block_size) {
    return base::make_error(EINVAL, "KV pool: a block of " + std::to_string(block_bytes) + " bytes cannot hold " +
                                        std::to_string(block_size) + " tokens");
  }
  const std::size_t bytes = static_cast<std::size_t>(total_blocks) * block_bytes;
  if (bytes / block_bytes != total_blocks || bytes > kMaxPoolBytes) {
    return base::make_error(EINVAL, "KV pool: " + std::to_string(total_blocks) + " blocks of " +
                                        std::to_string(block_bytes) + " bytes is more than 1 TiB");
  }
  // Private anonymous memory: pages cost nothing until a step writes them.
  auto m = base::Mapping::map(-1, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
  if (!m) return std::unexpected(std::move(m.error()).wrap("KV pool"));
  return std::unique_ptr<BlockPool>(new BlockPool(std::move(*m), total_blocks, block_size, block_bytes));
}

BlockPool::BlockPool(base::Mapping memory, std::uint32_t total_blocks, std::uint32_t block_size,
                     std::size_t block_bytes)
    : memory_(std::move(memory)),
      total_(total_blocks),
      block_size_(block_size),
      block_bytes_(block_bytes),
      slot_bytes_(block_bytes / block_size),
      touched_(total_blocks, false) {
  // A stack handing out low ids first.
  free_.reserve(total_blocks);
  for (std::uint32_t i = total_blocks; i > 0; --i) free_.push_back(i - 1);
  count_[index(KvPlace::kFree)] = total_blocks;
}

void BlockPool::moved(SessionId session, KvPlace from, KvPlace to, std::uint32_t blocks) {
  if (blocks == 0 || from == to) return;
  SessionBlocks& s = sessions_[session];
  std::vector<std::uint32_t> ids;
  ids.reserve(blocks);
  if (from == KvPlace::kFree) {
    const std::uint32_t n = std::min<std::uint32_t>(blocks, static_cast<std::uint32_t>(free_.size()));
    if (n < blocks) ++errors_;
    ids.assign(free_.end() - n, free_.end());
    std::reverse(ids.begin(), ids.end());
    free_.resize(free_.size() - n);
  } else {
    std::vector<std::uint32_t>& src = s.place[index(from)];
    const std::uint32_t n = std::min<std::uint32_t>(blocks, static_cast<std::uint32_t>(src.size()));
    if (n < blocks) ++errors_;
    if (to == KvPlace::kFree) {
      // Freed KV leaves from the tail (the partial block, the end of a prefix).
      ids.assign(src.end() - n, src.end());
      src.resize(src.size() - n);
    } else {
      ids.assign(src.begin(), src.begin() + n);
      src.erase(src.begin(), src.begin() + n);
    }
  }
  const auto n = static_cast<std::uint32_t>(ids.size());
  count_[index(from)] -= n;
  count_[index(to)] += n;
  if (to == KvPlace::kFree) {
    free_.insert(free_.end(), ids.rbegin(), ids.rend());
    return;
  }
  std::vector<std::uint32_t>& dst = s.place[index(to)];
  const std::size_t first = dst.size();
  dst.insert(dst.end(), ids.begin(), ids.end());
  if (to == KvPlace::kOffloading) {
    // The copy to host memory: block i of the session's KV to host block i.
    const std::size_t want = dst.size() * block_bytes_;
    if (s.host.size() < want) {
      host_total_ += static_cast<std::uint32_t>((want - s.host.size()) / block_bytes_);
      s.host.resize(want);
    }
    for (std::size_t i = first; i < dst.size(); ++i) {
      std::memcpy(s.host.data() + i * block_bytes_, block(dst[i]), block_bytes_);
      offloaded_bytes_ += block_bytes_;
    }
  }
}

std::uint64_t BlockPool::pattern(SessionId s, std::uint32_t token) const {
  // Distinct per session and token, never zero (untouched memory reads zero).
  return (s * 0x9E3779B97F4A7C15ULL) ^ (static_cast<std::uint64_t>(token) << 1) ^ 1ULL;
}

void BlockPool::touch(std::uint32_t id) {
  if (!touched_[id]) {
    touched_[id] = true;
    ++touched_blocks_;
  }
}

void BlockPool::computed(SessionId session, std::uint32_t first_token, std::uint32_t tokens, bool /*samples*/) {
  auto it = sessions_.find(session);
  const std::vector<std::uint32_t>* held = it == sessions_.end() ? nullptr : &it->second.place[index(KvPlace::kHeld)];
  for (std::uint32_t t = first_token; t < first_token + tokens; ++t) {
    const std::uint32_t b = t / block_size_;
    if (held == nullptr || b >= held->size()) {
      ++errors_;
      return;
    }
    const std::uint32_t id = (*held)[b];
    touch(id);
    std::byte* slot = block(id) + slot_offset(t);
    const std::uint64_t v = pattern(session, t);
    for (std::size_t off = 0; off < slot_bytes_; off += sizeof v) {
      std::memcpy(slot + off, &v, std::min(sizeof v, slot_bytes_ - off));
    }
  }
}

void BlockPool::reloaded(SessionId session, std::uint32_t first_token, std::uint32_t tokens) {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || tokens == 0) {
    ++errors_;
    return;
  }
  SessionBlocks& s = it->second;
  const std::vector<std::uint32_t>& held = s.place[index(KvPlace::kHeld)];
  const std::uint32_t first = first_token / block_size_;
  const std::uint32_t end = (first_token + tokens + block_size_ - 1) / block_size_;
  for (std::uint32_t b = first; b < end; ++b) {
    if (b >= held.size() || (b + 1) * block_bytes_ > s.host.size()) {
      ++errors_;
      return;
    }
    touch(held[b]);
    std::memcpy(block(held[b]), s.host.data() + b * block_bytes_, block_bytes_);
    reloaded_bytes_ += block_bytes_;
  }
}

PoolOccupancy BlockPool::occupancy() const {
  PoolOccupancy o;
  o.total = total_;
  o.free = count_[index(KvPlace::kFree)];
  o.held = count_[index(KvPlace::kHeld)];
  o.pinned = count_[index(KvPlace::kPinned)];
  o.cached = count_[index(KvPlace::kCached)];
  o.offloading = count_[index(KvPlace::kOffloading)];
  o.host_blocks = host_total_;
  o.touched_bytes = touched_blocks_ * block_bytes_;
  o.offloaded_bytes = offloaded_bytes_;
  o.reloaded_bytes = reloaded_bytes_;
  return o;
}

std::uint32_t BlockPool::blocks(SessionId session, KvPlace place) const {
  if (place == KvPlace::kFree) return count_[index(place)];
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : static_cast<std::uint32_t>(it->second.place[index(place)].size());
}

std::uint32_t BlockPool::host_blocks(SessionId session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : static_cast<std::uint32_t>(it->second.host.size() / block_bytes_);
}

void BlockPool::trim_host(SessionId session, std::uint32_t blocks) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  std::vector<std::byte>& host = it->second.host;
  const std::size_t keep = static_cast<std::size_t>(blocks) * block_bytes_;
  if (host.size() <= keep) return;
  host_total_ -= static_cast<std::uint32_t>((host.size() - keep) / block_bytes_);
  host.resize(keep);
  if (keep == 0) host.shrink_to_fit();
}

void BlockPool::forget(SessionId session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  for (std::size_t p = 1; p < 5; ++p) {
    if (!it->second.place[p].empty()) return;  // still holds KV: keep it
  }
  host_total_ -= static_cast<std::uint32_t>(it->second.host.size() / block_bytes_);
  sessions_.erase(it);
}

bool BlockPool::holds_tokens(SessionId session, KvPlace place, std::uint32_t tokens) const {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || place == KvPlace::kFree) return tokens == 0;
  const std::vector<std::uint32_t>& ids = it->second.place[index(place)];
  for (std::uint32_t t = 0; t < tokens; ++t) {
    const std::uint32_t b = t / block_size_;
    if (b >= ids.size()) return false;
    const std::byte* slot = block(ids[b]) + slot_offset(t);
    const std::uint64_t v = pattern(session, t);
    for (std::size_t off = 0; off < slot_bytes_; off += sizeof v) {
      if (std::memcmp(slot + off, &v, std::min(sizeof v, slot_bytes_ - off)) != 0) return false;
    }
  }
  return true;
}

}  // namespace tandem::testbed
