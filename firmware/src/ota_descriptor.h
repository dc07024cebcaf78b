// The 88-byte signed node image descriptor (docs/ota-protocol.md section 3,
// tesla_gateway/ota/descriptor.py). Little endian on the wire, decoded field by field (no casts).
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

constexpr size_t kDescriptorSize = 88;
constexpr size_t kModelNameMax = 32;

struct ImageDescriptor {
  uint32_t model_version = 0;
  uint32_t image_size = 0;
  uint8_t image_sha256[32] = {};
  char model_name[kModelNameMax + 1] = {};
  uint32_t window_length = 0;
  uint32_t arena_bytes = 0;
};

// False if magic, format, target or flags are not those of format 1, or the name is malformed.
bool decode_descriptor(const uint8_t* data, size_t length, ImageDescriptor* out);

}  // namespace tesla
