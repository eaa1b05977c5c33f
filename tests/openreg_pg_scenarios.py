"""Scenarios for tests/test_process_group.py: OpenReg's process group
(orccl) in two ranks, run by the kit's rank launcher
(conformance/_distributed.py)."""

import torch


def coalesced(r):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    r.init(timeout=20)
    group = dist.group.WORLD
    scale = float(r.rank + 1)
    a = torch.full((2, 3), scale, device=r.device)
    b = torch.arange(4.0, device=r.device) * scale
    r.step("all_gather", lambda: [t.cpu() for t in funcol.all_gather_into_tensor_coalesced([a, b], group)])
    x = torch.arange(8.0, device=r.device).reshape(4, 2) * scale
    y = torch.arange(6.0, device=r.device) * scale
    r.step("reduce_scatter", lambda: [t.cpu() for t in funcol.reduce_scatter_tensor_coalesced(
        [x, y], "avg", [0, 0], group)])
    r.step("all_reduce", lambda: [t.cpu() for t in funcol.all_reduce_coalesced([a, b], "sum", group)])

    # One Work for both tensors, and its future.
    outs = [torch.empty((4, 3), device=r.device), torch.empty(8, device=r.device)]

    def one_work():
        work = group.allgather_into_tensor_coalesced(outs, [a, b])
        value = work.get_future().wait()
        work.wait()
        return [t.cpu() for t in value]

    r.step("work", one_work)

    # A bad pair is refused before anything is queued: the group still works.
    r.step("unpaired", lambda: group.allgather_into_tensor_coalesced([outs[0]], [a, b]))
    r.step("wrong_size", lambda: group.allgather_into_tensor_coalesced(
        [outs[0], torch.empty(5, device=r.device)], [a, b]))
    z = torch.full((3,), scale, device=r.device)
    r.step("after", lambda: (dist.all_reduce(z), z.cpu())[1])
    dist.destroy_process_group()
