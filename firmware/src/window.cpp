#include "window.h"

#include <math.h>

namespace tesla {

Window::Window(float* storage, uint32_t length, uint32_t channels, uint32_t max_interpolated,
               uint32_t min_history)
    : values_(storage),
      length_(length),
      channels_(channels < kMaxChannels ? channels : kMaxChannels),
      max_interpolated_(max_interpolated),
      min_history_(min_history < 1 ? 1 : min_history > length ? length : min_history) {
  for (uint32_t i = 0; i < length_ * channels_; ++i) values_[i] = NAN;
}

float& Window::at(int64_t period, uint32_t channel) const {
  int64_t index = period % int64_t(length_);
  if (index < 0) index += length_;
  return values_[uint32_t(index) * channels_ + channel];
}

void Window::fill_gap(uint32_t channel, int64_t period, float value) const {
  const ChannelState& s = state_[channel];
  if (s.gap_from == INT64_MIN) return;
  const int64_t missing = period - s.gap_from - 1;
  const int64_t oldest_kept = period - int64_t(length_) + 1;
  for (int64_t p = s.gap_from + 1 > oldest_kept ? s.gap_from + 1 : oldest_kept; p < period; ++p) {
    float k = float(p - s.gap_from);
    at(p, channel) = s.gap_value + (value - s.gap_value) * k / float(missing + 1);
  }
}

void Window::add(int64_t period, uint32_t channel, float value) {
  if (channel >= channels_) return;
  ChannelState& s = state_[channel];
  if (period < s.last_observed) return;  // late reading: ignored, as the gateway's window does
  if (channel == 0 && first_period_ == INT64_MIN) first_period_ = period;
  if (period == s.last_observed) {
    s.sum += value;
    s.count += 1;
    s.last_value = s.sum / float(s.count);
    at(period, channel) = s.last_value;
    fill_gap(channel, period, s.last_value);  // the gap ends at the period's mean, not its first
    return;
  }
  // Clear the periods skipped since this channel's last reading (they scrolled in as missing).
  const int64_t oldest_kept = period - int64_t(length_) + 1;
  if (s.last_observed != INT64_MIN) {
    int64_t start = s.last_observed + 1 > oldest_kept ? s.last_observed + 1 : oldest_kept;
    for (int64_t p = start; p < period; ++p) at(p, channel) = NAN;
  } else {
    for (uint32_t i = 0; i < length_; ++i) values_[i * channels_ + channel] = NAN;
  }
  // A short gap between this channel's last observed value and this period is filled linearly
  // (only the part still inside the window: the ring holds N periods), again with every
  // further reading of this period.
  const int64_t missing = s.last_observed == INT64_MIN ? 0 : period - s.last_observed - 1;
  const bool fill = missing > 0 && missing <= int64_t(max_interpolated_);
  s.gap_from = fill ? s.last_observed : INT64_MIN;
  s.gap_value = s.last_value;
  s.last_observed = period;
  s.sum = value;
  s.count = 1;
  s.last_value = value;
  at(period, channel) = value;
  fill_gap(channel, period, value);
}

int64_t Window::newest_period() const {
  int64_t newest = INT64_MIN;
  for (uint32_t c = 0; c < channels_; ++c) {
    if (state_[c].last_observed > newest) newest = state_[c].last_observed;
  }
  return newest;
}

uint32_t Window::history() const {
  const int64_t newest = newest_period();
  if (first_period_ == INT64_MIN || newest < first_period_) return 0;
  const int64_t since = newest - first_period_ + 1;
  return since >= int64_t(length_) ? length_ : uint32_t(since);
}

bool Window::valid() const {
  int64_t newest = newest_period();
  if (newest == INT64_MIN) return false;
  for (uint32_t c = 0; c < channels_; ++c) {
    // A channel not observed in the newest period: its ring may still hold older values there.
    if (state_[c].last_observed != newest) return false;
  }
  const uint32_t real = history();
  if (real < min_history_) return false;
  // Only the real periods count: the older ones are padded from the first (checked here too).
  for (int64_t p = newest - int64_t(real) + 1; p <= newest; ++p) {
    for (uint32_t c = 0; c < channels_; ++c) {
      if (isnan(at(p, c))) return false;
    }
  }
  return true;
}

bool Window::copy(float* out) const {
  if (!valid()) return false;
  const int64_t newest = newest_period();
  const int64_t start = newest - int64_t(length_) + 1;
  const int64_t oldest_real = newest - int64_t(history()) + 1;
  for (uint32_t i = 0; i < length_; ++i) {
    const int64_t p = start + i < oldest_real ? oldest_real : start + i;
    for (uint32_t c = 0; c < channels_; ++c) out[i * channels_ + c] = at(p, c);
  }
  return true;
}

}  // namespace tesla
