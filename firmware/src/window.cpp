#include "window.h"

#include <math.h>

namespace tesla {

Window::Window(float* storage, uint32_t length, uint32_t max_interpolated)
    : values_(storage), length_(length), max_interpolated_(max_interpolated) {
  for (uint32_t i = 0; i < length_; ++i) values_[i] = NAN;
}

float& Window::at(int64_t period) const {
  int64_t index = period % int64_t(length_);
  if (index < 0) index += length_;
  return values_[index];
}

void Window::add(int64_t period, float value) {
  if (period < newest_) return;  // late reading: ignored, as the gateway's window does
  if (period == newest_ && period == last_observed_) {
    sum_ += value;
    count_ += 1;
    at(period) = sum_ / float(count_);
    return;
  }
  // Clear the periods skipped since the newest one (they scrolled in as missing).
  if (newest_ != INT64_MIN) {
    int64_t gap_end = period - 1;
    int64_t start = newest_ + 1;
    if (gap_end - start + 1 > int64_t(length_)) start = gap_end - int64_t(length_) + 1;
    for (int64_t p = start; p <= gap_end; ++p) at(p) = NAN;
  } else {
    for (uint32_t i = 0; i < length_; ++i) values_[i] = NAN;
  }
  // Fill a short gap between the last observed value and this one.
  if (last_observed_ != INT64_MIN) {
    int64_t missing = period - last_observed_ - 1;
    if (missing > 0 && missing <= int64_t(max_interpolated_) && missing < int64_t(length_)) {
      float previous = at(last_observed_);
      for (int64_t k = 1; k <= missing; ++k) {
        at(last_observed_ + k) = previous + (value - previous) * float(k) / float(missing + 1);
      }
    }
  }
  at(period) = value;
  newest_ = period;
  last_observed_ = period;
  sum_ = value;
  count_ = 1;
}

bool Window::valid() const {
  if (newest_ == INT64_MIN || newest_ != last_observed_) return false;
  for (uint32_t i = 0; i < length_; ++i) {
    if (isnan(values_[i])) return false;
  }
  return true;
}

bool Window::copy(float* out) const {
  if (!valid()) return false;
  for (uint32_t i = 0; i < length_; ++i) out[i] = at(newest_ - int64_t(length_) + 1 + i);
  return true;
}

}  // namespace tesla
