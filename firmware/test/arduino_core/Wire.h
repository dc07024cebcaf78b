// Arduino's Wire (I2C) API as the TFLite library's peripherals header includes it; a compile
// check stand-in (see Arduino.h here).
#pragma once

#include <stddef.h>
#include <stdint.h>

class TwoWire {
 public:
  void begin();
  void setClock(uint32_t frequency);
  void beginTransmission(uint8_t address);
  uint8_t endTransmission(bool stop = true);
  size_t write(uint8_t byte);
  size_t write(const uint8_t* data, size_t length);
  uint8_t requestFrom(uint8_t address, size_t length, bool stop = true);
  int available();
  int read();
};

extern TwoWire Wire;
