#include "model_input.h"

namespace tesla {

namespace {

bool reads_hour(const InputLayout& layout) {
  return layout.hour_sin >= 0 && layout.hour_cos >= 0 && layout.hour_sin != layout.hour_cos &&
         uint32_t(layout.hour_sin) < layout.channels &&
         uint32_t(layout.hour_cos) < layout.channels;
}

}  // namespace

uint32_t measured_channels(const InputLayout& layout) {
  return reads_hour(layout) ? layout.channels - 2 : layout.channels;
}

bool build_model_input(const Window& window, const InputLayout& layout, const WallClock& clock,
                       float* out) {
  const uint32_t measured = measured_channels(layout);
  if (measured == 0 || window.channels() != measured || !window.copy(out)) return false;
  if (measured == layout.channels) return true;
  // Spread the window's [N, measured] values to [N, C] in place, from the end (every value
  // moves to a later or the same index, so none is overwritten before it is moved).
  const uint32_t c_all = layout.channels;
  const bool known = clock.known();
  for (uint32_t i = window.length(); i-- > 0;) {
    float hour_sin = 0.0f, hour_cos = 0.0f;  // UNKNOWN_HOUR
    if (known) {
      // The start of the position's period (the oldest real one where padded) on the uptime,
      // in ms; unsigned arithmetic wraps for the far periods a test line may name.
      const int64_t start_ms =
          int64_t(uint64_t(window.period_at(i)) * uint64_t(layout.period_seconds) * 1000u);
      hour_phase(clock.unix_ms(start_ms), clock.utc_offset_s(), &hour_sin, &hour_cos);
    }
    uint32_t from = measured;
    for (uint32_t c = c_all; c-- > 0;) {
      float& slot = out[i * c_all + c];
      if (int32_t(c) == layout.hour_sin) {
        slot = hour_sin;
      } else if (int32_t(c) == layout.hour_cos) {
        slot = hour_cos;
      } else {
        slot = out[i * measured + --from];
      }
    }
  }
  return true;
}

}  // namespace tesla
