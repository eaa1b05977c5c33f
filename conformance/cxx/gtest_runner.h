// Runs the C++ contract tests (GoogleTest cases linked into the _cxx module)
// one at a time: conformance/test_cxx_contracts.py lists them and runs each in
// its own forked process, so crashes and hangs of the backend become verdicts
// like those of the Python tests. Plain C++: probe.cpp binds it for Python.
#pragma once

#include <string>
#include <vector>

namespace pu1c {

struct GtestOutcome {
  bool passed = false;
  bool skipped = false;
  std::string message;  // the failures (file:line: message), or the skip reasons
};

// Names (Suite.Name) of the C++ contract tests; the suite is the contract ID
// with '_' for '-'.
std::vector<std::string> gtest_list();

// Runs exactly the case `name` in this process. std::invalid_argument for a
// filter pattern, std::runtime_error when no case (or several) has the name.
GtestOutcome gtest_run(const std::string& name);

}  // namespace pu1c
