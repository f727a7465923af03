// Writes a buffer through cutrain's aio handle, reads it back and compares; reads a DeepSpeed
// config. Usage: aio_roundtrip FOLDER CONFIG.json
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "runtime/aio/aio_handle.h"
#include "runtime/error.h"
#include "train/config.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: aio_roundtrip FOLDER CONFIG.json\n");
    return 2;
  }
  try {
    const std::filesystem::path file = std::filesystem::path(argv[1]) / "roundtrip.bin";
    std::vector<unsigned char> out(3 * 1024 * 1024 + 17), in(out.size(), 0xAB);
    std::mt19937 gen(std::random_device{}());
    for (auto& b : out) b = static_cast<unsigned char>(gen());
    cutrain::aio::HandleOptions o;
    o.intra_op_parallelism = 4;
    cutrain::aio::AioHandle h(o);
    h.sync_pwrite(out.data(), out.size(), file.string());
    h.async_pread(in.data(), in.size(), file.string());
    const int done = h.wait();
    if (done != 1 || std::memcmp(in.data(), out.data(), out.size()) != 0) {
      std::fprintf(stderr, "aio_roundtrip: the bytes read back differ (wait() = %d)\n", done);
      return 1;
    }
    const cutrain::train::TrainConfig cfg = cutrain::train::load_config(argv[2]);
    std::printf("aio_roundtrip: %zu bytes through %s, config %s: bf16 %s\n", out.size(),
                cutrain::aio::backend_name(h.backend()), argv[2], cfg.bf16.enabled ? "on" : "off");
    std::filesystem::remove(file);
    return 0;
  } catch (const cutrain::Error& e) {
    std::fprintf(stderr, "aio_roundtrip: %s\n", e.what());
    return 1;
  }
}
