// Turns runtime error codes into c10::Error with the runtime's message.
#pragma once

#include <openreg/runtime.h>

#include <c10/util/Exception.h>

// Throws c10::Error (RuntimeError in Python) carrying the runtime's message.
// Out-of-memory becomes c10::OutOfMemoryError (torch.OutOfMemoryError).
#define OPENREG_CHECK(expr)                                                   \
  do {                                                                        \
    const orError_t openreg_status_ = (expr);                                 \
    if (openreg_status_ == orErrorMemoryAllocation) {                         \
      TORCH_CHECK_WITH(OutOfMemoryError, false, "OpenReg: ",                  \
                       orGetLastErrorMessage());                              \
    }                                                                         \
    TORCH_CHECK(openreg_status_ == orSuccess, "OpenReg: ",                    \
                orGetLastErrorMessage(), " [", orGetErrorName(openreg_status_), \
                "]");                                                         \
  } while (0)
