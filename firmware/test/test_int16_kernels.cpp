// Host test: firmware/tflm/int16_kernels.h (and dot_s16_s8.h's requantize64, the int16
// FULLY_CONNECTED's requantisation) against the Arduino library's reference kernels
// (header-only templates, compiled here from the same library), on random tensors and extreme
// values. Every output must be the same integer. Prints "<n> checks, 0 failures".
#include <stdio.h>

#include <random>
#include <vector>

#include "tensorflow/lite/kernels/internal/reference/integer_ops/mul.h"
#include "tensorflow/lite/kernels/internal/reference/reduce.h"
#include "tflm/dot_s16_s8.h"
#include "tflm/int16_kernels.h"

namespace {

int checks = 0;
int failures = 0;

void expect(bool ok, const char* what, long a, long b) {
  ++checks;
  if (!ok && ++failures <= 20) fprintf(stderr, "FAIL %s: %ld != %ld\n", what, a, b);
}

std::mt19937 rng(7);

int uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng); }

int16_t random_int16() {
  switch (uniform(0, 5)) {
    case 0: return std::numeric_limits<int16_t>::min();
    case 1: return std::numeric_limits<int16_t>::max();
    case 2: return static_cast<int16_t>(uniform(-3, 3));
    default: return static_cast<int16_t>(uniform(-32768, 32767));
  }
}

std::vector<int16_t> random_tensor(int size) {
  std::vector<int16_t> data(size);
  for (auto& v : data) v = random_int16();
  return data;
}

void check_multiplier() {
  for (int i = 0; i < 300000; ++i) {
    const int32_t x = i % 7 == 0 ? (i % 2 ? INT32_MIN : INT32_MAX)
                                 : static_cast<int32_t>(rng());
    const int32_t multiplier = i % 11 == 0 ? (1 << 30) : (1 << 30) + static_cast<int32_t>(rng() >> 2);
    const int shift = uniform(-31, i % 3 == 0 ? 4 : 0);
    // The reference's left shift overflows (UB) for large x: compare where it does not.
    if (shift > 0 && (x > (INT32_MAX >> shift) || x < (INT32_MIN >> shift))) continue;
    const int32_t want = tflite::MultiplyByQuantizedMultiplier(x, multiplier, shift);
    const int32_t got =
        tesla::multiply_by_quantized_multiplier(x, tesla::make_quantized_multiplier(multiplier, shift));
    expect(got == want, "multiply_by_quantized_multiplier", got, want);
  }
}

// requantize64 against tflite::MultiplyByQuantizedMultiplier(int64_t, ...) over the range the
// library assumes (|x| < 2^47, multiplier >= 0, shift in [-31, 7]), extremes included, and the
// int16 x int8 dot products plus an int64 bias that the node's layers feed it.
void check_requantize64() {
  for (int i = 0; i < 300000; ++i) {
    const int64_t limit = int64_t{1} << 47;
    int64_t x;
    switch (i % 5) {
      case 0: x = i % 2 ? limit - 1 : -limit; break;
      case 1: x = static_cast<int64_t>(static_cast<int32_t>(rng())) * uniform(-128, 127); break;
      case 2: x = uniform(-3, 3); break;
      default: x = (static_cast<int64_t>(rng()) << 16 | (rng() & 0xFFFF)) % limit; break;
    }
    int32_t multiplier;
    switch (i % 7) {
      case 0: multiplier = 0x7FFFFFFF; break;
      case 1: multiplier = 0x7FFF0000 - uniform(0, 1); break;
      case 2: multiplier = 1 << 30; break;
      default: multiplier = static_cast<int32_t>(rng() >> 1); break;
    }
    const int shift = uniform(-31, 7);
    const int32_t want = tflite::MultiplyByQuantizedMultiplier(x, multiplier, shift);
    const tesla::Requantizer64 q = tesla::make_requantizer64(multiplier, shift);
    const int32_t got = tesla::requantize64(x, q);
    expect(got == want, "requantize64", got, want);
    // The int32 fast path, on the low word of x (any int32, its extremes included).
    const int32_t x32 = i % 13 == 0 ? (i % 2 ? INT32_MIN : INT32_MAX) : static_cast<int32_t>(x);
    const int32_t want32 = tflite::MultiplyByQuantizedMultiplier(int64_t{x32}, multiplier, shift);
    const int32_t got32 = tesla::requantize32(x32, q);
    expect(got32 == want32, "requantize32", got32, want32);
  }
}

tflite::RuntimeShape shape_of(const std::vector<int>& dims) {
  return tflite::RuntimeShape(static_cast<int>(dims.size()), dims.data());
}

void check_broadcast_mul() {
  for (int trial = 0; trial < 3000; ++trial) {
    const int rank = uniform(1, 4);
    std::vector<int> out(rank), a(rank), b(rank);
    for (int d = 0; d < rank; ++d) {
      const int size = uniform(1, 9);
      a[d] = uniform(0, 2) == 0 ? 1 : size;
      b[d] = uniform(0, 2) == 0 ? 1 : size;
    }
    if (trial % 5 == 0) b.assign(trial % 2 ? 1 : 0, 1);  // a scalar or a rank-1 second input
    for (int d = 0; d < rank; ++d) {
      const int from_b = d - rank + static_cast<int>(b.size());  // b is right-aligned
      out[d] = std::max(a[d], from_b >= 0 ? b[from_b] : 1);
    }
    const auto shape_a = shape_of(a), shape_b = shape_of(b), shape_out = shape_of(out);
    const auto in_a = random_tensor(shape_a.FlatSize());
    const auto in_b = random_tensor(shape_b.FlatSize());
    tflite::ArithmeticParams params = {};
    params.input1_offset = 0;
    params.input2_offset = 0;
    params.output_offset = 0;
    params.output_multiplier = (1 << 30) + static_cast<int32_t>(rng() >> 2);
    params.output_shift = uniform(-20, trial % 4 == 0 ? 2 : -1);
    params.quantized_activation_min = trial % 3 == 0 ? -1000 : -32768;
    params.quantized_activation_max = trial % 3 == 0 ? 1000 : 32767;
    std::vector<int16_t> want(shape_out.FlatSize()), got(shape_out.FlatSize());
    tflite::reference_integer_ops::BroadcastMul4DSlow(params, shape_a, in_a.data(), shape_b,
                                                      in_b.data(), shape_out, want.data());
    tesla::broadcast_mul_s16(params, shape_a, in_a.data(), shape_b, in_b.data(), shape_out,
                             got.data());
    for (size_t i = 0; i < want.size(); ++i) expect(got[i] == want[i], "broadcast_mul_s16", got[i], want[i]);
  }
}

void check_sum_or_mean() {
  for (int trial = 0; trial < 3000; ++trial) {
    const int rank = uniform(1, 5);
    std::vector<int> dims(rank);
    for (auto& d : dims) d = uniform(1, 9);
    std::vector<int> axis(uniform(1, rank));
    for (auto& a : axis) a = uniform(-rank, rank - 1);  // negative and repeated axes too
    std::vector<int> out_dims;
    for (int d = 0; d < rank; ++d) {
      bool reduced = false;
      for (int a : axis) reduced = reduced || (a < 0 ? a + rank : a) == d;
      out_dims.push_back(reduced ? 1 : dims[d]);  // keep_dims
    }
    const auto input = random_tensor(shape_of(dims).FlatSize());
    const int outputs = shape_of(out_dims).FlatSize();
    const bool compute_sum = trial % 2 == 0;
    const float input_scale = std::uniform_real_distribution<float>(1e-6f, 1e-2f)(rng);
    // SUM's output scale must hold the sum (the reference does not clamp it either).
    const float output_scale =
        input_scale * std::uniform_real_distribution<float>(compute_sum ? 8.0f : 0.05f, 40.0f)(rng);
    std::vector<int16_t> want(outputs), got(outputs);
    std::vector<int32_t> want_sum(outputs), got_sum(outputs);
    int temp_index[6];
    int resolved[6];
    const bool ok_want = tflite::reference_ops::QuantizedMeanOrSum<int16_t, int32_t>(
        input.data(), 0, input_scale, dims.data(), rank, want.data(), 0, output_scale,
        out_dims.data(), rank, axis.data(), static_cast<int>(axis.size()), true, temp_index,
        resolved, want_sum.data(), compute_sum);
    const bool ok_got = tesla::sum_or_mean_s16(input.data(), 0, input_scale, dims.data(), rank,
                                               got.data(), 0, output_scale, outputs, axis.data(),
                                               static_cast<int>(axis.size()), got_sum.data(),
                                               compute_sum);
    expect(ok_got == ok_want, "sum_or_mean_s16 accepted", ok_got, ok_want);
    for (int i = 0; i < outputs; ++i) {
      expect(got_sum[i] == want_sum[i], "sum_or_mean_s16 sum", got_sum[i], want_sum[i]);
      expect(got[i] == want[i], compute_sum ? "sum_s16" : "mean_s16", got[i], want[i]);
    }
  }
}

}  // namespace

int main() {
  check_multiplier();
  check_requantize64();
  check_broadcast_mul();
  check_sum_or_mean();
  printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
