// moesim's programs allocate and free hundreds of MB an iteration at thousand-GPU scale (routing
// matrices, task graphs, the executor's per-part arrays), and on a VM each first touch of a 4 KiB
// page is a costly fault: a fifth to a third of an iteration's time at 1,024 GPUs. Linked with
// mimalloc (Debian's libmimalloc-dev, which replaces malloc and operator new in the whole process),
// memory comes in 2 MiB transparent huge pages instead (mi_option_large_os_pages: madvise
// MADV_HUGEPAGE), 512 times fewer faults. Without it (no package, or a sanitizer build) nothing
// changes but speed. docs/performance.md measures both.
#include "allocator.hpp"

#ifdef MOESIM_WITH_MIMALLOC
#include <mimalloc.h>
#endif

namespace moesim {

void use_large_pages() {
#ifdef MOESIM_WITH_MIMALLOC
  mi_option_enable(mi_option_large_os_pages);
#endif
}

}  // namespace moesim
