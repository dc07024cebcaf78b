// Reset and exception entry for the Cortex-M4F of qemu's mps2-an386: the vector table, the
// copy of .data from flash, zeroed .bss, the FPU switched on (the build uses the hard-float
// ABI, so the first VFP instruction would fault otherwise), static constructors, then main().
#include <stddef.h>
#include <stdint.h>

#include "board.h"

extern "C" {
extern uint32_t __data_start, __data_end, __data_load, __bss_start, __bss_end, __stack_top;
extern void (*__init_array_start[])();
extern void (*__init_array_end[])();
int main();
void reset_handler();
void fault_handler();
[[noreturn]] void fault_report(const uint32_t* frame);
}

namespace {

constexpr uintptr_t kCpacr = 0xE000ED88;

// Passes the exception frame (r0-r3, r12, lr, pc, xpsr) to fault_report.
__attribute__((naked)) void default_handler() {
  __asm volatile(
      "tst lr, #4\n"
      "ite eq\n"
      "mrseq r0, msp\n"
      "mrsne r0, psp\n"
      "b fault_report\n");
}

}  // namespace

// newlib's heap (strtof and printf's float conversion allocate): bounded by the linker
// script's .heap region; its high-water mark is reported by the node's #M command.
extern "C" void* _sbrk(ptrdiff_t increment) {
  extern uint8_t __heap_start, __heap_end;
  static uint8_t* brk = &__heap_start;
  if (increment > &__heap_end - brk || -increment > brk - &__heap_start) {
    return reinterpret_cast<void*>(-1);
  }
  uint8_t* previous = brk;
  brk += increment;
  tesla::board::note_heap_top(brk);
  return previous;
}

extern "C" [[noreturn]] void fault_report(const uint32_t* frame) {
  static char text[48];
  static const char kHex[] = "0123456789ABCDEF";
  const char prefix[] = "fault pc=0x";
  size_t n = 0;
  for (; prefix[n] != '\0'; ++n) text[n] = prefix[n];
  for (int shift = 28; shift >= 0; shift -= 4) text[n++] = kHex[(frame[6] >> shift) & 0xF];
  text[n++] = ' ';
  for (int shift = 28; shift >= 0; shift -= 4) text[n++] = kHex[(frame[5] >> shift) & 0xF];
  text[n] = '\0';
  tesla::board::panic(text);
}

extern "C" void fault_handler() { tesla::board::panic("fault"); }

extern "C" void reset_handler() {
  *reinterpret_cast<volatile uint32_t*>(kCpacr) |= (0xFu << 20);  // CP10, CP11: full access
  __asm volatile("dsb\n isb" ::: "memory");
  const uint32_t* from = &__data_load;
  for (uint32_t* to = &__data_start; to < &__data_end;) *to++ = *from++;
  for (uint32_t* to = &__bss_start; to < &__bss_end;) *to++ = 0;
  for (auto init = __init_array_start; init < __init_array_end; ++init) (*init)();
  main();
  tesla::board::panic("main returned");
}

using Handler = void (*)();

__attribute__((section(".vectors"), used)) const Handler kVectors[16] = {
    reinterpret_cast<Handler>(&__stack_top),
    reset_handler,
    default_handler,              // NMI
    default_handler,              // HardFault
    default_handler,              // MemManage
    default_handler,              // BusFault
    default_handler,              // UsageFault
    nullptr, nullptr, nullptr, nullptr,
    default_handler,              // SVCall
    default_handler,              // DebugMon
    nullptr,
    default_handler,              // PendSV
    tesla::board::systick_handler,
};
