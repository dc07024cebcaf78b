// The 88-byte signed node image descriptor (docs/ota-protocol.md section 3,
// tesla_gateway/ota/descriptor.py). Little endian on the wire, decoded field by field (no casts).
// Format 2 states the image's young-window rule (min_history_periods, u16 at offset 6); format 1
// (release tools before it) has flags 0 there and states nothing: whole windows only.
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
  uint32_t min_history = 0;  // format 2: 1..window_length; 0: format 1, states none
};

// False if magic, target or format is unknown, format 1's flags are not 0, format 2's
// min_history is outside 1..window_length, or the name is malformed.
bool decode_descriptor(const uint8_t* data, size_t length, ImageDescriptor* out);

// The periods of history from which the node calibrates a young window while `image` is the
// active model: `built_in` (model_constants.h kMinHistoryPeriods, generated from that model's
// manifest) when it is the firmware's factory image (`factory_raw`, its kDescriptorSize bytes);
// otherwise what its signed descriptor states, and whole windows (window_length) when it
// states nothing (format 1).
uint32_t image_min_history(const ImageDescriptor& image, const uint8_t* factory_raw,
                           uint32_t built_in);

}  // namespace tesla
