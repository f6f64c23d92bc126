// AMX tile configuration shared by the CPU kernels that run tiles (qgemm.cpp: int8,
// bgemm.cpp: bf16 GEMM, attention_bf16.cpp: bf16 attention). x86-64 only; the caller
// has checked that the CPU has AMX and that Linux granted this process the tile state.
#pragma once

#include <cstdint>

namespace bertfast {
namespace cpu {

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Configures tiles 0 .. tiles - 1 as 16 rows of 64 bytes (palette 1), the others
// unused. ldtilecfg is written by hand: GCC 12's _tile_loadconfig names only 8 bytes of
// the config as read, so the stores of the rest were dropped as dead.
inline void amx_configure_16x64(int tiles) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < tiles; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}

}  // namespace cpu
}  // namespace bertfast
