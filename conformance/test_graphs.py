"""Graph capture and replay (ST-GRAPH-001, optional feature graphs):
torch.accelerator.Graph, PyTorch's device-generic counterpart of CUDA
graphs. A backend registers a GraphImplInterface for its device type
(REGISTER_GRAPH_IMPL, keyed by the renamed backend's name in upper case);
work launched on the capturing stream is recorded, not run, and replay()
runs it again. Every check follows PyTorch's documented usage: the captured
code runs once before capture (warm-up, as PyTorch recommends for CUDA
graphs: one-time work such as loading a kernel cannot be captured), capture
happens under a stream of the check's own (the default stream cannot
capture on CUDA), and results are compared with the CPU's on the same
inputs.
"""

from __future__ import annotations

import pytest
import torch

from ._async import SCALES, Load, hold, new_stream, unobserved, waited
from ._helpers import Violation, check, must, scope

contract = pytest.mark.contract

# float32 results of the captured work are compared at float32's precision.
RTOL, ATOL = 1.3e-6, 1e-5


def _graph(**kwargs) -> torch.accelerator.Graph:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return must(lambda: torch.accelerator.Graph(**kwargs), f"torch.accelerator.Graph({args})")


def _close(device_tensor: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.allclose(device_tensor.cpu(), expected, rtol=RTOL, atol=ATOL)


def _work(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, acc: torch.Tensor) -> None:
    """Dependent operators, out of place (an intermediate the graph's memory
    must keep) and in place: out = sin(2a + b), acc += out."""
    t = a * 2
    t.add_(b)
    out.copy_(t.sin())
    acc.add_(out)


def _inputs(device, salt: float) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.linspace(-2, 2, 256) + salt
    return a, a.cos()


@contract("ST-GRAPH-001")
def test_capture_records_and_replay_runs_the_work(dt, backend):
    device = torch.device(dt, 0)
    s = new_stream(dt, 0)
    a_cpu, b_cpu = _inputs(device, 0.0)
    a, b = a_cpu.to(device), b_cpu.to(device)
    out, acc = torch.zeros(256, device=device), torch.zeros(256, device=device)
    with s:
        _work(a, b, out, acc)  # warm-up
        out.zero_()
        acc.zero_()
    torch.accelerator.synchronize(0)
    g = _graph()
    with scope("ST-GRAPH-001.1"):
        check("ST-GRAPH-001.1", s.is_capturing() is False,
              f"Stream.is_capturing() is {s.is_capturing()!r} on a stream that is not capturing")
        with s:
            with g:
                capturing = s.is_capturing()
                _work(a, b, out, acc)
        after = s.is_capturing()
        torch.accelerator.synchronize(0)
    check("ST-GRAPH-001.1", capturing is True,
          f"Stream.is_capturing() is {capturing!r} inside torch.accelerator.Graph's capture on that stream")
    check("ST-GRAPH-001.1", after is False, f"Stream.is_capturing() is still {after!r} after the capture ended")
    check("ST-GRAPH-001.1", _close(out, torch.zeros(256)) and _close(acc, torch.zeros(256)),
          "the captured operators ran during the capture: their results changed before any replay (capture records "
          "work; only replay() runs it)")
    expected_acc = torch.zeros(256)
    for replay, salt in enumerate((0.0, 0.0, 0.5, -1.25)):
        # New input values between replays: each replay reads the captured
        # tensors' current values.
        a_cpu, b_cpu = _inputs(device, salt)
        with scope("ST-GRAPH-001.2"):
            a.copy_(a_cpu)
            b.copy_(b_cpu)
            g.replay()
            torch.accelerator.synchronize(0)
        expected_out = (a_cpu * 2 + b_cpu).sin()
        expected_acc += expected_out
        check("ST-GRAPH-001.2", _close(out, expected_out),
              lambda: f"after replay {replay + 1}, the captured out = sin(2a + b) differs from the CPU's on the inputs "
                      f"of that replay (largest difference {(out.cpu() - expected_out).abs().max().item():.3g})")
        check("ST-GRAPH-001.2", _close(acc, expected_acc),
              lambda: f"after replay {replay + 1}, the captured acc += out is not the CPU's sum over {replay + 1} "
                      f"replays (largest difference {(acc.cpu() - expected_acc).abs().max().item():.3g}): a replay "
                      "must run each captured operator once, in capture order")


@contract("ST-GRAPH-001")
@pytest.mark.exclusive
def test_replay_runs_after_the_current_streams_earlier_work(dt, backend):
    load = Load(dt, 0)
    capture_stream = new_stream(dt, 0)
    current = new_stream(dt, 0)
    produced, consumed = load.target(), load.target()
    with capture_stream:
        consumed.copy_(produced)  # warm-up
    torch.accelerator.synchronize(0)
    g = _graph()
    with scope("ST-GRAPH-001.3"):
        with capture_stream, g:
            consumed.copy_(produced)
    for scale in SCALES:
        produced.zero_()
        consumed.zero_()
        torch.accelerator.synchronize(0)
        with hold(backend, current, load, scale) as held:
            with current:
                load.write(produced)
                with scope("ST-GRAPH-001.3"):
                    g.replay()
            conclusive = held.pending()
            if conclusive:
                # A replay queued on the capture's stream without ordering
                # after the current stream runs now, while the write is held
                # (not later, when a busy host schedules that stream after
                # the release). One ordered after the held write keeps the
                # capture's stream waiting: waited() releases the hold then.
                waited(lambda: must(capture_stream.synchronize, "Stream.synchronize() of the capture's stream"),
                       held)
        torch.accelerator.synchronize(0)
        if conclusive:
            check("ST-GRAPH-001.3", load.is_final(consumed),
                  "replay() under another stream than the capture's read the captured input before the work queued "
                  "earlier on the current stream had written it: a replay must be ordered on the current stream, "
                  "after its earlier work")
            return
    unobserved(backend, "ST-GRAPH-001.3", "a replay queued behind earlier work on the current stream")


@contract("ST-GRAPH-001")
def test_the_graphs_memory_is_not_handed_out_while_it_lives(dt, backend):
    device = torch.device(dt, 0)
    s = new_stream(dt, 0)
    n = 4096
    a_cpu = torch.linspace(0, 1, n)
    a = a_cpu.to(device)
    out = torch.zeros(n, device=device)

    def work():
        t = a * 2  # an intermediate: freed after the capture, but the replays write it
        u = t + 1
        out.copy_(u)

    with s:
        work()  # warm-up
    torch.accelerator.synchronize(0)
    g = _graph()
    with scope("ST-GRAPH-001.4"):
        with s, g:
            work()
    fresh = []
    with s:  # the capture's stream: the first place a caching allocator would look
        fresh += [torch.full((n,), 7.0, device=device) for _ in range(4)]
    with scope("ST-GRAPH-001.4"):
        torch.accelerator.empty_cache()
    with s:
        fresh += [torch.full((n,), 7.0, device=device) for _ in range(4)]
    fresh += [torch.full((n,), 7.0, device=device) for _ in range(4)]
    torch.accelerator.synchronize(0)
    with scope("ST-GRAPH-001.4"):
        with s:
            g.replay()
        torch.accelerator.synchronize(0)
    changed = [i for i, t in enumerate(fresh) if not bool((t.cpu() == 7.0).all())]
    check("ST-GRAPH-001.4", not changed,
          f"a replay wrote tensors allocated after the capture (numbers {changed} of {len(fresh)}, allocated on the "
          "capture's stream, after torch.accelerator.empty_cache() and on the default stream): memory the captured "
          "work uses (its intermediates too) must stay the graph's while the graph lives")
    check("ST-GRAPH-001.4", _close(out, a_cpu * 2 + 1),
          "the replay's result differs from the CPU's: the captured intermediate's memory was changed by work "
          "outside the graph")


@contract("ST-GRAPH-001")
def test_keep_graph_pools_and_reset(dt, backend):
    device = torch.device(dt, 0)
    s = new_stream(dt, 0)
    x_cpu = torch.arange(64, dtype=torch.float32)
    x = x_cpu.to(device)
    y = torch.zeros(64, device=device)
    with s:
        y.copy_(x * 3)  # warm-up
        y.zero_()
    torch.accelerator.synchronize(0)

    def captured(graph):
        with s, graph:
            y.copy_(x * 3)

    def replays_correctly(graph, what, instantiate=False):
        y.zero_()
        torch.accelerator.synchronize(0)
        if instantiate:
            must(graph.instantiate, f"{what}.instantiate()")
        must(graph.replay, f"{what}.replay()")
        torch.accelerator.synchronize(0)
        check("ST-GRAPH-001.5", _close(y, x_cpu * 3), f"{what}.replay() did not compute the captured y = 3x")

    with scope("ST-GRAPH-001.5"):
        kept = _graph(keep_graph=True)
        captured(kept)
        replays_correctly(kept, "Graph(keep_graph=True)")  # instantiated by the first replay
        kept2 = _graph(keep_graph=True)
        captured(kept2)
        replays_correctly(kept2, "Graph(keep_graph=True)", instantiate=True)
        first = _graph()
        captured(first)
        pool = must(first.pool, "Graph.pool()")
        check("ST-GRAPH-001.5", isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(p, int) for p in pool),
              f"Graph.pool() returned {pool!r}; expected a tuple of two ints (a pool token for another graph)")
        shared = _graph(pool=pool)
        captured(shared)
        replays_correctly(shared, "Graph(pool=other.pool())")
        replays_correctly(first, "the first of two graphs sharing a pool")
        must(first.reset, "Graph.reset()")
        captured(first)  # reset() lets the instance capture again
        replays_correctly(first, "a graph captured again after reset()")


@contract("ST-GRAPH-001")
def test_work_that_cannot_be_captured_raises(dt, backend):
    device = torch.device(dt, 0)
    s = new_stream(dt, 0)
    a = torch.linspace(0, 1, 64).to(device)
    with s:
        a.sum().item()  # warm-up
        torch.rand(8, device=device)
    torch.accelerator.synchronize(0)

    def capture(work) -> BaseException | None:
        g = _graph()
        try:
            with s, g:
                work()
        except RuntimeError as e:
            return e
        except BaseException as e:  # noqa: BLE001 - the backend's
            raise Violation(f"capturing it raised {type(e).__name__} (expected RuntimeError): {e}") from e
        return g

    with scope("ST-GRAPH-001.6"):
        result = capture(lambda: a.sum().item())
    check("ST-GRAPH-001.6", isinstance(result, RuntimeError),
          "Tensor.item() of a result computed during capture returned a value instead of raising RuntimeError (at "
          "the call or at the capture's end): the captured work has not run, so no value can be right")
    drawn = {}

    def draw():
        drawn["r"] = torch.rand(1024, device=device)

    with scope("ST-GRAPH-001.6"):
        result = capture(draw)
    if isinstance(result, BaseException):
        return  # refused: the backend does not capture random operators
    r = drawn["r"]
    with scope("ST-GRAPH-001.6"):
        with s:
            result.replay()
        first = r.cpu()
        with s:
            result.replay()
        second = r.cpu()
    check("ST-GRAPH-001.6", not torch.equal(first, second),
          "torch.rand captured in a graph drew the same numbers on two replays: a captured random operator must "
          "draw new numbers at each replay (or its capture must raise)")
