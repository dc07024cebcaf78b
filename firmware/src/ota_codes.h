// OTA status codes: mirrored exactly from docs/ota-protocol.md section 6 and
// tesla_gateway/ota/protocol.py (OtaStatus, status_message). The host tests compare this table with
// tests/vectors/ota_protocol.json, so a change on one side only fails the build.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

enum class OtaStatus : uint8_t {
  kOk = 0,
  kVerified = 1,
  kActive = 2,
  kRolledBack = 3,
  kBadFrame = 10,
  kBadMagic = 11,
  kUnsupportedVersion = 12,
  kBadDescriptor = 13,
  kBadSignature = 14,
  kDowngrade = 15,
  kIncompatible = 16,
  kTooLarge = 17,
  kNoSession = 20,
  kCrcMismatch = 21,
  kOutOfSequence = 22,
  kIncomplete = 23,
  kShaMismatch = 24,
  kNotVerified = 25,
  kFlashError = 30,
};

struct OtaStatusInfo {
  uint8_t code;
  const char* name;
  const char* message;
};

constexpr OtaStatusInfo kOtaStatusTable[] = {
    {0, "ok", "accepted; send the chunk numbered next_seq"},
    {1, "verified", "image complete, sha256 and signature valid; send commit"},
    {2, "active", "new model active and passed its self-test"},
    {3, "rolled_back", "new model failed to load or its self-test; previous model restored"},
    {10, "bad_frame", "malformed OTA frame; check that gateway and firmware speak the same protocol version"},
    {11, "bad_magic", "handshake magic is not TOTA; the sender is not an OTA gateway"},
    {12, "unsupported_version", "OTA protocol version not supported; update the gateway or the node firmware so both speak the same version"},
    {13, "bad_descriptor", "image descriptor malformed, or of a format the node's firmware predates (format 2 states min_history); reflash the node with current firmware, or re-create the release with `tesla-train release --target node`"},
    {14, "bad_signature", "descriptor signature does not verify with the node's public key; sign the release with the key the firmware was built with"},
    {15, "downgrade", "model version is not newer than the one running; publish a higher version"},
    {16, "incompatible", "model is for another model name, window length or a larger arena than this firmware has; build firmware for it or release a compatible model"},
    {17, "too_large", "image larger than the node's model slot; shrink the model or repartition the flash"},
    {20, "no_session", "no transfer in progress; send begin first"},
    {21, "crc_mismatch", "chunk CRC-32 mismatch; resend from next_seq"},
    {22, "out_of_sequence", "unexpected chunk number; resend from next_seq"},
    {23, "incomplete", "finish before every chunk arrived; resend from next_seq"},
    {24, "sha_mismatch", "image sha256 differs from the descriptor; the transfer restarts from chunk 0"},
    {25, "not_verified", "commit before a verified image; send finish first"},
    {30, "flash_error", "flash write or erase failed; power-cycle the node, replace it if it persists"},
};

constexpr size_t kOtaStatusCount = sizeof(kOtaStatusTable) / sizeof(kOtaStatusTable[0]);

inline const OtaStatusInfo* ota_status_info(uint8_t code) {
  for (const OtaStatusInfo& info : kOtaStatusTable) {
    if (info.code == code) return &info;
  }
  return nullptr;
}

}  // namespace tesla
