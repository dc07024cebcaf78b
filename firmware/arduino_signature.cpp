// Ed25519 verification with rweather's Crypto library (arduino-cli lib install Crypto).
#include <Ed25519.h>

#include "arduino_hardware.h"

namespace tesla {

bool ArduinoSignatureVerifier::verify(const uint8_t public_key[32], const uint8_t* message,
                                      size_t length, const uint8_t signature[64]) {
  return Ed25519::verify(signature, public_key, message, length);
}

}  // namespace tesla
