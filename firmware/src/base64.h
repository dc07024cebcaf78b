// Standard base64 with '=' padding (RFC 4648), strict: what Python's b64decode(validate=True) accepts.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

// Returns the decoded length, or -1 if `text` is not canonical base64 or does not fit `capacity`.
int base64_decode(const char* text, size_t length, uint8_t* out, size_t capacity);
// Returns the encoded length (without NUL), or -1 if it does not fit `capacity` (incl. NUL).
int base64_encode(const uint8_t* data, size_t length, char* out, size_t capacity);

}  // namespace tesla
