// The mutant selection of a woven OpenReg build (mutation/weave.py): every
// woven site asks openreg_mutant_is("id"), which compares its ID with this.
//
// OPENREG_MUTANT is read when the library loads, before its other static
// initializers (priority 101 runs before the default), so registrations made
// while it loads (hooks, kernels, autocast) can be mutated too. Each target
// with woven sources links a copy: the definitions are weak (a binary that
// holds two keeps one) and hidden (each library reads its own, directly,
// without a lookup through the GOT).
#include <cstdlib>

extern "C" {
__attribute__((weak, visibility("hidden"))) const char* openreg_mutant_selected = nullptr;
}

namespace {
__attribute__((constructor(101))) void openreg_read_mutant_selection() {
  const char* value = std::getenv("OPENREG_MUTANT");
  openreg_mutant_selected = value != nullptr && *value != '\0' ? value : nullptr;
}
}  // namespace
