"""OpenReg's Inductor backend: torch.compile's default compiler for the
``openreg`` device (docs/reference-backend/inductor.md).

PyTorch lets an out-of-tree device plug into Inductor with
``register_backend_for_device(device, scheduling, wrapper_codegen)``: the
scheduling class writes the kernels, the wrapper code generator writes the
Python that allocates buffers and calls them. OpenReg's device is a CPU
behind a wall (its memory is not host memory; its work runs on streams), so
the honest kernel language is the CPU's: OpenReg reuses Inductor's C++
code generation (``CppScheduling``) unchanged for the kernels' bodies, and
changes how a kernel is *called*:

* each kernel is compiled (and cached, by its source) together with a small
  binding of OpenReg's, not Inductor's CPU binding: calling it packs the
  arguments and launches the kernel on the current stream of the tensors'
  device through the runtime (``include/openreg_inductor.h``), then returns
  at once, as a CUDA kernel launch returns;
* on the stream's worker, the kernel gets each tensor's kernel-accessible
  address from the runtime, as OpenReg's own kernels do; the host never
  reads device memory;
* the generated code enters Inductor's device-generic ``DeviceGuard``
  (through OpenReg's dynamo ``DeviceInterface``) around each device's
  kernels, so the current device is the kernels' and is restored after.

Everything else (buffers, reuse, calls to ATen for operators Inductor does
not generate, the FX graph and code caches) is Inductor's own.
"""

from __future__ import annotations

import functools
from pathlib import Path

from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

DEVICE = "openreg"
INCLUDE_DIR = Path(__file__).with_name("include")
# Marks an OpenReg kernel's source: a CPU kernel of the same graph with the
# same body must not share its definition (it is called directly).
_MARKER = "// OpenReg kernel: launched on the current stream of its tensors' device\n"
_COMPILE = "openreg_kernels.compile("


# ---------------------------------------------------------------- the binding

def _c_type(argtype: str) -> str:
    return argtype.replace("const ", "").strip()


def _binding(argtypes: list[str]) -> str:
    """The C++ appended to a kernel's source: a Python module whose
    ``kernel(*args)`` launches kernel(args) on the current stream of the
    tensors' device and returns."""
    fields, host, device_args = [], [], []
    for n, argtype in enumerate(argtypes):
        c_type = _c_type(argtype)
        if c_type.endswith("*"):
            fields.append(f"OpenRegInductorTensor a{n};")
            # A host scalar (device -1, passed by value) is read only: a
            # kernel's result written into it would be lost.
            host.append(
                f"if (api->tensor(PyTuple_GET_ITEM(args, {n}), KERNEL_NAME, {n}, &call->a{n}) != 0) goto fail;\n"
                + ("" if argtype.strip().startswith("const ") else
                   f"if (call->a{n}.device == -1) {{\n"
                   f"  PyErr_Format(PyExc_TypeError, \"OpenReg: Inductor kernel %s: argument {n} is a CPU tensor the "
                   f"kernel writes; a kernel launched on an OpenReg device writes OpenReg tensors only\", KERNEL_NAME);\n"
                   f"  goto fail;\n}}\n")
                + f"if (call->a{n}.device == -1) {{}}\n"
                f"else if (device == -1) device = call->a{n}.device;\n"
                f"else if (call->a{n}.device != device) {{\n"
                f"  PyErr_Format(PyExc_RuntimeError, \"OpenReg: Inductor kernel %s: argument {n} is on openreg:%d, "
                f"an earlier one on openreg:%d; a kernel runs on one device\", KERNEL_NAME, call->a{n}.device, "
                f"device);\n  goto fail;\n}}")
            device_args.append(f"({argtype})mapped[{n}]")
        elif c_type in ("int64_t", "long", "int"):
            fields.append(f"{c_type} a{n};")
            host.append(f"call->a{n} = ({c_type})PyLong_AsLongLong(PyTuple_GET_ITEM(args, {n}));\n"
                        f"if (PyErr_Occurred()) goto fail;")
            device_args.append(f"call->a{n}")
        elif c_type in ("float", "double"):
            fields.append(f"{c_type} a{n};")
            host.append(f"call->a{n} = ({c_type})PyFloat_AsDouble(PyTuple_GET_ITEM(args, {n}));\n"
                        f"if (PyErr_Occurred()) goto fail;")
            device_args.append(f"call->a{n}")
        else:
            raise NotImplementedError(f"OpenReg's Inductor backend: kernel argument type {argtype!r}")
    maps = "\n".join(
        f"mapped[{n}] = api->map(&call->a{n}, &failed); if (failed) return 1;"
        for n, argtype in enumerate(argtypes) if _c_type(argtype).endswith("*"))
    nl = "\n"
    return f"""
// ---- OpenReg: launch kernel() on the current stream of its tensors' device
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openreg_inductor.h>
#include <stdlib.h>

#define KERNEL_NAME "kernel"
static const OpenRegInductorApi* api = NULL;

namespace {{
struct Call {{
  {f"{nl}  ".join(fields) if fields else "char unused;"}
}};

int run(void* opaque) {{
  Call* call = static_cast<Call*>(opaque);
  void* mapped[{max(len(argtypes), 1)}] = {{}};
  int failed = 0;
  (void)failed;
  {maps}
  kernel({", ".join(device_args)});
  return 0;
}}

void release(void* call) {{ delete static_cast<Call*>(call); }}
}}  // namespace

static PyObject* kernel_py(PyObject* self, PyObject* args) {{
  if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != {len(argtypes)}) {{
    PyErr_SetString(PyExc_TypeError, "OpenReg: Inductor kernel: expected {len(argtypes)} arguments");
    return NULL;
  }}
  Call* call = new Call();
  int device = -1;
  {nl.join(host)}
  if (device == -1) {{
    PyErr_SetString(PyExc_RuntimeError, "OpenReg: Inductor kernel without a tensor argument: no device to run on");
    goto fail;
  }}
  if (api->launch(device, &run, call, &release) != 0) return NULL;  // (launch released the call)
  Py_RETURN_NONE;
fail:
  delete call;
  return NULL;
}}

static PyMethodDef methods[] = {{{{"kernel", kernel_py, METH_VARARGS, ""}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module_def = {{PyModuleDef_HEAD_INIT, "kernel", NULL, -1, methods}};

PyMODINIT_FUNC PyInit_kernel(void) {{
  api = static_cast<const OpenRegInductorApi*>(PyCapsule_Import(OPENREG_INDUCTOR_API_CAPSULE, 0));
  if (api == NULL) return NULL;
  if (api->version != OPENREG_INDUCTOR_API_VERSION) {{
    PyErr_Format(PyExc_ImportError, "OpenReg: Inductor kernel built for interface version %d, OpenReg has %d",
                 OPENREG_INDUCTOR_API_VERSION, api->version);
    return NULL;
  }}
  return PyModule_Create(&module_def);
}}
"""


class KernelCache(CppPythonBindingsCodeCache):
    """Compiled OpenReg kernels, keyed by their source (binding included),
    in Inductor's on-disk C++ cache like the CPU's."""

    cache: dict = {}
    cache_clear = staticmethod(cache.clear)

    @classmethod
    def load_launcher(cls, argtypes: list[str], source: str):
        # The kernel is CPU code: compiled with the CPU's flags and vector ISA.
        load = cls.load_async(source + _binding(argtypes), "cpu", extra_flags=(f"-I{INCLUDE_DIR}",))
        return getattr(load(), "kernel")


@functools.cache
def _device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    return get_interface_for_device(DEVICE)


def device_guard(index: int):
    """Inductor's device-generic DeviceGuard for OpenReg device `index`,
    through OpenReg's dynamo DeviceInterface (what the generated wrapper
    enters around each OpenReg kernel)."""
    from torch._dynamo.device_interface import DeviceGuard

    return DeviceGuard(_device_interface(), index)


def compile(argtypes: list[str], source: str):  # noqa: A001 - the generated code's verb
    """What the generated wrapper calls for each OpenReg kernel (in place of
    the CPU's async_compile.cpp_pybinding): the kernel's launcher."""
    return KernelCache.load_launcher(list(argtypes), source)


# ---------------------------------------------------------------- codegen

class OpenRegScheduling(CppScheduling):
    """Inductor's C++ kernels, defined as OpenReg kernels (launched on the
    device's streams), never shared with a CPU kernel of the same body."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        wrapper = V.graph.wrapper_code
        wrapper.defining_openreg_kernel = True
        try:
            return super().define_kernel(_MARKER + src_code, nodes, kernel_args)
        finally:
            wrapper.defining_openreg_kernel = False


class _OpenRegWrapperMixin:
    """What OpenReg changes in Inductor's Python wrapper (the root graph's and
    its subgraphs'): OpenReg kernels are compiled by openreg._inductor.compile
    and called under the device guard of their device, and OpenReg buffers
    are allocated on their own device."""

    defining_openreg_kernel = False

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=False, cpp_definition=None):
        if self.defining_openreg_kernel:
            kernel_body = kernel_body.replace("async_compile.cpp_pybinding(", _COMPILE, 1)
        return super().define_kernel(kernel_name, kernel_body, metadata, gpu, cpp_definition)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type == DEVICE and not triton:
            # Under Inductor's DeviceGuard for the kernel's device, as a GPU
            # kernel is called: the device is current while the kernel is
            # launched, and the caller's is current again after. (Inductor
            # guards only its GPU types itself.) The launcher enqueues the
            # kernel on the current stream of its tensors' device.
            self.codegen_device_guard_enter(device.index)
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            self.codegen_device_guard_exit()
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        line = super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        if device.type == DEVICE and device.index is not None:
            # On the buffer's own device, not the current one (a GPU's
            # buffers are allocated inside its device guard, OpenReg's
            # between its kernels' guards).
            line = line.replace(f"device='{DEVICE}'", f"device='{DEVICE}:{device.index}'", 1)
        return line


class OpenRegSubgraphWrapperCodegen(_OpenRegWrapperMixin, SubgraphPythonWrapperCodegen):
    """A subgraph's wrapper (torch.cond, while_loop, ...)."""


class OpenRegWrapperCodegen(_OpenRegWrapperMixin, PythonWrapperCodegen):
    """Inductor's Python wrapper for graphs with OpenReg tensors."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return OpenRegSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return OpenRegWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("import openreg._inductor as openreg_kernels")


class OpenRegDeviceOpOverrides(DeviceOpOverrides):
    """What the generated wrapper writes for device management on OpenReg."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(index):\n    return torch.openreg.current_stream(index).native_handle\n"

    def set_device(self, device_idx: int) -> str:
        return f"torch.openreg.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.openreg.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"openreg_kernels.device_guard({device_idx})"

    def current_stream(self) -> str:
        return "torch.openreg.current_stream()"


def _scheduler_nodes_are_cpp_code() -> None:
    """Inductor's scheduler skips loop reordering and reindexing for nodes of
    its C++ backend (they are validated for Triton's loop groups only), and
    tells those nodes by their device type, "cpu". OpenReg's nodes are C++
    backend nodes on another device type: without this, fusion reindexes
    their C++ loop groups as Triton's and fails ("can't multiply sequence by
    non-int of type 'tuple'", seen compiling a convolutional model's
    backward). BaseSchedulerNode.is_cpu is read by those three decisions
    only (PyTorch 2.13); nothing else changes."""
    from torch._inductor import scheduler

    if getattr(scheduler.BaseSchedulerNode.is_cpu, "openreg", False):
        return

    def is_cpu(node) -> bool:
        device = node.get_device()
        return device is not None and device.type in ("cpu", DEVICE)

    is_cpu.openreg = True  # type: ignore[attr-defined]
    scheduler.BaseSchedulerNode.is_cpu = is_cpu


def _kernels_are_cpp_code() -> None:
    """Inductor asks get_current_backend(device type) which kernel language a
    device's kernels are in, and knows only its own device types: any other
    is config.cuda_backend, "triton". Code generation then treats OpenReg's
    C++ kernels as Triton's (the C++ fix-up of variables whose dtype an
    operation does not set is skipped: a dynamic-shape batch norm's
    c10::convert<float>(ks0*ks1) ends in an AssertionError). OpenReg's are
    "cpp". The function is looked up by name in torch._inductor.utils and
    bound by name in torch._inductor.codegen.common (PyTorch 2.13), so both
    are set; every other device type gets PyTorch's answer."""
    from torch._inductor import utils
    from torch._inductor.codegen import common

    original = utils.get_current_backend
    if getattr(original, "openreg", False):
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == DEVICE else original(device_type)

    get_current_backend.openreg = True  # type: ignore[attr-defined]
    utils.get_current_backend = get_current_backend
    common.get_current_backend = get_current_backend


def register() -> None:
    """Registers OpenReg's Inductor backend: its kernels' and wrapper's code
    generators and its device operations (openreg/_dynamo.py calls this once
    Inductor's compiler is imported)."""
    register_backend_for_device(DEVICE, OpenRegScheduling, OpenRegWrapperCodegen)
    register_device_op_overrides(DEVICE, OpenRegDeviceOpOverrides())
    _kernels_are_cpp_code()
    _scheduler_nodes_are_cpp_code()
