// The Nano 33 BLE Sense's humidity and temperature sensor, read once per PMS5003 frame and
// averaged per period by the sketch. The board heats itself a little, so its temperature reads
// above the air's; the covariate models learn that offset from co-location data.
#include <Arduino.h>
#include <math.h>

#ifdef TESLA_BOARD_REV2
#include <Arduino_HS300x.h>
#define TESLA_ENV HS300x
#else
#include <Arduino_HTS221.h>
#define TESLA_ENV HTS
#endif

#include "arduino_hardware.h"

namespace tesla {

bool ArduinoEnvironment::begin() {
  ok_ = TESLA_ENV.begin() != 0;
  return ok_;
}

bool ArduinoEnvironment::read(float* rh_percent, float* temp_c) {
  if (!ok_) return false;
  float rh = TESLA_ENV.readHumidity();
  float t = TESLA_ENV.readTemperature();
  if (!isfinite(rh) || !isfinite(t) || rh < 0.0f || rh > 100.0f || t < -40.0f || t > 85.0f) {
    return false;  // a bad sample is left out of the period's mean, never reported
  }
  *rh_percent = rh;
  *temp_c = t;
  return true;
}

}  // namespace tesla
