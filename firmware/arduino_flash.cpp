// Flash for the model slots: mbed::FlashIAP over the nRF52840 NVMC.
#include <Arduino.h>
#include <FlashIAP.h>

#include "arduino_hardware.h"

namespace tesla {
namespace {
mbed::FlashIAP g_flash;
}

bool ArduinoFlash::begin() { return g_flash.init() == 0; }

uint32_t ArduinoFlash::page_size() const { return 4096; }  // nRF52840 NVMC page

bool ArduinoFlash::erase(uint32_t address, uint32_t length) {
  return g_flash.erase(address, length) == 0;
}

bool ArduinoFlash::write(uint32_t address, const uint8_t* data, uint32_t length) {
  return g_flash.program(data, address, length) == 0;
}

bool ArduinoFlash::read(uint32_t address, uint8_t* out, uint32_t length) const {
  return g_flash.read(out, address, length) == 0;
}

const uint8_t* ArduinoFlash::map(uint32_t address) const {
  return reinterpret_cast<const uint8_t*>(address);  // internal flash is memory mapped
}

}  // namespace tesla
