// Mutants: deliberately broken variants of OpenReg, each violating one
// contract the way a real backend might, used to prove that every check of
// the conformance suite can fail (docs/mutation-testing.md; the registry is
// conformance/mutants.toml).
//
// A mutant is selected by the environment variable OPENREG_MUTANT, read once
// when the library loads (before any other static initializer of the
// library, so that registrations can be mutated too); no rebuild. With none
// selected (the normal case) a check costs one load and one predictable
// branch.
#pragma once

#include <cstring>
#include <string>
#include <vector>

namespace openreg::mutant {

// The selected mutant's ID, or nullptr. Set once, when the library loads.
extern const char* selected;

inline bool is(const char* id) {
  return __builtin_expect(selected != nullptr, 0) && std::strcmp(selected, id) == 0;
}

// The IDs of the mutants implemented in C++ (the Python package adds its own).
const std::vector<std::string>& known();

}  // namespace openreg::mutant
