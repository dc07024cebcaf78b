#include "ota_descriptor.h"

#include <string.h>

namespace tesla {
namespace {

uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

bool valid_name_char(char c, bool first) {
  bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  return alnum || (!first && (c == '.' || c == '_' || c == '+' || c == '-'));
}

}  // namespace

bool decode_descriptor(const uint8_t* data, size_t length, ImageDescriptor* out) {
  if (length != kDescriptorSize || memcmp(data, "TMDL", 4) != 0) return false;
  const uint8_t format = data[4];
  const uint32_t word = uint32_t(data[6]) | (uint32_t(data[7]) << 8);
  if ((format != 1 && format != 2) || data[5] != 1 || (format == 1 && word != 0)) return false;
  out->model_version = le32(data + 8);
  out->image_size = le32(data + 12);
  memcpy(out->image_sha256, data + 16, 32);
  size_t name_length = 0;
  while (name_length < kModelNameMax && data[48 + name_length] != 0) ++name_length;
  for (size_t i = name_length; i < kModelNameMax; ++i) {
    if (data[48 + i] != 0) return false;  // embedded NUL
  }
  if (name_length == 0) return false;
  for (size_t i = 0; i < name_length; ++i) {
    if (!valid_name_char(static_cast<char>(data[48 + i]), i == 0)) return false;
  }
  memcpy(out->model_name, data + 48, name_length);
  out->model_name[name_length] = '\0';
  out->window_length = le32(data + 80);
  out->arena_bytes = le32(data + 84);
  if (format == 2 && (word < 1 || word > out->window_length)) return false;
  out->min_history = format == 2 ? word : 0;
  return true;
}

uint32_t image_min_history(const ImageDescriptor& image, const uint8_t* factory_raw,
                           uint32_t built_in) {
  // The factory image is special because a boot record left by older firmware may hold a
  // format-1 factory descriptor, which states no rule: the built-in value is its rule.
  ImageDescriptor factory;
  const bool is_factory = decode_descriptor(factory_raw, kDescriptorSize, &factory) &&
                          image.model_version == factory.model_version &&
                          strcmp(image.model_name, factory.model_name) == 0 &&
                          memcmp(image.image_sha256, factory.image_sha256, 32) == 0;
  if (is_factory) return built_in;
  return image.min_history != 0 ? image.min_history : image.window_length;
}

}  // namespace tesla
