// Board implementations of src/hardware.h for the Arduino Nano 33 BLE Sense (nRF52840,
// Arduino mbed core). Only compiled by arduino-cli (see docs/firmware.md); the host tests use
// test/host_support.h instead.
#pragma once

#include "src/hardware.h"

namespace tesla {

// Internal flash through mbed's FlashIAP (the nRF52840 NVMC underneath): 4 KB pages,
// word writes, memory-mapped reads.
class ArduinoFlash : public Flash {
 public:
  bool begin();
  uint32_t page_size() const override;
  bool erase(uint32_t address, uint32_t length) override;
  bool write(uint32_t address, const uint8_t* data, uint32_t length) override;
  bool read(uint32_t address, uint8_t* out, uint32_t length) const override;
  const uint8_t* map(uint32_t address) const override;
};

// Ed25519 from rweather's Crypto library (installed by arduino-cli; see docs/firmware.md).
class ArduinoSignatureVerifier : public SignatureVerifier {
 public:
  bool verify(const uint8_t public_key[32], const uint8_t* message, size_t length,
              const uint8_t signature[64]) override;
};

// USB CDC (`Serial`, the gateway) or the PMS5003 UART (`Serial1`).
class ArduinoStream : public ByteStream {
 public:
  explicit ArduinoStream(bool usb) : usb_(usb) {}
  int read() override;
  size_t write(const uint8_t* data, size_t length) override;

 private:
  bool usb_;
};

// The on-board humidity sensor: HTS221 on the Nano 33 BLE Sense (Arduino_HTS221), HS3003 on
// its Rev2 (Arduino_HS300x; build with -DTESLA_BOARD_REV2).
class ArduinoEnvironment : public EnvironmentSensor {
 public:
  bool begin();
  bool read(float* rh_percent, float* temp_c) override;

 private:
  bool ok_ = false;
};

class ArduinoClock : public Clock {
 public:
  uint32_t millis() const override;
};

void reboot();  // NVIC_SystemReset: boot the staged slot

}  // namespace tesla
