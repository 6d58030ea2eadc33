// kiln::Error: the one exception type thrown at kiln's API boundary, with a stable code.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

/// Thrown for every user error (bad graph, bad data file, bad argument). `code()` is stable
/// across releases, e.g. "kiln.verify.shape", so programs and tests can branch on it; the
/// message names the node, file or argument that was wrong.
class Error : public std::runtime_error {
public:
  Error(std::string code, const std::string& message)
      : std::runtime_error("[" + code + "] " + message), code_(std::move(code)), message_(message) {
  }

  /// The stable error code, e.g. "kiln.data.truncated".
  [[nodiscard]] const std::string& code() const noexcept { return code_; }
  /// The message without the code.
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

private:
  std::string code_;
  std::string message_;
};

/// Stable error codes. Every code here has a test that triggers it.
namespace errc {
inline constexpr std::string_view shape = "kiln.verify.shape";        ///< incompatible shapes
inline constexpr std::string_view dtype = "kiln.verify.dtype";        ///< wrong element type
inline constexpr std::string_view arity = "kiln.verify.arity";        ///< wrong input count
inline constexpr std::string_view graph = "kiln.verify.graph";        ///< malformed graph
inline constexpr std::string_view attr = "kiln.verify.attr";          ///< bad op attribute
inline constexpr std::string_view argument = "kiln.api.argument";     ///< bad API argument
inline constexpr std::string_view not_found = "kiln.api.not_found";   ///< unknown name
inline constexpr std::string_view label = "kiln.data.label";          ///< label out of range
inline constexpr std::string_view io = "kiln.data.io";                ///< cannot open/read
inline constexpr std::string_view magic = "kiln.data.magic";          ///< not an IDX file
inline constexpr std::string_view truncated = "kiln.data.truncated";  ///< file too short
inline constexpr std::string_view format = "kiln.data.format";        ///< bad header field
inline constexpr std::string_view missing_data = "kiln.data.missing"; ///< no data directory
inline constexpr std::string_view no_kernel = "kiln.plan.no_kernel";  ///< backend cannot run a node
inline constexpr std::string_view precision =
    "kiln.target.precision";                                   ///< no kernels of that precision
inline constexpr std::string_view memory = "kiln.memory.host"; ///< host memory exhausted
inline constexpr std::string_view not_finite = "kiln.runtime.not_finite"; ///< a loss went NaN/inf
inline constexpr std::string_view checkpoint_io = "kiln.checkpoint.io";   ///< cannot write/read it
inline constexpr std::string_view checkpoint_format = "kiln.checkpoint.format";     ///< not valid
inline constexpr std::string_view checkpoint_mismatch = "kiln.checkpoint.mismatch"; ///< other net
inline constexpr std::string_view checkpoint_corrupt = "kiln.checkpoint.corrupt";   ///< CRC differs
inline constexpr std::string_view dist_collective =
    "kiln.dist.collective"; ///< an all-reduce failed or timed out
inline constexpr std::string_view dist_unavailable =
    "kiln.dist.unavailable"; ///< built without MPI, or MPI lacks thread support
inline constexpr std::string_view dist_mismatch = "kiln.dist.mismatch"; ///< ranks disagree
inline constexpr std::string_view cuda_unavailable =
    "kiln.cuda.unavailable";                                              ///< built without CUDA
inline constexpr std::string_view cuda_no_device = "kiln.cuda.no_device"; ///< no GPU visible
inline constexpr std::string_view cuda_driver = "kiln.cuda.driver"; ///< driver older than runtime
inline constexpr std::string_view cuda_memory = "kiln.memory.cuda"; ///< GPU memory exhausted
inline constexpr std::string_view cuda_launch = "kiln.cuda.launch"; ///< a kernel failed
inline constexpr std::string_view cuda_call = "kiln.cuda.call";     ///< another CUDA call failed
} // namespace errc

/// Throws kiln::Error with `code` and `message`.
[[noreturn]] inline void fail(std::string_view code, const std::string& message) {
  throw Error(std::string(code), message);
}

} // namespace kiln
