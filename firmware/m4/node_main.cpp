// The TESLA node on the emulated Cortex-M4 board: the sketch's boot and gateway handling
// (hello, OTA into the inactive slot, trial boot with self-test, rollback) over the same
// portable core, with the board layer of board.h instead of the Arduino shims.
//
// Besides the gateway protocol (docs/serial-protocol.md) it takes test commands, lines that
// start with '#' and that the gateway never sends:
//   #V,<offset>,<v>,...   put raw values into the [N, C] window at offset (oldest period first,
//                         a period's channels together: PM ug/m3, then rh %, temp_c degC);
//                         every <v> of #V and #A is a float32 as the 8 hex digits of its bits
//   #I                    calibrate the window -> #O,<int16 output>,<value>,<ticks>,<sum of q>
//   #A,<period>,<v>,...   one period's readings into the node's own window (src/window.h, the
//                         sketch's: gap rule, young windows padded), a value per measured
//                         channel in the model's order (not the hour's), '-' for none
//   #U,<uptime ms>        the uptime the next T line counts as received at (default: the board's
//                         ticks), so a test knows the wall time of every period: with #U,0 a
//                         period p starts at the T line's time + p * kPeriodSeconds
//   #T                    -> #T,<0|1 wall time known>,<unix s at uptime 0>,<and ms>,<UTC offset s>
//   #W                    calibrate the node's window as the sketch does (hour channels from
//                         the last T line, src/model_input.h) ->
//                         #W,<history>,<int16 output>,<value>,<sum of q>, or #W,<history>,- when
//                         it is not valid (too young, a hole, a channel behind)
//   #C,<n>                run a loop of 2n instructions -> #C,<n>,<ticks> (counter check)
//   #M                    -> #M,<arena used>,<arena size>,<model bytes>,<heap used>
//   #R,<0|1>              1: the int16 FULLY_CONNECTED runs the library's reference kernel and
//                         int16 MUL/SUM/MEAN the library's kernels, 0: our kernels (default:
//                         dot_s16_s8.h, int16_kernels.h) -> #R,<0|1>
//   #K,<trials>           compare dot_s16_s8 with its plain-C reference on pseudo-random
//                         vectors (lengths 1..1100, extremes included) -> #K,<trials>,<mismatches>
//   #P                    calibrate the window once with a per-op profiler attached ->
//                         #P,<op>,<calls>,<ticks> per op type, then #P,end
//   #D                    after #I: every graph output as #D,<index>,<bytes>,<CRC-32 of bytes>
//                         (with a probe model whose outputs are its intermediate tensors, this
//                         finds the first op that computes differently from LiteRT)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "board.h"
#include "tflm/device_op_resolver.h"
#include "tflm/dot_s16_s8.h"
#include "tflm/model_runner.h"
#include "src/checksums.h"
#include "src/line_protocol.h"
#include "src/model_constants.h"
#include "src/model_input.h"
#include "src/ota_receiver.h"
#include "src/release_key.h"
#include "src/slots.h"
#include "src/wall_clock.h"
#include "src/window.h"

extern const unsigned char kModelData[];
extern const unsigned int kModelDataSize;
extern const unsigned char kModelDescriptor[];

namespace {

constexpr char kNodeId[] = "node-m4";
constexpr char kFirmwareVersion[] = "1.0.0";
constexpr uint32_t kSlotBase = tesla::board::kSlotRegionBase;
constexpr uint32_t kSlotBytes = tesla::model::kSlotBytes;  // the model + headroom, as the sketch

tesla::board::Uart gateway;
tesla::board::SlotFlash flash;
tesla::board::CryptoVerifier verifier;
tesla::SlotManager slots(flash, kSlotBase, kSlotBytes);
const tesla::ReceiverProfile kProfile{tesla::model::kModelName, tesla::model::kWindowLength,
                                      tesla::model::kArenaBytes, kReleasePublicKey};
alignas(tesla::OtaReceiver) uint8_t receiver_storage[sizeof(tesla::OtaReceiver)];
tesla::OtaReceiver* receiver = nullptr;

#ifdef TESLA_PROBE_ARENA_BYTES  // probe builds keep every intermediate tensor alive
alignas(16) uint8_t arena[TESLA_PROBE_ARENA_BYTES];
#else
alignas(16) uint8_t arena[tesla::model::kArenaBytes];
#endif
tesla::ModelRunner runner(arena, sizeof(arena));
tesla::ImageDescriptor active;

float input_window[tesla::model::kInputValues];
constexpr uint32_t kMeasured = tesla::model::kMeasuredChannelCount;  // the window's channels
const tesla::InputLayout kLayout{tesla::model::kChannelCount, tesla::model::kHourSinChannel,
                                 tesla::model::kHourCosChannel, tesla::model::kPeriodSeconds};
float window_storage[tesla::model::kWindowLength * kMeasured];
tesla::WallClock wall_clock;
int64_t test_uptime_ms = -1;  // #U: the uptime of the next T line; -1: the board's
tesla::Window window(window_storage, tesla::model::kWindowLength, kMeasured,
                     tesla::model::kMaxInterpolatedPeriods, tesla::model::kMinHistoryPeriods);
tesla::LineReader gateway_lines;
char out[tesla::kMaxLineBytes + 1];

void send(size_t length) {
  if (length > 0) gateway.write(reinterpret_cast<const uint8_t*>(out), length);
}

void send_text(const char* text) { gateway.write_text(text); }

// Sums SysTick ticks per op type (TFLite Micro tags each op's Invoke with its name). Attached
// only for #P, so #I measures the interpreter exactly as the node runs it.
class OpProfiler : public tflite::MicroProfilerInterface {
 public:
  uint32_t BeginEvent(const char* tag) override {
    tag_ = tag;
    start_ = tesla::board::ticks();
    return 0;
  }
  void EndEvent(uint32_t) override {
    uint64_t elapsed = tesla::board::ticks() - start_;
    size_t i = 0;
    while (i < count_ && strcmp(tags_[i], tag_) != 0) ++i;
    if (i == count_) {
      if (count_ == kMaxTags) return;
      tags_[count_++] = tag_;
    }
    ticks_[i] += elapsed;
    ++calls_[i];
  }
  void report() {
    for (size_t i = 0; i < count_; ++i) {
      snprintf(out, sizeof(out), "#P,%s,%lu,%lu\n", tags_[i], (unsigned long)calls_[i],
               (unsigned long)ticks_[i]);
      send_text(out);
    }
    send_text("#P,end\n");
  }

 private:
  static constexpr size_t kMaxTags = 24;
  const char* tags_[kMaxTags] = {};
  uint64_t ticks_[kMaxTags] = {};
  uint32_t calls_[kMaxTags] = {};
  size_t count_ = 0;
  const char* tag_ = nullptr;
  uint64_t start_ = 0;
};

void send_hello() {
  send(tesla::encode_hello(kNodeId, kFirmwareVersion, active.model_name, &active.model_version,
                           out, sizeof(out)));
}

void send_status(tesla::OtaStatus code) {
  send(tesla::encode_ota_status({uint8_t(code), 0}, out, sizeof(out)));
}

bool load_and_test(int slot) {
  if (!slots.descriptor(slot, &active)) return false;
  return runner.load(slots.image(slot)) && runner.self_test(input_window);
}

void boot_model() {
  switch (tesla::boot_from_slots(slots, kModelDescriptor, kModelData, kModelDataSize,
                                 load_and_test)) {
    case tesla::BootResult::kServing:
      break;
    case tesla::BootResult::kTrialRejected:
      tesla::board::reboot();  // the previous slot boots
      break;
    case tesla::BootResult::kNoWorkingModel:
      tesla::board::panic("no working model");
  }
}

// 2 instructions per iteration (subs, bne): the reference for the instruction counter.
void counted_loop(uint32_t n) {
  __asm volatile(
      "1: subs %0, %0, #1\n"
      "   bne 1b\n"
      : "+r"(n)::"cc");
}

// Trials of dot_s16_s8 against its reference: random lengths (every block boundary and
// remainder), random values, and every third trial the extremes (-32768 x -128, the largest
// products, for the int32 partial sums). Returns the number of trials that differ.
uint32_t check_dot(unsigned long trials) {
  constexpr int kMaxDepth = 1100;
  int16_t input[kMaxDepth];
  int8_t weights[kMaxDepth];
  uint32_t state = 12345u;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;  // LCG: reproducible, no libc rand
    return state >> 8;
  };
  uint32_t mismatches = 0;
  for (unsigned long t = 0; t < trials; ++t) {
    const int depth = 1 + int(next() % kMaxDepth);
    const int offset = int(next() % 2);  // odd start: unaligned loads
    const bool extreme = t % 3 == 0;
    for (int d = 0; d < depth; ++d) {
      input[d] = extreme ? int16_t(-32768) : int16_t(next());
      weights[d] = extreme ? int8_t(-128) : int8_t(next());
    }
    const int n = depth - offset;
    if (tesla::dot_s16_s8(input + offset, weights + offset, n) !=
        tesla::dot_s16_s8_reference(input + offset, weights + offset, n)) {
      ++mismatches;
    }
  }
  return mismatches;
}

// A test line's float: the 8 hex digits of its IEEE-754 bits, exact by construction and parsed
// without newlib's decimal float parser (about 7 KB of flash that the sketch does not have).
float parse_float_bits(const char* text) {
  const uint32_t bits = uint32_t(strtoul(text, nullptr, 16));
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

void on_test_line(char* line) {
  char* fields[64];
  size_t count = 0;
  for (char* cursor = strtok(line, ","); cursor != nullptr && count < 64;
       cursor = strtok(nullptr, ",")) {
    fields[count++] = cursor;
  }
  if (count == 0) return;
  if (strcmp(fields[0], "#V") == 0 && count >= 2) {
    uint32_t offset = uint32_t(strtoul(fields[1], nullptr, 10));
    for (size_t i = 2; i < count && offset < tesla::model::kInputValues; ++i, ++offset) {
      input_window[offset] = parse_float_bits(fields[i]);
    }
  } else if (strcmp(fields[0], "#I") == 0) {
    int16_t raw = 0;
    int32_t sum = 0;
    uint64_t start = tesla::board::ticks();
    float value = runner.invoke(input_window, &raw, &sum);
    uint64_t elapsed = tesla::board::ticks() - start;
    char text[24];
    tesla::format_value(value, text, sizeof(text));
    snprintf(out, sizeof(out), "#O,%d,%s,%lu,%ld\n", int(raw), text, (unsigned long)elapsed,
             long(sum));
    send_text(out);
  } else if (strcmp(fields[0], "#A") == 0 && count == 2 + kMeasured) {
    const int64_t period = strtoll(fields[1], nullptr, 10);
    for (uint32_t c = 0; c < kMeasured; ++c) {
      if (strcmp(fields[2 + c], "-") != 0) window.add(period, c, parse_float_bits(fields[2 + c]));
    }
  } else if (strcmp(fields[0], "#U") == 0 && count == 2) {
    test_uptime_ms = strtoll(fields[1], nullptr, 10);
  } else if (strcmp(fields[0], "#T") == 0) {
    // newlib-nano's printf has no long long: the time at uptime 0 as seconds and milliseconds
    const int64_t at_zero = wall_clock.unix_ms(0);
    const int64_t ms = ((at_zero % 1000) + 1000) % 1000;
    snprintf(out, sizeof(out), "#T,%d,%ld,%ld,%ld\n", wall_clock.known() ? 1 : 0,
             long((at_zero - ms) / 1000), long(ms), long(wall_clock.utc_offset_s()));
    send_text(out);
  } else if (strcmp(fields[0], "#W") == 0) {
    if (tesla::fill_model_input<tesla::model::kHourSinChannel>(window, kLayout, wall_clock,
                                                               input_window)) {
      int16_t raw = 0;
      int32_t sum = 0;
      float value = runner.invoke(input_window, &raw, &sum);
      char text[24];
      tesla::format_value(value, text, sizeof(text));
      snprintf(out, sizeof(out), "#W,%lu,%d,%s,%ld\n", (unsigned long)window.history(),
               int(raw), text, long(sum));
    } else {
      snprintf(out, sizeof(out), "#W,%lu,-\n", (unsigned long)window.history());
    }
    send_text(out);
  } else if (strcmp(fields[0], "#R") == 0 && count == 2) {
    tesla::use_reference_fully_connected = strcmp(fields[1], "1") == 0;
    tesla::use_library_int16_kernels = tesla::use_reference_fully_connected;
    snprintf(out, sizeof(out), "#R,%d\n", tesla::use_reference_fully_connected ? 1 : 0);
    send_text(out);
  } else if (strcmp(fields[0], "#K") == 0 && count == 2) {
    unsigned long trials = strtoul(fields[1], nullptr, 10);
    snprintf(out, sizeof(out), "#K,%lu,%lu\n", trials, (unsigned long)check_dot(trials));
    send_text(out);
  } else if (strcmp(fields[0], "#C") == 0 && count == 2) {
    uint32_t n = uint32_t(strtoul(fields[1], nullptr, 10));
    uint64_t start = tesla::board::ticks();
    if (n > 0) counted_loop(n);
    uint64_t elapsed = tesla::board::ticks() - start;
    snprintf(out, sizeof(out), "#C,%lu,%lu\n", (unsigned long)n, (unsigned long)elapsed);
    send_text(out);
  } else if (strcmp(fields[0], "#P") == 0) {
    OpProfiler profiler;
    const uint8_t* image = slots.image(slots.active());
    if (runner.load(image, &profiler)) {
      runner.invoke(input_window);
      profiler.report();
    }
    runner.load(image);  // the interpreter without the profiler again
  } else if (strcmp(fields[0], "#D") == 0) {
    tflite::MicroInterpreter* interpreter = runner.interpreter();
    for (size_t i = 0; i < interpreter->outputs_size(); ++i) {
      const TfLiteTensor* tensor = interpreter->output(i);
      uint32_t crc = tesla::crc32(tensor->data.uint8, tensor->bytes);
      snprintf(out, sizeof(out), "#D,%u,%u,%08lX\n", unsigned(i), unsigned(tensor->bytes),
               (unsigned long)crc);
      send_text(out);
      if (count == 2 && size_t(strtoul(fields[1], nullptr, 10)) == i) {
        for (size_t b = 0; b < tensor->bytes; b += 2) {
          snprintf(out, sizeof(out), "%d,", int(int16_t(tensor->data.uint8[b] | (tensor->data.uint8[b + 1] << 8))));
          send_text(out);
        }
        send_text("\n");
      }
    }
  } else if (strcmp(fields[0], "#M") == 0) {
    snprintf(out, sizeof(out), "#M,%lu,%lu,%lu,%lu\n", (unsigned long)runner.arena_used(),
             (unsigned long)sizeof(arena), (unsigned long)active.image_size,
             (unsigned long)tesla::board::heap_used());
    send_text(out);
  }
}

void on_gateway_line() {
  char* line = gateway_lines.line();
  if (line[0] == '#') {
    on_test_line(line);
    return;
  }
  tesla::LineView view;
  if (tesla::parse_line(line, gateway_lines.length(), &view) != tesla::LineReject::kNone) {
    return;
  }
  tesla::TimeSync time;
  if (view.type == 'Q') {
    send_hello();
  } else if (view.type == 'T' && tesla::parse_time(view, &time)) {
    const uint64_t board_ms = tesla::board::ticks() / (tesla::board::kCoreClockHz / 1000u);
    wall_clock.set(time.unix_s, time.utc_offset_s,
                   test_uptime_ms >= 0 ? uint64_t(test_uptime_ms) : board_ms);
    test_uptime_ms = -1;
  } else if (view.type == 'O') {
    tesla::OtaAnswer answer{};
    if (receiver->handle(view.fields, view.count, &answer)) {
      send(tesla::encode_ota_status(answer, out, sizeof(out)));
    } else if (receiver->stage_verified()) {
      tesla::board::reboot();
    } else {
      send_status(tesla::OtaStatus::kFlashError);
    }
  }
}

}  // namespace

int main() {
  tesla::board::start_ticks();
  gateway.begin();
  boot_model();
  // The young-window rule of the image that serves (docs/ota-protocol.md section 3); after a
  // rollback the boot record's descriptor of the other slot brings its own rule back.
  window.set_min_history(
      tesla::image_min_history(active, kModelDescriptor, tesla::model::kMinHistoryPeriods));
  receiver = new (receiver_storage)
      tesla::OtaReceiver(kProfile, verifier, slots, active.model_version);
  tesla::OtaStatus trial_report;
  if (tesla::take_trial_report(slots, &trial_report)) send_status(trial_report);
  send_hello();
  while (true) {
    int byte;
    while ((byte = gateway.read()) >= 0) {
      if (gateway_lines.feed(uint8_t(byte))) on_gateway_line();
    }
  }
}
