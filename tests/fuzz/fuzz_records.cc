// Fuzz target: wire-record decoding. Every 64-byte chunk of the input is
// decoded in both directions; a record that decodes must re-encode to the
// identical bytes and expose consistent header fields.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ipc/records.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tandem::ipc;
  RecordDecoder up(Direction::kToDaemon);
  RecordDecoder down(Direction::kToClient);
  for (std::size_t off = 0; off + kSlotSize <= size; off += kSlotSize) {
    Slot raw;
    std::memcpy(&raw, data + off, kSlotSize);
    for (RecordDecoder* d : {&up, &down}) {
      Record rec;
      std::string_view problem;
      DecodeStatus s = d->decode(raw, rec, &problem);
      if (s == DecodeStatus::kOk) {
        if (std::memcmp(&rec.slot(), &raw, kSlotSize) != 0) __builtin_trap();
        if (rec.session() != raw.words[1]) __builtin_trap();
        if (record_type_name(rec.type()) == "UNKNOWN") __builtin_trap();
      } else if (problem.empty()) {
        __builtin_trap();  // every rejection names its problem
      }
    }
  }
  return 0;
}
