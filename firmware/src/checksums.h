// CRC-16/CCITT-FALSE (line protocol) and CRC-32/ISO-HDLC (OTA chunks), as in
// tesla_gateway/sources/line_protocol.py and tesla_gateway/ota/protocol.py.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace tesla {

uint16_t crc16_ccitt_false(const uint8_t* data, size_t length);
uint32_t crc32(const uint8_t* data, size_t length);

}  // namespace tesla
