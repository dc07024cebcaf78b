// RAM footprint of the portable core as the sketch instantiates it (static objects, the N x C-float
// window, line buffers). Compiled for Cortex-M4 only so arm-none-eabi-size reports its .bss;
// the TFLite Micro arena (model_constants.h kArenaBytes) and the library itself come on top.
#include "../src/line_protocol.h"
#include "../src/model_constants.h"
#include "../src/model_input.h"
#include "../src/ota_receiver.h"
#include "../src/pms5003.h"
#include "../src/slots.h"
#include "../src/window.h"

namespace {

class NullFlash : public tesla::Flash {
 public:
  uint32_t page_size() const override { return 4096; }
  bool erase(uint32_t, uint32_t) override { return false; }
  bool write(uint32_t, const uint8_t*, uint32_t) override { return false; }
  bool read(uint32_t, uint8_t*, uint32_t) const override { return false; }
  const uint8_t* map(uint32_t) const override { return nullptr; }
};

class NullVerifier : public tesla::SignatureVerifier {
 public:
  bool verify(const uint8_t*, const uint8_t*, size_t, const uint8_t*) override { return false; }
};

const uint8_t kKey[32] = {};
const tesla::ReceiverProfile kProfile{tesla::model::kModelName, tesla::model::kWindowLength,
                                      tesla::model::kArenaBytes, kKey};
NullFlash flash;
NullVerifier verifier;
tesla::SlotManager slots(flash, 0x80000, 0x10000);
tesla::OtaReceiver receiver(kProfile, verifier, slots, tesla::model::kModelVersion);
tesla::LineReader gateway_line;
tesla::Pms5003Parser sensor;
float window_storage[tesla::model::kWindowLength * tesla::model::kMeasuredChannelCount];
tesla::WallClock wall_clock;
tesla::Window window(window_storage, tesla::model::kWindowLength,
                     tesla::model::kMeasuredChannelCount,
                     tesla::model::kMaxInterpolatedPeriods, tesla::model::kMinHistoryPeriods);
char out_line[tesla::kMaxLineBytes + 1];

}  // namespace

// Referenced so nothing is discarded.
extern "C" size_t tesla_footprint_anchor() {
  return sizeof(receiver) + sizeof(gateway_line) + sizeof(sensor) + sizeof(window) +
         sizeof(out_line) + sizeof(slots) + sizeof(wall_clock);
}
