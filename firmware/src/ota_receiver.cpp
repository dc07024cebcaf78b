#include "ota_receiver.h"

#include <stdio.h>
#include <string.h>

#include "base64.h"
#include "checksums.h"
#include "line_protocol.h"

namespace tesla {
namespace {

// Decimal uint32 with 1-10 digits, as the gateway's _UINT rule.
bool parse_uint(const char* text, uint32_t* out) {
  size_t n = strlen(text);
  if (n == 0 || n > 10) return false;
  uint64_t value = 0;
  for (size_t i = 0; i < n; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + uint64_t(text[i] - '0');
  }
  if (value > 0xFFFFFFFFull) return false;
  *out = uint32_t(value);
  return true;
}

bool parse_hex8(const char* text, uint32_t* out) {
  if (strlen(text) != 8) return false;
  uint32_t value = 0;
  for (int i = 0; i < 8; ++i) {
    char c = text[i];
    int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (v < 0) return false;
    value = (value << 4) | uint32_t(v);
  }
  *out = value;
  return true;
}

}  // namespace

OtaReceiver::OtaReceiver(const ReceiverProfile& profile, SignatureVerifier& verifier,
                         SlotManager& slots, uint32_t active_version)
    : profile_(profile), verifier_(verifier), slots_(slots), active_version_(active_version) {}

bool OtaReceiver::handle(const char* const* fields, size_t count, OtaAnswer* answer) {
  const char* kind = count > 0 ? fields[0] : "";
  if (strcmp(kind, "B") == 0) {
    *answer = begin(fields + 1, count - 1);
  } else if (strcmp(kind, "C") == 0) {
    *answer = chunk(fields + 1, count - 1);
  } else if (strcmp(kind, "F") == 0 && count == 1) {
    *answer = finish();
  } else if (strcmp(kind, "M") == 0 && count == 1) {
    if (session_ && verified_) return false;
    *answer = reply(OtaStatus::kNotVerified, next_seq());
  } else if (strcmp(kind, "X") == 0 && count == 1) {
    session_ = false;
    verified_ = false;
    *answer = reply(OtaStatus::kOk, 0);
  } else {
    *answer = reply(OtaStatus::kBadFrame, next_seq());
  }
  return true;
}

OtaAnswer OtaReceiver::begin(const char* const* f, size_t count) {
  if (count != 5) return reply(OtaStatus::kBadFrame, next_seq());
  if (strcmp(f[0], "TOTA") != 0) return reply(OtaStatus::kBadMagic, next_seq());
  uint32_t version = 0;
  uint32_t chunk_size = 0;
  if (!parse_uint(f[1], &version)) return reply(OtaStatus::kBadFrame, next_seq());
  if (version != kOtaProtocolVersion) return reply(OtaStatus::kUnsupportedVersion, next_seq());
  if (!parse_uint(f[2], &chunk_size) || chunk_size < 1 || chunk_size > kMaxChunkSize) {
    return reply(OtaStatus::kBadFrame, next_seq());
  }
  uint8_t raw[kDescriptorSize + 3];
  int raw_length = base64_decode(f[3], strlen(f[3]), raw, sizeof(raw));
  if (raw_length < 0) return reply(OtaStatus::kBadFrame, next_seq());
  if (raw_length != int(kDescriptorSize)) return reply(OtaStatus::kBadDescriptor, next_seq());
  uint8_t signature[66];
  int signature_length = base64_decode(f[4], strlen(f[4]), signature, sizeof(signature));
  if (signature_length < 0) return reply(OtaStatus::kBadFrame, next_seq());
  if (signature_length != 64) return reply(OtaStatus::kBadSignature, next_seq());
  // Authenticity before anything the descriptor claims is believed.
  if (!verifier_.verify(profile_.public_key, raw, kDescriptorSize, signature)) {
    return reply(OtaStatus::kBadSignature, 0);
  }
  ImageDescriptor descriptor;
  if (!decode_descriptor(raw, kDescriptorSize, &descriptor)) {
    return reply(OtaStatus::kBadDescriptor, 0);
  }
  if (strcmp(descriptor.model_name, profile_.model_name) != 0 ||
      descriptor.window_length != profile_.window_length ||
      descriptor.arena_bytes > profile_.arena_bytes) {
    return reply(OtaStatus::kIncompatible, 0);
  }
  if (descriptor.image_size == 0 || descriptor.image_size > slots_.slot_bytes()) {
    return reply(OtaStatus::kTooLarge, 0);
  }
  if (descriptor.model_version <= active_version_) return reply(OtaStatus::kDowngrade, 0);
  bool same = session_ && chunk_size == chunk_size_ &&
              memcmp(raw, descriptor_raw_, kDescriptorSize) == 0 &&
              memcmp(signature, signature_, 64) == 0;
  if (!same) {  // a new image: start over in the inactive slot
    session_ = true;
    verified_ = false;
    chunk_size_ = chunk_size;
    total_ = (descriptor.image_size + chunk_size - 1) / chunk_size;
    next_seq_ = 0;
    slot_ = slots_.inactive();
    memcpy(descriptor_raw_, raw, kDescriptorSize);
    memcpy(signature_, signature, 64);
    descriptor_ = descriptor;
  }
  return reply(OtaStatus::kOk, next_seq_);
}

OtaAnswer OtaReceiver::chunk(const char* const* f, size_t count) {
  if (count != 3) return reply(OtaStatus::kBadFrame, next_seq());
  uint32_t seq = 0;
  uint32_t crc = 0;
  uint8_t payload[kMaxChunkSize + 3];
  if (!parse_uint(f[0], &seq) || !parse_hex8(f[1], &crc)) {
    return reply(OtaStatus::kBadFrame, next_seq());
  }
  int length = base64_decode(f[2], strlen(f[2]), payload, sizeof(payload));
  if (length < 1 || length > int(kMaxChunkSize)) return reply(OtaStatus::kBadFrame, next_seq());
  if (!session_) return reply(OtaStatus::kNoSession, 0);
  if (seq != next_seq_) return reply(OtaStatus::kOutOfSequence, next_seq_);
  if (crc32(payload, size_t(length)) != crc) return reply(OtaStatus::kCrcMismatch, next_seq_);
  uint32_t offset = seq * chunk_size_;
  uint32_t expected = descriptor_.image_size - offset < chunk_size_
                          ? descriptor_.image_size - offset
                          : chunk_size_;
  if (uint32_t(length) != expected) return reply(OtaStatus::kBadFrame, next_seq_);
  if (!slots_.write(slot_, offset, payload, uint32_t(length))) {
    return reply(OtaStatus::kFlashError, next_seq_);
  }
  next_seq_ += 1;
  return reply(OtaStatus::kOk, next_seq_);
}

OtaAnswer OtaReceiver::finish() {
  if (!session_) return reply(OtaStatus::kNoSession, 0);
  if (next_seq_ < total_) return reply(OtaStatus::kIncomplete, next_seq_);
  uint8_t digest[32];
  if (!slots_.sha256(slot_, descriptor_.image_size, digest)) {
    return reply(OtaStatus::kFlashError, next_seq_);
  }
  if (memcmp(digest, descriptor_.image_sha256, 32) != 0) {
    next_seq_ = 0;
    return reply(OtaStatus::kShaMismatch, 0);
  }
  verified_ = true;
  return reply(OtaStatus::kVerified, total_);
}

bool OtaReceiver::stage_verified() {
  if (!session_ || !verified_) return false;
  session_ = false;
  verified_ = false;
  return slots_.stage_trial(slot_, descriptor_raw_);
}

size_t encode_ota_status(const OtaAnswer& answer, char* out, size_t capacity) {
  char code[4];
  char next[12];
  snprintf(code, sizeof(code), "%u", unsigned(answer.code));
  snprintf(next, sizeof(next), "%lu", static_cast<unsigned long>(answer.next_seq));
  const char* fields[] = {"S", code, next};
  return encode_line('O', fields, 3, out, capacity);
}

}  // namespace tesla
