// The inner loop of the int16 x int8 per-channel FULLY_CONNECTED (most of the dense layers'
// instructions): sum of input[d] * weight[d], exactly as the library's reference
// FullyConnectedPerChannel adds it (int32 products into an int64), but two multiply-adds per
// instruction on a core with the DSP extension (Cortex-M4: SMLAD).
//
// Why it is exact: every product of an int16 and an int8 is at most 2^22 in magnitude, so a
// block of 256 of them (kDotBlock) sums to at most 2^30 and fits the int32 accumulator of SMLAD; each
// block's sum goes into the int64 total. No rounding, no saturation: the same integer.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#endif

namespace tesla {

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
// Four int8 weights w0..w3 (one word) -> the halfword pairs (w0, w1) and (w2, w3), sign-extended:
// SXTB16 and SXTB16 ROR #8, then PKHBT/PKHTB (GCC's ACLE has neither the rotation nor PKH).
inline void widen_pairs(uint32_t w, uint32_t* w01, uint32_t* w23) {
  uint32_t w02;
  uint32_t w13;
  __asm__("sxtb16 %0, %1" : "=r"(w02) : "r"(w));
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(w13) : "r"(w));
  __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(*w01) : "r"(w02), "r"(w13));
  __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(*w23) : "r"(w13), "r"(w02));
}
#endif

// Plain C, the reference's order of operations; also the fallback without the DSP extension.
inline int64_t dot_s16_s8_reference(const int16_t* input, const int8_t* weights, int depth) {
  int64_t total = 0;
  for (int d = 0; d < depth; ++d) total += int32_t(weights[d]) * int32_t(input[d]);
  return total;
}

// At most kBlock products in an int32 (see above).
constexpr int kDotBlock = 256;

inline int32_t dot_s16_s8_block(const int16_t* input, const int8_t* weights, int depth) {
  int32_t sum = 0;
  int d = 0;
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
  // Eight products per pass (two weight words): the loop's own compare and branch are paid
  // once per eight multiply-adds instead of once per four.
  for (; d + 8 <= depth; d += 8) {
    uint32_t w_lo;
    uint32_t w_hi;
    uint32_t x01;
    uint32_t x23;
    uint32_t x45;
    uint32_t x67;
    memcpy(&w_lo, weights + d, 4);
    memcpy(&w_hi, weights + d + 4, 4);
    memcpy(&x01, input + d, 4);
    memcpy(&x23, input + d + 2, 4);
    memcpy(&x45, input + d + 4, 4);
    memcpy(&x67, input + d + 6, 4);
    uint32_t w01;
    uint32_t w23;
    uint32_t w45;
    uint32_t w67;
    widen_pairs(w_lo, &w01, &w23);
    widen_pairs(w_hi, &w45, &w67);
    sum = __smlad(w01, x01, sum);
    sum = __smlad(w23, x23, sum);
    sum = __smlad(w45, x45, sum);
    sum = __smlad(w67, x67, sum);
  }
  for (; d + 4 <= depth; d += 4) {
    uint32_t w;  // four int8 weights; memcpy is one (unaligned) LDR on the M4
    uint32_t x01;
    uint32_t x23;
    memcpy(&w, weights + d, 4);
    memcpy(&x01, input + d, 4);
    memcpy(&x23, input + d + 2, 4);
    uint32_t w01;
    uint32_t w23;
    widen_pairs(w, &w01, &w23);
    sum = __smlad(w01, x01, sum);  // + w0*x0 + w1*x1
    sum = __smlad(w23, x23, sum);  // + w2*x2 + w3*x3
  }
#endif
  for (; d < depth; ++d) sum += int32_t(weights[d]) * int32_t(input[d]);
  return sum;
}

inline int64_t dot_s16_s8(const int16_t* input, const int8_t* weights, int depth) {
  if (depth <= kDotBlock) return dot_s16_s8_block(input, weights, depth);
  int64_t total = 0;
  for (int d = 0; d < depth; d += kDotBlock) {
    const int n = depth - d < kDotBlock ? depth - d : kDotBlock;
    total += dot_s16_s8_block(input + d, weights + d, n);
  }
  return total;
}

// tflite::MultiplyByQuantizedMultiplier(int64_t x, multiplier, shift), the requantisation of
// the reference FullyConnectedPerChannel for int16 inputs, with what depends only on the output
// channel (the multiplier reduced to 16 bits, the shift, the rounding term) computed once per
// channel instead of once per output, and without the library's asserts (this library build
// keeps them: a range check and two branches per output). The same integer expression, so the
// same result for every input; test/test_int16_kernels.cpp compares the two.
struct Requantizer64 {
  int64_t reduced_multiplier;
  int64_t round;
  int total_shift;
};

inline Requantizer64 make_requantizer64(int32_t quantized_multiplier, int shift) {
  const int32_t reduced = quantized_multiplier < 0x7FFF0000
                              ? ((quantized_multiplier + (1 << 15)) >> 16)
                              : 0x7FFF;
  const int total_shift = 15 - shift;
  return Requantizer64{reduced, int64_t{1} << (total_shift - 1), total_shift};
}

inline int32_t requantize64(int64_t x, const Requantizer64& q) {
  return static_cast<int32_t>((x * q.reduced_multiplier + q.round) >> q.total_shift);
}

// requantize64 for a sum that fits an int32 (a layer of depth <= kDotBlock whose biases are
// below 2^30 in magnitude): the product with the 16-bit multiplier is one 32 x 32 -> 64-bit
// multiply-add onto the rounding term, and the 64-bit shift (15 to 46 places) reads only the
// word it needs. Same integer as requantize64 for every int32 x (the host test compares them).
inline int32_t requantize32(int32_t x, const Requantizer64& q) {
  const int64_t total = static_cast<int64_t>(x) * q.reduced_multiplier + q.round;
  if (q.total_shift >= 32) {
    return static_cast<int32_t>(total >> 32) >> (q.total_shift - 32);
  }
  const uint32_t low = static_cast<uint32_t>(total) >> q.total_shift;
  const uint32_t high = static_cast<uint32_t>(static_cast<uint64_t>(total) >> 32)
                        << (32 - q.total_shift);
  return static_cast<int32_t>(low | high);
}

}  // namespace tesla
