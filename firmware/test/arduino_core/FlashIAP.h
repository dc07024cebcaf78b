// mbed OS's FlashIAP (drivers/FlashIAP.h, os.mbed.com/docs/mbed-os/v6.16/apis/flashiap.html),
// the part the sketch's flash shim uses; a compile check stand-in (see Arduino.h here).
#pragma once

#include <stdint.h>

namespace mbed {
class FlashIAP {
 public:
  int init();
  int deinit();
  int read(void* buffer, uint32_t address, uint32_t size);
  int program(const void* buffer, uint32_t address, uint32_t size);
  int erase(uint32_t address, uint32_t size);
  uint32_t get_sector_size(uint32_t address) const;
  uint32_t get_page_size() const;
};
}  // namespace mbed
