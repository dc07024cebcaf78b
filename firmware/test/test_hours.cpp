// Host tests of the node's wall time (src/wall_clock.h) and of the model input with the hour of
// the day (src/model_input.h) on the shared vectors tests/vectors/window_hours.json, which
// tests/firmware/hour_vectors.py builds from the contract (tesla_gateway/contract/
// time_of_day.py hour_phase, series.py gap rule and pad_history).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../src/model_input.h"
#include "../src/wall_clock.h"
#include "../src/window.h"
#include "json_lite.h"

namespace {

int* g_checks = nullptr;
int* g_failures = nullptr;

#define HCHECK(cond, ...)                                                    \
  do {                                                                       \
    ++*g_checks;                                                             \
    if (!(cond)) {                                                           \
      ++*g_failures;                                                         \
      std::fprintf(stderr, "FAIL %s:%d: %s | ", __FILE__, __LINE__, #cond);  \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
    }                                                                        \
  } while (0)

constexpr double kHourTolerance = 1e-6;  // float sin/cos of an angle within 3e-7 rad

bool near(float got, double want, double tolerance) {
  return std::fabs(double(got) - want) <= tolerance;
}

// The phase at known moments: midnight, 06:00, noon and 18:00 local standard time, east and
// west of UTC, before 1970 and at the end of a day.
void test_hour_phase() {
  struct Case { int64_t unix_ms; int32_t offset_s; double sin, cos; };
  const int64_t midnight = 1767225600000LL;  // 2026-01-01 00:00 UTC
  const Case cases[] = {
      {midnight, 0, 0.0, 1.0},
      {midnight + 6 * 3600000LL, 0, 1.0, 0.0},
      {midnight, 12 * 3600, 0.0, -1.0},            // noon at UTC+12
      {midnight, -6 * 3600, -1.0, 0.0},            // 18:00 the day before at UTC-6
      {midnight - 1, 0, -2 * M_PI / 86400000.0, 1.0},  // the last millisecond of a day
      {-3 * 3600000LL, 0, -1.0 / std::sqrt(2.0), 1.0 / std::sqrt(2.0)},  // 21:00, 1969
  };
  for (const Case& c : cases) {
    float s = 9, k = 9;
    tesla::hour_phase(c.unix_ms, c.offset_s, &s, &k);
    HCHECK(near(s, c.sin, kHourTolerance) && near(k, c.cos, kHourTolerance),
           "hour_phase(%lld, %d) = (%.8f, %.8f), want (%.8f, %.8f)", (long long)c.unix_ms,
           int(c.offset_s), double(s), double(k), c.sin, c.cos);
  }
}

// The clock keeps the offset of the last T line to the uptime; a step replaces it.
void test_wall_clock() {
  tesla::WallClock clock;
  HCHECK(!clock.known(), "no T line yet");
  clock.set(1767225600, 3600, 5000);
  HCHECK(clock.known() && clock.utc_offset_s() == 3600, "known after a T line");
  HCHECK(clock.unix_ms(5000) == 1767225600000LL, "the T line's moment");
  HCHECK(clock.unix_ms(65000) == 1767225660000LL, "a minute of uptime later");
  HCHECK(clock.unix_ms(0) == 1767225595000LL, "before it");
  clock.set(1767225600 - 3600, -18000, 70000);  // the gateway's clock stepped back an hour
  HCHECK(clock.unix_ms(70000) == 1767222000000LL && clock.utc_offset_s() == -18000,
         "a step resets the offset: %lld", (long long)clock.unix_ms(70000));
}

// A window without hour channels comes out as copy() gives it; a layout whose measured channels
// are not the window's is refused.
void test_layout_edges() {
  float storage[4 * 2];
  tesla::Window window(storage, 4, 2, 1, 1);
  window.add(10, 0, 5.0f);
  window.add(10, 1, 50.0f);
  float copied[8], built[16];
  tesla::WallClock clock;
  clock.set(1767225600, 0, 0);
  const tesla::InputLayout plain{2, -1, -1, 60};
  HCHECK(window.copy(copied) && tesla::build_model_input(window, plain, clock, built) &&
             std::equal(copied, copied + 8, built),
         "no hour channels: the window as it is");
  const tesla::InputLayout hours{4, 1, 3, 60};
  HCHECK(tesla::measured_channels(hours) == 2, "two of four measured");
  HCHECK(tesla::build_model_input(window, hours, clock, built) && built[0] == 5.0f &&
             built[2] == 50.0f && built[12] == 5.0f && built[14] == 50.0f,
         "PM, hour_sin, rh, hour_cos");
  const tesla::InputLayout three{3, 1, 2, 60};  // one measured channel, the window has two
  HCHECK(!tesla::build_model_input(window, three, clock, built), "channel counts disagree");
  const tesla::InputLayout same{4, 1, 1, 60};  // one position for both: no hour channels
  HCHECK(tesla::measured_channels(same) == 4, "an impossible layout reads no hour");
  // The per-build form: a model without the hour takes the window as it is (no hour code
  // linked), one with it builds as build_model_input does.
  float filled[16];
  HCHECK(tesla::fill_model_input<-1>(window, plain, clock, filled) &&
             std::equal(copied, copied + 8, filled),
         "fill_model_input without the hour: the window");
  HCHECK(!tesla::fill_model_input<-1>(window, three, clock, filled),
         "fill_model_input without the hour: channel counts disagree");
  HCHECK(tesla::fill_model_input<1>(window, hours, clock, filled) &&
             tesla::build_model_input(window, hours, clock, built) &&
             std::equal(built, built + 16, filled),
         "fill_model_input with the hour: build_model_input's input");
}

void test_hour_vectors(const json::Value& vectors) {
  int scenarios = 0;
  for (const json::Value& scenario : vectors["scenarios"].items) {
    ++scenarios;
    const std::string& name = scenario["name"].text;
    const uint32_t length = uint32_t(scenario["window_length"].integer());
    const auto& names = scenario["channels"].items;
    tesla::InputLayout layout{uint32_t(names.size()), -1, -1,
                              uint32_t(scenario["period_seconds"].integer())};
    for (uint32_t c = 0; c < names.size(); ++c) {
      if (names[c].text == "hour_sin") layout.hour_sin = int32_t(c);
      if (names[c].text == "hour_cos") layout.hour_cos = int32_t(c);
    }
    const uint32_t measured = tesla::measured_channels(layout);
    HCHECK(measured + 2 == layout.channels, "%s: reads the hour", name.c_str());
    std::vector<float> storage(length * measured);
    std::vector<float> input(length * layout.channels);
    tesla::Window window(storage.data(), length, measured,
                         uint32_t(scenario["max_interpolated_periods"].integer()),
                         uint32_t(scenario["min_history_periods"].integer()));
    tesla::WallClock clock;
    for (const json::Value& step : scenario["steps"].items) {
      if (step.has("time")) {
        const json::Value& t = step["time"];
        clock.set(t["unix_s"].integer(), int32_t(t["utc_offset_s"].integer()),
                  uint64_t(t["uptime_ms"].integer()));
        continue;
      }
      const int64_t period = step["period"].integer();
      const auto& readings = step["readings"].items;
      for (uint32_t c = 0; c < measured; ++c) {
        for (const json::Value& value : readings[c].items) window.add(period, c, float(value.number));
      }
      if (!step.has("input")) continue;
      const json::Value& expected = step["input"];
      const bool built = tesla::build_model_input(window, layout, clock, input.data());
      HCHECK(window.history() == uint32_t(step["history"].integer()), "%s: period %lld history",
             name.c_str(), (long long)period);
      if (expected.is_null()) {
        HCHECK(!built, "%s: period %lld is invalid", name.c_str(), (long long)period);
        continue;
      }
      HCHECK(built, "%s: period %lld is valid", name.c_str(), (long long)period);
      if (!built) continue;
      int wrong = 0;
      for (size_t i = 0; i < input.size(); ++i) {
        const uint32_t c = uint32_t(i % layout.channels);
        const bool hour = int32_t(c) == layout.hour_sin || int32_t(c) == layout.hour_cos;
        const double want = expected.items[i].number;
        const double tolerance = hour ? kHourTolerance : 1e-4 + 1e-5 * std::fabs(want);
        if (!near(input[i], want, tolerance)) {
          if (wrong == 0) std::fprintf(stderr, "  [%zu] %.9f vs %.9f\n", i, double(input[i]), want);
          ++wrong;
        }
      }
      HCHECK(wrong == 0, "%s: period %lld: %d values differ", name.c_str(), (long long)period,
             wrong);
    }
  }
  HCHECK(scenarios >= 4, "%d scenarios", scenarios);
}

}  // namespace

void run_hour_tests(const json::Value& hour_vectors, int* checks, int* failures) {
  g_checks = checks;
  g_failures = failures;
  test_hour_phase();
  test_wall_clock();
  test_layout_edges();
  test_hour_vectors(hour_vectors);
}
