// The inner loop of the int16 x int8 per-channel FULLY_CONNECTED (most of the dense layers'
// instructions): sum of input[d] * weight[d], exactly as the library's reference
// FullyConnectedPerChannel adds it (int32 products into an int64), but two multiply-adds per
// instruction on a core with the DSP extension (Cortex-M4: SMLAD).
//
// Why it is exact: every product of an int16 and an int8 is at most 2^22 in magnitude, so a
// block of 256 of them sums to at most 2^30 and fits the int32 accumulator of SMLAD; each
// block's sum goes into the int64 total. No rounding, no saturation: the same integer.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#endif

namespace tesla {

// Plain C, the reference's order of operations; also the fallback without the DSP extension.
inline int64_t dot_s16_s8_reference(const int16_t* input, const int8_t* weights, int depth) {
  int64_t total = 0;
  for (int d = 0; d < depth; ++d) total += int32_t(weights[d]) * int32_t(input[d]);
  return total;
}

inline int64_t dot_s16_s8(const int16_t* input, const int8_t* weights, int depth) {
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
  constexpr int kBlock = 256;  // products per int32 partial sum (see above)
  int64_t total = 0;
  int d = 0;
  while (depth - d >= 4) {
    const int remaining = (depth - d) & ~3;
    const int end = d + (remaining < kBlock ? remaining : kBlock);
    int32_t block = 0;
    for (; d < end; d += 4) {
      uint32_t w;  // four int8 weights; memcpy is one (unaligned) LDR on the M4
      uint32_t x01;
      uint32_t x23;
      memcpy(&w, weights + d, 4);
      memcpy(&x01, input + d, 4);
      memcpy(&x23, input + d + 2, 4);
      const uint32_t w02 = __sxtb16(w);                      // w0 | w2 << 16, sign-extended
      const uint32_t w13 = __sxtb16((w >> 8) | (w << 24));  // w1 | w3 << 16 (ROR 8)
      const uint32_t w01 = (w02 & 0xFFFFu) | (w13 << 16);    // PKHBT
      const uint32_t w23 = (w02 >> 16) | (w13 & 0xFFFF0000u);  // PKHTB
      block = __smlad(w01, x01, block);  // + w0*x0 + w1*x1
      block = __smlad(w23, x23, block);  // + w2*x2 + w3*x3
    }
    total += block;
  }
  return total + dot_s16_s8_reference(input + d, weights + d, depth - d);
#else
  return dot_s16_s8_reference(input, weights, depth);
#endif
}

}  // namespace tesla
