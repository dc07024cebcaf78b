#include "line_protocol.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checksums.h"

namespace tesla {

const char* line_reject_name(LineReject reject) {
  switch (reject) {
    case LineReject::kNone: return "none";
    case LineReject::kTooLarge: return "too_large";
    case LineReject::kBadEncoding: return "bad_encoding";
    case LineReject::kBadFrame: return "bad_frame";
    case LineReject::kBadChecksum: return "bad_checksum";
  }
  return "unknown";
}

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lower case is a bad frame, as in the gateway
}

}  // namespace

LineReject parse_line(char* line, size_t length, LineView* out) {
  if (length > 0 && line[length - 1] == '\n') --length;
  if (length > 0 && line[length - 1] == '\r') --length;
  if (length + 1 > kMaxLineBytes) return LineReject::kTooLarge;
  for (size_t i = 0; i < length; ++i) {
    uint8_t c = static_cast<uint8_t>(line[i]);
    if (c < 0x21 || c > 0x7E) return LineReject::kBadEncoding;
  }
  size_t star = length;
  for (size_t i = length; i > 0; --i) {
    if (line[i - 1] == '*') { star = i - 1; break; }
  }
  if (star == length || length - star - 1 != 4) return LineReject::kBadFrame;
  uint16_t given = 0;
  for (size_t i = star + 1; i < length; ++i) {
    int v = hex_value(line[i]);
    if (v < 0) return LineReject::kBadFrame;
    given = static_cast<uint16_t>((given << 4) | v);
  }
  if (crc16_ccitt_false(reinterpret_cast<const uint8_t*>(line), star) != given) {
    return LineReject::kBadChecksum;
  }
  if (memchr(line, '*', star) != nullptr) return LineReject::kBadFrame;
  line[star] = '\0';
  // Split "T,f1,f2": the type is everything before the first ',' and must be one letter.
  out->count = 0;
  char* cursor = line;
  char* comma = strchr(cursor, ',');
  if (comma != nullptr) *comma = '\0';
  if (strlen(cursor) != 1) return LineReject::kBadFrame;
  out->type = cursor[0];
  while (comma != nullptr) {
    cursor = comma + 1;
    comma = strchr(cursor, ',');
    if (comma != nullptr) *comma = '\0';
    if (out->count == kMaxFields) return LineReject::kBadFrame;
    out->fields[out->count++] = cursor;
  }
  switch (out->type) {
    case 'H': case 'R': case 'O': case 'T': return LineReject::kNone;
    case 'Q': return out->count == 0 ? LineReject::kNone : LineReject::kBadFrame;
    default: return LineReject::kBadFrame;
  }
}

namespace {

// `[0-9]{1,digits}` (with a leading '-' when `sign`) into *out; false for anything else.
bool parse_integer(const char* text, size_t digits, bool sign, int64_t* out) {
  const bool negative = sign && *text == '-';
  if (negative) ++text;
  size_t n = 0;
  int64_t value = 0;
  for (; text[n] != '\0'; ++n) {
    if (n == digits || text[n] < '0' || text[n] > '9') return false;
    value = value * 10 + (text[n] - '0');
  }
  if (n == 0) return false;
  *out = negative ? -value : value;
  return true;
}

}  // namespace

bool parse_time(const LineView& view, TimeSync* out) {
  int64_t unix_s = 0;
  int64_t offset = 0;
  if (view.type != 'T' || view.count != 2 || !parse_integer(view.fields[0], 10, false, &unix_s) ||
      !parse_integer(view.fields[1], 5, true, &offset)) {
    return false;
  }
  if (unix_s < kTimeMinSeconds || unix_s > kTimeMaxSeconds) return false;
  if (offset < -kMaxUtcOffsetSeconds || offset > kMaxUtcOffsetSeconds) return false;
  out->unix_s = unix_s;
  out->utc_offset_s = int32_t(offset);
  return true;
}

size_t encode_line(char type, const char* const* fields, size_t count, char* out, size_t capacity) {
  size_t used = 0;
  auto put = [&](const char* text, size_t n) {
    if (used + n >= capacity) return false;
    memcpy(out + used, text, n);
    used += n;
    return true;
  };
  if (!put(&type, 1)) return 0;
  for (size_t i = 0; i < count; ++i) {
    for (const char* c = fields[i]; *c; ++c) {
      uint8_t b = static_cast<uint8_t>(*c);
      if (b < 0x21 || b > 0x7E || *c == ',' || *c == '*') return 0;
    }
    if (!put(",", 1) || !put(fields[i], strlen(fields[i]))) return 0;
  }
  char tail[8];
  snprintf(tail, sizeof(tail), "*%04X\n", crc16_ccitt_false(reinterpret_cast<uint8_t*>(out), used));
  if (!put(tail, 6) || used > kMaxLineBytes) return 0;
  out[used] = '\0';
  return used;
}

void format_value(double value, char* out, size_t capacity) {
  if (isnan(value)) {
    snprintf(out, capacity, "nan");
    return;
  }
  snprintf(out, capacity, "%.3f", value);
  size_t n = strlen(out);
  while (n > 0 && out[n - 1] == '0') out[--n] = '\0';
  if (n > 0 && out[n - 1] == '.') out[--n] = '\0';
  if (n == 0 || strcmp(out, "-0") == 0) snprintf(out, capacity, "0");
}

size_t encode_hello(const char* node_id, const char* firmware, const char* model_name,
                    const uint32_t* model_version, char* out, size_t capacity) {
  char version[12];
  char protocol[12];
  snprintf(protocol, sizeof(protocol), "%lu", static_cast<unsigned long>(kLineProtocolVersion));
  if (model_version != nullptr) {
    snprintf(version, sizeof(version), "%lu", static_cast<unsigned long>(*model_version));
  } else {
    snprintf(version, sizeof(version), "-");
  }
  const char* fields[] = {protocol, node_id, firmware, model_name ? model_name : "-", version};
  return encode_line('H', fields, 5, out, capacity);
}

size_t encode_reading(const char* node_id, uint32_t seq, double timestamp, const ReadingValues& v,
                      char* out, size_t capacity) {
  char storage[12][32];
  const char* fields[14];
  size_t count = 0;
  size_t slot = 0;
  fields[count++] = node_id;
  snprintf(storage[slot], 32, "%lu", static_cast<unsigned long>(seq));
  fields[count++] = storage[slot++];
  if (timestamp < 0) {
    fields[count++] = "-";
  } else {
    format_value(timestamp, storage[slot], 32);
    fields[count++] = storage[slot++];
  }
  struct Item { bool present; const char* key; double value; };
  const Item items[] = {
      {v.has_pm1, "pm1", v.pm1},          {v.has_pm2_5, "pm2_5", v.pm2_5},
      {v.has_pm10, "pm10", v.pm10},       {v.has_rh, "rh", v.rh},
      {v.has_temp_c, "temp_c", v.temp_c}, {v.has_cal_pm1, "cal_pm1", v.cal_pm1},
      {v.has_cal_pm2_5, "cal_pm2_5", v.cal_pm2_5}, {v.has_cal_pm10, "cal_pm10", v.cal_pm10},
  };
  bool calibrated = false;
  for (const Item& item : items) {
    if (!item.present) continue;
    if (isinf(item.value)) return 0;
    calibrated |= strncmp(item.key, "cal_", 4) == 0;
    char number[24];
    format_value(item.value, number, sizeof(number));
    snprintf(storage[slot], 32, "%s=%s", item.key, number);
    fields[count++] = storage[slot++];
  }
  if (calibrated && !v.has_model_version) return 0;
  if (v.has_model_version) {
    snprintf(storage[slot], 32, "mv=%lu", static_cast<unsigned long>(v.model_version));
    fields[count++] = storage[slot++];
  }
  return encode_line('R', fields, count, out, capacity);
}

bool LineReader::feed(uint8_t byte) {
  if (byte == '\n') {
    bool was_discarding = discarding_;
    discarding_ = false;
    size_t length = used_;
    used_ = 0;
    if (was_discarding || length == 0) return false;
    buffer_[length] = '\0';
    complete_length_ = length;
    return !(length == 1 && buffer_[0] == '\r');
  }
  if (discarding_) return false;
  if (used_ + 1 >= kMaxLineBytes) {  // the LF would make it longer than the limit
    discarding_ = true;
    overflowed_ = true;
    used_ = 0;
    return false;
  }
  buffer_[used_++] = static_cast<char>(byte);
  return false;
}

}  // namespace tesla
