#include "slots.h"

#include <string.h>

#include "checksums.h"
#include "sha256.h"

namespace tesla {
namespace {
constexpr uint32_t kRecordMagic = 0x424C5354u;  // "TSLB"
}

SlotManager::SlotManager(Flash& flash, uint32_t base, uint32_t slot_bytes)
    : flash_(flash), base_(base), slot_bytes_(slot_bytes) {}

uint32_t SlotManager::slot_address(int slot) const {
  return base_ + 2 * flash_.page_size() + uint32_t(slot) * slot_bytes_;
}

bool SlotManager::load() {
  bool found = false;
  for (int page = 0; page < 2; ++page) {
    Record candidate;
    if (!flash_.read(base_ + uint32_t(page) * flash_.page_size(),
                     reinterpret_cast<uint8_t*>(&candidate), sizeof(candidate))) {
      continue;
    }
    uint32_t crc = crc32(reinterpret_cast<const uint8_t*>(&candidate), offsetof(Record, crc));
    if (candidate.magic != kRecordMagic || candidate.crc != crc || candidate.active > 1) continue;
    if (!found || candidate.sequence > record_.sequence) {
      record_ = candidate;
      record_page_ = page;
      found = true;
    }
  }
  return found;
}

bool SlotManager::persist() {
  record_.magic = kRecordMagic;
  record_.sequence += 1;
  record_.crc = crc32(reinterpret_cast<const uint8_t*>(&record_), offsetof(Record, crc));
  int page = 1 - record_page_;  // never overwrite the last good record
  uint32_t address = base_ + uint32_t(page) * flash_.page_size();
  if (!flash_.erase(address, flash_.page_size())) return false;
  if (!flash_.write(address, reinterpret_cast<const uint8_t*>(&record_), sizeof(record_))) {
    return false;
  }
  record_page_ = page;
  return true;
}

bool SlotManager::install_factory(const uint8_t descriptor[kDescriptorSize], const uint8_t* image,
                                  uint32_t size) {
  memset(&record_, 0, sizeof(record_));
  record_.trial = 0xFF;
  if (size > slot_bytes_ || !write(0, 0, image, size)) return false;
  memcpy(record_.descriptors[0], descriptor, kDescriptorSize);
  record_.valid[0] = 1;
  record_.active = 0;
  return persist();
}

bool SlotManager::descriptor(int slot, ImageDescriptor* out) const {
  return has_model(slot) && decode_descriptor(record_.descriptors[slot], kDescriptorSize, out);
}

bool SlotManager::write(int slot, uint32_t offset, const uint8_t* data, uint32_t length) {
  if (slot < 0 || slot > 1 || offset + length > slot_bytes_ || offset % 4 != 0) return false;
  const uint32_t page = flash_.page_size();
  uint32_t first_page = (offset + page - 1) / page * page;
  for (uint32_t start = first_page; start < offset + length; start += page) {
    if (!flash_.erase(slot_address(slot) + start, page)) return false;
  }
  if (offset % page == 0 && length == 0) return true;
  uint8_t words[368];
  uint32_t done = 0;
  while (done < length) {
    uint32_t take = length - done < 364 ? length - done : 364;
    uint32_t padded = (take + 3) / 4 * 4;
    memset(words, 0xFF, padded);
    memcpy(words, data + done, take);
    if (!flash_.write(slot_address(slot) + offset + done, words, padded)) return false;
    done += take;
  }
  return true;
}

bool SlotManager::sha256(int slot, uint32_t size, uint8_t digest[32]) const {
  if (size > slot_bytes_) return false;
  Sha256 hash;
  uint8_t buffer[64];
  for (uint32_t offset = 0; offset < size; offset += sizeof(buffer)) {
    uint32_t take = size - offset < sizeof(buffer) ? size - offset : sizeof(buffer);
    if (!flash_.read(slot_address(slot) + offset, buffer, take)) return false;
    hash.update(buffer, take);
  }
  hash.finish(digest);
  return true;
}

bool SlotManager::stage_trial(int slot, const uint8_t descriptor[kDescriptorSize]) {
  memcpy(record_.descriptors[slot], descriptor, kDescriptorSize);
  record_.valid[slot] = 1;
  record_.trial = uint8_t(slot);
  record_.trial_booted = 0;
  return persist();
}

int SlotManager::select_boot() {
  if (record_.trial == 0xFF) return has_model(record_.active) ? record_.active : kNone;
  if (record_.trial_booted == 0) {
    record_.trial_booted = 1;
    persist();  // if this boot never confirms, the next one falls back
    return record_.trial;
  }
  reject(record_.trial);  // the trial boot crashed or hung before confirming
  return has_model(record_.active) ? record_.active : kNone;
}

SlotManager::Outcome SlotManager::take_outcome() {
  Outcome outcome = static_cast<Outcome>(record_.outcome);
  if (outcome != Outcome::kNone) {
    record_.outcome = 0;
    persist();
  }
  return outcome;
}

bool SlotManager::confirm(int slot) {
  record_.outcome = uint8_t(Outcome::kConfirmed);
  record_.active = uint8_t(slot);
  record_.trial = 0xFF;
  record_.trial_booted = 0;
  return persist();
}

bool SlotManager::reject(int slot) {
  record_.outcome = uint8_t(Outcome::kRolledBack);
  record_.valid[slot] = 0;
  record_.trial = 0xFF;
  record_.trial_booted = 0;
  return persist();
}

BootResult boot_from_slots(SlotManager& slots, const uint8_t factory_descriptor[kDescriptorSize],
                           const uint8_t* factory_image, uint32_t factory_size,
                           bool (*self_test)(int slot)) {
  if (!slots.load()) slots.install_factory(factory_descriptor, factory_image, factory_size);
  int slot = slots.select_boot();
  bool trial = slots.is_trial(slot);
  if (slot != SlotManager::kNone && self_test(slot)) {
    if (trial) slots.confirm(slot);
    return BootResult::kServing;
  }
  if (trial) {
    slots.reject(slot);
    return BootResult::kTrialRejected;
  }
  return BootResult::kNoWorkingModel;
}

bool take_trial_report(SlotManager& slots, OtaStatus* status) {
  switch (slots.take_outcome()) {
    case SlotManager::Outcome::kConfirmed: *status = OtaStatus::kActive; return true;
    case SlotManager::Outcome::kRolledBack: *status = OtaStatus::kRolledBack; return true;
    default: return false;
  }
}

}  // namespace tesla
