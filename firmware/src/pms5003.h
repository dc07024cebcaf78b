// Plantower PMS5003 32-byte frames (as tesla_gateway/sources/pms5003.py): 0x42 0x4D, big-endian
// length 28, 13 big-endian data words, a 16-bit sum of the 30 bytes before it.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

struct Pms5003Reading {
  uint16_t pm1;    // atmospheric environment, µg/m³ (words 4-6)
  uint16_t pm2_5;
  uint16_t pm10;
};

class Pms5003Parser {
 public:
  enum class Result : uint8_t { kNeedMore, kFrame, kBadChecksum, kBadLength };
  // Feeds one byte; on kFrame `reading()` holds the frame's values. Resynchronises on the next
  // 0x42 0x4D after a bad frame.
  Result feed(uint8_t byte);
  const Pms5003Reading& reading() const { return reading_; }

 private:
  uint8_t frame_[32] = {};
  size_t used_ = 0;
  Pms5003Reading reading_{};
};

}  // namespace tesla
