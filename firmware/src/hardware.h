// The small hardware interfaces the portable core needs; arduino_*.cpp implement them on the
// Nano 33 BLE Sense, firmware/test/ implements them on the host.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

// NOR flash: erase sets bytes to 0xFF in whole pages; write can only clear bits.
class Flash {
 public:
  virtual ~Flash() = default;
  virtual uint32_t page_size() const = 0;
  virtual bool erase(uint32_t address, uint32_t length) = 0;  // page aligned
  virtual bool write(uint32_t address, const uint8_t* data, uint32_t length) = 0;  // word aligned
  virtual bool read(uint32_t address, uint8_t* out, uint32_t length) const = 0;
  // Where the bytes can be read in place (memory-mapped flash), or nullptr.
  virtual const uint8_t* map(uint32_t address) const = 0;
};

// Ed25519 verification (libsodium on the host, rweather's Crypto library on the board).
class SignatureVerifier {
 public:
  virtual ~SignatureVerifier() = default;
  virtual bool verify(const uint8_t public_key[32], const uint8_t* message, size_t length,
                      const uint8_t signature[64]) = 0;
};

// Byte streams (the USB serial line to the gateway, the PMS5003 UART).
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  virtual int read() = 0;  // -1 when nothing is waiting
  virtual size_t write(const uint8_t* data, size_t length) = 0;
};

// The board's own humidity and temperature sensor (covariate channels, docs/serial-protocol.md).
class EnvironmentSensor {
 public:
  virtual ~EnvironmentSensor() = default;
  // False when the sensor is absent or did not answer: the reading then carries no rh/temp_c.
  virtual bool read(float* rh_percent, float* temp_c) = 0;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint32_t millis() const = 0;
};

}  // namespace tesla
