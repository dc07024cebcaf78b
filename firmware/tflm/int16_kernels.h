// Faster int16 MUL (with broadcasting) and SUM/MEAN for the int8 device graphs (int16
// activations), bit for bit the library's reference kernels.
//
// Why: the attention's broadcast MUL (1x9x1x16 * 1x1x9x16) and the SUM after it ran the
// library's generic loops (BroadcastMul4DSlow: two SubscriptToIndex per element; the reduce:
// an N-d index walk per element), about 50 and 130 instructions per element on the M4, 44 % of
// an inference. Here the same arithmetic runs in loops over precomputed strides:
// - MUL: the same NdArrayDesc strides, the same product and requantisation as
//   reference_integer_ops::BroadcastMul4DSlow, with MultiplyByQuantizedMultiplier written out
//   as one 64-bit multiply (see multiply_by_quantized_multiplier below, exact for every input);
// - SUM/MEAN: the same int32 sums (integer additions: order does not matter) and the same float
//   finish, written as in reference_ops::QuantizedMeanOrSum.
// tests/firmware/test_int16_kernels.cpp compares both with the library's reference kernels on
// random tensors; the node's golden-window tests compare whole inferences with LiteRT.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <limits>

#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/kernels/internal/cppmath.h"
#include "tensorflow/lite/kernels/internal/max.h"
#include "tensorflow/lite/kernels/internal/min.h"
#include "tensorflow/lite/kernels/internal/types.h"

namespace tesla {

// tflite::MultiplyByQuantizedMultiplier(int32 x, multiplier, shift), double rounding (the
// library's TFLITE_SINGLE_ROUNDING is 0), for a multiplier in [0, 2^31):
// SaturatingRoundingDoublingHighMul(a, b) adds a nudge of 2^30 (or 1 - 2^30 below zero) and
// truncates towards zero; both cases equal floor((a*b + 2^30) / 2^31), one arithmetic shift.
// Its only saturating input (a = b = INT32_MIN) cannot occur with b >= 0.
// RoundingDivideByPOT(x, e) rounds half away from zero, as gemmlowp's.
struct QuantizedMultiplier {
  int32_t multiplier;
  int left_shift;
  int right_shift;
  int32_t mask;  // (1 << right_shift) - 1, once per op rather than per element
};

inline QuantizedMultiplier make_quantized_multiplier(int32_t multiplier, int shift) {
  const int right_shift = shift > 0 ? 0 : -shift;
  return QuantizedMultiplier{multiplier, shift > 0 ? shift : 0, right_shift,
                             static_cast<int32_t>((int64_t{1} << right_shift) - 1)};
}

inline int32_t multiply_by_quantized_multiplier(int32_t x, const QuantizedMultiplier& q) {
  // x * (1 << left_shift) as the reference computes it (two's complement wrap).
  const int32_t shifted = static_cast<int32_t>(static_cast<uint32_t>(x) << q.left_shift);
  const int32_t high = static_cast<int32_t>(
      (static_cast<int64_t>(shifted) * q.multiplier + (int64_t{1} << 30)) >> 31);
  const int32_t remainder = high & q.mask;
  const int32_t threshold = (q.mask >> 1) + (high < 0 ? 1 : 0);
  return (high >> q.right_shift) + (remainder > threshold ? 1 : 0);
}

// One row of broadcast_mul_s16 for what the int16 graphs always have: zero offsets (int16 is
// symmetric) and a multiplier below one (no left shift). The arithmetic is
// multiply_by_quantized_multiplier's with those two terms gone, so fewer values stay live in the
// loop (the general loop keeps eight invariants and spills them to the stack on the M4), and
// the strides are template arguments (1, or 0 for the broadcast operand).
template <int kStep1, int kStep2>
inline void mul_row_s16(const int16_t* row1, const int16_t* row2, int16_t* output, int count,
                        int32_t multiplier, int right_shift, int32_t mask, int32_t low,
                        int32_t high) {
  const int32_t half = mask >> 1;
  for (int c = 0; c < count; ++c) {
    const int32_t product = int32_t{row1[c * kStep1]} * int32_t{row2[c * kStep2]};
    const int32_t doubled = static_cast<int32_t>(
        (static_cast<int64_t>(product) * multiplier + (int64_t{1} << 30)) >> 31);
    const int32_t threshold = half + (doubled < 0 ? 1 : 0);
    const int32_t value = (doubled >> right_shift) + ((doubled & mask) > threshold ? 1 : 0);
    output[c] = static_cast<int16_t>(std::min(high, std::max(low, value)));
  }
}

// reference_integer_ops::BroadcastMul4DSlow<int16_t> (shapes of up to 4 dimensions).
inline void broadcast_mul_s16(const tflite::ArithmeticParams& params,
                              const tflite::RuntimeShape& shape1, const int16_t* input1,
                              const tflite::RuntimeShape& shape2, const int16_t* input2,
                              const tflite::RuntimeShape& output_shape, int16_t* output) {
  tflite::NdArrayDesc<4> desc1;
  tflite::NdArrayDesc<4> desc2;
  tflite::NdArrayDescsForElementwiseBroadcast(shape1, shape2, &desc1, &desc2);
  const tflite::RuntimeShape shape = tflite::RuntimeShape::ExtendedShape(4, output_shape);
  const QuantizedMultiplier q =
      make_quantized_multiplier(params.output_multiplier, params.output_shift);
  const int32_t offset1 = params.input1_offset;
  const int32_t offset2 = params.input2_offset;
  const int32_t output_offset = params.output_offset;
  const int32_t low = params.quantized_activation_min;
  const int32_t high = params.quantized_activation_max;
  const int depth = shape.Dims(3);
  const int step1 = desc1.strides[3];
  const int step2 = desc2.strides[3];
  using Row = void (*)(const int16_t*, const int16_t*, int16_t*, int, int32_t, int, int32_t,
                       int32_t, int32_t);
  Row fast = nullptr;
  if (offset1 == 0 && offset2 == 0 && output_offset == 0 && q.left_shift == 0) {
    if (step1 == 1 && step2 == 1) fast = mul_row_s16<1, 1>;
    if (step1 == 1 && step2 == 0) fast = mul_row_s16<1, 0>;
    if (step1 == 0 && step2 == 1) fast = mul_row_s16<0, 1>;
  }
  for (int b = 0; b < shape.Dims(0); ++b) {
    for (int y = 0; y < shape.Dims(1); ++y) {
      for (int x = 0; x < shape.Dims(2); ++x) {
        const int16_t* row1 =
            input1 + b * desc1.strides[0] + y * desc1.strides[1] + x * desc1.strides[2];
        const int16_t* row2 =
            input2 + b * desc2.strides[0] + y * desc2.strides[1] + x * desc2.strides[2];
        if (fast != nullptr) {
          fast(row1, row2, output, depth, q.multiplier, q.right_shift, q.mask, low, high);
          output += depth;
          continue;
        }
        for (int c = 0; c < depth; ++c) {
          const int32_t product = (offset1 + row1[c * step1]) * (offset2 + row2[c * step2]);
          const int32_t value = output_offset + multiply_by_quantized_multiplier(product, q);
          *output++ = static_cast<int16_t>(std::min(high, std::max(low, value)));
        }
      }
    }
  }
}

// The most dimensions sum_or_mean_s16 handles (the library's kMaxNumberOfAxis is 5).
constexpr int kMaxReduceDims = 6;

// reference_ops::QuantizedMeanOrSum<int16_t, int32_t>: the int32 sum over the axes, then
// round(sum * scale + bias) (SUM) or round(sum / count * scale + bias) (MEAN) in float.
// Returns false where the reference would (an axis out of range) or for more than
// kMaxReduceDims dimensions; temp_sum holds one int32 per output.
inline bool sum_or_mean_s16(const int16_t* input, int32_t input_zero_point, float input_scale,
                            const int* input_dims, int input_num_dims, int16_t* output,
                            int32_t output_zero_point, float output_scale, int num_outputs,
                            const int* axis, int num_axis, int32_t* temp_sum,
                            bool compute_sum) {
  if (input_num_dims > kMaxReduceDims) return false;
  for (int i = 0; i < num_outputs; ++i) {
    output[i] = 0;
    temp_sum[i] = 0;
  }
  for (int d = 0; d < input_num_dims; ++d) {
    if (input_dims[d] == 0) return true;
  }
  bool reduced[kMaxReduceDims] = {};
  for (int i = 0; i < num_axis && input_num_dims > 0; ++i) {
    const int current = axis[i] < 0 ? axis[i] + input_num_dims : axis[i];
    if (current < 0 || current >= input_num_dims) return false;
    reduced[current] = true;
  }
  // Output stride of each input dimension: 0 along a reduced axis.
  int out_stride[kMaxReduceDims] = {};
  int kept = 1;
  size_t count = 1;  // elements summed into each output
  for (int d = input_num_dims - 1; d >= 0; --d) {
    if (reduced[d]) {
      count *= static_cast<size_t>(input_dims[d]);
    } else {
      out_stride[d] = kept;
      kept *= input_dims[d];
    }
  }
  const int inner = input_num_dims > 0 ? input_dims[input_num_dims - 1] : 1;
  const bool inner_reduced = input_num_dims > 0 && reduced[input_num_dims - 1];
  int total = 1;
  for (int d = 0; d < input_num_dims; ++d) total *= input_dims[d];
  int index[kMaxReduceDims] = {};
  int out_base = 0;
  for (int row = 0; row < total / inner; ++row) {
    int32_t* sums = temp_sum + out_base;
    if (inner_reduced) {
      int32_t sum = 0;
      for (int c = 0; c < inner; ++c) sum += input[c];
      *sums += sum;
    } else {
      for (int c = 0; c < inner; ++c) sums[c] += input[c];
    }
    input += inner;
    for (int d = input_num_dims - 2; d >= 0; --d) {  // the next row's output offset
      out_base += out_stride[d];
      if (++index[d] < input_dims[d]) break;
      out_base -= out_stride[d] * input_dims[d];
      index[d] = 0;
    }
  }
  // As the reference writes it (float, TfLiteRound: half away from zero).
  const float scale = input_scale / output_scale;
  if (compute_sum) {
    const float bias = -input_zero_point * scale * count;
    for (int i = 0; i < num_outputs; ++i) {
      const int32_t value =
          static_cast<int32_t>(tflite::TfLiteRound(temp_sum[i] * scale + bias)) +
          output_zero_point;
      output[i] = static_cast<int16_t>(value);
    }
  } else {
    const float bias = -input_zero_point * scale;
    for (int i = 0; i < num_outputs; ++i) {
      const float mean = static_cast<float>(temp_sum[i]) / static_cast<float>(count);
      float result = tflite::TfLiteMin(tflite::TfLiteRound(mean * scale + bias) + output_zero_point,
                                       static_cast<float>(std::numeric_limits<int16_t>::max()));
      result = tflite::TfLiteMax(result, static_cast<float>(std::numeric_limits<int16_t>::min()));
      output[i] = static_cast<int16_t>(result);
    }
  }
  return true;
}

}  // namespace tesla
