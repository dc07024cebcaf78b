// The op resolver the node builds from the manifest (TESLA_MODEL_OPS in the generated
// model_constants.h), shared by the sketch and the emulated board.
//
// The Arduino_TensorFlowLite library (2.4.0-ALPHA, synced Dec 2023) has no int16 TRANSPOSE and
// no int16 RSQRT (both kernels take float32 and int8 only), so the int8 device graphs, whose
// activations are int16, fail on the board ("Type INT16 is currently not supported by
// Transpose", then "Current data type INT16 is not supported." from RSQRT). The Python
// tflite-micro the exporter checks against is newer and has both. This resolver therefore
// answers TRANSPOSE and RSQRT with kernels of our own for int16 (TRANSPOSE moves elements with
// the library's reference_ops::Transpose; RSQRT follows the library's integer int8 recipe) and
// hands every other type to the library's kernels; all other ops are the library's.
// FULLY_CONNECTED with int16 input and per-channel int8 weights (the library applies channel
// 0's scale to every channel) gets its own kernel too: the reference arithmetic, with the dot
// products two at a time on the M4's DSP (dot_s16_s8.h), bit for bit the same outputs.
// int16 MUL with broadcasting, SUM and MEAN get faster loops with the library's arithmetic
// (int16_kernels.h: the attention's broadcast MUL and SUM were 44 % of an inference), bit for
// bit the same outputs too. STRIDED_SLICE is ours for int16 only (the library's kernel is 12 KB
// of flash for five types the graphs do not use).
#pragma once

#include "src/model_constants.h"
#include "tensorflow/lite/micro/compatibility.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/micro/micro_op_resolver.h"

namespace tesla {

// The int16 per-channel FULLY_CONNECTED normally runs the DSP loop of dot_s16_s8.h; true runs the
// library's reference FullyConnectedPerChannel instead (the emulated node's #R command, for the
// test that both give the same outputs).
extern bool use_reference_fully_connected;

// int16 MUL with broadcasting, SUM and MEAN normally run int16_kernels.h; true runs the
// library's kernels instead (the emulated node's #R command, as above).
extern bool use_library_int16_kernels;

class DeviceOpResolver : public tflite::MicroOpResolver {
 public:
  DeviceOpResolver();
  const TfLiteRegistration* FindOp(tflite::BuiltinOperator op) const override;
  const TfLiteRegistration* FindOp(const char* op) const override;
  tflite::TfLiteBridgeBuiltinParseFunction GetOpDataParser(
      tflite::BuiltinOperator op) const override;

 private:
  template <tflite::BuiltinOperator kOp, typename AddToLibrary>
  void add(AddToLibrary add_to_library);

  tflite::MicroMutableOpResolver<model::kOpCount> library_ops_;
  TfLiteRegistration strided_slice_{};
  TfLiteRegistration transpose_;
  TfLiteRegistration rsqrt_;
  TfLiteRegistration fully_connected_;
  TfLiteRegistration mul_;
  TfLiteRegistration sum_;
  TfLiteRegistration mean_;

  TF_LITE_REMOVE_VIRTUAL_DELETE
};

}  // namespace tesla
