#include "Mutants.h"

#include <cstdlib>

namespace openreg::mutant {

// Dynamic initialization at load: code running before it (other static
// initializers) sees nullptr, i.e. no mutant, which is the safe answer.
const char* const selected = [] {
  const char* value = std::getenv("OPENREG_MUTANT");
  return value != nullptr && *value != '\0' ? value : nullptr;
}();

const std::vector<std::string>& known() {
  // Kept in step with conformance/mutants.toml by tests/test_mutants.py.
  static const std::vector<std::string> ids = {
  };
  return ids;
}

}  // namespace openreg::mutant
