// Arduino_HS300x (the Nano 33 BLE Sense's humidity sensor library) as the sketch uses it:
// begin, readHumidity, readTemperature; a compile check stand-in (see Arduino.h here).
#pragma once

class HS300xClass {
 public:
  int begin();
  void end();
  float readHumidity();
  float readTemperature();
};

extern HS300xClass HS300x;
