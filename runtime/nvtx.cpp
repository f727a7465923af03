#include "runtime/nvtx.h"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>

namespace cutrain {

namespace {
thread_local std::string g_path;
}

NvtxRange::NvtxRange(std::string_view name) : parent_len_(g_path.size()) {
  if (!g_path.empty()) g_path.push_back('/');
  g_path.append(name);
  nvtxRangePushA(g_path.c_str());
}

NvtxRange::~NvtxRange() {
  nvtxRangePop();
  g_path.resize(parent_len_);
}

const std::string& NvtxRange::current_path() { return g_path; }

void nvtx_name_stream(void* stream, const char* name) { nvtxNameCudaStreamA(static_cast<cudaStream_t>(stream), name); }

}  // namespace cutrain
