#include "Mutants.h"

#include <cstdlib>

namespace openreg::mutant {

// Constant-initialized to "no mutant"; set from the environment by the
// constructor below, which runs before every other static initializer of this
// library (priority 101 < the default 65535): registrations made while the
// library loads (hooks, kernels, autocast) can be mutants too.
const char* selected = nullptr;

namespace {
__attribute__((constructor(101))) void read_selection() {
  const char* value = std::getenv("OPENREG_MUTANT");
  selected = value != nullptr && *value != '\0' ? value : nullptr;
}
}  // namespace

const std::vector<std::string>& known() {
  // Kept in step with conformance/mutants.toml by tests/test_mutants.py.
  static const std::vector<std::string> ids = {
      "any-host-pointer-is-pinned",
      "autocast-does-not-cast",
      "availability-initializes",
      "cross-device-copy-lands-on-source",
      "current-device-process-wide",
      "current-stream-process-wide",
      "default-generator-new-per-call",
      "default-stream-aliases-pool",
      "device-from-ptr-is-current-device",
      "elapsed-time-host-clock",
      "empty-cache-before-init-raises",
      "event-complete-before-work",
      "event-destroy-leaks",
      "event-records-on-any-device",
      "exchange-returns-new",
      "exchange-stream-returns-new",
      "exchange-stream-switches-device",
      "fallback-views-are-copies",
      "fork-not-detected",
      "guard-accepts-other-device-types",
      "guard-does-not-restore",
      "guard-redundant-switch",
      "h2d-drops-last-byte",
      "hooks-count-disagrees",
      "hooks-exchange-clamps",
      "init-at-import",
      "item-ignores-offset",
      "maybe-exchange-minus-one-raises",
      "new-generator-is-default",
      "new-stream-always-same",
      "no-index-means-device-0",
      "offset-silently-ignored",
      "one-generator-for-all-devices",
      "oom-aborts",
      "peak-never-resets",
      "pinned-block-freed-before-copy",
      "pinned-memory-is-pageable",
      "primary-context-always-true",
      "random-ops-use-cpu-generator",
      "range-error-without-range",
      "record-stream-ignored",
      "resize-drops-data",
      "rng-set-state-ignored",
      "set-device-ignores-out-of-range",
      "stats-ignore-frees",
      "stream-query-always-true",
      "stream-wait-is-noop",
      "synchronize-current-device",
      "unchecked-set-device-throws",
      "zero-byte-allocation-fails",
  };
  return ids;
}

}  // namespace openreg::mutant
