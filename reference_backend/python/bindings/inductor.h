// The interface between Inductor-generated kernels and OpenReg, exported to
// them as the capsule openreg._C._inductor_api (inductor.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace openreg_bindings {

void add_inductor_api(pybind11::module_& m);

}  // namespace openreg_bindings
