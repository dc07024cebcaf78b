// Arduino_HTS221 (the Nano 33 BLE Sense's humidity sensor library) as the sketch uses it:
// begin, readHumidity, readTemperature; a compile check stand-in (see Arduino.h here).
#pragma once

class HTS221Class {
 public:
  int begin();
  void end();
  float readHumidity();
  float readTemperature();
};

extern HTS221Class HTS;
