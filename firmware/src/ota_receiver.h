// The node's OTA state machine (docs/ota-protocol.md section 5). Pure logic over SlotManager
// and SignatureVerifier; tests/support/virtual_node.py:OtaReceiver is its Python mirror, and
// both run tests/vectors/ota_protocol.json.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "hardware.h"
#include "ota_codes.h"
#include "ota_descriptor.h"
#include "slots.h"

namespace tesla {

constexpr uint32_t kOtaProtocolVersion = 1;
constexpr uint32_t kMaxChunkSize = 360;

struct ReceiverProfile {
  const char* model_name;      // the model family this firmware runs
  uint32_t window_length;      // N it was built for
  uint32_t arena_bytes;        // its tensor arena
  const uint8_t* public_key;   // 32 bytes: the release key it trusts
};

struct OtaAnswer {
  uint8_t code;
  uint32_t next_seq;
};

class OtaReceiver {
 public:
  OtaReceiver(const ReceiverProfile& profile, SignatureVerifier& verifier, SlotManager& slots,
              uint32_t active_version);

  // Handles the fields of one O line (after parse_line). Returns true with the status to send,
  // or false for an accepted commit: the caller stages the slot and reboots into it.
  bool handle(const char* const* fields, size_t count, OtaAnswer* answer);

  void set_active_version(uint32_t version) { active_version_ = version; }
  uint32_t next_seq() const { return session_ ? next_seq_ : 0; }
  // After an accepted commit: stage the verified slot as the trial (persisted).
  bool stage_verified();

 private:
  OtaAnswer begin(const char* const* fields, size_t count);
  OtaAnswer chunk(const char* const* fields, size_t count);
  OtaAnswer finish();
  OtaAnswer reply(OtaStatus code, uint32_t next) const { return {uint8_t(code), next}; }

  const ReceiverProfile& profile_;
  SignatureVerifier& verifier_;
  SlotManager& slots_;
  uint32_t active_version_;

  bool session_ = false;
  bool verified_ = false;
  uint32_t chunk_size_ = 0;
  uint32_t total_ = 0;
  uint32_t next_seq_ = 0;
  int slot_ = 0;
  uint8_t descriptor_raw_[kDescriptorSize] = {};
  uint8_t signature_[64] = {};
  ImageDescriptor descriptor_;
};

// "O,S,<code>,<next>*CRC\n" into out; returns its length.
size_t encode_ota_status(const OtaAnswer& answer, char* out, size_t capacity);

}  // namespace tesla
