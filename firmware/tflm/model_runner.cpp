#include "model_runner.h"

#include <math.h>

#include <new>

#include "tensorflow/lite/schema/schema_generated.h"

namespace tesla {

ModelRunner::ModelRunner(uint8_t* arena, size_t arena_bytes)
    : arena_(arena), arena_bytes_(arena_bytes) {}

bool ModelRunner::load(const uint8_t* image, tflite::MicroProfilerInterface* profiler) {
  if (image == nullptr) return false;
  const tflite::Model* model = tflite::GetModel(image);
  if (model->version() != TFLITE_SCHEMA_VERSION) return false;
  if (interpreter_ != nullptr) interpreter_->~MicroInterpreter();
  interpreter_ = new (storage_) tflite::MicroInterpreter(model, resolver_, arena_, arena_bytes_,
                                                         nullptr, profiler);
  if (interpreter_->AllocateTensors() != kTfLiteOk) return false;
  TfLiteTensor* input = interpreter_->input(0);
  return input->type == kTfLiteInt16 && input->bytes == 2 * model::kInputValues;
}

float ModelRunner::invoke(const float* values, int16_t* raw_output, int32_t* quantised_sum) {
  TfLiteTensor* input = interpreter_->input(0);
  int32_t sum = 0;
  for (uint32_t i = 0; i < model::kInputValues; ++i) {
    float q = roundf(values[i] / model::kInputScale) + model::kInputZeroPoint;
    input->data.i16[i] = int16_t(q < -32768.f ? -32768.f : (q > 32767.f ? 32767.f : q));
    sum += input->data.i16[i];
  }
  if (quantised_sum != nullptr) *quantised_sum = sum;
  if (interpreter_->Invoke() != kTfLiteOk) return NAN;
  int16_t raw = interpreter_->output(0)->data.i16[0];
  if (raw_output != nullptr) *raw_output = raw;
  return (float(raw) - model::kOutputZeroPoint) * model::kOutputScale;
}

bool ModelRunner::self_test(float* scratch) {
  for (uint32_t i = 0; i < model::kInputValues; ++i) {
    scratch[i] = model::kSelfTestLevels[i % model::kChannelCount];
  }
  const float value = invoke(scratch);
  return isfinite(value) && value >= 0.0f && value < 1000.0f;
}

size_t ModelRunner::arena_used() const {
  return interpreter_ == nullptr ? 0 : interpreter_->arena_used_bytes();
}

}  // namespace tesla
