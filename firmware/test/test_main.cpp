// Host tests of the portable firmware core. They read the SAME vectors as the Python tests
// (tests/vectors/line_protocol.json, ota_protocol.json, window_gap_policy.json and
// window_hours.json: test_hours.cpp), so host and device agree byte for byte. Usage: test_firmware <vectors dir> ; exit status 0 when everything passes.
#include <sodium.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../src/base64.h"
#include "../src/checksums.h"
#include "../src/line_protocol.h"
#include "../src/ota_codes.h"
#include "../src/ota_descriptor.h"
#include "../src/ota_receiver.h"
#include "../src/pms5003.h"
#include "../src/sha256.h"
#include "../src/slots.h"
#include "../src/uptime.h"
#include "../src/window.h"
#include "host_support.h"
#include "json_lite.h"

namespace {

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    ++g_checks;                                                 \
    if (!(cond)) {                                              \
      ++g_failures;                                             \
      std::fprintf(stderr, "FAIL %s:%d: %s | ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
    }                                                           \
  } while (0)

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<uint8_t> unhex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(uint8_t(std::stoul(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string tohex(const uint8_t* data, size_t length) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < length; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

void test_checksums(const json::Value& line_vectors, const json::Value& ota_vectors) {
  const char* check = "123456789";
  char text[8];
  std::snprintf(text, sizeof(text), "%04X", tesla::crc16_ccitt_false(reinterpret_cast<const uint8_t*>(check), 9));
  CHECK(line_vectors["crc"]["check_value"].text == text, "crc16 %s", text);
  char text32[12];
  std::snprintf(text32, sizeof(text32), "%08X", unsigned(tesla::crc32(reinterpret_cast<const uint8_t*>(check), 9)));
  CHECK(ota_vectors["crc32"]["check_value"].text == text32, "crc32 %s", text32);
  uint8_t digest[32];
  tesla::Sha256 sha;
  sha.update(reinterpret_cast<const uint8_t*>("abc"), 3);
  sha.finish(digest);
  CHECK(tohex(digest, 32) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(abc)");
}

// Line protocol: framing rejects match the gateway's, and the encoders reproduce the lines.
void test_line_vectors(const json::Value& vectors) {
  for (const json::Value& v : vectors["vectors"].items) {
    std::vector<uint8_t> raw = unhex(v["line_hex"].text);
    std::string name = v["name"].text;
    std::vector<char> line(raw.begin(), raw.end());
    line.push_back('\0');
    tesla::LineView view;
    tesla::LineReject reject = tesla::parse_line(line.data(), raw.size(), &view);
    const json::Value& expect = v["expect"];
    if (expect.has("reject")) {
      std::string reason = expect["reject"].text;
      bool framing = reason == "too_large" || reason == "bad_encoding" || reason == "bad_checksum" ||
                     (reason == "bad_frame" && (name == "lower-case checksum" || name == "no checksum" ||
                                                name == "unknown line type"));
      if (framing) {
        CHECK(tesla::line_reject_name(reject) == reason, "%s: got %s", name.c_str(), tesla::line_reject_name(reject));
      } else {
        // Semantic checks of H/R lines are the gateway's job; the node only sends them.
        CHECK(reject == tesla::LineReject::kNone, "%s: framing should pass", name.c_str());
        tesla::TimeSync time;
        if (reject == tesla::LineReject::kNone && view.type == 'T') {  // the node reads T lines
          CHECK(!tesla::parse_time(view, &time), "%s: the node takes it", name.c_str());
        }
      }
      continue;
    }
    CHECK(reject == tesla::LineReject::kNone, "%s: rejected %s", name.c_str(), tesla::line_reject_name(reject));
    const json::Value& ok = expect["ok"];
    std::string type = ok["type"].text;
    std::string canonical(raw.begin(), raw.end());
    size_t cr = canonical.find("\r\n");
    if (cr != std::string::npos) canonical.erase(cr, 1);
    char out[tesla::kMaxLineBytes + 1];
    size_t n = 0;
    if (type == "H") {
      uint32_t version = ok["model_version"].is_null() ? 0 : uint32_t(ok["model_version"].integer());
      n = tesla::encode_hello(ok["node_id"].text.c_str(), ok["firmware_version"].text.c_str(),
                              ok["model_name"].is_null() ? nullptr : ok["model_name"].text.c_str(),
                              ok["model_version"].is_null() ? nullptr : &version, out, sizeof(out));
    } else if (type == "R") {
      tesla::ReadingValues values;
      const json::Value& raw_values = ok["values"];
      const json::Value& cal = ok["calibrated"];
      auto get = [](const json::Value& m, const char* key, bool* has, double* value) {
        if (m.has(key)) {
          *has = true;
          *value = m[key].number;
        }
      };
      get(raw_values, "pm1", &values.has_pm1, &values.pm1);
      get(raw_values, "pm2_5", &values.has_pm2_5, &values.pm2_5);
      get(raw_values, "pm10", &values.has_pm10, &values.pm10);
      get(raw_values, "rh", &values.has_rh, &values.rh);
      get(raw_values, "temp_c", &values.has_temp_c, &values.temp_c);
      get(cal, "cal_pm1", &values.has_cal_pm1, &values.cal_pm1);
      get(cal, "cal_pm2_5", &values.has_cal_pm2_5, &values.cal_pm2_5);
      get(cal, "cal_pm10", &values.has_cal_pm10, &values.cal_pm10);
      if (!ok["model_version"].is_null()) {
        values.has_model_version = true;
        values.model_version = uint32_t(ok["model_version"].integer());
      }
      double timestamp = ok["timestamp"].is_null() ? -1.0 : ok["timestamp"].number;
      n = tesla::encode_reading(ok["node_id"].text.c_str(), uint32_t(ok["seq"].integer()), timestamp,
                                values, out, sizeof(out));
    } else if (type == "T") {
      tesla::TimeSync time;
      CHECK(tesla::parse_time(view, &time) && time.unix_s == ok["unix_s"].integer() &&
                time.utc_offset_s == int32_t(ok["utc_offset_s"].integer()),
            "%s: parsed %lld %d", name.c_str(), (long long)time.unix_s, int(time.utc_offset_s));
      continue;  // the node never sends T
    } else {
      continue;  // Q and O lines are decoded above; the node never encodes Q
    }
    CHECK(n > 0 && canonical == std::string(out, n), "%s: encoded %s", name.c_str(), out);
  }
}

void test_line_reader() {
  tesla::LineReader reader;
  std::string long_line(600, 'A');
  long_line += "\nQ*AB24\n";
  int complete = 0;
  for (char c : long_line) {
    if (reader.feed(uint8_t(c))) {
      ++complete;
      CHECK(std::string(reader.line()) == "Q*AB24", "line %s", reader.line());
    }
  }
  CHECK(complete == 1 && reader.overflowed(), "over-long line skipped, next one read");
}

void test_ota_codes(const json::Value& vectors) {
  const auto& codes = vectors["status_codes"].items;
  CHECK(codes.size() == tesla::kOtaStatusCount, "table sizes %zu vs %zu", codes.size(), tesla::kOtaStatusCount);
  for (const json::Value& entry : codes) {
    const tesla::OtaStatusInfo* info = tesla::ota_status_info(uint8_t(entry["code"].integer()));
    CHECK(info != nullptr, "code %lld missing", static_cast<long long>(entry["code"].integer()));
    if (info == nullptr) continue;
    CHECK(entry["name"].text == info->name, "name of %u", unsigned(info->code));
    CHECK(entry["message"].text == info->message, "message of %u", unsigned(info->code));
  }
}

void test_signatures_and_descriptor(const json::Value& vectors) {
  tesla_test::SodiumVerifier verifier;
  std::vector<uint8_t> key = unhex(vectors["public_key_hex"].text);
  for (const json::Value& v : vectors["signatures"].items) {
    std::vector<uint8_t> message = unhex(v["message_hex"].text);
    std::vector<uint8_t> signature = unhex(v["signature_hex"].text);
    bool valid = verifier.verify(key.data(), message.data(), message.size(), signature.data());
    CHECK(valid == v["valid"].boolean, "signature %s", v["name"].text.c_str());
  }
  for (const json::Value& d : vectors["descriptors"].items) {
    std::vector<uint8_t> raw = unhex(d["hex"].text);
    tesla::ImageDescriptor descriptor;
    bool decoded = tesla::decode_descriptor(raw.data(), raw.size(), &descriptor);
    CHECK(decoded == d["valid"].boolean, "descriptor %s", d["name"].text.c_str());
    if (!decoded || !d["valid"].boolean) continue;
    const json::Value& f = d["fields"];
    CHECK(f["model_name"].text == descriptor.model_name, "name %s", descriptor.model_name);
    CHECK(uint32_t(f["model_version"].integer()) == descriptor.model_version, "version");
    CHECK(uint32_t(f["image_size"].integer()) == descriptor.image_size, "size");
    CHECK(f["image_sha256"].text == tohex(descriptor.image_sha256, 32), "sha");
    CHECK(uint32_t(f["window_length"].integer()) == descriptor.window_length, "window");
    CHECK(uint32_t(f["arena_bytes"].integer()) == descriptor.arena_bytes, "arena");
    uint32_t stated = f["min_history_periods"].is_null() ? 0 : uint32_t(f["min_history_periods"].integer());
    CHECK(stated == descriptor.min_history, "%s: min_history %u", d["name"].text.c_str(),
          unsigned(descriptor.min_history));
    raw[0] = 'X';
    CHECK(!tesla::decode_descriptor(raw.data(), raw.size(), &descriptor), "bad magic refused");
  }
}

void test_frames(const json::Value& vectors) {
  for (const json::Value& v : vectors["frames"].items) {
    std::vector<uint8_t> raw = unhex(v["line_hex"].text);
    std::vector<char> line(raw.begin(), raw.end());
    line.push_back('\0');
    tesla::LineView view;
    CHECK(tesla::parse_line(line.data(), raw.size(), &view) == tesla::LineReject::kNone, "frame %s", v["name"].text.c_str());
    const json::Value& expect = v["expect"];
    CHECK(view.type == 'O' && expect["kind"].text == view.fields[0], "kind of %s", v["name"].text.c_str());
    if (expect["kind"].text == "C") {
      uint8_t payload[400];
      int n = tesla::base64_decode(view.fields[3], std::strlen(view.fields[3]), payload, sizeof(payload));
      CHECK(n > 0 && tohex(payload, size_t(n)) == expect["payload_hex"].text, "payload of %s", v["name"].text.c_str());
      CHECK(std::stoul(view.fields[2], nullptr, 16) == uint32_t(expect["crc"].integer()), "crc field");
      CHECK(tesla::crc32(payload, size_t(n)) == uint32_t(expect["crc"].integer()), "crc32 of payload");
    } else if (expect["kind"].text == "B") {
      uint8_t descriptor[100];
      int n = tesla::base64_decode(view.fields[4], std::strlen(view.fields[4]), descriptor, sizeof(descriptor));
      CHECK(n == 88 && tohex(descriptor, 88) == expect["descriptor_hex"].text, "begin descriptor");
    } else if (expect["kind"].text == "S") {
      tesla::OtaAnswer answer{uint8_t(expect["code"].integer()), uint32_t(expect["next_seq"].integer())};
      char out[64];
      size_t n = tesla::encode_ota_status(answer, out, sizeof(out));
      CHECK(std::string(out, n) == std::string(raw.begin(), raw.end()), "status encodes");
    }
  }
}

// Every receiver scenario of the vectors, through the real C++ receiver on RAM flash.
void test_receiver_scenarios(const json::Value& vectors) {
  const json::Value& node = vectors["node"];
  std::vector<uint8_t> key = unhex(vectors["public_key_hex"].text);
  std::string model_name = node["model_name"].text;
  tesla::ReceiverProfile profile{model_name.c_str(), uint32_t(node["window_length"].integer()),
                                 uint32_t(node["arena_bytes"].integer()), key.data()};
  for (const json::Value& scenario : vectors["scenarios"].items) {
    uint32_t slot_bytes = uint32_t(node["slot_bytes"].integer());
    tesla_test::RamFlash flash(2 * 4096 + 2 * slot_bytes);
    tesla::SlotManager slots(flash, 0, slot_bytes);
    tesla_test::SodiumVerifier verifier;
    tesla::OtaReceiver receiver(profile, verifier, slots, uint32_t(node["active_version"].integer()));
    std::string name = scenario["name"].text;
    int step_index = 0;
    for (const json::Value& step : scenario["steps"].items) {
      ++step_index;
      std::vector<uint8_t> raw = unhex(step["line_hex"].text);
      std::vector<char> line(raw.begin(), raw.end());
      line.push_back('\0');
      tesla::LineView view;
      tesla::LineReject reject = tesla::parse_line(line.data(), raw.size(), &view);
      if (reject != tesla::LineReject::kNone) {
        CHECK(step["answer"].is_null(), "%s step %d: line rejected (%s) but an answer was expected",
              name.c_str(), step_index, tesla::line_reject_name(reject));
        continue;
      }
      tesla::OtaAnswer answer{};
      bool answered = receiver.handle(view.fields, view.count, &answer);
      if (step["answer"].is_null()) {
        CHECK(!answered, "%s step %d: expected an accepted commit", name.c_str(), step_index);
        continue;
      }
      char out[64];
      size_t n = answered ? tesla::encode_ota_status(answer, out, sizeof(out)) : 0;
      std::string expected;
      for (uint8_t b : unhex(step["answer_hex"].text)) expected += char(b);
      CHECK(answered && std::string(out, n) == expected, "%s step %d: answered %u,%lu expected %s",
            name.c_str(), step_index, unsigned(answer.code), static_cast<unsigned long>(answer.next_seq),
            expected.c_str());
    }
  }
}

// A/B slots: a trial that fails its self-test (or never confirms) falls back.
void test_slots() {
  tesla_test::RamFlash flash(2 * 4096 + 2 * 16384);
  tesla::SlotManager slots(flash, 0, 16384);
  CHECK(!slots.load(), "fresh flash has no record");
  uint8_t descriptor[88] = {'T', 'M', 'D', 'L', 1, 1, 0, 0};
  const char* name = "m";
  std::memcpy(descriptor + 48, name, 1);
  std::vector<uint8_t> image(5000, 0x5A);
  CHECK(slots.install_factory(descriptor, image.data(), uint32_t(image.size())), "factory install");
  CHECK(slots.select_boot() == 0, "boots factory slot");
  uint8_t digest[32];
  CHECK(slots.sha256(0, uint32_t(image.size()), digest), "hash slot");
  CHECK(std::memcmp(slots.image(0), image.data(), image.size()) == 0, "image readable in place");
  std::vector<uint8_t> update(6001, 0x33);
  for (uint32_t off = 0; off < update.size(); off += 256) {
    uint32_t take = std::min<uint32_t>(256, uint32_t(update.size()) - off);
    CHECK(slots.write(1, off, update.data() + off, take), "write chunk");
  }
  CHECK(std::memcmp(slots.image(1), update.data(), update.size()) == 0, "chunks landed");
  CHECK(slots.stage_trial(1, descriptor), "stage");
  // Power loss right here: the record survives a reload.
  tesla::SlotManager after_reset(flash, 0, 16384);
  CHECK(after_reset.load() && after_reset.trial_pending(), "trial persisted");
  CHECK(after_reset.select_boot() == 1, "trial boots once");
  tesla::SlotManager crashed(flash, 0, 16384);  // it hung in the self-test: reboot
  CHECK(crashed.load() && crashed.select_boot() == 0, "falls back after an unconfirmed trial");
  CHECK(!crashed.has_model(1), "failed trial slot invalidated");
  CHECK(crashed.stage_trial(1, descriptor) && crashed.select_boot() == 1 && crashed.confirm(1), "confirm");
  tesla::SlotManager confirmed(flash, 0, 16384);
  CHECK(confirmed.load() && confirmed.select_boot() == 1 && confirmed.active() == 1, "confirmed survives reset");
  CHECK(confirmed.stage_trial(0, descriptor) && confirmed.select_boot() == 0 && confirmed.reject(0), "reject");
  CHECK(confirmed.select_boot() == 1, "rejected trial: previous slot boots");
  CHECK(confirmed.take_outcome() == tesla::SlotManager::Outcome::kRolledBack, "outcome reported");
  CHECK(confirmed.take_outcome() == tesla::SlotManager::Outcome::kNone, "outcome reported once");
}

// The boot rule both boards run (tesla::boot_from_slots).
bool passing_self_test(int) { return true; }
bool failing_self_test(int) { return false; }

void test_boot_from_slots() {
  tesla_test::RamFlash flash(2 * 4096 + 2 * 16384);
  uint8_t descriptor[88] = {'T', 'M', 'D', 'L', 1, 1, 0, 0};
  std::vector<uint8_t> image(5000, 0x5A);
  tesla::SlotManager fresh(flash, 0, 16384);
  CHECK(tesla::boot_from_slots(fresh, descriptor, image.data(), uint32_t(image.size()),
                               passing_self_test) == tesla::BootResult::kServing,
        "a fresh device serves its factory model");
  CHECK(fresh.active() == 0 && fresh.has_model(0), "factory model in slot 0");
  CHECK(fresh.stage_trial(1, descriptor), "stage a trial");
  tesla::SlotManager trial(flash, 0, 16384);
  CHECK(tesla::boot_from_slots(trial, descriptor, image.data(), uint32_t(image.size()),
                               failing_self_test) == tesla::BootResult::kTrialRejected,
        "a failing trial is rejected");
  tesla::SlotManager after(flash, 0, 16384);
  CHECK(tesla::boot_from_slots(after, descriptor, image.data(), uint32_t(image.size()),
                               passing_self_test) == tesla::BootResult::kServing &&
            after.active() == 0,
        "the previous slot serves after the rejected trial");
  CHECK(after.stage_trial(1, descriptor), "stage again");
  tesla::SlotManager good(flash, 0, 16384);
  CHECK(tesla::boot_from_slots(good, descriptor, image.data(), uint32_t(image.size()),
                               passing_self_test) == tesla::BootResult::kServing &&
            good.active() == 1 && !good.trial_pending(),
        "a passing trial is confirmed");
  tesla::SlotManager broken(flash, 0, 16384);
  CHECK(tesla::boot_from_slots(broken, descriptor, image.data(), uint32_t(image.size()),
                               failing_self_test) == tesla::BootResult::kNoWorkingModel,
        "no working model is reported, not booted");
}

// The young-window rule follows the active image (tesla::image_min_history, applied by both
// boards after boot): the factory image's built-in value, an OTA image's signed value, whole
// windows for a format 1 descriptor, and after a rollback the rule of the slot that serves.
std::vector<uint8_t> descriptor_bytes(uint32_t version, uint8_t image_byte, uint32_t min_history) {
  std::vector<uint8_t> image(5000, image_byte);
  uint8_t sha[32];
  tesla::Sha256 hash;
  hash.update(image.data(), image.size());
  hash.finish(sha);
  std::vector<uint8_t> d(88, 0);
  std::memcpy(d.data(), "TMDL", 4);
  d[4] = min_history == 0 ? 1 : 2;
  d[5] = 1;
  d[6] = uint8_t(min_history);
  d[7] = uint8_t(min_history >> 8);
  for (int i = 0; i < 4; ++i) {
    d[8 + i] = uint8_t(version >> (8 * i));
    d[12 + i] = uint8_t(5000u >> (8 * i));
    d[80 + i] = uint8_t(360u >> (8 * i));
  }
  std::memcpy(d.data() + 16, sha, 32);
  std::memcpy(d.data() + 48, "pm10-test", 9);
  return d;
}

// A young window of `periods` periods under the rule of the slot that boots: is it calibrated?
bool young_window_calibrated(tesla::SlotManager& slots, const uint8_t* factory_raw,
                             const std::vector<uint8_t>& factory_image, uint32_t built_in,
                             bool (*self_test)(int), int periods) {
  tesla::boot_from_slots(slots, factory_raw, factory_image.data(), uint32_t(factory_image.size()),
                         self_test);
  tesla::ImageDescriptor active;
  if (!slots.descriptor(slots.active(), &active)) return false;
  std::vector<float> storage(360);
  tesla::Window window(storage.data(), 360, 1, 30, built_in);  // as the boards build it
  window.set_min_history(tesla::image_min_history(active, factory_raw, built_in));
  for (int p = 0; p < periods; ++p) window.add(1000 + p, 0, 20.0f);
  return window.valid();
}

void test_min_history_follows_the_active_image() {
  for (uint32_t factory_value : {0u, 1u}) {  // a factory descriptor of format 1 or 2
    tesla_test::RamFlash flash(2 * 4096 + 2 * 16384);
    std::vector<uint8_t> factory_image(5000, 0x5A);
    std::vector<uint8_t> factory_raw = descriptor_bytes(1, 0x5A, factory_value);
    auto calibrated = [&](bool (*self_test)(int)) {
      tesla::SlotManager slots(flash, 0, 16384);  // a reboot: the boot record is read again
      return young_window_calibrated(slots, factory_raw.data(), factory_image, 1, self_test, 3);
    };
    CHECK(calibrated(passing_self_test), "factory image: its built-in value 1 calibrates");
    tesla::SlotManager ota(flash, 0, 16384);
    ota.load();
    std::vector<uint8_t> whole = descriptor_bytes(2, 0x11, 360);  // trained on whole windows
    CHECK(ota.stage_trial(1, whole.data()), "stage v2 (min_history N)");
    CHECK(!calibrated(passing_self_test), "an OTA image stating N: a young window is NOT calibrated");
    CHECK(!calibrated(passing_self_test), "and still not after a reboot");
    tesla::SlotManager again(flash, 0, 16384);
    again.load();
    std::vector<uint8_t> young = descriptor_bytes(3, 0x22, 1);
    CHECK(again.stage_trial(0, young.data()), "stage v3 (min_history 1)");
    CHECK(calibrated(passing_self_test), "an OTA image stating 1: a young window is calibrated");
    tesla::SlotManager failing(flash, 0, 16384);
    failing.load();
    CHECK(failing.stage_trial(1, whole.data()), "stage v2 again");
    tesla::SlotManager trial(flash, 0, 16384);
    CHECK(tesla::boot_from_slots(trial, factory_raw.data(), factory_image.data(),
                                 uint32_t(factory_image.size()), failing_self_test) ==
              tesla::BootResult::kTrialRejected,
          "v2 fails its self-test on trial: the board reboots");
    CHECK(calibrated(passing_self_test), "rolled back to v3: its value 1 applies again");
    tesla::SlotManager legacy(flash, 0, 16384);
    legacy.load();
    std::vector<uint8_t> silent = descriptor_bytes(4, 0x33, 0);  // format 1: states nothing
    CHECK(legacy.stage_trial(1, silent.data()), "stage v4 (format 1)");
    CHECK(!calibrated(passing_self_test), "a format 1 OTA image: whole windows only");
    tesla::SlotManager status(flash, 0, 16384);
    CHECK(status.load() && status.active() == 1, "v4 serves");
  }
  // The built-in value is the factory image's own: a factory model built for whole windows
  // does not calibrate young windows even if its descriptor said otherwise.
  tesla::ImageDescriptor image;
  std::vector<uint8_t> raw = descriptor_bytes(1, 0x5A, 1);
  CHECK(tesla::decode_descriptor(raw.data(), 88, &image) && image.min_history == 1, "decodes");
  CHECK(tesla::image_min_history(image, raw.data(), 360) == 360, "factory: built-in wins");
  std::vector<uint8_t> other = descriptor_bytes(9, 0x5A, 1);  // same image, another version
  CHECK(tesla::image_min_history(image, other.data(), 360) == 1, "other image: its descriptor");
  std::vector<float> storage(24);
  tesla::Window window(storage.data(), 24, 1, 30, 1);
  window.set_min_history(0);
  CHECK(window.min_history() == 1, "set_min_history clamps 0 to 1");
  window.set_min_history(99);
  CHECK(window.min_history() == 24, "set_min_history clamps to N");
}

// The one report after boot (tesla::take_trial_report): confirmed -> active, rejected -> rolled
// back, each once; nothing without a trial.
void test_trial_report() {
  tesla_test::RamFlash flash(2 * 4096 + 2 * 16384);
  uint8_t descriptor[88] = {'T', 'M', 'D', 'L', 1, 1, 0, 0};
  std::vector<uint8_t> image(5000, 0x5A);
  tesla::OtaStatus status = tesla::OtaStatus::kOk;
  tesla::SlotManager fresh(flash, 0, 16384);
  tesla::boot_from_slots(fresh, descriptor, image.data(), uint32_t(image.size()), passing_self_test);
  CHECK(!tesla::take_trial_report(fresh, &status), "no trial: nothing to report");
  CHECK(fresh.stage_trial(1, descriptor), "stage a trial");
  tesla::SlotManager good(flash, 0, 16384);
  tesla::boot_from_slots(good, descriptor, image.data(), uint32_t(image.size()), passing_self_test);
  CHECK(tesla::take_trial_report(good, &status) && status == tesla::OtaStatus::kActive,
        "a confirmed trial reports active");
  CHECK(!tesla::take_trial_report(good, &status), "reported once");
  CHECK(good.stage_trial(0, descriptor), "stage another trial");
  tesla::SlotManager bad(flash, 0, 16384);
  tesla::boot_from_slots(bad, descriptor, image.data(), uint32_t(image.size()), failing_self_test);
  tesla::SlotManager rebooted(flash, 0, 16384);  // the board reboots after a rejected trial
  tesla::boot_from_slots(rebooted, descriptor, image.data(), uint32_t(image.size()), passing_self_test);
  CHECK(tesla::take_trial_report(rebooted, &status) && status == tesla::OtaStatus::kRolledBack,
        "a rejected trial reports rolled back after the reboot");
  CHECK(!tesla::take_trial_report(rebooted, &status), "reported once");
}

void test_pms5003() {
  uint8_t frame[32] = {0x42, 0x4D, 0x00, 28};
  uint16_t words[13] = {1, 2, 3, 11, 22, 33, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 13; ++i) {
    frame[4 + 2 * i] = uint8_t(words[i] >> 8);
    frame[5 + 2 * i] = uint8_t(words[i]);
  }
  uint16_t sum = 0;
  for (int i = 0; i < 30; ++i) sum = uint16_t(sum + frame[i]);
  frame[30] = uint8_t(sum >> 8);
  frame[31] = uint8_t(sum);
  tesla::Pms5003Parser parser;
  std::vector<uint8_t> stream = {0x00, 0x42, 0x42};  // noise, then a false start
  stream.insert(stream.end(), frame, frame + 32);
  std::vector<uint8_t> bad(frame, frame + 32);
  bad[10] ^= 1;
  stream.insert(stream.end(), bad.begin(), bad.end());
  int frames = 0, bad_checksums = 0;
  for (uint8_t b : stream) {
    auto result = parser.feed(b);
    if (result == tesla::Pms5003Parser::Result::kFrame) {
      ++frames;
      CHECK(parser.reading().pm1 == 11 && parser.reading().pm2_5 == 22 && parser.reading().pm10 == 33, "values");
    }
    if (result == tesla::Pms5003Parser::Result::kBadChecksum) ++bad_checksums;
  }
  CHECK(frames == 1 && bad_checksums == 1, "frames %d bad %d", frames, bad_checksums);
  // One stray 0x42 right before the frame: its 0x42 must start the frame, not reset the parser.
  tesla::Pms5003Parser single;
  std::vector<uint8_t> stray = {0x42};
  stray.insert(stray.end(), frame, frame + 32);
  int after_stray = 0;
  for (uint8_t b : stray) {
    if (single.feed(b) == tesla::Pms5003Parser::Result::kFrame) ++after_stray;
  }
  CHECK(after_stray == 1, "one stray 0x42 then a frame: %d frames", after_stray);
}

// The gap rule of tesla_gateway/contract/series.py, channel by channel, on the shared vectors
// (tests/vectors/window_gap_policy.json, built from the contract; the gateway's ring passes
// the same file): after each period's readings, the window ending there is what the file says.
void test_window_vectors(const json::Value& vectors) {
  for (const json::Value& scenario : vectors["scenarios"].items) {
    const std::string& name = scenario["name"].text;
    const uint32_t length = uint32_t(scenario["window_length"].integer());
    const uint32_t channels = uint32_t(scenario["channels"].items.size());
    std::vector<float> storage(length * channels);
    std::vector<float> out(length * channels);
    tesla::Window window(storage.data(), length, channels,
                         uint32_t(scenario["max_interpolated_periods"].integer()),
                         uint32_t(scenario["min_history_periods"].integer()));
    CHECK(window.channels() == channels, "%s: channels", name.c_str());
    for (const json::Value& step : scenario["periods"].items) {
      const int64_t period = step["period"].integer();
      const auto& readings = step["readings"].items;
      for (uint32_t c = 0; c < channels; ++c) {
        for (const json::Value& value : readings[c].items) {
          window.add(period, c, float(value.number));
        }
      }
      if (!step.has("window")) continue;  // PM not observed: no window is asked for
      CHECK(window.history() == uint32_t(step["history"].integer()), "%s: period %lld history %u",
            name.c_str(), (long long)period, unsigned(window.history()));
      const json::Value& expected = step["window"];
      if (expected.is_null()) {
        CHECK(!window.valid() && !window.copy(out.data()), "%s: period %lld is invalid",
              name.c_str(), (long long)period);
        continue;
      }
      bool copied = window.copy(out.data());
      CHECK(copied && window.newest_period() == period, "%s: period %lld is valid", name.c_str(),
            (long long)period);
      if (!copied) continue;
      int wrong = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        double want = expected.items[i].number;
        if (std::fabs(double(out[i]) - want) > 1e-4 + 1e-5 * std::fabs(want)) {
          if (wrong == 0) std::fprintf(stderr, "  [%zu] %.6f vs %.6f\n", i, double(out[i]), want);
          ++wrong;
        }
      }
      CHECK(wrong == 0, "%s: period %lld: %d values differ", name.c_str(), (long long)period,
            wrong);
    }
  }
}

// What the vectors cannot say: late readings and unknown channels are ignored; min_history
// outside 1 .. N.
void test_window_edges() {
  float storage[3 * 2];
  tesla::Window window(storage, 3, 2, 1, 3);
  for (int p = 0; p < 3; ++p) {
    window.add(p, 0, float(p));
    window.add(p, 1, 10.0f + float(p));
  }
  float out[6];
  CHECK(window.copy(out) && out[0] == 0.0f && out[1] == 10.0f && out[5] == 12.0f, "[N, C] order");
  window.add(1, 0, 100.0f);  // late: ignored
  window.add(2, 2, 100.0f);  // no such channel: ignored
  CHECK(window.copy(out) && out[2] == 1.0f && out[4] == 2.0f, "late reading ignored");
  window.add(3, 0, 3.0f);  // PM of the next period, rh not yet: invalid until rh comes
  CHECK(!window.valid() && window.newest_period() == 3, "a channel behind");
  window.add(3, 1, 13.0f);
  CHECK(window.copy(out) && out[4] == 3.0f && out[5] == 13.0f, "caught up");

  // min_history is clamped to 1 .. N: 0 calibrates from the first period, N + 5 at N.
  float young_storage[4];
  tesla::Window young(young_storage, 4, 1, 0, 0);
  CHECK(!young.valid() && young.history() == 0, "nothing yet");
  young.add(7, 0, 5.0f);
  float young_out[4];
  CHECK(young.copy(young_out) && young.history() == 1 && young_out[0] == 5.0f, "one period");
  tesla::Window whole(young_storage, 4, 1, 0, 9);
  for (int p = 0; p < 4; ++p) {
    whole.add(p, 0, float(p));
    CHECK(whole.valid() == (p == 3), "whole windows only at period %d", p);
  }
}

// Periods and values the emulated node's #A line (or a broken sensor) can hand the window:
// periods at the ends of int64 (no signed overflow: the old window's history wrapped to
// 4,294,965,681 periods, the bound of valid()'s loop), INT64_MIN (the "never observed" mark) and non-finite values, which the
// gateway drops at its edge (contract/readings.py) and the window ignores the same way.
void test_window_hostile_input() {
  float storage[4];
  tesla::Window far(storage, 4, 1, 0, 1);
  far.add(-INT64_MAX + 5, 0, 1.0f);
  far.add(INT64_MAX - 5, 0, 2.0f);
  CHECK(far.history() == 4, "a period 2^64 later: history %u", unsigned(far.history()));
  if (far.history() > 4) return;  // a wrapped history is valid()'s loop bound: stop here
  float out[4];
  CHECK(!far.valid() && !far.copy(out), "the far period has no history before it");
  far.add(INT64_MAX, 0, 3.0f);
  CHECK(!far.valid() && far.newest_period() == INT64_MAX, "newest at INT64_MAX");

  tesla::Window edge(storage, 4, 1, 1, 1);
  edge.add(INT64_MIN, 0, 9.0f);  // the "never observed" mark: ignored
  CHECK(edge.history() == 0 && !edge.valid(), "INT64_MIN is no period");
  edge.add(INT64_MIN + 1, 0, 4.0f);
  CHECK(edge.copy(out) && edge.history() == 1 && out[0] == 4.0f && out[3] == 4.0f,
        "the oldest period, padded");
  edge.add(INT64_MIN + 3, 0, 6.0f);  // a gap of one, filled
  CHECK(edge.copy(out) && out[0] == 4.0f && out[1] == 4.0f && out[2] == 5.0f && out[3] == 6.0f,
        "gap filled at the bottom of int64");

  tesla::Window finite(storage, 4, 1, 0, 1);
  finite.add(10, 0, 5.0f);
  finite.add(10, 0, NAN);
  finite.add(10, 0, INFINITY);
  CHECK(finite.copy(out) && out[3] == 5.0f, "non-finite readings of a period ignored");
  finite.add(11, 0, -INFINITY);
  CHECK(finite.valid() && finite.newest_period() == 10, "a non-finite reading is no reading");
}

// The sketch's periods come from Uptime: across millis()'s wrap at 2^32 ms (49.7 days) they go on
// rising, so the window keeps taking readings.
void test_uptime_across_the_millis_wrap() {
  tesla::Uptime uptime;
  CHECK(uptime.update(1000u) == 1000u, "from boot");
  CHECK(uptime.update(0xFFFFFF00u) == 0xFFFFFF00u, "before the wrap");
  const uint64_t after = uptime.update(0x100u);
  CHECK(after == 0x100000100ull, "after the wrap: %llu", (unsigned long long)after);
  CHECK(uptime.update(0x100u) == after, "no time passed");
  uptime.update(0xFFFFFFFFu);
  CHECK(uptime.update(5u) == 0x200000005ull, "second wrap");
}

}  // namespace

void run_hour_tests(const json::Value& hour_vectors, int* checks, int* failures);  // test_hours

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/vectors directory>\n", argv[0]);
    return 2;
  }
  if (sodium_init() < 0) return 2;
  std::string dir = argv[1];
  std::string line_text = read_file(dir + "/line_protocol.json");
  std::string ota_text = read_file(dir + "/ota_protocol.json");
  json::Value line_vectors = json::Parser(line_text).parse();
  json::Value ota_vectors = json::Parser(ota_text).parse();
  std::string window_text = read_file(dir + "/window_gap_policy.json");
  json::Value window_vectors = json::Parser(window_text).parse();
  test_checksums(line_vectors, ota_vectors);
  test_line_vectors(line_vectors);
  test_line_reader();
  test_ota_codes(ota_vectors);
  test_signatures_and_descriptor(ota_vectors);
  test_frames(ota_vectors);
  test_receiver_scenarios(ota_vectors);
  test_slots();
  test_boot_from_slots();
  test_min_history_follows_the_active_image();
  test_trial_report();
  test_pms5003();
  test_window_vectors(window_vectors);
  test_window_edges();
  test_window_hostile_input();
  test_uptime_across_the_millis_wrap();
  std::string hour_text = read_file(dir + "/window_hours.json");
  run_hour_tests(json::Parser(hour_text).parse(), &g_checks, &g_failures);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
