// The emulated board: qemu's mps2-an386 (Cortex-M4F). A second implementation of
// src/hardware.h beside the Arduino shims (arduino_*.cpp), so the same node code runs on it:
// the CMSDK UART0 is the line to the gateway, the end of the 1 MB "flash" holds the A/B
// model slots with NOR rules, and SysTick on the 25 MHz core clock is the tick.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "src/hardware.h"
#include "src/model_constants.h"

namespace tesla {
namespace board {

constexpr uint32_t kCoreClockHz = 25000000;  // mps2-an386 SYSCLK, SysTick's clock source
// The sketch's layout (src/model_constants.h): boot records and slots A/B at the end of flash.
constexpr uint32_t kSlotRegionBase = model::kSlotRegionBase;
constexpr uint32_t kSlotRegionBytes = model::kSlotRegionBytes;

// CMSDK APB UART0 (qemu's serial0), polled.
class Uart : public ByteStream {
 public:
  void begin();
  int read() override;
  size_t write(const uint8_t* data, size_t length) override;
  void write_text(const char* text);
};

// NOR flash over the board's SSRAM: erase sets 4 KB pages to 0xFF, writes can only clear bits,
// reads are memory mapped. Refuses anything outside the slot region.
class SlotFlash : public Flash {
 public:
  uint32_t page_size() const override { return 4096; }
  bool erase(uint32_t address, uint32_t length) override;
  bool write(uint32_t address, const uint8_t* data, uint32_t length) override;
  bool read(uint32_t address, uint8_t* out, uint32_t length) const override;
  const uint8_t* map(uint32_t address) const override;

 private:
  static bool inside(uint32_t address, uint32_t length);
};

// Ed25519 verification with rweather's Crypto library, as arduino_signature.cpp on the board.
class CryptoVerifier : public SignatureVerifier {
 public:
  bool verify(const uint8_t public_key[32], const uint8_t* message, size_t length,
              const uint8_t signature[64]) override;
};

class TickClock : public Clock {
 public:
  uint32_t millis() const override;
};

void start_ticks();  // SysTick on the core clock, wrapping every 2^24 ticks into a 64-bit count
// Core-clock ticks since start_ticks(). Under `qemu -icount shift=0` every instruction advances
// virtual time by 1 ns, so a tick is exactly 40 instructions (see docs/benchmarks/node-m4).
uint64_t ticks();
void systick_handler();
void note_heap_top(const uint8_t* top);
size_t heap_used();  // bytes newlib has taken from .heap so far
[[noreturn]] void reboot();  // SCB AIRCR SYSRESETREQ: qemu resets the core, RAM slots stay
[[noreturn]] void panic(const char* why);

}  // namespace board
}  // namespace tesla
