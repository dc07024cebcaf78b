#include "board.h"

#include <Ed25519.h>
#include <string.h>

extern "C" uint8_t __heap_start;

namespace tesla {
namespace board {
namespace {

struct CmsdkUart {
  volatile uint32_t data;
  volatile uint32_t state;  // bit 0 TX full, bit 1 RX full
  volatile uint32_t ctrl;   // bit 0 TX enable, bit 1 RX enable
  volatile uint32_t intstatus;
  volatile uint32_t bauddiv;
};
CmsdkUart& uart0() { return *reinterpret_cast<CmsdkUart*>(0x40004000u); }

struct SysTickRegs {
  volatile uint32_t ctrl;
  volatile uint32_t load;
  volatile uint32_t val;
  volatile uint32_t calib;
};
SysTickRegs& systick() { return *reinterpret_cast<SysTickRegs*>(0xE000E010u); }
constexpr uint32_t kSysTickPeriod = 1u << 24;

volatile uint32_t g_wraps = 0;

uint8_t* slot_memory(uint32_t address) { return reinterpret_cast<uint8_t*>(address); }

}  // namespace

void Uart::begin() {
  uart0().bauddiv = 16;  // the smallest divider the CMSDK UART accepts; qemu does not pace it
  uart0().ctrl = 0x3;
}

int Uart::read() {
  if ((uart0().state & 0x2u) == 0) return -1;
  return int(uart0().data & 0xFFu);
}

size_t Uart::write(const uint8_t* data, size_t length) {
  for (size_t i = 0; i < length; ++i) {
    while (uart0().state & 0x1u) {
    }
    uart0().data = data[i];
  }
  return length;
}

void Uart::write_text(const char* text) {
  write(reinterpret_cast<const uint8_t*>(text), strlen(text));
}

bool SlotFlash::inside(uint32_t address, uint32_t length) {
  return address >= kSlotRegionBase && length <= kSlotRegionBytes &&
         address - kSlotRegionBase <= kSlotRegionBytes - length;
}

bool SlotFlash::erase(uint32_t address, uint32_t length) {
  if (!inside(address, length) || address % page_size() != 0 || length % page_size() != 0) {
    return false;
  }
  memset(slot_memory(address), 0xFF, length);
  return true;
}

bool SlotFlash::write(uint32_t address, const uint8_t* data, uint32_t length) {
  if (!inside(address, length) || address % 4 != 0 || length % 4 != 0) return false;
  uint8_t* to = slot_memory(address);
  for (uint32_t i = 0; i < length; ++i) to[i] &= data[i];  // NOR: programming clears bits only
  return true;
}

bool SlotFlash::read(uint32_t address, uint8_t* out, uint32_t length) const {
  if (!inside(address, length)) return false;
  memcpy(out, slot_memory(address), length);
  return true;
}

const uint8_t* SlotFlash::map(uint32_t address) const {
  return inside(address, 0) ? slot_memory(address) : nullptr;
}

bool CryptoVerifier::verify(const uint8_t public_key[32], const uint8_t* message, size_t length,
                            const uint8_t signature[64]) {
  return Ed25519::verify(signature, public_key, message, length);
}

uint32_t TickClock::millis() const { return uint32_t(ticks() / (kCoreClockHz / 1000u)); }

void start_ticks() {
  systick().ctrl = 0;
  systick().load = kSysTickPeriod - 1;
  systick().val = 0;
  systick().ctrl = 0x7;  // core clock, interrupt on wrap, enable
}

uint64_t ticks() {
  while (true) {
    uint32_t wraps = g_wraps;
    uint32_t value = systick().val;
    if (wraps == g_wraps) return uint64_t(wraps) * kSysTickPeriod + (kSysTickPeriod - 1 - value);
  }
}

void systick_handler() { g_wraps = g_wraps + 1; }

namespace {
const uint8_t* g_heap_top = nullptr;
}

void note_heap_top(const uint8_t* top) {
  if (top > g_heap_top) g_heap_top = top;
}

size_t heap_used() {
  return g_heap_top == nullptr ? 0 : size_t(g_heap_top - &__heap_start);
}

void reboot() {
  __asm volatile("dsb" ::: "memory");
  *reinterpret_cast<volatile uint32_t*>(0xE000ED0Cu) = 0x05FA0004u;  // AIRCR: SYSRESETREQ
  __asm volatile("dsb" ::: "memory");
  while (true) {
  }
}

void panic(const char* why) {
  Uart uart;
  uart.write_text("!panic ");
  uart.write_text(why);
  uart.write_text("\n");
  while (true) {
  }
}

}  // namespace board
}  // namespace tesla
