"""Autoload: ``import torch`` loads the backend through the ``torch.backends``
entry point group.

PyTorch calls every entry point of that group at the end of ``import torch``
unless TORCH_DEVICE_BACKEND_AUTOLOAD is set to anything but ``1``
(``_import_device_backends`` in torch/__init__.py; RFC pytorch#122468). A
backend that declares one is ready in every process that imports torch: the
children ``multiprocessing`` starts with ``spawn``, ``torch.load`` in a new
interpreter, device-generic test runners.

The run itself has autoload off (the kit imports the backend under test; see
harness/plugin.py), so each check starts its own interpreter with it on and
never imports the backend there: only PyTorch's autoload can load it. A
backend that declares no entry point lists the feature ``autoload`` as
unclaimed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ._helpers import check, inconclusive, scope

contract = pytest.mark.contract

# The interpreter the checks start. It imports torch and nothing else of the
# backend; argv: the backend's module, its device type, the start method of
# the child ("spawn" or "fork"). The child runs before the parent touches the
# device: with fork, a device initialized by the parent would be inherited.
_SCRIPT = r'''
import json, multiprocessing, queue, sys
import torch


def child(name, answers):
    try:
        values = torch.arange(3, device=name + ":0").mul(2).cpu().tolist()
        answers.put({"values": values, "claimed": torch._C._get_privateuse1_backend_name()})
    except BaseException as e:
        answers.put({"error": repr(e)})


if __name__ == "__main__":
    module, name, method = sys.argv[1:4]
    claimed = torch._C._get_privateuse1_backend_name()
    answer = {"claimed": claimed, "loaded": module in sys.modules}
    if claimed == name and answer["loaded"]:
        context = multiprocessing.get_context(method)
        answers = context.Queue()
        process = context.Process(target=child, args=(name, answers))
        process.start()
        while "child" not in answer:
            try:
                answer["child"] = answers.get(timeout=0.5)
            except queue.Empty:
                if not process.is_alive() and answers.empty():
                    answer["child"] = {"error": f"the child ended without an answer (exit code {process.exitcode})"}
        process.join()
        try:
            answer["values"] = torch.ones(3, device=name + ":0").add(1).cpu().tolist()
        except Exception as e:
            answer["error"] = repr(e)
    print("ANSWER " + json.dumps(answer), flush=True)
'''


# A process that imports torch only when its own code runs, after start-up:
# no import torch at the top of this script, so that neither the interpreter
# nor a spawn child unpickling its target (defined here) imports torch. Each
# child imports torch in its target, on the main thread or first on a new
# thread; then the parent imports torch on a new thread too. argv: the
# backend's module, its device type.
_LAZY_SCRIPT = r'''
import json, multiprocessing, queue, sys, threading


def use(module, name):
    try:
        import torch
        claimed = torch._C._get_privateuse1_backend_name()
        answer = {"claimed": claimed, "loaded": module in sys.modules}
        answer["values"] = torch.arange(3, device=name + ":0").mul(2).cpu().tolist()
        return answer
    except BaseException as e:
        return {"error": repr(e)}


def child(module, name, on_thread, answers):
    if on_thread:
        result = []
        worker = threading.Thread(target=lambda: result.append(use(module, name)))
        worker.start()
        worker.join()
        answers.put(result[0] if result else {"error": "the thread ended without an answer"})
    else:
        answers.put(use(module, name))


if __name__ == "__main__":
    module, name = sys.argv[1:3]
    context = multiprocessing.get_context("spawn")
    answer = {}
    children = {}  # both children at once: each starts an interpreter
    for where in ("main thread", "new thread"):
        answers = context.Queue()
        process = context.Process(target=child, args=(module, name, where == "new thread", answers))
        process.start()
        children[where] = process, answers
    for where, (process, answers) in children.items():
        while where not in answer:
            try:
                answer[where] = answers.get(timeout=0.5)
            except queue.Empty:
                if not process.is_alive() and answers.empty():
                    answer[where] = {"error": f"the child ended without an answer (exit code {process.exitcode})"}
        process.join()
    result = []
    worker = threading.Thread(target=lambda: result.append(use(module, name)))
    worker.start()
    worker.join()
    answer["this process, on a new thread"] = result[0] if result else {"error": "no answer"}
    print("ANSWER " + json.dumps(answer), flush=True)
'''


def _normal(distribution: str) -> str:
    return distribution.lower().replace("-", "_").replace(".", "_")


def autoloaded(backend, dt, tmp_path, method: str, clause: str) -> dict:
    """Runs the script in a new interpreter with autoload on; its answer, or
    inconclusive when another backend holds PrivateUse1 there."""
    from privateuse1_conformance.harness.backend import autoload_declarations, autoload_distributions

    declared = autoload_declarations()
    if backend.distribution:
        check(clause, _normal(backend.distribution) in {_normal(d) for d in autoload_distributions()},
              f"the backend's distribution {backend.distribution!r} declares no entry point in the group "
              f"torch.backends (entry points installed: {declared or 'none'})")
    script = tmp_path / "autoload_check.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    with scope(clause):
        result = subprocess.run([sys.executable, str(script), backend.module_name, dt, method],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ANSWER ")]
    check(clause, result.returncode == 0 and lines,
          lambda: f"import torch with TORCH_DEVICE_BACKEND_AUTOLOAD=1 in a new interpreter failed "
                  f"(exit status {result.returncode}): {result.stderr[-2000:]}")
    answer = json.loads(lines[-1][len("ANSWER "):])
    if answer["claimed"] not in ("privateuseone", dt) or (answer["claimed"] == dt and not answer["loaded"]):
        inconclusive(f"in this environment import torch gave PrivateUse1 to another backend "
                     f"({answer['claimed']!r}); torch.backends entry points installed: {declared}")
    check(clause, answer["claimed"] == dt,
          f"import torch with TORCH_DEVICE_BACKEND_AUTOLOAD=1 left PrivateUse1 unclaimed: the backend was not "
          f"loaded (torch.backends entry points installed: {declared or 'none'})")
    return answer


@contract("AL-LOAD-001")
def test_import_torch_loads_the_backend_and_a_spawn_child_can_use_it(backend, dt, tmp_path):
    answer = autoloaded(backend, dt, tmp_path, "spawn", "AL-LOAD-001.1")
    check("AL-LOAD-001.1", answer.get("values") == [2.0, 2.0, 2.0],
          lambda: f"after import torch loaded the backend, torch.ones(3, device='{dt}:0').add(1) read back "
                  f"{answer.get('values', answer.get('error'))}, not [2.0, 2.0, 2.0]")
    child = answer["child"]
    check("AL-LOAD-001.2", child.get("values") == [0, 2, 4],
          lambda: f"in a child started with the spawn method (which imports torch and not the backend), "
                  f"torch.arange(3, device='{dt}:0').mul(2) gave {child.get('values', child.get('error'))}, "
                  f"not [0, 2, 4]")


@contract("AL-LOAD-001")
@pytest.mark.requires("fork")
def test_import_torch_initializes_no_device(backend, dt, tmp_path):
    """A process that imports torch and forks (a DataLoader's workers) must
    keep working: loading the backend must leave the device uninitialized."""
    answer = autoloaded(backend, dt, tmp_path, "fork", "AL-LOAD-001.3")
    child = answer["child"]
    check("AL-LOAD-001.3", child.get("values") == [0, 2, 4],
          lambda: f"a child forked right after import torch loaded the backend (before any device use) could "
                  f"not use the device: {child.get('values', child.get('error'))} (was a device initialized "
                  f"while the backend loaded?)")


@contract("AL-LOAD-001")
def test_a_process_that_imports_torch_later_loads_the_backend(backend, dt, tmp_path):
    """torch is often imported long after start-up: in a spawn child's
    target when it runs (not while unpickling it), in a worker thread of a
    server. Autoload must not depend on how or where the first import
    happens."""
    from privateuse1_conformance.harness.backend import autoload_declarations

    script = tmp_path / "autoload_lazy_check.py"
    script.write_text(_LAZY_SCRIPT)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    with scope("AL-LOAD-001.4"):
        result = subprocess.run([sys.executable, str(script), backend.module_name, dt],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
    lines = [line for line in result.stdout.splitlines() if line.startswith("ANSWER ")]
    check("AL-LOAD-001.4", result.returncode == 0 and lines,
          lambda: f"a process importing torch after start-up with TORCH_DEVICE_BACKEND_AUTOLOAD=1 failed "
                  f"(exit status {result.returncode}): {result.stderr[-2000:]}")
    answers = json.loads(lines[-1][len("ANSWER "):])
    for where, answer in answers.items():
        if answer.get("claimed") not in (None, "privateuseone", dt):
            inconclusive(f"in this environment import torch gave PrivateUse1 to another backend "
                         f"({answer['claimed']!r}); torch.backends entry points installed: {autoload_declarations()}")
        what = (f"a spawn child whose target imports torch when it runs, on its {where}" if "thread" in where
                and not where.startswith("this") else "a process that imports torch first on a new thread")
        check("AL-LOAD-001.4", answer.get("claimed") == dt and answer.get("values") == [0, 2, 4],
              lambda: f"in {what}, with TORCH_DEVICE_BACKEND_AUTOLOAD=1, "
                      + (f"import torch left PrivateUse1 as {answer['claimed']!r} (the backend was not loaded; "
                         f"torch.backends entry points installed: {autoload_declarations() or 'none'})"
                         if "claimed" in answer and answer["claimed"] != dt else
                         f"torch.arange(3, device='{dt}:0').mul(2) gave {answer.get('values', answer.get('error'))}, "
                         f"not [0, 2, 4]"))
