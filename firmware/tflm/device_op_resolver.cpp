#include "device_op_resolver.h"

#include <math.h>

#include <algorithm>
#include <limits>

#include "dot_s16_s8.h"
#include "int16_kernels.h"
#include "strided_slice_s16.h"
#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/kernels/internal/quantization_util.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/fully_connected.h"
#include "tensorflow/lite/kernels/internal/reference/process_broadcast_shapes.h"
#include "tensorflow/lite/kernels/internal/reference/transpose.h"
#include "tensorflow/lite/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/fully_connected.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/kernels/mul.h"
#include "tensorflow/lite/micro/kernels/reduce.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tensorflow/lite/micro/micro_utils.h"

namespace tesla {

bool use_reference_fully_connected = false;
bool use_library_int16_kernels = false;

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

// Library's FULLY_CONNECTED (CMSIS-NN), kept for everything but int16 with per-channel weights.
TfLiteRegistration library_fully_connected;

// int16 FULLY_CONNECTED with per-channel int8 weights: the converter quantises dense layers per
// output channel, but this library's kernel applies the first channel's scale to all of them
// (silently wrong outputs). These nodes get one multiplier per channel and the library's
// reference FullyConnectedPerChannel; the rest keep the library's kernel and its own data.
struct FullyConnectedNode {
  void* library_data;
  bool per_channel;
  bool int32_sums;  // depth <= kDotBlock and every |bias| < 2^30: sums fit an int32
  tflite::OpDataFullyConnected op;
  int32_t* multipliers;
  int* shifts;
};

void* fully_connected_init(TfLiteContext* context, const char* buffer, size_t length) {
  auto* node_data = static_cast<FullyConnectedNode*>(
      context->AllocatePersistentBuffer(context, sizeof(FullyConnectedNode)));
  if (node_data == nullptr) return nullptr;
  node_data->library_data = library_fully_connected.init(context, buffer, length);
  node_data->per_channel = false;
  return node_data;
}

bool int16_per_channel(const TfLiteTensor* input, const TfLiteTensor* filter) {
  if (input->type != kTfLiteInt16 || filter->type != kTfLiteInt8) return false;
  if (filter->quantization.type != kTfLiteAffineQuantization) return false;
  const auto* q = static_cast<const TfLiteAffineQuantization*>(filter->quantization.params);
  return q != nullptr && q->scale != nullptr && q->scale->size > 1;
}

TfLiteStatus fully_connected_prepare(TfLiteContext* context, TfLiteNode* node) {
  auto* node_data = static_cast<FullyConnectedNode*>(node->user_data);
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, 0);
  TfLiteTensor* filter = micro_context->AllocateTempInputTensor(node, 1);
  TfLiteTensor* bias = micro_context->AllocateTempInputTensor(node, 2);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, 0);
  TF_LITE_ENSURE(context, input != nullptr && filter != nullptr && output != nullptr);
  node_data->per_channel = int16_per_channel(input, filter);
  TfLiteStatus status = kTfLiteOk;
  if (node_data->per_channel) {
    const auto* params = static_cast<const TfLiteFullyConnectedParams*>(node->builtin_data);
    status = tflite::CalculateOpDataFullyConnected(context, params->activation, input->type,
                                                   input, filter, bias, output, &node_data->op);
    const auto* q = static_cast<const TfLiteAffineQuantization*>(filter->quantization.params);
    const int channels = q->scale->size;
    TF_LITE_ENSURE_EQ(context, channels, filter->dims->data[0]);
    node_data->multipliers = static_cast<int32_t*>(
        context->AllocatePersistentBuffer(context, channels * sizeof(int32_t)));
    node_data->shifts =
        static_cast<int*>(context->AllocatePersistentBuffer(context, channels * sizeof(int)));
    TF_LITE_ENSURE(context, node_data->multipliers != nullptr && node_data->shifts != nullptr);
    const int depth = filter->dims->data[filter->dims->size - 1];
    node_data->int32_sums = depth <= kDotBlock;
    if (bias != nullptr && bias->type == kTfLiteInt64) {
      const int64_t* biases = tflite::GetTensorData<int64_t>(bias);
      constexpr int64_t kLimit = int64_t{1} << 30;
      for (int c = 0; c < channels && node_data->int32_sums; ++c) {
        node_data->int32_sums = biases[c] > -kLimit && biases[c] < kLimit;
      }
    } else if (bias != nullptr) {
      node_data->int32_sums = false;
    }
    for (int c = 0; c < channels; ++c) {
      const double scale = static_cast<double>(input->params.scale) *
                           static_cast<double>(q->scale->data[c]) /
                           static_cast<double>(output->params.scale);
      tflite::QuantizeMultiplier(scale, &node_data->multipliers[c], &node_data->shifts[c]);
    }
  }
  micro_context->DeallocateTempTfLiteTensor(input);
  micro_context->DeallocateTempTfLiteTensor(filter);
  if (bias != nullptr) micro_context->DeallocateTempTfLiteTensor(bias);
  micro_context->DeallocateTempTfLiteTensor(output);
  if (node_data->per_channel || status != kTfLiteOk) return status;
  node->user_data = node_data->library_data;  // the library's kernel sees only its own data
  status = library_fully_connected.prepare(context, node);
  node->user_data = node_data;
  return status;
}

// The reference kernel's arithmetic with the dot products of dot_s16_s8.h (int16 inputs are
// symmetric: zero point 0, which the caller checks), bit for bit the same outputs. Channel by
// channel: its requantisation constants (requantize64) are set up once for all the batch's rows
// (the attention's projections run 9 rows of 16 channels).
void fully_connected_s16_s8(const FullyConnectedNode* node_data, const TfLiteEvalTensor* input,
                            const TfLiteEvalTensor* filter, const TfLiteEvalTensor* bias,
                            int batches, int channels, TfLiteEvalTensor* output) {
  const tflite::RuntimeShape filter_shape = tflite::micro::GetTensorShape(filter);
  const int depth = filter_shape.Dims(filter_shape.DimensionsCount() - 1);
  const int16_t* in = tflite::micro::GetTensorData<int16_t>(input);
  const int8_t* weights = tflite::micro::GetTensorData<int8_t>(filter);
  const int64_t* biases = tflite::micro::GetOptionalTensorData<int64_t>(bias);
  int16_t* out = tflite::micro::GetTensorData<int16_t>(output);
  const tflite::OpDataFullyConnected& op = node_data->op;
  const int32_t low = op.output_activation_min;
  const int32_t high = op.output_activation_max;
  const int32_t zero_point = op.output_zero_point;
  for (int c = 0; c < channels; ++c) {
    const Requantizer64 q = make_requantizer64(node_data->multipliers[c], node_data->shifts[c]);
    if (node_data->int32_sums) {  // |dot| <= 2^30 (dot_s16_s8.h) and |bias| < 2^30
      const int32_t channel_bias = biases != nullptr ? static_cast<int32_t>(biases[c]) : 0;
      const int8_t* channel_weights = weights + c * depth;
      const int16_t* row = in;
      int16_t* to = out + c;
      for (int b = 0; b < batches; ++b, row += depth, to += channels) {
        const int32_t acc = dot_s16_s8_block(row, channel_weights, depth) + channel_bias;
        const int32_t scaled = requantize32(acc, q) + zero_point;
        *to = static_cast<int16_t>(std::min(std::max(scaled, low), high));
      }
      continue;
    }
    const int64_t channel_bias = biases != nullptr ? biases[c] : 0;
    const int8_t* channel_weights = weights + c * depth;
    const int16_t* row = in;
    int16_t* to = out + c;
    for (int b = 0; b < batches; ++b, row += depth, to += channels) {
      const int64_t acc = dot_s16_s8(row, channel_weights, depth) + channel_bias;
      const int32_t scaled = requantize64(acc, q) + zero_point;
      *to = static_cast<int16_t>(std::min(std::max(scaled, low), high));
    }
  }
}

TfLiteStatus fully_connected_eval(TfLiteContext* context, TfLiteNode* node) {
  auto* node_data = static_cast<FullyConnectedNode*>(node->user_data);
  if (!node_data->per_channel) {
    node->user_data = node_data->library_data;
    TfLiteStatus status = library_fully_connected.invoke(context, node);
    node->user_data = node_data;
    return status;
  }
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* filter = tflite::micro::GetEvalInput(context, node, 1);
  const TfLiteEvalTensor* bias = tflite::micro::GetEvalInput(context, node, 2);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  // The library's reference kernel wants a 2-D output: batches x channels.
  const tflite::RuntimeShape output_shape = tflite::micro::GetTensorShape(output);
  const int channels = output_shape.Dims(output_shape.DimensionsCount() - 1);
  const int32_t flat_dims[2] = {output_shape.FlatSize() / channels, channels};
  const tflite::RuntimeShape flat_output(2, flat_dims);
  if (node_data->op.input_zero_point == 0 && !use_reference_fully_connected) {
    fully_connected_s16_s8(node_data, input, filter, bias, flat_dims[0], channels, output);
    return kTfLiteOk;
  }
  tflite::reference_integer_ops::FullyConnectedPerChannel(
      tflite::FullyConnectedParamsQuantized(node_data->op), node_data->multipliers,
      node_data->shifts, tflite::micro::GetTensorShape(input),
      tflite::micro::GetTensorData<int16_t>(input), tflite::micro::GetTensorShape(filter),
      tflite::micro::GetTensorData<int8_t>(filter), tflite::micro::GetTensorShape(bias),
      tflite::micro::GetOptionalTensorData<int64_t>(bias), flat_output,
      tflite::micro::GetTensorData<int16_t>(output));
  return kTfLiteOk;
}

// Library's MUL (CMSIS-NN), kept for every type and for int16 without broadcasting
// (arm_elementwise_mul_s16). int16 with broadcasting runs its BroadcastMul4DSlow arithmetic in
// int16_kernels.h, with the library's own op data (MulPrepare).
TfLiteRegistration library_mul;

TfLiteStatus mul_eval(TfLiteContext* context, TfLiteNode* node) {
  const TfLiteEvalTensor* input1 = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* input2 = tflite::micro::GetEvalInput(context, node, 1);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  if (input1->type != kTfLiteInt16 || output->type != kTfLiteInt16 ||
      use_library_int16_kernels) {
    return library_mul.invoke(context, node);
  }
  const auto* data = static_cast<const tflite::OpDataMul*>(node->user_data);
  tflite::ArithmeticParams params = {};
  params.quantized_activation_min = data->output_activation_min;
  params.quantized_activation_max = data->output_activation_max;
  params.input1_offset = -data->input1_zero_point;
  params.input2_offset = -data->input2_zero_point;
  params.output_offset = data->output_zero_point;
  params.output_multiplier = data->output_multiplier;
  params.output_shift = data->output_shift;
  const tflite::RuntimeShape shape1 = tflite::micro::GetTensorShape(input1);
  const tflite::RuntimeShape shape2 = tflite::micro::GetTensorShape(input2);
  const tflite::RuntimeShape output_shape = tflite::micro::GetTensorShape(output);
  if (!tflite::reference_ops::ProcessBroadcastShapes(shape1, shape2, &params) ||
      output_shape.DimensionsCount() > 4) {
    return library_mul.invoke(context, node);
  }
  broadcast_mul_s16(params, shape1, tflite::micro::GetTensorData<int16_t>(input1), shape2,
                    tflite::micro::GetTensorData<int16_t>(input2), output_shape,
                    tflite::micro::GetTensorData<int16_t>(output));
  return kTfLiteOk;
}

// Library's SUM and MEAN, kept for every type but int16 (and for an int16 MEAN whose input and
// output quantisation are the same, which the library computes another way). int16 runs
// QuantizedMeanOrSum's arithmetic in int16_kernels.h with the library's op data and scratch.
TfLiteRegistration library_sum;
TfLiteRegistration library_mean;

TfLiteStatus reduce_eval(TfLiteContext* context, TfLiteNode* node, bool compute_sum) {
  const TfLiteRegistration& library = compute_sum ? library_sum : library_mean;
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* axis = tflite::micro::GetEvalInput(context, node, 1);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  const auto* data = static_cast<const tflite::OpDataReduce*>(node->user_data);
  if (input->type != kTfLiteInt16 || output->type != kTfLiteInt16 || use_library_int16_kernels ||
      (!compute_sum && data->input_zp == data->output_zp &&
       data->input_scale == data->output_scale)) {
    return library.invoke(context, node);
  }
  auto* temp_sum =
      static_cast<int32_t*>(context->GetScratchBuffer(context, data->temp_buffer_idx));
  const bool done = sum_or_mean_s16(
      tflite::micro::GetTensorData<int16_t>(input), data->input_zp, data->input_scale,
      input->dims->data, input->dims->size, tflite::micro::GetTensorData<int16_t>(output),
      data->output_zp, data->output_scale, tflite::micro::GetTensorShape(output).FlatSize(),
      tflite::micro::GetTensorData<int>(axis), static_cast<int>(tflite::ElementCount(*axis->dims)),
      temp_sum, compute_sum);
  if (!done) return library.invoke(context, node);  // the library reports what is wrong
  return kTfLiteOk;
}

TfLiteStatus sum_eval(TfLiteContext* context, TfLiteNode* node) {
  return reduce_eval(context, node, true);
}

TfLiteStatus mean_eval(TfLiteContext* context, TfLiteNode* node) {
  return reduce_eval(context, node, false);
}

}  // namespace

// Every op of the manifest goes to the library's resolver, but STRIDED_SLICE, which gets the
// int16 kernel above: a generic lambda per op (the macro's), called here only for the others, so
// the library's STRIDED_SLICE kernel is never referenced and the linker drops it.
template <tflite::BuiltinOperator kOp, typename AddToLibrary>
void DeviceOpResolver::add(AddToLibrary add_to_library) {
  if constexpr (kOp == tflite::BuiltinOperator_STRIDED_SLICE) {
    strided_slice_ = tflite::micro::RegisterOp(nullptr, strided_slice_prepare, strided_slice_eval);
    strided_slice_.builtin_code = tflite::BuiltinOperator_STRIDED_SLICE;
  } else {
    add_to_library(library_ops_);
  }
}

DeviceOpResolver::DeviceOpResolver() {
#define TESLA_REGISTER_OP(op, method) \
  add<tflite::BuiltinOperator_##op>([](auto& ops) { ops.Add##method(); });
  TESLA_MODEL_OPS(TESLA_REGISTER_OP)
#undef TESLA_REGISTER_OP
  // Copies of the library's registrations as the resolver holds them (builtin_code set).
  const TfLiteRegistration* transpose = library_ops_.FindOp(tflite::BuiltinOperator_TRANSPOSE);
  library_transpose = transpose != nullptr ? *transpose : tflite::Register_TRANSPOSE();
  transpose_ = library_transpose;
  transpose_.invoke = transpose_eval;
  const TfLiteRegistration* rsqrt = library_ops_.FindOp(tflite::BuiltinOperator_RSQRT);
  library_rsqrt = rsqrt != nullptr ? *rsqrt : tflite::ops::micro::Register_RSQRT();
  rsqrt_ = library_rsqrt;
  rsqrt_.prepare = rsqrt_prepare;
  rsqrt_.invoke = rsqrt_eval;
  const TfLiteRegistration* fully_connected =
      library_ops_.FindOp(tflite::BuiltinOperator_FULLY_CONNECTED);
  library_fully_connected =
      fully_connected != nullptr ? *fully_connected : tflite::Register_FULLY_CONNECTED();
  fully_connected_ = library_fully_connected;
  fully_connected_.init = fully_connected_init;
  fully_connected_.prepare = fully_connected_prepare;
  fully_connected_.invoke = fully_connected_eval;
  const TfLiteRegistration* mul = library_ops_.FindOp(tflite::BuiltinOperator_MUL);
  library_mul = mul != nullptr ? *mul : tflite::Register_MUL();
  mul_ = library_mul;
  mul_.invoke = mul_eval;
  const TfLiteRegistration* sum = library_ops_.FindOp(tflite::BuiltinOperator_SUM);
  library_sum = sum != nullptr ? *sum : tflite::Register_SUM();
  sum_ = library_sum;
  sum_.invoke = sum_eval;
  const TfLiteRegistration* mean = library_ops_.FindOp(tflite::BuiltinOperator_MEAN);
  library_mean = mean != nullptr ? *mean : tflite::Register_MEAN();
  mean_ = library_mean;
  mean_.invoke = mean_eval;
}

const TfLiteRegistration* DeviceOpResolver::FindOp(tflite::BuiltinOperator op) const {
  if (op == tflite::BuiltinOperator_STRIDED_SLICE) {
    return strided_slice_.invoke != nullptr ? &strided_slice_ : nullptr;
  }
  const TfLiteRegistration* found = library_ops_.FindOp(op);
  if (found != nullptr && op == tflite::BuiltinOperator_TRANSPOSE) return &transpose_;
  if (found != nullptr && op == tflite::BuiltinOperator_RSQRT) return &rsqrt_;
  if (found != nullptr && op == tflite::BuiltinOperator_FULLY_CONNECTED) return &fully_connected_;
  if (found != nullptr && op == tflite::BuiltinOperator_MUL) return &mul_;
  if (found != nullptr && op == tflite::BuiltinOperator_SUM) return &sum_;
  if (found != nullptr && op == tflite::BuiltinOperator_MEAN) return &mean_;
  return found;
}

const TfLiteRegistration* DeviceOpResolver::FindOp(const char* op) const {
  return library_ops_.FindOp(op);
}

tflite::TfLiteBridgeBuiltinParseFunction DeviceOpResolver::GetOpDataParser(
    tflite::BuiltinOperator op) const {
  if (op == tflite::BuiltinOperator_STRIDED_SLICE) {
    return strided_slice_.invoke != nullptr ? tflite::ParseStridedSlice : nullptr;
  }
  return library_ops_.GetOpDataParser(op);
}

}  // namespace tesla
