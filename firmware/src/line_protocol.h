// The serial line protocol (docs/serial-protocol.md), node side: frame checks identical to
// tesla_gateway/sources/line_protocol.py (same reject reasons, same order), the H/R encoders and
// the decoder of the gateway's T (time) line.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

constexpr size_t kMaxLineBytes = 512;  // including the LF
constexpr size_t kMaxFields = 24;
constexpr uint32_t kLineProtocolVersion = 1;

enum class LineReject : uint8_t { kNone, kTooLarge, kBadEncoding, kBadFrame, kBadChecksum };
const char* line_reject_name(LineReject reject);

struct LineView {
  char type = 0;
  const char* fields[kMaxFields] = {};
  size_t count = 0;
};

// Checks one line (with or without CR/LF) and splits it in place ('\0' at each ','), so
// `line` must stay alive while `out` is used. `length` excludes nothing: pass what you read.
LineReject parse_line(char* line, size_t length, LineView* out);

// The gateway's `T,<unix seconds>,<standard UTC offset seconds>` (docs/serial-protocol.md):
// the time it holds, refused outside the protocol's bounds (a gateway whose clock is unset).
constexpr int64_t kTimeMinSeconds = 1700000000;  // 2023-11-14
constexpr int64_t kTimeMaxSeconds = 4102444800;  // 2100-01-01
constexpr int32_t kMaxUtcOffsetSeconds = 14 * 3600;
struct TimeSync {
  int64_t unix_s = 0;
  int32_t utc_offset_s = 0;
};
// A parsed `T` line's fields into `out`; false (out untouched) if they are not a valid time.
bool parse_time(const LineView& view, TimeSync* out);

// Frames `type`, fields, '*', CRC, LF into `out`; returns the length or 0 if it does not fit.
size_t encode_line(char type, const char* const* fields, size_t count, char* out, size_t capacity);

// Python's f"{v:.3f}" with trailing zeros and '.' stripped; "nan"; "-0" becomes "0".
void format_value(double value, char* out, size_t capacity);

size_t encode_hello(const char* node_id, const char* firmware, const char* model_name,
                    const uint32_t* model_version, char* out, size_t capacity);

struct ReadingValues {
  // NaN-free optional values; has_* marks presence. Raw first, then calibrated.
  bool has_pm1 = false, has_pm2_5 = false, has_pm10 = false, has_rh = false, has_temp_c = false;
  double pm1 = 0, pm2_5 = 0, pm10 = 0, rh = 0, temp_c = 0;
  bool has_cal_pm1 = false, has_cal_pm2_5 = false, has_cal_pm10 = false;
  double cal_pm1 = 0, cal_pm2_5 = 0, cal_pm10 = 0;
  bool has_model_version = false;
  uint32_t model_version = 0;
};

// timestamp < 0 means "no clock" ('-').
size_t encode_reading(const char* node_id, uint32_t seq, double timestamp, const ReadingValues& v,
                      char* out, size_t capacity);

// Cuts a byte stream into lines, bounded like the gateway's LineSplitter.
class LineReader {
 public:
  // Feeds one byte; returns true when `line()` holds a complete line (without LF).
  bool feed(uint8_t byte);
  char* line() { return buffer_; }
  size_t length() const { return complete_length_; }
  bool overflowed() const { return overflowed_; }

 private:
  char buffer_[kMaxLineBytes + 1] = {};
  size_t used_ = 0;
  size_t complete_length_ = 0;
  bool discarding_ = false;
  bool overflowed_ = false;
};

}  // namespace tesla
