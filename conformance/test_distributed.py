"""torch.distributed on the device: the c10d backend a vendor registers for
its device type (``torch.distributed.Backend.register_backend(name, creator,
devices=[device type])``).

Every test starts its own ranks (conformance/_distributed.py): two new
interpreters that import torch and the backend, each on device ``rank % n``,
meeting through a file store. The ranks run a scenario (the ``rank_*``
functions below) and record what they observe; the test compares that with
the CPU's results on the same inputs, in the test's own process. Rank
crashes and hangs are bounded by the test's budget and reported with the
rank's output.

Which c10d backend: the one the manifest names (``[backend] process_group``)
or else the one registered for the device type. A backend without one
declares the feature ``distributed`` unclaimed.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ._distributed import Outcome, Raised, run_ranks
from ._helpers import check

contract = pytest.mark.contract
MODULE = "privateuse1_conformance.conformance.test_distributed"
WORLD = 2
SHAPE = (3, 5)
PG_TIMEOUT = 20.0      # the process group's timeout in correctness scenarios (seconds)
ERROR_TIMEOUT = 5.0    # and in the error scenarios: their errors must come within it


# ---------------------------------------------------------------- inputs
# Both sides make the same inputs: the ranks put them on the device, the
# test reduces them on the CPU.

def data(rank: int, key: str, shape, dtype: str = "float32") -> torch.Tensor:
    seed = (hash_key(key) * 131 + rank) % (2 ** 31)
    generator = torch.Generator().manual_seed(seed)
    kind = getattr(torch, dtype)
    if kind == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if kind.is_complex:
        real = torch.randint(-4, 5, shape, generator=generator).float()
        return torch.complex(real, torch.randint(-4, 5, shape, generator=generator).float()).to(kind)
    if kind.is_floating_point:
        # Small integers in floating point: sums and products are exact in
        # every dtype, so only a wrong reduction can differ.
        return torch.randint(-4, 5, shape, generator=generator).to(kind)
    low = 0 if kind == torch.uint8 else -4
    return torch.randint(low, 5, shape, generator=generator).to(kind)


def hash_key(key: str) -> int:
    # Python's hash() of a str differs between interpreters: not usable here.
    value = 0
    for char in key:
        value = (value * 31 + ord(char)) % (2 ** 31)
    return value


def reduce_cpu(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    result = tensors[0].clone()
    for other in tensors[1:]:
        if op in ("SUM", "AVG"):
            result = result + other
        elif op == "PRODUCT":
            result = result * other
        elif op == "MIN":
            result = torch.minimum(result, other)
        elif op == "MAX":
            result = torch.maximum(result, other)
        elif op == "BAND":
            result = result & other
        elif op == "BOR":
            result = result | other
        elif op == "BXOR":
            result = result ^ other
    if op == "AVG":
        result = result / len(tensors)
    return result


REQUIRED_REDUCTIONS = [(op, dtype) for op in ("SUM", "PRODUCT", "MIN", "MAX") for dtype in ("float32", "int64")]
REQUIRED_REDUCTIONS.append(("AVG", "float32"))
OPTIONAL_REDUCTIONS = ([("SUM", dtype) for dtype in ("float16", "bfloat16", "float64", "int8", "uint8", "int32",
                                                       "complex64")]
                       + [("MAX", "bool"), ("MIN", "float16")]
                       + [(op, "int64") for op in ("BAND", "BOR", "BXOR")])
LARGE = (4 << 20,)   # 16 MiB of float32


def uneven_send(rank: int, peer: int) -> int:
    """Rows rank sends to peer in the uneven all_to_all_single (not symmetric)."""
    return 1 + rank + 2 * peer


# ---------------------------------------------------------- the test side

@pytest.fixture(scope="module")
def process_group(backend, dt) -> str | None:
    """The c10d backend under test: the manifest's, else the one registered
    for the device type (None: there is none)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.fail("this torch build has no torch.distributed: the feature distributed cannot be checked",
                    pytrace=False)
    named = backend.manifest.process_group
    return named.lower() if named else dist.Backend.default_device_backend_map.get(dt)


def unregistered(dt: str, process_group: str | None) -> str | None:
    """Why the process group cannot be used (None: it can)."""
    import torch.distributed as dist

    if process_group is None:
        return (f"no torch.distributed backend is registered for the device type {dt!r} "
                f"(Backend.default_device_backend_map: {dict(dist.Backend.default_device_backend_map)}): register "
                f"one with torch.distributed.Backend.register_backend(name, creator, devices=[{dt!r}]) when the "
                "backend is imported, or declare the feature distributed unclaimed")
    if process_group not in dist.Backend.backend_list:
        return (f"the manifest names the process group {process_group!r}, which is not registered with "
                f"torch.distributed (registered: {dist.Backend.backend_list})")
    return None


def ranks(session, backend, process_group: str | None, scenario: str, clause: str, **kwargs) -> list[Outcome]:
    """Runs `scenario` in the ranks; a process group that cannot be used
    fails `clause`, the first the test decides."""
    problem = unregistered(backend.device_type, process_group)
    check(clause, problem is None, lambda: problem)
    # Within the harness's own limit for a test, so that a hang is reported
    # here, with each rank's state, rather than as a bare timeout.
    budget = max(20.0, session.timeout - 8.0)
    return run_ranks(backend, process_group, scenario, module=MODULE, world=WORLD, budget=budget, **kwargs)


def seen(outcomes: list[Outcome], rank: int, name: str, clause: str, what: str):
    """Rank `rank`'s observation `name`: a failure of `clause` when the rank
    raised there or never got there."""
    outcome = outcomes[rank]
    if name not in outcome.observed:
        check(clause, False, lambda: f"{what}: rank {rank} recorded no result; {outcome.describe()}")
    value = outcome.observed[name]
    check(clause, not isinstance(value, Raised),
          lambda: f"{what} raised on rank {rank}: {value.message}\n{value.traceback}")
    return value


def agrees(clause: str, got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """`got` equals `expected` at the dtype's own precision (exactly for
    integers and bool)."""
    ok = got.dtype == expected.dtype and got.shape == expected.shape
    if ok:
        try:
            torch.testing.assert_close(got, expected, equal_nan=True)
        except AssertionError:
            ok = False
    check(clause, ok, lambda: f"{what}: got {got.dtype} {tuple(got.shape)}\n{got}\nexpected (the CPU's result on the "
                              f"same inputs) {expected.dtype} {tuple(expected.shape)}\n{expected}")


# ---------------------------------------------------------- registration

def same_backend(name, registered: str) -> bool:
    """Whether a group's backend `name` (its getBackendName(), the vendor's
    own spelling) is the backend registered as `registered`:
    register_backend keeps names in lower case, whatever their case."""
    return isinstance(name, str) and name.lower() == registered.lower()


def rank_lifecycle(r):
    import torch.distributed as dist

    def device_backend():
        group_backend = dist.group.WORLD._get_backend(r.device)
        return group_backend.name() if hasattr(group_backend, "name") else type(group_backend).__name__

    def summed(group=None):
        t = torch.full(SHAPE, float(r.rank + 1), device=r.device)
        dist.all_reduce(t, group=group)
        return t.cpu()

    r.step("init/mapping", r.init)
    r.step("get_backend", dist.get_backend)
    r.step("device_backend/mapping", device_backend)
    r.step("all_reduce/mapping", summed)
    solo = r.step("new_group/solo", lambda: dist.new_group([0]))
    everyone = r.step("new_group/all", lambda: dist.new_group(list(range(r.world))))
    if r.rank == 0 and solo is not None:
        r.step("all_reduce/solo", lambda: summed(solo))
    if everyone is not None:
        r.step("all_reduce/all", lambda: summed(everyone))
    r.step("destroy", dist.destroy_process_group)
    r.record("initialized_after_destroy", dist.is_initialized())
    r.step("init/default", lambda: r.init(backend=None))
    r.step("device_backend/default", device_backend)
    r.step("all_reduce/default", summed)
    r.step("destroy/default", dist.destroy_process_group)


# decides DD-REG-001.1, DD-REG-001.2, DD-REG-001.3, DD-REG-001.4, DD-REG-001.5
@contract("DD-REG-001")
def test_the_process_group_is_registered_selected_and_destroyed(session, backend, dt, process_group):
    import torch.distributed as dist

    problem = unregistered(dt, process_group)
    check("DD-REG-001.1", problem is None, lambda: problem)
    check("DD-REG-001.1", dist.Backend.default_device_backend_map.get(dt) == process_group,
          lambda: f"torch.distributed.Backend.default_device_backend_map maps {dt!r} to "
                  f"{dist.Backend.default_device_backend_map.get(dt)!r}, not to the backend's process group "
                  f"{process_group!r}: register it with register_backend(..., devices=[{dt!r}])")
    outcomes = ranks(session, backend, process_group, "rank_lifecycle", "DD-REG-001.2")
    mapping = f"cpu:gloo,{dt}:{process_group}"
    expected = torch.full(SHAPE, float(sum(range(1, WORLD + 1))))
    for rank in range(WORLD):
        seen(outcomes, rank, "init/mapping", "DD-REG-001.2", f"init_process_group(backend={mapping!r})")
        got = seen(outcomes, rank, "get_backend", "DD-REG-001.2", "get_backend()")
        check("DD-REG-001.2", got == mapping, f"get_backend() on rank {rank} returned {got!r}, not {mapping!r}")
        name = seen(outcomes, rank, "device_backend/mapping", "DD-REG-001.2", f"the group's backend for {dt}")
        check("DD-REG-001.2", same_backend(name, process_group),
              f"the group's backend for {dt} tensors on rank {rank} is {name!r}, not {process_group!r}")
        agrees("DD-REG-001.2", seen(outcomes, rank, "all_reduce/mapping", "DD-REG-001.2", "all_reduce"), expected,
               f"all_reduce (SUM) on rank {rank} in the group made with the mapping")
        seen(outcomes, rank, "new_group/all", "DD-REG-001.4", "new_group(every rank)")
        agrees("DD-REG-001.4", seen(outcomes, rank, "all_reduce/all", "DD-REG-001.4", "all_reduce in a subgroup"),
               expected, f"all_reduce (SUM) on rank {rank} in a subgroup of every rank")
        seen(outcomes, rank, "destroy", "DD-REG-001.5", "destroy_process_group()")
        check("DD-REG-001.5", outcomes[rank].observed.get("initialized_after_destroy") is False,
              f"torch.distributed.is_initialized() is still True on rank {rank} after destroy_process_group()")
        seen(outcomes, rank, "init/default", "DD-REG-001.5",
             "init_process_group() (without a backend) after destroy_process_group()")
        seen(outcomes, rank, "all_reduce/default", "DD-REG-001.5",
             "all_reduce in the group initialized after destroy_process_group()")
        name = seen(outcomes, rank, "device_backend/default", "DD-REG-001.3",
                    f"the default group's backend for {dt}")
        check("DD-REG-001.3", same_backend(name, process_group),
              f"init_process_group() without a backend gave {dt} tensors the backend {name!r} on rank {rank}, not "
              f"{process_group!r}")
        agrees("DD-REG-001.3", seen(outcomes, rank, "all_reduce/default", "DD-REG-001.3", "all_reduce"), expected,
               f"all_reduce (SUM) on rank {rank} in a group made without naming a backend (after destroying the "
               "first)")
    seen(outcomes, 0, "new_group/solo", "DD-REG-001.4", "new_group([0])")
    agrees("DD-REG-001.4", seen(outcomes, 0, "all_reduce/solo", "DD-REG-001.4", "all_reduce in a group of rank 0"),
           torch.full(SHAPE, 1.0), "all_reduce (SUM) in a group of rank 0 alone must leave rank 0's tensor as it was")


# ------------------------------------------------------------- all_reduce

def rank_all_reduce(r):
    import torch.distributed as dist

    def reduced(op, tensor):
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.cpu()

    r.init(timeout=PG_TIMEOUT)
    for op, dtype in REQUIRED_REDUCTIONS:
        tensor = data(r.rank, f"{op}/{dtype}", SHAPE, dtype).to(r.device)
        r.step(f"{op}/{dtype}", lambda op=op, tensor=tensor: reduced(op, tensor))
    large = data(r.rank, "large", LARGE).to(r.device)
    r.step("large", lambda: reduced("SUM", large))
    # Cases a backend may refuse: each refusal gets a fresh group, so that a
    # backend that fails its group on an error is not charged twice.
    base = data(r.rank, "non-contiguous", (6, 4)).to(r.device)
    cases = [(op, dtype, data(r.rank, f"{op}/{dtype}", SHAPE, dtype).to(r.device))
             for op, dtype in OPTIONAL_REDUCTIONS] + [("SUM", "non-contiguous", base.t())]
    for op, dtype, tensor in cases:
        if r.step(f"{op}/{dtype}", lambda op=op, tensor=tensor: reduced(op, tensor)) is None:
            r.step(f"{op}/{dtype}/reinit", lambda: (dist.destroy_process_group(), r.init(timeout=PG_TIMEOUT)))
    dist.destroy_process_group()


# decides DD-COLL-001.1, DD-COLL-001.2, DD-COLL-001.3
@contract("DD-COLL-001")
def test_all_reduce_gives_the_cpu_reduction(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_all_reduce", "DD-COLL-001.1")
    for op, dtype in REQUIRED_REDUCTIONS:
        expected = reduce_cpu(op, [data(rank, f"{op}/{dtype}", SHAPE, dtype) for rank in range(WORLD)])
        for rank in range(WORLD):
            got = seen(outcomes, rank, f"{op}/{dtype}", "DD-COLL-001.1", f"all_reduce({op}) of {dtype}")
            agrees("DD-COLL-001.1", got, expected, f"all_reduce({op}) of {dtype} on rank {rank}")
    expected = reduce_cpu("SUM", [data(rank, "large", LARGE) for rank in range(WORLD)])
    for rank in range(WORLD):
        got = seen(outcomes, rank, "large", "DD-COLL-001.3", "all_reduce(SUM) of 16 MiB of float32")
        agrees("DD-COLL-001.3", got, expected, f"all_reduce(SUM) of 16 MiB of float32 on rank {rank}")
    for op, dtype in OPTIONAL_REDUCTIONS + [("SUM", "non-contiguous")]:
        clause = "DD-COLL-001.3" if dtype == "non-contiguous" else "DD-COLL-001.2"
        if dtype == "non-contiguous":
            expected = reduce_cpu(op, [data(rank, "non-contiguous", (6, 4)).t() for rank in range(WORLD)])
        else:
            expected = reduce_cpu(op, [data(rank, f"{op}/{dtype}", SHAPE, dtype) for rank in range(WORLD)])
        for rank in range(WORLD):
            got = outcomes[rank].observed.get(f"{op}/{dtype}")
            if isinstance(got, Raised):
                continue  # refused with an error: allowed
            check(clause, got is not None,
                  lambda: f"all_reduce({op}) of {dtype}: rank {rank} recorded no result; {outcomes[rank].describe()}")
            agrees(clause, got, expected, f"all_reduce({op}) of {dtype} on rank {rank}"
                   + (" (a transposed view, reduced in place)" if dtype == "non-contiguous" else ""))


# ----------------------------------------------------- other collectives

def rank_collectives(r):
    import torch.distributed as dist

    device, rank, world = r.device, r.rank, r.world

    def run(call, *results):
        call()
        return [t.cpu() for t in results]

    r.init(timeout=PG_TIMEOUT)
    for root in range(world):
        t = data(rank, f"broadcast/{root}", SHAPE).to(device)
        r.step(f"broadcast/{root}", lambda t=t, root=root: run(lambda: dist.broadcast(t, src=root), t))
        t = data(rank, f"reduce/{root}", SHAPE).to(device)
        r.step(f"reduce/{root}", lambda t=t, root=root: run(lambda: dist.reduce(t, dst=root), t))
    x = data(rank, "all_gather", SHAPE).to(device)
    outs = [torch.empty(SHAPE, device=device) for _ in range(world)]
    r.step("all_gather", lambda: run(lambda: dist.all_gather(outs, x), *outs))
    out = torch.empty((world * SHAPE[0], SHAPE[1]), device=device)
    r.step("all_gather_into_tensor", lambda: run(lambda: dist.all_gather_into_tensor(out, x), out))
    inp = data(rank, "reduce_scatter", (world * 4, 3)).to(device)
    piece = torch.empty((4, 3), device=device)
    r.step("reduce_scatter_tensor", lambda: run(lambda: dist.reduce_scatter_tensor(piece, inp), piece))
    inp = data(rank, "all_to_all", (world * 2, 3)).to(device)
    got = torch.empty_like(inp)
    r.step("all_to_all/equal", lambda: run(lambda: dist.all_to_all_single(got, inp), got))
    send = [uneven_send(rank, peer) for peer in range(world)]
    recv = [uneven_send(peer, rank) for peer in range(world)]
    inp = data(rank, "all_to_all/uneven", (sum(send), 3)).to(device)
    got_uneven = torch.empty((sum(recv), 3), device=device)
    r.step("all_to_all/uneven",
           lambda: run(lambda: dist.all_to_all_single(got_uneven, inp, recv, send), got_uneven))
    for root in range(world):
        x = data(rank, f"gather/{root}", SHAPE).to(device)
        gathered = [torch.empty(SHAPE, device=device) for _ in range(world)] if rank == root else None
        r.step(f"gather/{root}", lambda x=x, gathered=gathered, root=root:
               run(lambda: dist.gather(x, gathered, dst=root), *(gathered or [])))
        pieces = [data(root, f"scatter/{root}/{peer}", SHAPE).to(device) for peer in range(world)] \
            if rank == root else None
        mine = torch.empty(SHAPE, device=device)
        r.step(f"scatter/{root}", lambda pieces=pieces, mine=mine, root=root:
               run(lambda: dist.scatter(mine, pieces, src=root), mine))
    # barrier: the last rank enters late; no rank may leave before it entered.
    if rank == world - 1:
        time.sleep(0.3)
    r.mark(f"barrier.{rank}")
    # On the device (not the group's CPU backend): its barrier is the one checked.
    r.step("barrier", lambda: dist.barrier(device_ids=[device.index]))
    r.record("barrier/everyone_entered", all(r.marked(f"barrier.{peer}") for peer in range(world)))
    # Non-contiguous tensors, last: a backend may refuse them, and each
    # refusal gets a fresh group (as in rank_all_reduce).
    view = data(rank, "non-contiguous/broadcast", (6, 4)).to(device).t()
    strided = data(rank, "non-contiguous/all_gather", (5, 3)).to(device).t()
    gathered = torch.empty((world * 3, 5), device=device)
    cases = [("non-contiguous/broadcast", lambda: run(lambda: dist.broadcast(view, src=0), view)),
             ("non-contiguous/all_gather_into_tensor",
              lambda: run(lambda: dist.all_gather_into_tensor(gathered, strided), gathered))]
    for name, call in cases:
        if r.step(name, call) is None:
            r.step(f"{name}/reinit", lambda: (dist.destroy_process_group(), r.init(timeout=PG_TIMEOUT)))
    dist.destroy_process_group()


# decides DD-COLL-002.1, DD-COLL-002.2, DD-COLL-002.3, DD-COLL-002.4, DD-COLL-002.5, DD-COLL-002.6, DD-COLL-002.7
@contract("DD-COLL-002")
def test_collectives_give_each_rank_the_cpu_result(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_collectives", "DD-COLL-002.1")
    for root in range(WORLD):
        expected = data(root, f"broadcast/{root}", SHAPE)
        for rank in range(WORLD):
            got = seen(outcomes, rank, f"broadcast/{root}", "DD-COLL-002.1", f"broadcast from rank {root}")[0]
            agrees("DD-COLL-002.1", got, expected, f"broadcast from rank {root}, on rank {rank}")
        expected = reduce_cpu("SUM", [data(rank, f"reduce/{root}", SHAPE) for rank in range(WORLD)])
        got = seen(outcomes, root, f"reduce/{root}", "DD-COLL-002.1", f"reduce to rank {root}")[0]
        agrees("DD-COLL-002.1", got, expected, f"reduce (SUM) to rank {root}, on rank {root}")
    blocks = [data(rank, "all_gather", SHAPE) for rank in range(WORLD)]
    for rank in range(WORLD):
        got = seen(outcomes, rank, "all_gather", "DD-COLL-002.2", "all_gather")
        for place in range(WORLD):
            agrees("DD-COLL-002.2", got[place], blocks[place], f"all_gather on rank {rank}, place {place} "
                   f"(rank {place}'s input)")
        got = seen(outcomes, rank, "all_gather_into_tensor", "DD-COLL-002.2", "all_gather_into_tensor")[0]
        agrees("DD-COLL-002.2", got, torch.cat(blocks), f"all_gather_into_tensor on rank {rank}")
    total = reduce_cpu("SUM", [data(rank, "reduce_scatter", (WORLD * 4, 3)) for rank in range(WORLD)])
    for rank in range(WORLD):
        got = seen(outcomes, rank, "reduce_scatter_tensor", "DD-COLL-002.3", "reduce_scatter_tensor")[0]
        agrees("DD-COLL-002.3", got, total[rank * 4:(rank + 1) * 4],
               f"reduce_scatter_tensor (SUM) on rank {rank} (block {rank} of the sum)")
    inputs = [data(rank, "all_to_all", (WORLD * 2, 3)) for rank in range(WORLD)]
    uneven = [data(rank, "all_to_all/uneven", (sum(uneven_send(rank, p) for p in range(WORLD)), 3))
              for rank in range(WORLD)]
    for rank in range(WORLD):
        got = seen(outcomes, rank, "all_to_all/equal", "DD-COLL-002.4", "all_to_all_single (equal splits)")[0]
        agrees("DD-COLL-002.4", got, torch.cat([inputs[peer][rank * 2:(rank + 1) * 2] for peer in range(WORLD)]),
               f"all_to_all_single with equal splits on rank {rank}")
        parts = []
        for peer in range(WORLD):
            start = sum(uneven_send(peer, p) for p in range(rank))
            parts.append(uneven[peer][start:start + uneven_send(peer, rank)])
        got = seen(outcomes, rank, "all_to_all/uneven", "DD-COLL-002.4", "all_to_all_single (uneven splits)")[0]
        agrees("DD-COLL-002.4", got, torch.cat(parts), f"all_to_all_single with uneven splits on rank {rank}")
    for root in range(WORLD):
        got = seen(outcomes, root, f"gather/{root}", "DD-COLL-002.5", f"gather to rank {root}")
        for place in range(WORLD):
            agrees("DD-COLL-002.5", got[place], data(place, f"gather/{root}", SHAPE),
                   f"gather to rank {root}, place {place} (rank {place}'s input)")
        for rank in range(WORLD):
            got = seen(outcomes, rank, f"scatter/{root}", "DD-COLL-002.5", f"scatter from rank {root}")[0]
            agrees("DD-COLL-002.5", got, data(root, f"scatter/{root}/{rank}", SHAPE),
                   f"scatter from rank {root}, on rank {rank} (the root's piece {rank})")
    for rank in range(WORLD):
        seen(outcomes, rank, "barrier", "DD-COLL-002.6", "barrier()")
        check("DD-COLL-002.6", outcomes[rank].observed.get("barrier/everyone_entered") is True,
              f"rank {rank} returned from barrier() before every rank had entered it (rank {WORLD - 1} entered "
              "last, 0.3 s late)")
    strided = [data(rank, "non-contiguous/all_gather", (5, 3)).t() for rank in range(WORLD)]
    for name, expected, how in (
            ("non-contiguous/broadcast", data(0, "non-contiguous/broadcast", (6, 4)).t(),
             "broadcast from rank 0 into a transposed (non-contiguous) view"),
            ("non-contiguous/all_gather_into_tensor", torch.cat(strided),
             "all_gather_into_tensor of a transposed (non-contiguous) input")):
        for rank in range(WORLD):
            got = outcomes[rank].observed.get(name)
            if isinstance(got, Raised):
                continue  # refused with an error: allowed
            check("DD-COLL-002.7", got is not None,
                  lambda: f"{how}: rank {rank} recorded no result; {outcomes[rank].describe()}")
            agrees("DD-COLL-002.7", got[0], expected, f"{how}, on rank {rank}")


# ---------------------------------------------------------------- send/recv

def rank_point_to_point(r):
    import torch.distributed as dist

    device, rank = r.device, r.rank
    peer = 1 - rank
    r.init(timeout=PG_TIMEOUT)
    if rank == 0:
        first = data(0, "send/1", (7,)).to(device)
        second = data(0, "send/2", (3,), "int64").to(device)
        r.step("send", lambda: (dist.send(first, 1), dist.send(second, 1)))
    else:
        first = torch.empty(7, device=device)
        second = torch.empty(3, dtype=torch.int64, device=device)
        r.step("recv", lambda: (dist.recv(first, 0), dist.recv(second, 0), [first.cpu(), second.cpu()])[-1])
    # rank 1 sends only once rank 0 has queued a reader after irecv's wait()
    # (or after a while, for a backend whose irecv waits for the message).
    if rank == 1:
        message = data(1, "isend", SHAPE).to(device)
        deadline = time.monotonic() + 3.0
        while not r.marked("irecv.queued") and time.monotonic() < deadline:
            time.sleep(0.01)
        r.step("isend", lambda: dist.isend(message, 0).wait())
    else:
        into = torch.empty(SHAPE, device=device)

        def receive():
            dist.irecv(into, 1).wait()
            copy = into.clone()
            r.mark("irecv.queued")
            return copy.cpu()

        r.step("irecv", receive)
    # Both ranks send first and receive second, 4 MiB each way: a backend
    # must not make either wait for the other's receive.
    outgoing = data(rank, "batch", (1 << 20,)).to(device)
    incoming = torch.empty(1 << 20, device=device)

    def exchange():
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, peer),
                                           dist.P2POp(dist.irecv, incoming, peer)])
        for request in requests:
            request.wait()
        return incoming.cpu()

    r.step("batch", exchange)
    dist.destroy_process_group()


# decides DD-P2P-001.1, DD-P2P-001.2, DD-P2P-001.3
@contract("DD-P2P-001")
def test_messages_reach_the_named_peer(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_point_to_point", "DD-P2P-001.1")
    seen(outcomes, 0, "send", "DD-P2P-001.1", "send")
    first, second = seen(outcomes, 1, "recv", "DD-P2P-001.1", "recv")
    agrees("DD-P2P-001.1", first, data(0, "send/1", (7,)), "the first message rank 1 received from rank 0")
    agrees("DD-P2P-001.1", second, data(0, "send/2", (3,), "int64"),
           "the second message (int64) rank 1 received from rank 0")
    seen(outcomes, 1, "isend", "DD-P2P-001.2", "isend(...).wait()")
    agrees("DD-P2P-001.2", seen(outcomes, 0, "irecv", "DD-P2P-001.2", "irecv(...).wait()"), data(1, "isend", SHAPE),
           "a clone queued on the current stream right after irecv(...).wait() on rank 0 (rank 1 sent only after "
           "it was queued)")
    for rank in range(WORLD):
        got = seen(outcomes, rank, "batch", "DD-P2P-001.3", "batch_isend_irecv exchanging 4 MiB each way")
        agrees("DD-P2P-001.3", got, data(1 - rank, "batch", (1 << 20,)),
               f"what rank {rank} received in batch_isend_irecv")


# ------------------------------------------------------------ stream order

HELD_SECONDS = 0.3


def produced_then_reduced(r, device, key: str):
    """Observation `key`: all_reduce(async_op=True) of a tensor on `device`
    whose producer, a device-to-device copy of rank + 1 (queued without
    waiting for its stream wherever copies are asynchronous), is held behind
    the instrumentation's gate on that device's current stream, or without a
    gate comes after a long chain of such copies. Records the sum and whether
    the producer was still queued when the collective was called (always,
    behind the gate): only then does a right sum show that the collective
    waited for it. `device` need not be the current device."""
    import torch.distributed as dist

    block = r.instrument("block_stream")
    t = torch.zeros(SHAPE, device=device)
    source = torch.full(SHAPE, float(r.rank + 1), device=device)
    torch.accelerator.synchronize(device)
    stream = torch.accelerator.current_stream(device)

    def reduced():
        work = dist.all_reduce(t, async_op=True)
        in_flight = not stream.query()
        work.wait()
        return t.cpu(), in_flight

    def held():
        release = block(stream)
        # Released from another thread: a backend whose copies or collectives
        # wait on the host for their stream must not wait for this thread.
        timer = threading.Timer(HELD_SECONDS, release)
        timer.start()
        try:
            t.copy_(source)
            return reduced()
        finally:
            timer.join()

    def long_producer():
        a = torch.zeros(1 << 20, device=device)
        b = torch.ones(1 << 20, device=device)
        torch.accelerator.synchronize(device)
        for _ in range(40):
            a.copy_(b)
            b.copy_(a)
        t.copy_(source)
        return reduced()

    r.record(f"{key}/gate", block is not None)
    r.step(key, held if block is not None else long_producer)


def read_after(r, x, key: str, variant: str) -> None:
    """Observation `key`: all_reduce of `x`, then on rank 0 a clone queued on
    the current stream of x's device right after Work.wait() (variant
    "wait") or the synchronous call ("sync"). The last rank joins only once
    rank 0 has queued its clone (or after a while, for backends whose calls
    block the host until every rank has joined): a clone not ordered after
    the collective runs before the data can be there."""
    import torch.distributed as dist

    mark = "queued." + key.replace("/", ".")
    if r.rank == 0:
        def reader():
            if variant == "wait":
                dist.all_reduce(x, async_op=True).wait()
            else:
                dist.all_reduce(x)
            y = x.clone()
            r.mark(mark)
            return y.cpu()
        r.step(key, reader)
    else:
        deadline = time.monotonic() + 3.0
        while not r.marked(mark) and time.monotonic() < deadline:
            time.sleep(0.01)
        r.step(key, lambda: (dist.all_reduce(x), x.cpu())[1])


def rank_stream_order(r):
    import torch.distributed as dist

    device, rank = r.device, r.rank
    r.init(timeout=PG_TIMEOUT)
    # 1. The input's producer is held on the current stream.
    produced_then_reduced(r, device, "held")
    # 2. Work queued on the current stream after wait() (or after a
    # synchronous call) sees the result. The last rank joins only once rank 0
    # has queued its reader (or after a while, for backends whose calls block
    # the host until every rank has joined): a reader not ordered after the
    # collective runs before the data can be there.
    for variant in ("wait", "sync"):
        read_after(r, data(rank, f"order/{variant}", SHAPE).to(device), f"order/{variant}", variant)
    # 3. Memory an in-flight collective reads is not reused: rank 0 drops
    # its input as soon as all_gather_into_tensor(async_op=True) returns,
    # fills the next allocation of the input's size, and the last rank joins
    # only after that fill has run (or after a while, as above).
    held_inputs = [data(rank, "freed", SHAPE).to(device)]
    gathered = torch.zeros((r.world * SHAPE[0], SHAPE[1]), device=device)
    torch.accelerator.synchronize()
    if rank == 0:
        def freed():
            work = dist.all_gather_into_tensor(gathered, held_inputs.pop(), async_op=True)
            # The input's last reference is gone: a caching allocator may hand
            # out its memory again only once the collective no longer uses it.
            reused = torch.empty(SHAPE, device=device)
            reused.fill_(-99.0)
            torch.accelerator.current_stream().synchronize()
            r.mark("freed.filled")
            work.wait()
            return gathered.cpu()
        r.step("freed", freed)
    else:
        deadline = time.monotonic() + 3.0
        while not r.marked("freed.filled") and time.monotonic() < deadline:
            time.sleep(0.01)
        r.step("freed", lambda: (dist.all_gather_into_tensor(gathered, held_inputs[0]), gathered.cpu())[1])
    # 4. The future and is_completed().
    x = data(rank, "future", SHAPE).to(device)

    def future():
        work = dist.all_reduce(x, async_op=True)
        value = work.get_future().wait()
        doubled = work.get_future().then(lambda f: f.value()[0] * 2).wait()
        work.wait()
        torch.accelerator.synchronize()
        return [v.cpu() for v in value], doubled.cpu(), work.is_completed()

    r.step("future", future)
    dist.destroy_process_group()


# decides DD-STREAM-001.1, DD-STREAM-001.2, DD-STREAM-001.3, DD-STREAM-001.4
@contract("DD-STREAM-001")
def test_collectives_are_ordered_with_the_callers_stream(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_stream_order", "DD-STREAM-001.1")
    gated = outcomes[0].observed.get("held/gate", False)
    expected = torch.full(SHAPE, float(sum(range(1, WORLD + 1))))
    for rank in range(WORLD):
        got, in_flight = seen(outcomes, rank, "held", "DD-STREAM-001.1", "all_reduce of a tensor still being produced")
        check("DD-STREAM-001.1", torch.equal(got, expected),
              lambda: f"all_reduce on rank {rank} read its input before the work queued on the caller's current "
                      f"stream had produced it: got\n{got}\nexpected {expected[0, 0].item()} everywhere (each rank "
                      f"copied rank + 1 into its tensor on the current stream, "
                      + ("held behind the instrumentation's gate)" if gated else "after a chain of 80 copies)"),
              observed=bool(gated) or in_flight)
    for variant, how in (("wait", "all_reduce(async_op=True).wait()"), ("sync", "all_reduce(async_op=False)")):
        expected = reduce_cpu("SUM", [data(rank, f"order/{variant}", SHAPE) for rank in range(WORLD)])
        for rank in range(WORLD):
            got = seen(outcomes, rank, f"order/{variant}", "DD-STREAM-001.2", how)
            agrees("DD-STREAM-001.2", got, expected,
                   f"a clone queued on the current stream right after {how} on rank {rank} (rank {WORLD - 1} joined "
                   "the collective only after rank 0 had queued it)")
    expected = torch.cat([data(rank, "freed", SHAPE) for rank in range(WORLD)])
    for rank in range(WORLD):
        got = seen(outcomes, rank, "freed", "DD-STREAM-001.4", "all_gather_into_tensor of an input freed in flight")
        agrees("DD-STREAM-001.4", got, expected,
               f"all_gather_into_tensor on rank {rank}, whose input rank 0 freed as soon as the call returned (async_op"
               "=True) and whose memory's next allocation it then filled with -99 before the last rank joined: the "
               "allocator must not reuse memory that an in-flight collective still reads (record the tensors on the "
               "communication stream, as ProcessGroupNCCL does, or keep them alive until the collective ends)")
    expected = reduce_cpu("SUM", [data(rank, "future", SHAPE) for rank in range(WORLD)])
    for rank in range(WORLD):
        value, doubled, completed = seen(outcomes, rank, "future", "DD-STREAM-001.3", "Work.get_future()")
        check("DD-STREAM-001.3", len(value) == 1,
              f"Work.get_future() of all_reduce on rank {rank} completed with {len(value)} tensors, not the one output")
        agrees("DD-STREAM-001.3", value[0], expected, f"the value of Work.get_future() of all_reduce on rank {rank}")
        agrees("DD-STREAM-001.3", doubled, expected * 2, f"a callback chained with then() on rank {rank}")
        check("DD-STREAM-001.3", completed is True,
              f"Work.is_completed() is {completed!r} on rank {rank} after wait() and synchronizing the device")


# ------------------------------------------------------------ other devices
# A rank's tensors need not be on its current device: ProcessGroupNCCL runs
# a collective on the tensors' device, orders it after that device's current
# stream and makes that device's current stream wait in Work.wait(), under a
# device guard that leaves the current device as it was.

def rank_other_devices(r):
    import torch.distributed as dist

    rank, world = r.rank, r.world
    n = torch.accelerator.device_count()
    r.init(timeout=PG_TIMEOUT)
    r.record("devices", n)
    # Round k puts rank r's tensors on device (r + k) % n, never its current
    # device r % n: the ranks use distinct devices in each round, and over the
    # rounds every rank uses every other device.
    for k in range(1, n):
        device = torch.device(r.dt, (rank + k) % n)
        tag = f"other/{k}"
        x = data(rank, f"{tag}/all_reduce", SHAPE).to(device)
        r.step(f"{tag}/all_reduce", lambda x=x: (dist.all_reduce(x), x.cpu())[1])
        b = data(rank, f"{tag}/broadcast", SHAPE).to(device)
        r.step(f"{tag}/broadcast", lambda b=b, k=k: (dist.broadcast(b, src=k % world), b.cpu())[1])
        g = data(rank, f"{tag}/all_gather", SHAPE).to(device)
        out = torch.empty((world * SHAPE[0], SHAPE[1]), device=device)
        r.step(f"{tag}/all_gather_into_tensor",
               lambda g=g, out=out: (dist.all_gather_into_tensor(out, g), out.cpu())[1])
        if rank == 0:
            message = data(0, f"{tag}/send", (7,)).to(device)
            r.step(f"{tag}/send", lambda message=message: dist.send(message, 1))
        else:
            into = torch.empty(7, device=device)
            r.step(f"{tag}/recv", lambda into=into: (dist.recv(into, 0), into.cpu())[1])
        r.record(f"{tag}/current", torch.accelerator.current_device_index())
    if n > 1:
        # Ordering on the first other device, as DD-STREAM-001 checks it on
        # the current one.
        device = torch.device(r.dt, (rank + 1) % n)
        produced_then_reduced(r, device, "other/held")
        read_after(r, data(rank, "other/wait", SHAPE).to(device), "other/wait", "wait")
        r.record("other/current", torch.accelerator.current_device_index())
    dist.destroy_process_group()


# decides DD-DEV-001.1, DD-DEV-001.2, DD-DEV-001.3, DD-DEV-001.4
@contract("DD-DEV-001")
@pytest.mark.requires("multi-device")
def test_collectives_run_on_the_tensors_device(session, backend, process_group, n, two_devices):
    outcomes = ranks(session, backend, process_group, "rank_other_devices", "DD-DEV-001.1")
    for rank in range(WORLD):
        devices = seen(outcomes, rank, "devices", "DD-DEV-001.1", "torch.accelerator.device_count()")
        check("DD-DEV-001.1", devices == n,
              f"rank {rank} counts {devices} devices, the test's process {n}: the ranks must see every device")
    for k in range(1, n):
        tag = f"other/{k}"
        where = {rank: f"on rank {rank}, tensors on {backend.device_type}:{(rank + k) % n}, current device " \
                       f"{rank % n}" for rank in range(WORLD)}
        total = reduce_cpu("SUM", [data(rank, f"{tag}/all_reduce", SHAPE) for rank in range(WORLD)])
        blocks = torch.cat([data(rank, f"{tag}/all_gather", SHAPE) for rank in range(WORLD)])
        for rank in range(WORLD):
            agrees("DD-DEV-001.1", seen(outcomes, rank, f"{tag}/all_reduce", "DD-DEV-001.1", "all_reduce"), total,
                   f"all_reduce (SUM) {where[rank]}")
            agrees("DD-DEV-001.1", seen(outcomes, rank, f"{tag}/broadcast", "DD-DEV-001.1", "broadcast"),
                   data(k % WORLD, f"{tag}/broadcast", SHAPE), f"broadcast from rank {k % WORLD} {where[rank]}")
            agrees("DD-DEV-001.1", seen(outcomes, rank, f"{tag}/all_gather_into_tensor", "DD-DEV-001.1",
                                        "all_gather_into_tensor"), blocks,
                   f"all_gather_into_tensor {where[rank]}")
        seen(outcomes, 0, f"{tag}/send", "DD-DEV-001.1", "send")
        agrees("DD-DEV-001.1", seen(outcomes, 1, f"{tag}/recv", "DD-DEV-001.1", "recv"),
               data(0, f"{tag}/send", (7,)), f"the message rank 1 received from rank 0 {where[1]} (sent {where[0]})")
    expected = torch.full(SHAPE, float(sum(range(1, WORLD + 1))))
    gated = outcomes[0].observed.get("other/held/gate", False)
    for rank in range(WORLD):
        device = f"{backend.device_type}:{(rank + 1) % n}"
        got, in_flight = seen(outcomes, rank, "other/held", "DD-DEV-001.2",
                              f"all_reduce of a tensor on {device} still being produced")
        check("DD-DEV-001.2", torch.equal(got, expected),
              lambda: f"all_reduce on rank {rank} of a tensor on {device} (current device {rank % n}) read its "
                      f"input before the work queued on {device}'s current stream had produced it: got\n{got}\n"
                      f"expected {expected[0, 0].item()} everywhere. A collective must wait for the current stream "
                      "of its tensors' device, not the current device's",
              observed=bool(gated) or in_flight)
    total = reduce_cpu("SUM", [data(rank, "other/wait", SHAPE) for rank in range(WORLD)])
    got = seen(outcomes, 0, "other/wait", "DD-DEV-001.3", "all_reduce(async_op=True).wait()")
    agrees("DD-DEV-001.3", got, total,
           f"a clone queued on the current stream of {backend.device_type}:{1 % n} right after "
           f"all_reduce(async_op=True).wait() of a tensor there on rank 0 (current device 0; rank {WORLD - 1} "
           "joined the collective only after rank 0 had queued it): Work.wait() must make the current stream of "
           "the tensors' device wait, not the current device's")
    for rank in range(1, WORLD):
        got = seen(outcomes, rank, "other/wait", "DD-DEV-001.3", "all_reduce(async_op=False)")
        agrees("DD-DEV-001.3", got, total,
               f"the tensor on {backend.device_type}:{(rank + 1) % n} that a synchronous all_reduce on rank {rank} "
               f"(current device {rank % n}) reduced, read back: a synchronous collective must make the current "
               "stream of the tensors' device wait for its result, not the current device's")
    for rank in range(WORLD):
        for name in [f"other/{k}/current" for k in range(1, n)] + ["other/current"]:
            current = seen(outcomes, rank, name, "DD-DEV-001.4", "torch.accelerator.current_device_index()")
            check("DD-DEV-001.4", current == rank % n,
                  f"rank {rank}'s current device is {current} after collectives on another device "
                  f"({'round ' + name.split('/')[1] if name != 'other/current' else 'the ordering checks'}), "
                  f"not its own {rank % n}: a collective must restore the current device (a device guard)")


# ------------------------------------------------------------------ errors

def rank_mismatch(r):
    import torch.distributed as dist

    r.init(timeout=ERROR_TIMEOUT)
    t = torch.ones(4 * (r.rank + 1), device=r.device)
    r.step("mismatch", lambda: (dist.all_reduce(t), t.cpu())[1])


def rank_bad_arguments(r):
    import torch.distributed as dist

    r.init(timeout=ERROR_TIMEOUT)
    # A root and a peer outside the group: refused on each rank by itself,
    # after which the group still works.
    t = torch.zeros(SHAPE, device=r.device)
    r.step("bad_root", lambda: (dist.broadcast(t, src=r.world), t.cpu())[1])
    r.step("bad_peer", lambda: (dist.send(t, dst=r.world), "sent")[1])
    x = torch.full(SHAPE, float(r.rank + 1), device=r.device)
    r.step("after_bad", lambda: (dist.all_reduce(x), x.cpu())[1])
    # Last, since it may end the group: the same element count in dtypes of
    # different sizes (a backend that compares sizes in bytes sees it too).
    y = torch.ones(4, dtype=torch.float32 if r.rank == 0 else torch.float64, device=r.device)
    r.step("dtype_mismatch", lambda: (dist.all_reduce(y), y.cpu())[1])


def rank_dead_peer(r):
    import os

    import torch.distributed as dist

    r.init(timeout=ERROR_TIMEOUT)
    r.step("barrier", dist.barrier)
    if r.rank == 1:
        os._exit(3)
    t = torch.ones(SHAPE, device=r.device)
    started = time.monotonic()
    r.step("dead_peer", lambda: (dist.all_reduce(t), t.cpu())[1])
    r.record("dead_peer/seconds", time.monotonic() - started)


def rank_never_joins(r):
    if r.rank == 1:
        return
    started = time.monotonic()
    # The device's backend alone: its own rendezvous is what must give up.
    r.step("init", lambda: r.init(backend=f"{r.dt}:{r.process_group}", timeout=ERROR_TIMEOUT))
    r.record("init/seconds", time.monotonic() - started)


def ended_with_error(outcome: Outcome, step: str) -> str | None:
    """How a rank ended a step that must fail: None when it raised there or
    the rank ended abnormally (an error, not a hang); else what happened."""
    value = outcome.observed.get(step)
    if isinstance(value, Raised):
        return None
    if value is not None:
        return f"it completed without an error and returned\n{value}"
    if outcome.exit is not None and outcome.exit.startswith("killed"):
        return f"it never returned ({outcome.exit})"
    if outcome.exit is not None:
        return None  # the rank ended with the error (an abort, as some backends do)
    return f"it recorded nothing ({outcome.describe()})"


# decides DD-ERR-001.1
@contract("DD-ERR-001")
def test_mismatched_collectives_fail(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_mismatch", "DD-ERR-001.1")
    for rank in range(WORLD):
        wrong = ended_with_error(outcomes[rank], "mismatch")
        check("DD-ERR-001.1", wrong is None,
              lambda: f"rank 0 called all_reduce on 4 elements and rank 1 on 8, in a group with a {ERROR_TIMEOUT:g} s "
                      f"timeout; on rank {rank} {wrong}. A mismatch must end in an error on every rank (at the call, "
                      "at wait() or when the output is read), never in a result or a hang")


# decides DD-ERR-001.4, DD-ERR-001.5
@contract("DD-ERR-001")
def test_bad_ranks_and_dtypes_fail(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_bad_arguments", "DD-ERR-001.5")
    expected = torch.full(SHAPE, float(sum(range(1, WORLD + 1))))
    for rank in range(WORLD):
        for step, how in (("bad_root", f"broadcast(tensor, src={WORLD})"), ("bad_peer", f"send(tensor, dst={WORLD})")):
            value = outcomes[rank].observed.get(step)
            check("DD-ERR-001.5", isinstance(value, Raised),
                  lambda: f"{how} in a group of {WORLD} ranks did not raise on rank {rank}: "
                          + (f"it returned\n{value}" if value is not None else outcomes[rank].describe())
                          + f". A rank outside [0, {WORLD}) must be refused with an error on the calling rank (at the "
                            "call or at wait()), leaving the group usable")
        got = seen(outcomes, rank, "after_bad", "DD-ERR-001.5",
                   f"all_reduce after broadcast(src={WORLD}) and send(dst={WORLD}) were refused")
        agrees("DD-ERR-001.5", got, expected,
               f"all_reduce on rank {rank} after broadcast(src={WORLD}) and send(dst={WORLD}) were refused (a "
               "refused call must leave the group as it was)")
    for rank in range(WORLD):
        wrong = ended_with_error(outcomes[rank], "dtype_mismatch")
        check("DD-ERR-001.4", wrong is None,
              lambda: f"rank 0 called all_reduce on 4 float32 elements and rank 1 on 4 float64, in a group with a "
                      f"{ERROR_TIMEOUT:g} s timeout; on rank {rank} {wrong}. A dtype mismatch must end in an error on "
                      "every rank (at the call, at wait() or when the output is read), never in a result or a hang")


# decides DD-ERR-001.2
@contract("DD-ERR-001")
def test_a_dead_peer_fails_the_collective(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_dead_peer", "DD-ERR-001.2")
    for rank in range(WORLD):
        seen(outcomes, rank, "barrier", "DD-ERR-001.2", "barrier() before the peer exits")
    wrong = ended_with_error(outcomes[0], "dead_peer")
    check("DD-ERR-001.2", wrong is None,
          lambda: f"rank 1 exited after a barrier; rank 0's all_reduce, in a group with a {ERROR_TIMEOUT:g} s timeout, "
                  f"did not fail: {wrong}")


# decides DD-ERR-001.3
@contract("DD-ERR-001")
def test_a_peer_that_never_joins_fails_the_init(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_never_joins", "DD-ERR-001.3")
    wrong = ended_with_error(outcomes[0], "init")
    check("DD-ERR-001.3", wrong is None,
          lambda: f"rank 1 never called init_process_group; rank 0's init_process_group with a {ERROR_TIMEOUT:g} s "
                  f"timeout did not fail: {wrong}")


# ------------------------------------------------------- object collectives

def rank_objects(r):
    import torch.distributed as dist

    r.init(backend=f"{r.dt}:{r.process_group}", timeout=PG_TIMEOUT)
    objects = [{"from": r.rank, "items": list(range(3 * r.rank))}, f"rank {r.rank}"]
    r.step("broadcast_object_list", lambda: (dist.broadcast_object_list(objects, src=1), objects)[1])
    gathered = [None] * r.world
    payload = {"rank": r.rank, "text": "x" * (100 * (r.rank + 1))}
    r.step("all_gather_object", lambda: (dist.all_gather_object(gathered, payload), gathered)[1])
    dist.destroy_process_group()


# decides DD-OBJ-001.1
@contract("DD-OBJ-001")
def test_object_collectives_travel_on_the_device(session, backend, dt, process_group):
    outcomes = ranks(session, backend, process_group, "rank_objects", "DD-OBJ-001.1")
    for rank in range(WORLD):
        got = seen(outcomes, rank, "broadcast_object_list", "DD-OBJ-001.1", "broadcast_object_list")
        check("DD-OBJ-001.1", got == [{"from": 1, "items": [0, 1, 2]}, "rank 1"],
              f"broadcast_object_list from rank 1 in a group of {dt} only gave rank {rank} {got!r}")
        got = seen(outcomes, rank, "all_gather_object", "DD-OBJ-001.1", "all_gather_object")
        check("DD-OBJ-001.1", got == [{"rank": p, "text": "x" * (100 * (p + 1))} for p in range(WORLD)],
              f"all_gather_object in a group of {dt} only gave rank {rank} {str(got)[:300]}")


# ------------------------------------------------------------------ training

DDP_STEPS = 3


def ddp_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def ddp_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 8, generator=generator), torch.randn(8, 4, generator=generator)


def train(model, optimizer, batches) -> None:
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def rank_batches(r) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's share of each of the DDP_STEPS batches (its rows of
    ddp_batch), on its device."""
    share = 8 // r.world
    rows = slice(r.rank * share, (r.rank + 1) * share)
    return [(x[rows].to(r.device), y[rows].to(r.device)) for x, y in map(ddp_batch, range(DDP_STEPS))]


def matches_one_process(clause: str, outcomes: list[Outcome], step: str, what: str) -> None:
    """Every rank's parameters after `step` (`what` trained DDP_STEPS SGD
    steps on its share of each batch) equal single-process training on the
    whole batches on the CPU."""
    model = ddp_model()
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), list(map(ddp_batch, range(DDP_STEPS))))
    expected = [p.detach() for p in model.parameters()]
    for rank in range(WORLD):
        got = seen(outcomes, rank, step, clause, f"{what} training")
        for k, (g, e) in enumerate(zip(got, expected)):
            check(clause, torch.allclose(g, e, rtol=1e-4, atol=1e-5),
                  lambda: f"after {DDP_STEPS} SGD steps of {what} on rank {rank}, parameter {k} differs from "
                          f"single-process training on whole batches on the CPU by "
                          f"{(g - e).abs().max().item():.3g} (max):\n{g}\nexpected\n{e}")


def rank_ddp(r):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    r.init(timeout=PG_TIMEOUT)

    def run():
        model = DistributedDataParallel(ddp_model().to(r.device), bucket_cap_mb=0.0001)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank_batches(r))
        return [p.detach().cpu() for p in model.module.parameters()]

    r.step("parameters", run)
    dist.destroy_process_group()


# decides DD-DDP-001.1
@contract("DD-DDP-001")
def test_data_parallel_training_matches_one_process(session, backend, process_group):
    outcomes = ranks(session, backend, process_group, "rank_ddp", "DD-DDP-001.1")
    matches_one_process("DD-DDP-001.1", outcomes, "parameters", "DistributedDataParallel")


# ------------------------------------------------- DTensor and FSDP2

def sharded_input(rank: int, key: str) -> torch.Tensor:
    return data(rank, key, (2 * WORLD, 3 * WORLD))


def rank_sharded(r):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    r.init(timeout=PG_TIMEOUT)
    made = {}  # what the steps build (only what they return is recorded)

    def build(name, make):
        made[name] = make()
        return str(made[name]) if name == "mesh" else made[name].to_local().cpu()

    if r.step("mesh", lambda: build("mesh", lambda: init_device_mesh(r.dt, (r.world,)))) is None:
        return
    mesh = made["mesh"]
    local = lambda t: t.to_local().cpu()  # noqa: E731
    full = sharded_input(0, "dtensor").to(r.device)
    if r.step("Shard(0)", lambda: build("rows", lambda: distribute_tensor(full, mesh, [Shard(0)]))) is not None:
        rows = made["rows"]
        r.step("Shard(0)->Replicate", lambda: local(rows.redistribute(mesh, [Replicate()])))
        r.step("Shard(0)->Shard(1)", lambda: local(rows.redistribute(mesh, [Shard(1)])))
    partial = lambda: DTensor.from_local(sharded_input(r.rank, "partial").to(r.device), mesh, [Partial()])  # noqa: E731
    r.step("Partial->Replicate", lambda: local(partial().redistribute(mesh, [Replicate()])))
    r.step("Partial->Shard(0)", lambda: local(partial().redistribute(mesh, [Shard(0)])))

    def train_sharded():
        model = ddp_model().to(r.device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank_batches(r))
        return [p.full_tensor().detach().cpu() for p in model.parameters()]

    r.step("fully_shard", train_sharded)
    dist.destroy_process_group()


# decides DD-SHARD-001.1, DD-SHARD-001.2
@contract("DD-SHARD-001")
def test_dtensor_and_fsdp2_work_on_the_device(session, backend, dt, process_group):
    outcomes = ranks(session, backend, process_group, "rank_sharded", "DD-SHARD-001.1")
    full = sharded_input(0, "dtensor")
    total = reduce_cpu("SUM", [sharded_input(rank, "partial") for rank in range(WORLD)])
    for rank in range(WORLD):
        seen(outcomes, rank, "mesh", "DD-SHARD-001.1", f"init_device_mesh({dt!r}, ({WORLD},))")
        for name, expected in (("Shard(0)", full.chunk(WORLD, 0)[rank]),
                               ("Shard(0)->Replicate", full),
                               ("Shard(0)->Shard(1)", full.chunk(WORLD, 1)[rank]),
                               ("Partial->Replicate", total),
                               ("Partial->Shard(0)", total.chunk(WORLD, 0)[rank])):
            what = ("distribute_tensor(..., [Shard(0)])" if name == "Shard(0)"
                    else f"DTensor.redistribute {name.replace('->', ' to ')}")
            got = seen(outcomes, rank, name, "DD-SHARD-001.1", what)
            agrees("DD-SHARD-001.1", got, expected, f"the local tensor of {what} on rank {rank}")
    matches_one_process("DD-SHARD-001.2", outcomes, "fully_shard", "FSDP2 (fully_shard)")
