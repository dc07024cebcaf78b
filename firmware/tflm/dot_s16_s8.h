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

}  // namespace tesla
