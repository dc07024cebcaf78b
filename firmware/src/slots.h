// A/B model slots in flash with a power-safe boot record (two alternating record pages, each
// with a sequence number and CRC-32; the newest valid one wins).
//
// A new model goes to the inactive slot, is verified, then staged as "trial". The next boot
// tries it once (the attempt is recorded *before* booting it, so a crash or hang during the
// self-test falls back on the following boot); a passing self-test confirms it, a failing one
// rejects it and the previous slot boots again. The node therefore never boots into nothing.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "hardware.h"
#include "ota_codes.h"
#include "ota_descriptor.h"

namespace tesla {

class SlotManager {
 public:
  static constexpr int kNone = -1;

  // Flash layout from `base`: two record pages, then slot 0 and slot 1 of `slot_bytes` each.
  SlotManager(Flash& flash, uint32_t base, uint32_t slot_bytes);

  bool load();  // read the boot record; false if none is valid (a factory-fresh device)
  bool install_factory(const uint8_t descriptor[kDescriptorSize], const uint8_t* image,
                       uint32_t size);  // first boot: the model built into the sketch -> slot 0

  int active() const { return record_.active; }
  int inactive() const { return 1 - record_.active; }
  uint32_t slot_bytes() const { return slot_bytes_; }
  bool has_model(int slot) const { return slot >= 0 && slot < 2 && record_.valid[slot] == 1; }
  bool descriptor(int slot, ImageDescriptor* out) const;
  const uint8_t* image(int slot) const { return flash_.map(slot_address(slot)); }

  // Writes image bytes; erases each page the first time a write reaches its start.
  bool write(int slot, uint32_t offset, const uint8_t* data, uint32_t length);
  bool sha256(int slot, uint32_t size, uint8_t digest[32]) const;

  bool stage_trial(int slot, const uint8_t descriptor[kDescriptorSize]);
  int select_boot();            // the slot to boot now (records a trial attempt)
  bool confirm(int slot);       // the trial passed its self-test
  bool reject(int slot);        // the trial failed: back to the previous slot
  bool trial_pending() const { return record_.trial != 0xFF; }
  bool is_trial(int slot) const { return record_.trial == slot; }
  enum class Outcome : uint8_t { kNone = 0, kConfirmed = 1, kRolledBack = 2 };
  // The outcome of the last trial, once (persisted, so it survives the reboot that follows).
  Outcome take_outcome();

 private:
  struct Record {
    uint32_t magic;
    uint32_t sequence;
    uint8_t active;
    uint8_t trial;         // 0xFF: none
    uint8_t trial_booted;  // 1 once the trial has been booted
    uint8_t outcome;       // last trial: 0 none/reported, 1 confirmed, 2 rolled back
    uint8_t valid[2];
    uint8_t pad[2];
    uint8_t descriptors[2][kDescriptorSize];
    uint32_t crc;
  };
  static_assert(sizeof(Record) % 4 == 0, "flash writes whole words");

  uint32_t slot_address(int slot) const;
  bool persist();

  Flash& flash_;
  uint32_t base_;
  uint32_t slot_bytes_;
  Record record_{};
  int record_page_ = 0;
};

// The boot rule every board runs (the Arduino sketch and the emulated Cortex-M4 node): a fresh
// device installs the model built into its firmware, the selected slot runs its self-test, and
// a trial is confirmed when it passes or rejected when it fails. The board acts on the result:
// reboot after a rejected trial (the previous slot boots), halt when no model works.
enum class BootResult : uint8_t { kServing, kTrialRejected, kNoWorkingModel };
BootResult boot_from_slots(SlotManager& slots, const uint8_t factory_descriptor[kDescriptorSize],
                           const uint8_t* factory_image, uint32_t factory_size,
                           bool (*self_test)(int slot));

// What a board tells the gateway once after boot about the last trial (docs/serial-protocol.md):
// kActive when it was confirmed, kRolledBack when it was rejected. False when there is nothing
// to report (no trial, or already reported). The sketch and the emulated node both send it
// before their hello.
bool take_trial_report(SlotManager& slots, OtaStatus* status);

}  // namespace tesla
