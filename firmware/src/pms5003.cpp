#include "pms5003.h"

namespace tesla {
namespace {
uint16_t be16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
}  // namespace

Pms5003Parser::Result Pms5003Parser::feed(uint8_t byte) {
  if (used_ == 0 && byte != 0x42) return Result::kNeedMore;
  if (used_ == 1 && byte != 0x4D) {
    used_ = byte == 0x42 ? 1 : 0;  // a repeated 0x42 may start the real frame
    return Result::kNeedMore;
  }
  frame_[used_++] = byte;
  if (used_ == 4 && be16(frame_ + 2) != 28) {
    used_ = 0;
    return Result::kBadLength;
  }
  if (used_ < 32) return Result::kNeedMore;
  used_ = 0;
  uint16_t sum = 0;
  for (int i = 0; i < 30; ++i) sum = uint16_t(sum + frame_[i]);
  if (sum != be16(frame_ + 30)) return Result::kBadChecksum;
  reading_.pm1 = be16(frame_ + 4 + 2 * 3);
  reading_.pm2_5 = be16(frame_ + 4 + 2 * 4);
  reading_.pm10 = be16(frame_ + 4 + 2 * 5);
  return Result::kFrame;
}

}  // namespace tesla
