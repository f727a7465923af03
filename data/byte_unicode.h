// @brief GPT-2's reversible byte <-> unicode map: every byte value gets a printable code point, so
// vocabulary files can spell arbitrary bytes as text ("Ġ" is the space byte 0x20).
#pragma once

#include <array>
#include <cstdint>

namespace cutrain::data {

// byte_to_unicode()[b] is the code point standing for byte b (printable bytes map to themselves,
// the other 68 to U+0100..U+0143 in byte order).
const std::array<uint32_t, 256>& byte_to_unicode();

// The byte a code point stands for, or -1 if it stands for none.
int unicode_to_byte(uint32_t cp);

}  // namespace cutrain::data
