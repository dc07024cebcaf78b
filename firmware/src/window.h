// The node's own N-period window with the gap rule of tesla_gateway/contract/series.py: readings are averaged
// per period (aligned to the epoch of the node's clock); a gap of at most max_interpolated
// missing periods between two observed values is filled linearly when the later value
// arrives; a window is valid only if its newest period was observed and nothing in it is
// missing. Storage is a caller-provided ring of N floats (NaN = missing).
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

class Window {
 public:
  Window(float* storage, uint32_t length, uint32_t max_interpolated);

  // Adds a reading for `period` (non-decreasing). Readings of the same period are averaged.
  void add(int64_t period, float value);
  bool valid() const;  // for the window ending at the newest period with a reading
  // Copies the window oldest first into out[length]; false if not valid.
  bool copy(float* out) const;
  int64_t newest_period() const { return newest_; }

 private:
  float& at(int64_t period) const;
  float* values_;
  uint32_t length_;
  uint32_t max_interpolated_;
  int64_t newest_ = INT64_MIN;  // newest period seen
  int64_t last_observed_ = INT64_MIN;
  float sum_ = 0;
  uint32_t count_ = 0;
};

}  // namespace tesla
