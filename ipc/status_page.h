// StatusPage: a seqlock-protected snapshot one side writes and the other reads.
//
// The daemon publishes per-engine state that changes rarely and is read often
// (admission window, SM-partition index, offload plan, policy epoch) without a
// message per change. The writer bumps `seq` to odd, writes the payload, bumps
// it to even; a reader retries until it sees the same even `seq` before and
// after copying. Payload words are relaxed atomics, so a torn read is retried,
// never undefined. The writer keeps its sequence privately; the reader bounds
// its retries, so a writer that stalls (or scribbles) mid-update costs the
// reader EAGAIN, never a hang.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <fmt/format.h>

#include "base/result.h"
#include "ipc/abi.h"
#include "ipc/spsc_ring.h"

namespace tandem::ipc {

template <class T>
concept StatusPayload = std::is_trivially_copyable_v<T> && sizeof(T) % 8 == 0 && sizeof(T) <= 4096;

namespace detail {

struct StatusView {
  StatusControl* control = nullptr;
  std::uint64_t* words = nullptr;
};

inline base::Result<StatusView> view_status(std::span<std::byte> region, std::size_t payload) {
  if (region.size() < status_region_size(static_cast<std::uint32_t>(payload))) {
    return base::make_error(
        EINVAL, fmt::format("status page: region of {} bytes cannot hold a {}-byte payload", region.size(), payload));
  }
  if (reinterpret_cast<std::uintptr_t>(region.data()) % kIndexAlign != 0) {
    return base::make_error(EINVAL, "status page: region is not 128-byte aligned");
  }
  return StatusView{reinterpret_cast<StatusControl*>(region.data()),
                    reinterpret_cast<std::uint64_t*>(region.data() + sizeof(StatusControl))};
}

}  // namespace detail

// Thread-safety: one writer thread.
template <StatusPayload T>
class StatusWriter {
 public:
  StatusWriter() = default;

  static base::Result<StatusWriter> attach(std::span<std::byte> region) {
    auto view = detail::view_status(region, sizeof(T));
    if (!view) return base::propagate(std::move(view.error()));
    StatusWriter w;
    w.view_ = *view;
    // Start from an even number past whatever is there, so readers that
    // already hold a sequence see a change.
    std::uint32_t seq = std::atomic_ref<std::uint32_t>(view->control->seq).load(std::memory_order_relaxed);
    w.seq_ = (seq + 1) & ~1u;
    return w;
  }

  void publish(const T& value) {
    auto words = std::bit_cast<std::array<std::uint64_t, kWords>>(value);
    std::atomic_ref<std::uint32_t> seq(view_.control->seq);
    seq.store(seq_ + 1, std::memory_order_relaxed);
    // SYNC: release fence orders the odd seq store above before the payload
    // stores below. Pairs with the reader's acquire fence: a reader that saw
    // any new payload word re-reads seq as odd or newer and retries.
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t i = 0; i < kWords; ++i) {
      std::atomic_ref<std::uint64_t>(view_.words[i]).store(words[i], std::memory_order_relaxed);
    }
    seq_ += 2;
    // SYNC: release publishes the payload. Pairs with the reader's acquire
    // load of seq at the start of read().
    seq.store(seq_, std::memory_order_release);
  }

  // The sequence of the last publish (even; 0 before the first).
  std::uint32_t sequence() const { return seq_; }

 private:
  static constexpr std::size_t kWords = sizeof(T) / 8;
  detail::StatusView view_;
  std::uint32_t seq_ = 0;  // private: never trusted from shared memory
};

// Thread-safety: one reader thread per StatusReader.
template <StatusPayload T>
class StatusReader {
 public:
  static constexpr unsigned kDefaultAttempts = 1000;

  StatusReader() = default;

  static base::Result<StatusReader> attach(std::span<std::byte> region) {
    auto view = detail::view_status(region, sizeof(T));
    if (!view) return base::propagate(std::move(view.error()));
    StatusReader r;
    r.view_ = *view;
    return r;
  }

  // A consistent snapshot, or EAGAIN if `attempts` tries all raced a writer.
  base::Result<T> read(unsigned attempts = kDefaultAttempts) const {
    std::atomic_ref<std::uint32_t> seq(view_.control->seq);
    std::array<std::uint64_t, kWords> words;
    for (unsigned i = 0; i < attempts; ++i) {
      // SYNC: acquire pairs with the writer's final release store of seq.
      std::uint32_t before = seq.load(std::memory_order_acquire);
      if (before & 1u) {
        detail::cpu_relax();
        continue;
      }
      for (std::size_t w = 0; w < kWords; ++w) {
        words[w] = std::atomic_ref<std::uint64_t>(view_.words[w]).load(std::memory_order_relaxed);
      }
      // SYNC: acquire fence pairs with the writer's release fence after its odd
      // store: if we read a word from an update in progress, the seq load below
      // sees that update's odd (or a later) value.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (seq.load(std::memory_order_relaxed) == before) return std::bit_cast<T>(words);
    }
    return base::make_error(EAGAIN, fmt::format("status page: no consistent snapshot in {} attempts", attempts));
  }

  // The current sequence: cheap change detection without copying the payload.
  std::uint32_t sequence() const {
    // SYNC: acquire pairs with the writer's release store of seq.
    return std::atomic_ref<std::uint32_t>(view_.control->seq).load(std::memory_order_acquire);
  }

 private:
  static constexpr std::size_t kWords = sizeof(T) / 8;
  detail::StatusView view_;
};

}  // namespace tandem::ipc
