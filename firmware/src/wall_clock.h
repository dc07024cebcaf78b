// The node's wall time, learnt from the gateway's T line (docs/serial-protocol.md): the node has
// no clock of its own, only its uptime (uptime.h), so it keeps the offset between the two from
// the last T line. Every T line sets it anew: the gateway sends one after each hello and every
// hour, which also corrects the drift of the board's crystal and follows a gateway clock step.
// Its one use is the hour of the day of a model that reads it (tesla_gateway/contract/
// time_of_day.py): the phase of a moment in the zone's local standard time.
#pragma once

#include <stdint.h>

namespace tesla {

class WallClock {
 public:
  // A T line's time and standard UTC offset, received when the uptime was `uptime_ms`.
  void set(int64_t unix_s, int32_t utc_offset_s, uint64_t uptime_ms) {
    offset_ms_ = unix_s * 1000 - int64_t(uptime_ms);
    utc_offset_s_ = utc_offset_s;
    known_ = true;
  }
  bool known() const { return known_; }
  // Unix milliseconds at an uptime; meaningful only when known(). Wraps (never overflows) for
  // the far periods a test line may name.
  int64_t unix_ms(int64_t uptime_ms) const {
    return int64_t(uint64_t(uptime_ms) + uint64_t(offset_ms_));
  }
  int32_t utc_offset_s() const { return utc_offset_s_; }

 private:
  bool known_ = false;
  int64_t offset_ms_ = 0;  // unix ms - uptime ms
  int32_t utc_offset_s_ = 0;
};

// (sin, cos) of the local standard time of day at `unix_ms`: the contract's hour_phase.
void hour_phase(int64_t unix_ms, int32_t utc_offset_s, float* sin_out, float* cos_out);

}  // namespace tesla
