#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_runtime (corpus/*.bin), deterministically.

Input format (see the header of fuzz_runtime.cpp): one header byte (threads =
2 + byte % 3), then 8-byte records [t, op, a, b, c, d, e, f]; record r runs on
thread t % threads. Run from anywhere:

    python3 reference_backend/runtime/fuzz/make_corpus.py

It replaces corpus/*.bin with the seeds below (the file name says what each
one exercises). The race_* seeds make 2-4 threads allocate, write, read back
and free blocks of 4 KiB to ~1.75 MiB against each other on one device, so
that frees whose (merged) block reaches 1 MiB discard pages while the other
threads allocate: with the runtime that discarded a freed block's pages only
after putting it back on the free list (a thread handed the block in between
and writing to it read zeros back), they report the lost write within
seconds.
"""

import os
import random
import re


def _fuzzer_ops() -> list[str]:
    """The op names, in enum order, from fuzz_runtime.cpp's kOpNames: one
    list for both, so that a seed can never name the wrong op."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_runtime.cpp")
    with open(source) as f:
        text = f.read()
    table = re.search(r"kOpNames\[kNumOps\] = \{(.*?)\};", text, re.S)
    if not table:
        raise SystemExit("make_corpus.py: kOpNames not found in fuzz_runtime.cpp")
    return re.findall(r'"([A-Z0-9_]+)"', table.group(1))


OPS = _fuzzer_ops()
OP = {name: i for i, name in enumerate(OPS)}

# Size classes of MALLOC (byte b); see pick_size() in fuzz_runtime.cpp.
TINY, SMALL, MEDIUM, AROUND_1M, MIB_1_4, MIB_2, MIB_8, ALIGNED = range(8)
# Range modes.
WHOLE, HEAD, TAIL, ANY = range(4)
# Init modes of MALLOC (byte e).
NO_INIT, INIT_H2D, INIT_MEMSET, INIT_TAIL = range(4)
SYNC_COPY = 0x80  # bit 7 of the stream byte: use the synchronous orMemcpy

MAX_RECORDS = 512


def rec(t, op, a=0, b=0, c=0, d=0, e=0, f=0):
    return bytes([t & 0xFF, OP[op], a & 0xFF, b & 0xFF, c & 0xFF, d & 0xFF,
                  e & 0xFF, f & 0xFF])


def seed(threads, per_thread):
    """per_thread: one list of records per thread, interleaved round robin
    (each thread's records keep their order)."""
    assert 2 <= threads <= 4 and len(per_thread) == threads
    out = [bytes([threads - 2])]
    queues = [list(q) for q in per_thread]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    assert len(out) - 1 <= MAX_RECORDS, len(out)
    return b"".join(out)


def rotate(t, rounds, classes, nslots=4, init=INIT_H2D, writer=None,
           reader=None, pre=()):
    """Allocate into slot i % nslots (freeing its previous buffer, which was
    read back first), so each buffer lives a few rounds before it is checked.
    With several threads doing this, frees of >= 1 MiB (merged) blocks race
    with the other threads' allocations and writes."""
    ops = list(pre)
    for i in range(rounds):
        slot = i % nslots
        cls, hi, lo = classes[i % len(classes)]
        if i >= nslots:
            ops.append(reader(t, slot, i) if reader else
                       rec(t, "D2H", slot, WHOLE, 0, 0, 0, SYNC_COPY))
        ops.append(rec(t, "MALLOC", slot, cls, hi, lo,
                       NO_INIT if writer else init, i * 7 + t))
        if writer:
            ops.append(writer(t, slot, i))
    return ops


# 64 KiB, ~1 MiB (around the punch threshold), 4 KiB, ~1.75 MiB.
MIX = [(MEDIUM, 0, 0x10), (AROUND_1M, 0, 0), (SMALL, 0x0F, 0xFF), (MIB_1_4, 0, 0x40)]


def mix(t):
    return MIX[t % 4:] + MIX[:t % 4]


def seeds():
    s = {}
    # ---- the free/allocate race: pages discarded after the block was reusable
    s["race_rotate_mix_4threads"] = seed(4, [rotate(t, 60, mix(t)) for t in range(4)])
    s["race_rotate_mix_3threads"] = seed(3, [rotate(t, 70, mix(t)) for t in range(3)])
    s["race_rotate_mix_2threads"] = seed(2, [rotate(t, 100, mix(t)) for t in range(2)])
    s["race_rotate_64k_4threads"] = seed(4, [
        rotate(t, 60, [(MEDIUM, 0, 0x10)], nslots=2) for t in range(4)])
    s["race_rotate_tail_4threads"] = seed(4, [
        rotate(t, 50, mix(t), init=INIT_TAIL,
               reader=lambda t, slot, i: rec(t, "D2H", slot, TAIL, 0, 0xFF, 0, SYNC_COPY))
        for t in range(4)])
    s["race_rotate_device1"] = seed(4, [
        rotate(t, 50, mix(t), pre=[rec(t, "SET_DEVICE", 1)]) for t in range(4)])
    s["race_rotate_kernels"] = seed(4, [
        rotate(t, 40, mix(t), pre=[rec(t, "STREAM_CREATE", 0)],
               writer=lambda t, slot, i: rec(t, "KERNEL_WRITE", slot, WHOLE, 0, 0, i, 2),
               reader=lambda t, slot, i: rec(t, "D2H", slot, WHOLE, 0, 0, 2, 0))
        for t in range(4)])
    s["race_rotate_memset"] = seed(4, [
        rotate(t, 40, mix(t), pre=[rec(t, "STREAM_CREATE", 0)],
               writer=lambda t, slot, i: rec(t, "MEMSET", slot, WHOLE, 0, 0, 0x40 + i, 2),
               reader=lambda t, slot, i: rec(t, "D2H", slot, WHOLE, 0, 0, 0, 1))
        for t in range(4)])
    s["race_rotate_async"] = seed(4, [
        rotate(t, 40, mix(t), pre=[rec(t, "STREAM_CREATE", 0)],
               writer=lambda t, slot, i: rec(t, "H2D", slot, WHOLE, 0, 0, i, 2),
               reader=lambda t, slot, i: rec(t, "D2H", slot, WHOLE, 0, 0, 2, 1))
        for t in range(4)])
    # Large blocks: 8 MiB and 2 MiB, written whole, the tail read back.
    big = []
    for t in range(2):
        ops = []
        for i in range(6):
            cls = MIB_8 if (i + t) % 2 == 0 else MIB_2
            ops += [rec(t, "MALLOC", 0, cls, 0, 0, INIT_H2D, i),
                    rec(t, "D2H", 0, TAIL, 0x10, 0, 0, SYNC_COPY),
                    rec(t, "FREE", 0, 0)]
        big.append(ops)
    s["large_blocks"] = seed(2, big)

    # ---- single features, two or three threads each
    basic = []
    for t in range(2):
        basic.append([
            rec(t, "MALLOC", 0, SMALL, 3, 0x21, INIT_H2D, 5),
            rec(t, "MALLOC", 1, MEDIUM, 1, 2, NO_INIT),
            rec(t, "H2D", 1, WHOLE, 0, 0, 9, 0),
            rec(t, "D2D", 0, 1, ANY, 0x30, 0x40, 0),
            rec(t, "MEMSET", 0, HEAD, 0, 100, 0xEE, 0),
            rec(t, "D2H", 0, WHOLE, 0, 0, 0, 0),
            rec(t, "D2H", 1, ANY, 0x80, 0x80, 0, 1),
            rec(t, "D2H", 1, TAIL, 0, 50, 0, 2),
            rec(t, "VERIFY", 0, 0),
            rec(t, "FREE", 0, 1),
            rec(t, "FREE", 1, 2),
        ])
    s["basic_copies"] = seed(2, basic)

    streams = []
    for t in range(3):
        streams.append([
            rec(t, "STREAM_CREATE", 0, 0),
            rec(t, "STREAM_CREATE", 1, 1),
            rec(t, "MALLOC", 0, MEDIUM, 0, 0, NO_INIT),
            rec(t, "MALLOC", 1, MEDIUM, 0, 0, NO_INIT),
            rec(t, "H2D", 0, WHOLE, 0, 0, 1, 2),      # own stream 0
            rec(t, "H2D", 1, WHOLE, 0, 0, 2, 3),      # own stream 1
            rec(t, "D2D", 0, 1, ANY, 0x10, 0x20, 3),  # cross-stream hazard
            rec(t, "MEMSET", 1, HEAD, 0, 77, 0x55, 2 | (0 << 3)),
            rec(t, "D2D", 1, 0, ANY, 0x20, 0x10, 4 | (1 << 1)),
            rec(t, "STREAM_QUERY", 3),
            rec(t, "D2H", 0, WHOLE, 0, 0, 3, 0),
            rec(t, "D2H", 1, WHOLE, 0, 0, 2, 1),
            rec(t, "STREAM_DESTROY", 1),
            rec(t, "D2H", 1, WHOLE, 0, 0, 0, 2),
            rec(t, "STREAM_SYNC", 3),
        ])
    s["streams_ordering"] = seed(3, streams)

    events = []
    for t in range(2):
        events.append([
            rec(t, "STREAM_CREATE", 0),
            rec(t, "EVENT_CREATE", 0, 0),
            rec(t, "EVENT_CREATE", 1, 0),
            rec(t, "EVENT_CREATE", 2, 1),
            rec(t, "MALLOC", 0, SMALL, 0x10, 0, NO_INIT),
            rec(t, "EVENT_RECORD", 0, 3),
            rec(t, "KERNEL_WRITE", 0, WHOLE, 0, 0, 7, 2),
            rec(t, "EVENT_RECORD", 1, 3),
            rec(t, "EVENT_QUERY", 1),
            rec(t, "STREAM_WAIT_EVENT", 1, 0),
            rec(t, "EVENT_SYNC", 1),
            rec(t, "EVENT_ELAPSED", 0, 1),
            rec(t, "EVENT_SYNC", 0),
            rec(t, "EVENT_ELAPSED", 0, 1),
            rec(t, "EVENT_RECORD", 2, 0),
            rec(t, "EVENT_QUERY", 2),
            rec(t, "EVENT_DESTROY", 0),
            rec(t, "KERNEL_XOR", 0, HEAD, 0, 200, 0x11, 1),
            rec(t, "KERNEL_VERIFY", 0, WHOLE, 0, 0, 0, 2),
            rec(t, "D2H", 0, WHOLE, 0, 0, 0, 0),
            rec(t, "DEVICE_SYNC", 0),
        ])
    s["events"] = seed(2, events)

    devices = []
    for t in range(2):
        devices.append([
            rec(t, "SET_DEVICE", 1),
            rec(t, "MALLOC", 0, MEDIUM, 0, 0x80, INIT_H2D, 3),
            rec(t, "STREAM_CREATE", 0),
            rec(t, "EVENT_CREATE", 0),
            rec(t, "SET_DEVICE", 0),
            rec(t, "MALLOC", 1, MEDIUM, 0, 0x40, INIT_MEMSET, 0x42),
            rec(t, "D2D", 1, 0, ANY, 0, 0, 0),            # peer copy 1 -> 0 on device 0
            rec(t, "D2D", 0, 1, ANY, 0x40, 0x10, 0x40 | 2),  # peer copy on the source's (own) stream
            rec(t, "EVENT_RECORD", 0, 3),
            rec(t, "STREAM_WAIT_EVENT", 0, 0),
            rec(t, "KERNEL_INVALID", 1, 1, 0, 0, 0, 0),   # map another device's buffer
            rec(t, "SET_DEVICE", 0x81),
            rec(t, "D2H", 0, WHOLE, 0, 0, 1, 0),
            rec(t, "D2H", 1, WHOLE, 0, 0, 0, 0x80),
            rec(t, "DEVICE_SYNC", 1),
            rec(t, "MEMINFO", 1),
        ])
    s["two_devices"] = seed(2, devices)

    invalid = []
    for t in range(2):
        ops = [rec(t, "MALLOC", 0, SMALL, 0x0F, 0x33, INIT_H2D, 1),
               rec(t, "MALLOC", 1, TINY, 0, 5, INIT_MEMSET, 0x99),
               rec(t, "EVENT_CREATE", 0)]
        for sub in range(22):
            ops.append(rec(t, "INVALID", sub, t, 0x20 + sub, sub, 1 + sub % 2, 0x80 if sub % 3 == 0 else 0))
        ops += [rec(t, "ATTRIBUTES", 0, 0x80, 0),
                rec(t, "ATTRIBUTES", 5),
                rec(t, "DOUBLE_FREE", 1, 0),
                rec(t, "SET_DEVICE", 0x80),
                rec(t, "SET_DEVICE", 0x83),
                rec(t, "PINNED", 0, ANY, 0x10, 0x80, 3, 0),
                rec(t, "PINNED", 0, WHOLE, 0, 0, 4, 0)]
        invalid.append(ops)
    s["invalid_calls"] = seed(2, invalid)

    kernels = []
    for t in range(3):
        kernels.append([
            rec(t, "STREAM_CREATE", 0),
            rec(t, "MALLOC", 0, ALIGNED, 0, 31, INIT_H2D, 2),
            rec(t, "MALLOC", 1, MEDIUM, 0, 3, NO_INIT),
            rec(t, "KERNEL_WRITE", 1, WHOLE, 0, 0, 0x31, 2),
            rec(t, "KERNEL_XOR", 0, ANY, 0x10, 0x80, 0x22, 1),
            rec(t, "KERNEL_VERIFY", 0, WHOLE, 0, 0, 0, 2),
            rec(t, "KERNEL_INVALID", 0, 0, 0x10, 3, 0, 2),
            rec(t, "KERNEL_INVALID", 1, 2, 0, 0, 0, 0),
            rec(t, "KERNEL_INVALID", 1, 3, 0, 0, 0, 2),
            rec(t, "KERNEL_INVALID", 1, 4, 0, 0, 0, 2),   # failing kernel (private stream)
            rec(t, "KERNEL_INVALID", 1, 5, 0, 0, 0, 1),
            rec(t, "STREAM_QUERY", 3),
            rec(t, "D2D", 1, 0, HEAD, 0, 0x40, 2),
            rec(t, "STREAM_SYNC", 3),
            rec(t, "D2H", 1, WHOLE, 0, 0, 0, 0),
            rec(t, "DEVICE_SYNC", 0),
        ])
    s["kernels"] = seed(3, kernels)
    # A failing kernel, then a synchronous copy on its stream: orMemcpySync
    # returns (and clears) the stream's kernel error, as a synchronize does.
    s["kernel_failure_then_sync_copy"] = seed(2, [[
        rec(t, "STREAM_CREATE", 0),
        rec(t, "MALLOC", 1, MEDIUM, 0, 3, NO_INIT),
        rec(t, "KERNEL_WRITE", 1, WHOLE, 0, 0, 0x31, 2),
        rec(t, "KERNEL_INVALID", 1, 4, 0, 0, 0, 2),   # failing kernel (private stream)
        rec(t, "D2H", 1, WHOLE, 0, 0, 2, 3),          # orMemcpySync on that stream
        rec(t, "STREAM_SYNC", 3),
    ] for t in range(2)])

    # Pseudo-random mixes (fixed generator seeds).
    rng = random.Random(20240611)
    weights = {name: 3 for name in OPS}
    weights.update({"MALLOC": 8, "FREE": 5, "H2D": 8, "D2H": 8, "D2D": 6,
                    "MEMSET": 4, "VERIFY": 4, "YIELD": 1, "PINNED": 1})
    names = list(weights)
    for i in range(8):
        threads = 2 + i % 3
        per = []
        for t in range(threads):
            ops = [rec(t, "STREAM_CREATE", rng.randrange(3), rng.randrange(2))]
            for _ in range(rng.randrange(15, 35)):
                name = rng.choices(names, [weights[n] for n in names])[0]
                args = [rng.randrange(256) for _ in range(6)]
                if name == "MALLOC":
                    args[1] = rng.choice([TINY, SMALL, MEDIUM, MEDIUM, ALIGNED,
                                          AROUND_1M, MIB_1_4])
                ops.append(rec(t, name, *args))
            per.append(ops)
        s[f"mix_{i}"] = seed(threads, per)
    return s


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    corpus = os.path.join(here, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name in os.listdir(corpus):
        if name.endswith(".bin"):
            os.remove(os.path.join(corpus, name))
    for name, data in sorted(seeds().items()):
        with open(os.path.join(corpus, name + ".bin"), "wb") as f:
            f.write(data)
        print(f"{name}.bin: {len(data)} bytes")


if __name__ == "__main__":
    main()
