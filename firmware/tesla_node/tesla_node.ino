// TESLA calibration node: Arduino Nano 33 BLE Sense + Plantower PMS5003 on Serial1 (9600 8N1),
// reporting to the gateway over USB (Serial, docs/serial-protocol.md) and receiving signed
// model updates over the same line (docs/ota-protocol.md).
//
// Build with `make -C firmware arduino` (assembles this sketch with the portable core, the
// board shims and the generated constants, then runs arduino-cli): see docs/firmware.md.
#include <Arduino.h>
#include <TensorFlowLite.h>
#include <math.h>

#include "arduino_hardware.h"
#include "model_runner.h"  // the manifest's ops (int16 kernels the library lacks), quantisation
#include "src/line_protocol.h"
#include "src/model_constants.h"
#include "src/model_input.h"
#include "src/ota_receiver.h"
#include "src/pms5003.h"
#include "src/slots.h"
#include "src/uptime.h"
#include "src/wall_clock.h"
#include "src/window.h"
#if __has_include("src/release_key.h")
#include "src/release_key.h"  // kReleasePublicKey, generated from the operator's .pub file
#else
#error "generate src/release_key.h: make -C firmware arduino RELEASE_KEY=keys/release_key.pub"
#endif

extern const unsigned char kModelData[];  // the default model, generated into model_data.cpp
extern const unsigned int kModelDataSize;
extern const unsigned char kModelDescriptor[];  // its signed descriptor bytes (88)

namespace {

constexpr char kNodeId[] = "node-1";  // change per node (readings are published under it)
constexpr char kFirmwareVersion[] = "1.0.0";
// Boot records and slots A/B at the end of the 1 MB flash, sized to the model (generated).
constexpr uint32_t kSlotBase = tesla::model::kSlotRegionBase;
constexpr uint32_t kSlotBytes = tesla::model::kSlotBytes;
using tesla::model::Channel;
constexpr uint32_t kChannels = tesla::model::kChannelCount;  // PM first, then rh / temp_c / hour
// The window holds the measured channels; the hour channels come from the gateway's time.
constexpr uint32_t kMeasured = tesla::model::kMeasuredChannelCount;
using tesla::model::kInputValues;  // N * C
static_assert(kMeasured <= tesla::Window::kMaxChannels, "more channels than the window holds");
const tesla::InputLayout kLayout{kChannels, tesla::model::kHourSinChannel,
                                 tesla::model::kHourCosChannel, tesla::model::kPeriodSeconds};

tesla::ArduinoFlash flash;
tesla::ArduinoSignatureVerifier verifier;
tesla::ArduinoStream gateway(true);
tesla::ArduinoStream sensor_uart(false);
tesla::ArduinoEnvironment environment;  // rh and temp_c channels for covariate models
tesla::SlotManager slots(flash, kSlotBase, kSlotBytes);
const tesla::ReceiverProfile kProfile{tesla::model::kModelName, tesla::model::kWindowLength,
                                      tesla::model::kArenaBytes, kReleasePublicKey};
tesla::OtaReceiver* receiver = nullptr;
alignas(tesla::OtaReceiver) uint8_t receiver_storage[sizeof(tesla::OtaReceiver)];

alignas(16) uint8_t arena[tesla::model::kArenaBytes];
tesla::ModelRunner runner(arena, sizeof(arena));  // the emulated node runs the same code
tesla::ImageDescriptor active;

float window_storage[tesla::model::kWindowLength * kMeasured];
tesla::Window window(window_storage, tesla::model::kWindowLength, kMeasured,
                     tesla::model::kMaxInterpolatedPeriods, tesla::model::kMinHistoryPeriods);
float input_window[kInputValues];  // [N, C], oldest period first: the model's input order
tesla::LineReader gateway_lines;
tesla::Pms5003Parser pms;
tesla::Uptime uptime;  // millis() wraps after 49.7 days; periods must not step back
uint64_t uptime_ms = 0;  // at the start of this loop()
tesla::WallClock wall_clock;  // from the gateway's T lines: the hour channels' time
char out[tesla::kMaxLineBytes + 1];
uint32_t seq = 0;
int64_t period = -1;
uint32_t samples = 0;
double sum_pm1 = 0, sum_pm2_5 = 0, sum_pm10 = 0;
uint32_t env_samples = 0;
double sum_rh = 0, sum_temp_c = 0;

void send(size_t length) {
  if (length > 0) gateway.write(reinterpret_cast<const uint8_t*>(out), length);
}

void send_hello() {
  send(tesla::encode_hello(kNodeId, kFirmwareVersion, active.model_name, &active.model_version,
                           out, sizeof(out)));
}

void send_status(tesla::OtaStatus code) {
  send(tesla::encode_ota_status({uint8_t(code), 0}, out, sizeof(out)));
}

// Loads a slot into the interpreter and runs the self-test; false if the model is unusable
// (e.g. a PM-only release on a node built for a covariate model: its input is not [1, N, 3]).
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
      tesla::reboot();  // back to the previous slot on the next boot
      break;
    case tesla::BootResult::kNoWorkingModel:
      while (true) delay(1000);  // no working model at all: never reached with a factory image
  }
}

// The calibrated value goes out as the field of the PM value the model calibrates.
void set_calibrated(tesla::ReadingValues* v, float value) {
  switch (tesla::model::kInputChannels[0]) {
    case Channel::kPm1:
      v->has_cal_pm1 = true;
      v->cal_pm1 = value;
      break;
    case Channel::kPm2_5:
      v->has_cal_pm2_5 = true;
      v->cal_pm2_5 = value;
      break;
    default:
      v->has_cal_pm10 = true;
      v->cal_pm10 = value;
  }
}

// One frame's (and its humidity sample's) values into the window's channels (the model's
// measured ones, in its order); a channel without a value this time (no humidity sample) is
// left for the gap rule. The hour channels are not the window's (model_input.h).
void add_to_window(int64_t now, const tesla::Pms5003Reading& r, bool env_ok, float rh,
                   float temp_c) {
  uint32_t w = 0;  // the window's channel
  for (uint32_t c = 0; c < kChannels; ++c) {
    switch (tesla::model::kInputChannels[c]) {
      case Channel::kPm1: window.add(now, w++, float(r.pm1)); break;
      case Channel::kPm2_5: window.add(now, w++, float(r.pm2_5)); break;
      case Channel::kPm10: window.add(now, w++, float(r.pm10)); break;
      case Channel::kRh:
        if (env_ok) window.add(now, w, rh);
        ++w;
        break;
      case Channel::kTempC:
        if (env_ok) window.add(now, w, temp_c);
        ++w;
        break;
      case Channel::kHourSin:
      case Channel::kHourCos:
        break;  // derived from the gateway's time (model_input.h), not measured
    }
  }
}

void report_period() {
  if (samples == 0) return;
  tesla::ReadingValues v;
  v.has_pm1 = v.has_pm2_5 = v.has_pm10 = true;
  v.pm1 = sum_pm1 / samples;
  v.pm2_5 = sum_pm2_5 / samples;
  v.pm10 = sum_pm10 / samples;
  if (env_samples > 0) {
    v.has_rh = v.has_temp_c = true;
    v.rh = sum_rh / env_samples;
    v.temp_c = sum_temp_c / env_samples;
  }
  if (tesla::fill_model_input<tesla::model::kHourSinChannel>(window, kLayout, wall_clock,
                                                             input_window)) {
    float calibrated = runner.invoke(input_window);
    if (isfinite(calibrated)) {
      set_calibrated(&v, calibrated);
      v.has_model_version = true;
      v.model_version = active.model_version;
    }
  }
  send(tesla::encode_reading(kNodeId, seq++, -1.0, v, out, sizeof(out)));
  samples = 0;
  sum_pm1 = sum_pm2_5 = sum_pm10 = 0;
  env_samples = 0;
  sum_rh = sum_temp_c = 0;
}

void on_gateway_line() {
  tesla::LineView view;
  if (tesla::parse_line(gateway_lines.line(), gateway_lines.length(), &view) !=
      tesla::LineReject::kNone) {
    return;  // the gateway resends after its timeout
  }
  tesla::TimeSync time;
  if (view.type == 'Q') {
    send_hello();
  } else if (view.type == 'T' && tesla::parse_time(view, &time)) {
    wall_clock.set(time.unix_s, time.utc_offset_s, uptime_ms);  // a clock step: just reset
  } else if (view.type == 'O') {
    tesla::OtaAnswer answer{};
    if (receiver->handle(view.fields, view.count, &answer)) {
      send(tesla::encode_ota_status(answer, out, sizeof(out)));
    } else if (receiver->stage_verified()) {
      tesla::reboot();  // boot the new slot; its self-test decides active or rolled back
    } else {
      send_status(tesla::OtaStatus::kFlashError);
    }
  }
}

}  // namespace

void setup() {
  Serial.begin(115200);
  Serial1.begin(9600);
  flash.begin();
  environment.begin();  // absent or failed: readings simply carry no rh/temp_c
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
}

void loop() {
  uptime_ms = uptime.update(millis());
  int byte;
  while ((byte = gateway.read()) >= 0) {
    if (gateway_lines.feed(uint8_t(byte))) on_gateway_line();
  }
  while ((byte = sensor_uart.read()) >= 0) {
    if (pms.feed(uint8_t(byte)) != tesla::Pms5003Parser::Result::kFrame) continue;
    int64_t now = int64_t(uptime_ms / 1000u / tesla::model::kPeriodSeconds);
    if (now != period) {
      report_period();  // the period just closed
      period = now;
    }
    const tesla::Pms5003Reading& r = pms.reading();
    sum_pm1 += r.pm1;
    sum_pm2_5 += r.pm2_5;
    sum_pm10 += r.pm10;
    ++samples;
    float rh = 0, temp_c = 0;
    bool env_ok = environment.read(&rh, &temp_c);
    if (env_ok) {
      sum_rh += rh;
      sum_temp_c += temp_c;
      ++env_samples;
    }
    add_to_window(now, r, env_ok, rh, temp_c);
  }
}
