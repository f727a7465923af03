#include "data/byte_unicode.h"

namespace cutrain::data {

const std::array<uint32_t, 256>& byte_to_unicode() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(uint32_t cp) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> inv{};
    inv.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace cutrain::data
