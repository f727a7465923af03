// @brief NVTX ranges with hierarchical names ("step/fwd/layer03/attn").
// A thread-local stack joins the names of the ranges open on this thread, so a launcher that
// opens "attn" inside "step/fwd/layer03" shows up in Nsight under the full path.
#pragma once

#include <string>
#include <string_view>

namespace cutrain {

class NvtxRange {
 public:
  explicit NvtxRange(std::string_view name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

  // The full path of the innermost open range on this thread ("" when none).
  static const std::string& current_path();

 private:
  std::size_t parent_len_;
};

// Names a stream in Nsight's timeline.
void nvtx_name_stream(void* stream, const char* name);

}  // namespace cutrain
