// The Arduino core API the sketch and its shims use, declared for a compile check only
// (tests/firmware/test_firmware_host.py: no mbed core here). Everything the libraries declare
// comes from the real Arduino_TensorFlowLite and Crypto; only the board's core is this file.
// Declarations follow the ArduinoCore-API (github.com/arduino/ArduinoCore-API, api/Common.h,
// api/HardwareSerial.h) and the mbed core's pin names for the Nano 33 BLE.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint8_t pin_size_t;
enum PinName { P0_27 = 27, P1_2 = 34, P1_11 = 43, P1_12 = 44, NC = -1 };
enum PinMode { INPUT = 0, OUTPUT = 1, INPUT_PULLUP = 2 };
enum PinStatus { LOW = 0, HIGH = 1 };
constexpr pin_size_t D2 = 2, D3 = 3, D8 = 8, D9 = 9, D10 = 10, D13 = 13;

unsigned long millis();
unsigned long micros();
void delay(unsigned long ms);
void pinMode(pin_size_t pin, PinMode mode);
void digitalWrite(pin_size_t pin, PinStatus value);
PinStatus digitalRead(pin_size_t pin);
void NVIC_SystemReset();

class HardwareSerial {
 public:
  void begin(unsigned long baud);
  int available();
  int read();
  void flush();
  size_t write(uint8_t byte);
  size_t write(const uint8_t* data, size_t length);
  size_t print(const char* text);
  size_t println(const char* text);
  explicit operator bool();
};

extern HardwareSerial Serial;
extern HardwareSerial Serial1;
