// The default pass pipeline, in the order it runs. Each name is what
// CompileOptions::disable takes.
#pragma once

#include <array>

#include "kiln/passes/canonicalize.hpp"
#include "kiln/passes/choose_conv_algorithms.hpp"
#include "kiln/passes/choose_layouts.hpp"
#include "kiln/passes/compute_in_place.hpp"
#include "kiln/passes/eliminate_common_subexpressions.hpp"
#include "kiln/passes/eliminate_dead_nodes.hpp"
#include "kiln/passes/fold_constants.hpp"
#include "kiln/passes/fold_reorders.hpp"
#include "kiln/passes/fuse_elementwise.hpp"
#include "kiln/passes/fuse_epilogue.hpp"
#include "kiln/passes/fuse_loss.hpp"
#include "kiln/passes/fuse_reductions.hpp"
#include "kiln/passes/move_masks_through_pools.hpp"
#include "kiln/passes/pass.hpp"
#include "kiln/passes/schedule_for_memory.hpp"

namespace kiln {

/// Cleanup first, so that equivalent graphs reach fusion in the same form (canonicalize
/// before cse, so rewritten forms merge); dead nodes go before fusion so that no group is
/// grown around a value nobody needs (the pool gradient a moved mask no longer reads among
/// them). Layouts are chosen before fusion, so that fused kernels run in the layout their
/// anchors read and write; the reorders they insert fold into the pools beside them at once,
/// while the layout pass's record of them still names them; convolution algorithms next, since
/// only channels-last convolutions have Winograd kernels. Elementwise chains fuse before epilogues,
/// so that a whole chain (bias, relu; or an optimizer update) becomes one anchor's epilogue; sums
/// then take in the chains left over that only they read. The schedule orders the kernels that
/// fusion left, and in-place reuse, which decides by that order, comes last.
inline constexpr std::array default_pipeline = {
    Pass{"fold", &fold_constants},
    Pass{"canonicalize", &canonicalize},
    Pass{"cse", &eliminate_common_subexpressions},
    Pass{"mask_through_pool", &move_masks_through_pools},
    Pass{"dce", &eliminate_dead_nodes},
    Pass{"layout", &choose_layouts},
    Pass{"fold_reorders", &fold_reorders},
    Pass{"winograd", &choose_conv_algorithms},
    Pass{"fuse_elementwise", &fuse_elementwise},
    Pass{"fuse_epilogue", &fuse_epilogue},
    Pass{"fuse_loss", &fuse_loss},
    Pass{"fuse_reductions", &fuse_reductions},
    Pass{"schedule", &schedule_for_memory},
    Pass{"inplace", &compute_in_place},
};

} // namespace kiln
