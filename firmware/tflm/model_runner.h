// The int8 device graph under TFLite Micro, for the sketch and the emulated node alike: the op
// resolver built from the manifest's op list (device_op_resolver.h), the int16 input quantised
// with roundf and clamped, the int16 output dequantised, and the self-test a slot must pass.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "src/model_constants.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "device_op_resolver.h"

namespace tesla {

class ModelRunner {
 public:
  ModelRunner(uint8_t* arena, size_t arena_bytes);
  // Builds an interpreter for the FlatBuffer at `image` (kept in place, e.g. a flash slot);
  // false if the schema, the allocation or the input's type and size do not fit this firmware
  // (a model of other channels than the firmware was built for fails here).
  bool load(const uint8_t* image, tflite::MicroProfilerInterface* profiler = nullptr);
  // Quantises values[model::kInputValues], invokes, dequantises; NaN if the interpreter fails.
  // `raw_output` receives the output tensor's int16 and `quantised_sum` the sum of the inputs.
  float invoke(const float* values, int16_t* raw_output = nullptr,
               int32_t* quantised_sum = nullptr);
  // The loaded model on a flat window of kSelfTestLevels: a finite value in [0, 1000) ug/m3.
  // Uses `scratch` (kInputValues floats) for the window.
  bool self_test(float* scratch);
  size_t arena_used() const;
  tflite::MicroInterpreter* interpreter() { return interpreter_; }

 private:
  uint8_t* arena_;
  size_t arena_bytes_;
  DeviceOpResolver resolver_;
  alignas(tflite::MicroInterpreter) uint8_t storage_[sizeof(tflite::MicroInterpreter)];
  tflite::MicroInterpreter* interpreter_ = nullptr;
};

}  // namespace tesla
