# The torch that ${Python_EXECUTABLE} imports, for C++ that runs inside it.
#
# A PrivateUse1 backend compiles against the headers of the torch its users
# run and links only torch's CPU libraries (c10, torch_cpu) and, for its
# Python bindings, torch_python. This asks that torch where they are
# (torch.utils.cpp_extension, the way torch's own extension builder does)
# instead of calling find_package(Torch): on a CUDA build of torch,
# TorchConfig.cmake looks for a CUDA toolkit, cuDNN and NVRTC that a
# PrivateUse1 backend never uses and a vendor's build machine may not have.
#
# Defines:
#   Torch::cpu            imported target: include directories, the C++ ABI
#                         flag torch was built with, libc10 and libtorch_cpu
#   TORCH_LIBRARIES       Torch::cpu (what find_package(Torch) users expect)
#   TORCH_PYTHON_LIBRARY  libtorch_python (Python bindings only)
#   TORCH_INSTALL_PREFIX  the torch package folder (include/, lib/)
#   TORCH_VERSION         torch.__version__ (C++ sees TORCH_VERSION_MAJOR/MINOR
#                         from <torch/headeronly/version.h>)
if(TARGET Torch::cpu)
  return()
endif()

# Without autoload: an installed backend's torch.backends entry point would
# otherwise import the backend being rebuilt, and a broken one would make
# `import torch` fail.
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0
          "${Python_EXECUTABLE}" -c [=[
import os, torch
from torch.utils import cpp_extension
print(os.path.dirname(torch.__file__))
print(torch.__version__)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(";".join(cpp_extension.include_paths()))
]=]
  OUTPUT_VARIABLE _torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE
  COMMAND_ERROR_IS_FATAL ANY)
string(REPLACE "\n" ";" _torch_facts "${_torch_facts}")
list(POP_FRONT _torch_facts TORCH_INSTALL_PREFIX TORCH_VERSION _torch_abi)
set(_torch_includes ${_torch_facts})

foreach(_lib c10 torch_cpu torch_python)
  find_library(TORCH_${_lib}_LIBRARY ${_lib} REQUIRED
               PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
endforeach()
set(TORCH_PYTHON_LIBRARY "${TORCH_torch_python_LIBRARY}")

add_library(Torch::cpu INTERFACE IMPORTED)
set_target_properties(Torch::cpu PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_torch_includes}"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${_torch_abi}"
  INTERFACE_LINK_LIBRARIES "${TORCH_c10_LIBRARY};${TORCH_torch_cpu_LIBRARY}")
set(TORCH_LIBRARIES Torch::cpu)
message(STATUS "torch ${TORCH_VERSION} from ${TORCH_INSTALL_PREFIX}")
