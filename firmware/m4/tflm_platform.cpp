// What TFLite Micro asks of a platform (tensorflow/lite/micro/debug_log.h, micro_time.h): the
// Arduino library puts these in system_setup.cpp for the Nano 33 BLE; here they go to UART0
// (as '#' lines the gateway ignores) and to the SysTick count.
#include "tensorflow/lite/micro/debug_log.h"
#include "tensorflow/lite/micro/micro_time.h"

#include "board.h"

extern "C" void DebugLog(const char* s) {
  tesla::board::Uart uart;
  uart.write_text("#log ");
  uart.write_text(s);
}

namespace tflite {

uint32_t ticks_per_second() { return tesla::board::kCoreClockHz; }
uint32_t GetCurrentTimeTicks() { return uint32_t(tesla::board::ticks()); }

}  // namespace tflite
