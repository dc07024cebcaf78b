// The node's uptime in 64-bit milliseconds from the board's 32-bit millis(), which wraps after
// 49.7 days: periods computed from millis() itself would then step back, the window would ignore
// every reading as late (src/window.h) and the node would stop calibrating until rebooted.
#pragma once

#include <stdint.h>

namespace tesla {

class Uptime {
 public:
  // Takes millis() now; call at least once per 49 days (the sketch calls it every loop).
  uint64_t update(uint32_t millis_now) {
    total_ += uint32_t(millis_now - last_);  // modulo 2^32: right across the wrap
    last_ = millis_now;
    return total_;
  }

 private:
  uint32_t last_ = 0;
  uint64_t total_ = 0;
};

}  // namespace tesla
