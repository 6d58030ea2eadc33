// Skipping a test case whose data or hardware is missing, so that ctest reports a skip
// instead of a pass.
#pragma once

#include <string>

namespace kiln::test {

/// The exit code of a run in which a case skipped and none failed; ctest's SKIP_RETURN_CODE.
inline constexpr int skip_exit_code = 77;

/// Marks the running test case as skipped for `reason` (printed); the caller then returns.
void skip(const std::string& reason);

} // namespace kiln::test
