// The node's STRIDED_SLICE: int16 only (the device graphs' activations), registered by
// device_op_resolver.cpp instead of the library's kernel.
#pragma once

#include <math.h>

#include "tensorflow/lite/kernels/internal/reference/strided_slice.h"
#include "tensorflow/lite/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"

namespace tesla {

// int16 STRIDED_SLICE (the attention's head split), with the library's reference
// StridedSlice<int16_t> and the checks of the library's Prepare. Registered instead of the
// library's kernel, whose Eval instantiates the slice for five types (float, int8, int16,
// int32, bool): 12 KB of flash of which the device graphs (int16 activations) use one.
inline TfLiteStatus strided_slice_prepare(TfLiteContext* context, TfLiteNode* node) {
  TF_LITE_ENSURE_EQ(context, tflite::NumInputs(node), 4);
  TF_LITE_ENSURE_EQ(context, tflite::NumOutputs(node), 1);
  auto* params = static_cast<tflite::StridedSliceParams*>(
      context->AllocatePersistentBuffer(context, sizeof(tflite::StridedSliceParams)));
  TF_LITE_ENSURE(context, params != nullptr);
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* tensors[5] = {
      micro_context->AllocateTempInputTensor(node, 0),
      micro_context->AllocateTempInputTensor(node, 1),
      micro_context->AllocateTempInputTensor(node, 2),
      micro_context->AllocateTempInputTensor(node, 3),
      micro_context->AllocateTempOutputTensor(node, 0)};
  const TfLiteTensor* input = tensors[0];
  const TfLiteTensor* output = tensors[4];
  const auto* options = static_cast<const TfLiteStridedSliceParams*>(node->builtin_data);
  TfLiteStatus status = kTfLiteOk;
  const int dims = input != nullptr ? tflite::NumDimensions(input) : 0;
  if (input == nullptr || tensors[1] == nullptr || tensors[2] == nullptr ||
      tensors[3] == nullptr || output == nullptr) {
    status = kTfLiteError;
  } else if (input->type != kTfLiteInt16 || output->type != kTfLiteInt16 || dims > 4) {
    MicroPrintf("STRIDED_SLICE: this node slices int16 tensors of up to 4 dimensions only");
    status = kTfLiteError;
  } else {
    params->start_indices_count = static_cast<int8_t>(dims);
    params->stop_indices_count = static_cast<int8_t>(dims);
    params->strides_count = static_cast<int8_t>(dims);
    for (int i = 0; i < dims; ++i) {
      params->start_indices[i] = tflite::GetTensorData<int32_t>(tensors[1])[i];
      params->stop_indices[i] = tflite::GetTensorData<int32_t>(tensors[2])[i];
      params->strides[i] = tflite::GetTensorData<int32_t>(tensors[3])[i];
    }
    params->begin_mask = static_cast<uint16_t>(options->begin_mask);
    params->ellipsis_mask = 0;
    params->end_mask = static_cast<uint16_t>(options->end_mask);
    params->new_axis_mask = 0;
    params->shrink_axis_mask = static_cast<uint16_t>(options->shrink_axis_mask);
    // The output shape the graph declares must be the slice's (the library's CheckOutputSize).
    const tflite::RuntimeShape input_shape = tflite::GetTensorShape(input);
    int kept = 0;
    for (int i = 0; i < dims && status == kTfLiteOk; ++i) {
      const int32_t stride = params->strides[i];
      if (stride == 0) {
        status = kTfLiteError;
        break;
      }
      const int32_t begin = tflite::strided_slice::StartForAxis(*params, input_shape, i);
      int32_t end = tflite::strided_slice::StopForAxis(*params, input_shape, i, begin);
      const bool shrink = (params->shrink_axis_mask & (1 << i)) != 0;
      if (shrink) end = begin + 1;
      int32_t size = static_cast<int32_t>(ceilf(static_cast<float>(end - begin) /
                                                static_cast<float>(stride)));
      size = size < 0 ? 0 : size;
      if (shrink) continue;
      if (kept >= output->dims->size || output->dims->data[kept] != size) status = kTfLiteError;
      ++kept;
    }
    if (status == kTfLiteOk && kept != output->dims->size) status = kTfLiteError;
    if (status != kTfLiteOk) MicroPrintf("STRIDED_SLICE: the output shape is not the slice's");
  }
  for (TfLiteTensor* tensor : tensors) {
    if (tensor != nullptr) micro_context->DeallocateTempTfLiteTensor(tensor);
  }
  node->user_data = params;
  return status;
}

inline TfLiteStatus strided_slice_eval(TfLiteContext* context, TfLiteNode* node) {
  const auto* params = static_cast<const tflite::StridedSliceParams*>(node->user_data);
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  tflite::reference_ops::StridedSlice(*params, tflite::micro::GetTensorShape(input),
                                      tflite::micro::GetTensorData<int16_t>(input),
                                      tflite::micro::GetTensorShape(output),
                                      tflite::micro::GetTensorData<int16_t>(output));
  return kTfLiteOk;
}

}  // namespace tesla
