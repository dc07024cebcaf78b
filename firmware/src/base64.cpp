#include "base64.h"

namespace tesla {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int value_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

int base64_decode(const char* text, size_t length, uint8_t* out, size_t capacity) {
  if (length % 4 != 0) return -1;
  size_t written = 0;
  for (size_t i = 0; i < length; i += 4) {
    int v[4];
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      char c = text[i + k];
      if (c == '=') {
        if (i + 4 != length || k < 2) return -1;  // padding only at the very end
        v[k] = 0;
        ++padding;
      } else {
        if (padding) return -1;
        v[k] = value_of(c);
        if (v[k] < 0) return -1;
      }
    }
    uint32_t triple = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    size_t bytes = 3 - size_t(padding);
    if (written + bytes > capacity) return -1;
    for (size_t k = 0; k < bytes; ++k) out[written++] = uint8_t(triple >> (16 - 8 * k));
  }
  return int(written);
}

int base64_encode(const uint8_t* data, size_t length, char* out, size_t capacity) {
  size_t needed = (length + 2) / 3 * 4;
  if (needed + 1 > capacity) return -1;
  size_t o = 0;
  for (size_t i = 0; i < length; i += 3) {
    uint32_t triple = uint32_t(data[i]) << 16;
    if (i + 1 < length) triple |= uint32_t(data[i + 1]) << 8;
    if (i + 2 < length) triple |= data[i + 2];
    out[o++] = kAlphabet[(triple >> 18) & 63];
    out[o++] = kAlphabet[(triple >> 12) & 63];
    out[o++] = i + 1 < length ? kAlphabet[(triple >> 6) & 63] : '=';
    out[o++] = i + 2 < length ? kAlphabet[triple & 63] : '=';
  }
  out[o] = '\0';
  return int(o);
}

}  // namespace tesla
