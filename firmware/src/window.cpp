#include "window.h"

#include <math.h>

namespace tesla {

Window::Window(float* storage, uint32_t length, uint32_t channels, uint32_t max_interpolated,
               uint32_t min_history)
    : values_(storage),
      length_(length),
      channels_(channels < kMaxChannels ? channels : kMaxChannels),
      max_interpolated_(max_interpolated),
      min_history_(1) {
  set_min_history(min_history);
  for (uint32_t i = 0; i < length_ * channels_; ++i) values_[i] = NAN;
}

void Window::set_min_history(uint32_t min_history) {
  min_history_ = min_history < 1 ? 1 : min_history > length_ ? length_ : min_history;
}

// period - from for from <= period, exact over the whole int64 range (no signed overflow).
static uint64_t distance(int64_t from, int64_t period) {
  return uint64_t(period) - uint64_t(from);
}

int64_t Window::oldest_kept(int64_t from, int64_t period) const {
  return distance(from, period) < length_ ? from : period - int64_t(length_ - 1);
}

float& Window::at(int64_t period, uint32_t channel) const {
  int64_t index = period % int64_t(length_);
  if (index < 0) index += length_;
  return values_[uint32_t(index) * channels_ + channel];
}

void Window::fill_gap(uint32_t channel, int64_t period, float value) const {
  const ChannelState& s = state_[channel];
  if (s.gap_from == INT64_MIN) return;
  const float steps = float(period - s.gap_from);  // at most max_interpolated + 1
  for (int64_t p = oldest_kept(s.gap_from + 1, period); p < period; ++p) {
    at(p, channel) = s.gap_value + (value - s.gap_value) * float(p - s.gap_from) / steps;
  }
}

void Window::add(int64_t period, uint32_t channel, float value) {
  // INT64_MIN marks "never observed"; a non-finite value is no reading (the gateway drops it).
  if (channel >= channels_ || period == INT64_MIN || !isfinite(value)) return;
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
  if (s.last_observed != INT64_MIN) {
    for (int64_t p = oldest_kept(s.last_observed + 1, period); p < period; ++p) {
      at(p, channel) = NAN;
    }
  } else {
    for (uint32_t i = 0; i < length_; ++i) values_[i * channels_ + channel] = NAN;
  }
  // A short gap between this channel's last observed value and this period is filled linearly
  // (only the part still inside the window: the ring holds N periods), again with every
  // further reading of this period.
  const uint64_t missing =
      s.last_observed == INT64_MIN ? 0 : distance(s.last_observed, period) - 1;
  const bool fill = missing > 0 && missing <= max_interpolated_;
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
  const uint64_t before = distance(first_period_, newest);  // periods before the newest
  return before >= length_ - 1 ? length_ : uint32_t(before) + 1;
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
  for (uint32_t age = 0; age < real; ++age) {  // counted down: newest may be INT64_MAX
    for (uint32_t c = 0; c < channels_; ++c) {
      if (isnan(at(newest - int64_t(age), c))) return false;
    }
  }
  return true;
}

int64_t Window::period_at(uint32_t position) const {
  const uint32_t real = history();
  const uint32_t age = length_ - 1 - position;  // periods before the newest
  return newest_period() - int64_t(age < real ? age : real - 1);  // older: padded
}

bool Window::copy(float* out) const {
  if (!valid()) return false;
  for (uint32_t i = 0; i < length_; ++i) {
    const int64_t p = period_at(i);
    for (uint32_t c = 0; c < channels_; ++c) out[i * channels_ + c] = at(p, c);
  }
  return true;
}

}  // namespace tesla
