// Parameter blocks of the test module's kernels (test_kernels_module.cpp),
// shared by the module and the tests that launch them.
#pragma once

#include <cstdint>

namespace openreg_test_kernels {

struct FillParams {  // openreg_test_fill_u32
  uint64_t dst;
  uint64_t count;
  uint32_t value;
};

struct AddParams {  // openreg_test_add_u32
  uint64_t dst;
  uint64_t src;
  uint64_t count;
  uint32_t addend;
};

struct PointerParams {  // openreg_test_where, openreg_test_gate
  uint64_t ptr;
};

}  // namespace openreg_test_kernels
