// Runs the C++ contract tests (GoogleTest cases linked into the _cxx module)
// one at a time from Python: conformance/test_cxx_contracts.py lists them and
// runs each in its own forked process, so crashes and hangs of the backend
// become verdicts like those of the Python tests.
#pragma once

#include <pybind11/pybind11.h>

namespace pu1c {

// Adds gtest_list(), gtest_run(name) and the probes of contracts_probes.h to
// the module.
void add_gtest_bindings(pybind11::module_& m);

}  // namespace pu1c
