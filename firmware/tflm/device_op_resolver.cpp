#include "device_op_resolver.h"

#include <math.h>

#include <limits>

#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/kernels/internal/quantization_util.h"
#include "tensorflow/lite/kernels/internal/reference/transpose.h"
#include "tensorflow/lite/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"

namespace tesla {
namespace {

// Library's TRANSPOSE, kept for the types it handles and for its Prepare (type-agnostic checks).
TfLiteRegistration library_transpose;

TfLiteStatus transpose_eval(TfLiteContext* context, TfLiteNode* node) {
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  if (input->type != kTfLiteInt16) return library_transpose.invoke(context, node);
  const TfLiteEvalTensor* perm = tflite::micro::GetEvalInput(context, node, 1);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  tflite::TransposeParams params;
  params.perm_count = static_cast<int8_t>(perm->dims->data[0]);
  for (int i = 0; i < params.perm_count; ++i) params.perm[i] = perm->data.i32[i];
  tflite::reference_ops::Transpose(params, tflite::micro::GetTensorShape(input),
                                   tflite::micro::GetTensorData<int16_t>(input),
                                   tflite::micro::GetTensorShape(output),
                                   tflite::micro::GetTensorData<int16_t>(output));
  return kTfLiteOk;
}

// Library's RSQRT, kept for float32 and int8.
TfLiteRegistration library_rsqrt;

// int16 RSQRT (symmetric, zero points 0): y = 1/sqrt(x * s_in) / s_out, computed per element
// in integers like the library's int8 path: 1/sqrt(x) as a quantized multiplier and exponent
// (GetInvSqrtQuantizedMultiplierExp), then rescaled by 1/(sqrt(s_in) * s_out).
struct Int16Rsqrt {
  int32_t multiplier;
  int shift;
};

TfLiteStatus rsqrt_prepare(TfLiteContext* context, TfLiteNode* node) {
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, 0);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, 0);
  TF_LITE_ENSURE(context, input != nullptr && output != nullptr);
  if (input->type != kTfLiteInt16) {
    micro_context->DeallocateTempTfLiteTensor(input);
    micro_context->DeallocateTempTfLiteTensor(output);
    return library_rsqrt.prepare(context, node);
  }
  TF_LITE_ENSURE_TYPES_EQ(context, output->type, kTfLiteInt16);
  TF_LITE_ENSURE_EQ(context, input->params.zero_point, 0);
  TF_LITE_ENSURE_EQ(context, output->params.zero_point, 0);
  auto* data = static_cast<Int16Rsqrt*>(
      context->AllocatePersistentBuffer(context, sizeof(Int16Rsqrt)));
  TF_LITE_ENSURE(context, data != nullptr);
  const double scale = 1.0 / (static_cast<double>(sqrtf(input->params.scale)) *
                              static_cast<double>(output->params.scale));
  tflite::QuantizeMultiplier(scale, &data->multiplier, &data->shift);
  node->user_data = data;
  micro_context->DeallocateTempTfLiteTensor(input);
  micro_context->DeallocateTempTfLiteTensor(output);
  return kTfLiteOk;
}

TfLiteStatus rsqrt_eval(TfLiteContext* context, TfLiteNode* node) {
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  if (input->type != kTfLiteInt16) return library_rsqrt.invoke(context, node);
  const auto* data = static_cast<const Int16Rsqrt*>(node->user_data);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  const int16_t* in = tflite::micro::GetTensorData<int16_t>(input);
  int16_t* out = tflite::micro::GetTensorData<int16_t>(output);
  constexpr int32_t kMax = std::numeric_limits<int16_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int16_t>::min();
  constexpr int kKeepInteger = 20;  // headroom so 1/sqrt(x) stays an integer before rescaling
  const int count = tflite::micro::GetTensorShape(input).FlatSize();
  for (int i = 0; i < count; ++i) {
    const int32_t x = in[i];
    TF_LITE_ENSURE_MSG(context, x >= 0, "Rsqrt is only defined for positive values");
    if (x == 0) {
      out[i] = kMax;  // the largest representable value stands for 1/sqrt(0)
      continue;
    }
    int32_t inv_multiplier;
    int inv_shift;
    tflite::GetInvSqrtQuantizedMultiplierExp(x, tflite::kReverseShift, &inv_multiplier,
                                             &inv_shift);
    const int32_t inv_sqrt =
        tflite::MultiplyByQuantizedMultiplier(int32_t{1}, inv_multiplier, inv_shift + kKeepInteger);
    int32_t y = tflite::MultiplyByQuantizedMultiplier(inv_sqrt, data->multiplier,
                                                      data->shift - kKeepInteger);
    out[i] = static_cast<int16_t>(y > kMax ? kMax : (y < kMin ? kMin : y));
  }
  return kTfLiteOk;
}

}  // namespace

DeviceOpResolver::DeviceOpResolver() {
#define TESLA_REGISTER_OP(op, method) library_ops_.Add##method();
  TESLA_MODEL_OPS(TESLA_REGISTER_OP)
#undef TESLA_REGISTER_OP
  library_transpose = tflite::Register_TRANSPOSE();
  transpose_ = library_transpose;
  transpose_.invoke = transpose_eval;
  library_rsqrt = tflite::ops::micro::Register_RSQRT();
  rsqrt_ = library_rsqrt;
  rsqrt_.prepare = rsqrt_prepare;
  rsqrt_.invoke = rsqrt_eval;
}

const TfLiteRegistration* DeviceOpResolver::FindOp(tflite::BuiltinOperator op) const {
  const TfLiteRegistration* found = library_ops_.FindOp(op);
  if (found != nullptr && op == tflite::BuiltinOperator_TRANSPOSE) return &transpose_;
  if (found != nullptr && op == tflite::BuiltinOperator_RSQRT) return &rsqrt_;
  return found;
}

const TfLiteRegistration* DeviceOpResolver::FindOp(const char* op) const {
  return library_ops_.FindOp(op);
}

tflite::TfLiteBridgeBuiltinParseFunction DeviceOpResolver::GetOpDataParser(
    tflite::BuiltinOperator op) const {
  return library_ops_.GetOpDataParser(op);
}

}  // namespace tesla
