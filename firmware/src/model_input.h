// The model's input [N, C] from the node's window (window.h: the measured channels, gap rule,
// young windows padded) and, for a model that reads it, the hour of the day: hour_sin and
// hour_cos (tesla_gateway/contract/time_of_day.py), derived from the wall time, not measured.
// The window rule of training, the gateway and the node: each position whose PM value is
// present (observed or gap-filled; in a valid window, every real one) holds the hour of its
// period's start in the zone's standard time; then a young window is padded, every channel
// alike, so padded positions repeat the oldest real period's hour as they repeat its PM.
// A node that has no wall time yet (no T line) puts UNKNOWN_HOUR, (0, 0), everywhere.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wall_clock.h"
#include "window.h"

namespace tesla {

struct InputLayout {
  uint32_t channels;        // C, the model's input channels (model_constants.h kChannelCount)
  int32_t hour_sin;         // where hour_sin sits in them, -1 if the model does not read it
  int32_t hour_cos;         // where hour_cos sits, -1 likewise
  uint32_t period_seconds;  // the window's period (its periods are on the node's uptime)
};

// The number of the layout's channels the window must hold: those that are not the hour's.
uint32_t measured_channels(const InputLayout& layout);

// Fills out[N * layout.channels], oldest period first, a period's channels together: the
// window's channels in order at the measured positions, the hour at its own. False (out
// undefined) if the window is not valid or does not hold measured_channels(layout) channels.
bool build_model_input(const Window& window, const InputLayout& layout, const WallClock& clock,
                       float* out);

// build_model_input for a firmware built for one model (HourSin: model_constants.h's
// kHourSinChannel). A model that does not read the hour takes the window as it is, and the
// build never references the hour code, so the linker leaves it and the C library's sinf and
// cosf out (5.4 KB of flash on the emulated node).
template <int32_t HourSin>
inline bool fill_model_input(const Window& window, const InputLayout& layout,
                             const WallClock& clock, float* out) {
  if (HourSin < 0) {
    return layout.channels > 0 && window.channels() == layout.channels && window.copy(out);
  }
  return build_model_input(window, layout, clock, out);
}

}  // namespace tesla
