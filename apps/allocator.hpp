// The programs' allocator settings (allocator.cpp).
#pragma once

namespace moesim {

/// Huge pages for what is allocated from here on, where moesim is linked with mimalloc; a no-op
/// otherwise. The first call in main().
void use_large_pages();

}  // namespace moesim
