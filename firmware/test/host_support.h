// Host implementations of the hardware interfaces: NOR-flash semantics in RAM (erase to 0xFF,
// writes can only clear bits, whole words only) and Ed25519 verification by libsodium.
#pragma once

#include <sodium.h>

#include <cstring>
#include <vector>

#include "../src/hardware.h"

namespace tesla_test {

class RamFlash : public tesla::Flash {
 public:
  explicit RamFlash(uint32_t size, uint32_t page = 4096) : bytes_(size, 0x00), page_(page) {}
  uint32_t page_size() const override { return page_; }
  bool erase(uint32_t address, uint32_t length) override {
    if (address % page_ || length % page_ || address + length > bytes_.size()) return false;
    std::memset(bytes_.data() + address, 0xFF, length);
    ++erases;
    return true;
  }
  bool write(uint32_t address, const uint8_t* data, uint32_t length) override {
    if (address % 4 || length % 4 || address + length > bytes_.size()) return false;
    if (fail_writes) return false;
    for (uint32_t i = 0; i < length; ++i) bytes_[address + i] &= data[i];
    return true;
  }
  bool read(uint32_t address, uint8_t* out, uint32_t length) const override {
    if (address + length > bytes_.size()) return false;
    std::memcpy(out, bytes_.data() + address, length);
    return true;
  }
  const uint8_t* map(uint32_t address) const override { return bytes_.data() + address; }
  int erases = 0;
  bool fail_writes = false;

 private:
  std::vector<uint8_t> bytes_;
  uint32_t page_;
};

class SodiumVerifier : public tesla::SignatureVerifier {
 public:
  bool verify(const uint8_t public_key[32], const uint8_t* message, size_t length,
              const uint8_t signature[64]) override {
    return crypto_sign_verify_detached(signature, message, length, public_key) == 0;
  }
};

}  // namespace tesla_test
