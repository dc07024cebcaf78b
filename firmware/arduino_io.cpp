// Serial ports, clock and reset of the Nano 33 BLE Sense.
#include <Arduino.h>

#include "arduino_hardware.h"

namespace tesla {

int ArduinoStream::read() { return usb_ ? Serial.read() : Serial1.read(); }

size_t ArduinoStream::write(const uint8_t* data, size_t length) {
  return usb_ ? Serial.write(data, length) : Serial1.write(data, length);
}

uint32_t ArduinoClock::millis() const { return ::millis(); }

void reboot() {
  Serial.flush();
  delay(50);
  NVIC_SystemReset();
}

}  // namespace tesla
