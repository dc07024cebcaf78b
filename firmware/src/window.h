// The node's own N-period window of one or more channels, with the gap rule of
// tesla_gateway/contract/series.py applied channel by channel, as the gateway's ring does
// (tesla_gateway/windows/ring.py): readings are averaged per period and channel (periods aligned
// to the epoch of the node's clock); a gap of at most max_interpolated missing periods between
// two observed values of a channel is filled linearly when the later value arrives; a window is
// valid only if every channel was observed in its newest period and nothing in it is missing.
// A young node (fewer than N periods since its first PM reading) calibrates from min_history
// periods on: the window's periods before its first take that first period's values, channel by
// channel (the contract's pad_history, edge padding), as the gateway pads a young sensor.
// Storage is a caller-provided ring of N x C floats, period-major (NaN = missing), and a copy
// is laid out as the model's input [1, N, C]: oldest period first, a period's channels together.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

class Window {
 public:
  static constexpr uint32_t kMaxChannels = 4;  // PM, rh, temp_c and one more

  // `storage` holds length * channels floats; channels is at most kMaxChannels. A window with
  // fewer than `min_history` periods since the first PM reading is not valid (clamped to
  // 1 .. length; `length` calibrates whole windows only).
  Window(float* storage, uint32_t length, uint32_t channels, uint32_t max_interpolated,
         uint32_t min_history);

  // Adds a reading of `channel` for `period` (non-decreasing per channel; an older period is
  // ignored, as the gateway ignores late readings). Readings of the same period are averaged; a
  // non-finite value is no reading (the gateway drops it at its edge).
  void add(int64_t period, uint32_t channel, float value);
  // For the window ending at the newest period with a reading of any channel.
  bool valid() const;
  // Copies the window into out[length * channels], oldest period first, its periods before the
  // first PM reading padded with that period's values; false if not valid.
  bool copy(float* out) const;
  int64_t newest_period() const;
  // The period whose values copy() puts at `position` (0 = oldest) of a valid window: the
  // window's own period, or its oldest real one where the window is padded.
  int64_t period_at(uint32_t position) const;
  // Periods of real history in the window ending at the newest period: those since the first
  // PM reading, at most length (0 before any).
  uint32_t history() const;
  uint32_t channels() const { return channels_; }
  uint32_t length() const { return length_; }
  // The young-window rule of the model that now serves (ota_descriptor.h image_min_history),
  // clamped as in the constructor; set at boot, once the active slot is known.
  void set_min_history(uint32_t min_history);
  uint32_t min_history() const { return min_history_; }

 private:
  struct ChannelState {
    int64_t last_observed = INT64_MIN;  // the newest period with a reading
    float last_value = 0;  // the mean of last_observed
    int64_t gap_from = INT64_MIN;  // the observed period before a gap that ends at last_observed
    float gap_value = 0;           // and its mean
    float sum = 0;
    uint32_t count = 0;
  };
  // The later of `from` and the oldest period the ring keeps when `period` is the newest.
  int64_t oldest_kept(int64_t from, int64_t period) const;
  float& at(int64_t period, uint32_t channel) const;
  void fill_gap(uint32_t channel, int64_t period, float value) const;
  float* values_;
  uint32_t length_;
  uint32_t channels_;
  uint32_t max_interpolated_;
  uint32_t min_history_;
  int64_t first_period_ = INT64_MIN;  // the first period with a reading of channel 0
  ChannelState state_[kMaxChannels];
};

}  // namespace tesla
