#include "wall_clock.h"

#include <math.h>

namespace tesla {

void hour_phase(int64_t unix_ms, int32_t utc_offset_s, float* sin_out, float* cos_out) {
  constexpr int64_t kDayMs = 86400000;
  int64_t of_day = (unix_ms % kDayMs + int64_t(utc_offset_s) * 1000) % kDayMs;
  if (of_day < 0) of_day += kDayMs;
  // The fraction of the day in double (a float would round the millisecond count to 8 ms), the
  // angle in float: within 3e-7 rad of the contract's.
  const float angle = float(6.283185307179586 * (double(of_day) / double(kDayMs)));
  *sin_out = sinf(angle);
  *cos_out = cosf(angle);
}

}  // namespace tesla
