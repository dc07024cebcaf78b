// SHA-256 (FIPS 180-4), streaming, no allocation: hashes the image slot in flash on the node.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

class Sha256 {
 public:
  static constexpr size_t kDigestSize = 32;
  Sha256() { reset(); }
  void reset();
  void update(const uint8_t* data, size_t length);
  void finish(uint8_t digest[kDigestSize]);

 private:
  void block(const uint8_t* chunk);
  uint32_t state_[8];
  uint8_t buffer_[64];
  uint64_t length_;
  size_t used_;
};

}  // namespace tesla
