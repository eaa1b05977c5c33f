"""Serialization: torch.save / torch.load of device tensors (location tags
'<name>:<index>'), storage sharing, map_location, weights_only."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from ._helpers import check, must, must_raise, scope

contract = pytest.mark.contract


def save(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    must(lambda: torch.save(obj, buffer), "torch.save of device tensors")
    buffer.seek(0)
    return buffer


def load(buffer: io.BytesIO, what: str, **kwargs):
    buffer.seek(0)
    return must(lambda: torch.load(buffer, **kwargs), what)


def supported_dtypes(index: int) -> set[torch.dtype] | None:
    try:
        return set(torch.accelerator.get_device_capability(index)["supported_dtypes"])
    except Exception:  # noqa: BLE001 - capability queries are another contract
        return None


def sample(dt: str, index: int) -> dict[str, torch.Tensor]:
    device = f"{dt}:{index}"
    supported = supported_dtypes(index)
    tensors = {
        "float32": torch.linspace(-3, 3, 50).view(5, 10).to(device),
        "int64": torch.arange(-20, 20).to(device),
        "bool": (torch.arange(16) % 3 == 0).to(device),
        "float64": torch.tensor([1e-300, -2.5, 7.0], dtype=torch.float64),
        "strided": torch.arange(24.0).view(4, 6).t().to(device)[1:, ::2],
    }
    if supported is None or torch.float64 in supported:
        tensors["float64"] = tensors["float64"].to(device)
    else:
        del tensors["float64"]
    return tensors


def check_same(loaded: dict, original: dict, device: torch.device, what: str) -> None:
    for key, tensor in original.items():
        got = loaded[key]
        assert isinstance(got, torch.Tensor), f"{what}: {key} loaded as {type(got).__name__}"
        assert got.device == device, f"{what}: the {key} tensor loaded on {got.device}, expected {device}"
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, \
            f"{what}: the {key} tensor loaded as {got.dtype} {tuple(got.shape)}"
        assert torch.equal(got.cpu(), tensor.cpu()), f"{what}: the {key} tensor loaded with different values"


# decides SR-RT-001.1
@contract("SR-RT-001")
def test_save_load_round_trip(dt, mod, n):
    for index in sorted({0, n - 1}):
        original = sample(dt, index)
        buffer = save(original)
        mod.set_device(0)
        for weights_only in (False, True):
            loaded = load(buffer, f"torch.load(weights_only={weights_only}) of tensors of device {index}",
                          weights_only=weights_only)
            check_same(loaded, original, torch.device(dt, index), f"torch.load(weights_only={weights_only})")
        assert mod.current_device() == 0, "torch.load changed the current device"


# decides SR-RT-001.2
@contract("SR-RT-001")
def test_views_keep_sharing_storage(dt):
    base = torch.arange(12.0, device=dt)
    views = {"tail": base[4:], "matrix": base.view(3, 4), "base": base}
    loaded = load(save(views), "torch.load of views of one device storage")
    pointers = {k: v.untyped_storage().data_ptr() for k, v in loaded.items()}
    assert len(set(pointers.values())) == 1, f"views of one storage were loaded into separate storages: {pointers}"
    offset = loaded["tail"].storage_offset()
    assert offset == 4, f"the storage offset of a view was lost: it is {offset}, not 4"
    loaded["matrix"][2, 3] = -1.0
    assert loaded["tail"][-1].item() == -1.0 and loaded["base"][11].item() == -1.0, \
        "writing through one loaded view is not visible through the others"


# decides SR-RT-001.3
@contract("SR-RT-001")
def test_module_state_dict_round_trip(dt):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(dt)
    state = model.state_dict()
    loaded = load(save(state), "torch.load(weights_only=True) of a device state_dict", weights_only=True)
    assert list(loaded) == list(state), f"state_dict keys changed: {list(loaded)}"
    for key, tensor in state.items():
        assert loaded[key].device == tensor.device, f"{key} loaded on {loaded[key].device}"
        assert torch.equal(loaded[key].cpu(), tensor.cpu()), f"{key} loaded with different values"
    clone = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(dt)
    must(lambda: clone.load_state_dict(loaded), "load_state_dict of a loaded device state_dict")


# decides SR-RT-001.4
@contract("SR-RT-001")
@pytest.mark.requires("multi-device")
def test_load_restores_the_saved_index(dt, mod, n, two_devices):
    """A tensor saved from device n-1 comes back on n-1, whatever is current."""
    last = n - 1
    original = sample(dt, last)
    buffer = save(original)
    mod.set_device(0)
    check_same(load(buffer, f"torch.load of tensors of device {last}"), original, torch.device(dt, last),
               "torch.load with device 0 current")
    assert mod.current_device() == 0, "torch.load changed the current device"


# decides SR-MAP-001.1
@contract("SR-MAP-001")
def test_map_location_cpu(dt, n):
    original = sample(dt, n - 1)
    buffer = save(original)
    for spelling in ("cpu", torch.device("cpu"), lambda storage, location: storage):
        loaded = load(buffer, f"torch.load(map_location={spelling!r})", map_location=spelling)
        check_same(loaded, original, torch.device("cpu"), f"torch.load(map_location={spelling!r})")


# decides SR-MAP-001.2
@contract("SR-MAP-001")
def test_map_location_to_a_missing_device(dt, n):
    buffer = save({"t": torch.arange(4.0, device=dt)})
    for bad in (n, n + 5):
        buffer.seek(0)
        must_raise(lambda: torch.load(buffer, map_location=f"{dt}:{bad}"),
                   f"torch.load(map_location='{dt}:{bad}') with {n} device(s)", RuntimeError,
                   mentions=(str(bad), str(n)))


# decides SR-MAP-001.3
@contract("SR-MAP-001")
@pytest.mark.requires("multi-device")
def test_map_location_to_another_device(dt, mod, n, two_devices):
    original = sample(dt, 0)
    buffer = save(original)
    last = n - 1
    mod.set_device(0)
    for spelling in (f"{dt}:{last}", torch.device(dt, last), {f"{dt}:0": f"{dt}:{last}"}):
        loaded = load(buffer, f"torch.load(map_location={spelling!r})", map_location=spelling)
        check_same(loaded, original, torch.device(dt, last), f"torch.load(map_location={spelling!r})")
    assert mod.current_device() == 0, "torch.load with map_location changed the current device"


# ------------------------------------------------------------ backend metadata


def metadata_of(t: torch.Tensor, what: str) -> dict:
    return must(lambda: torch._utils.get_tensor_metadata(t), f"torch._utils.get_tensor_metadata of {what}")


def holds(metadata: dict, expected: dict) -> bool:
    return all(key in metadata and metadata[key] == value for key, value in expected.items())


@pytest.fixture
def declared(backend) -> dict:
    """The metadata the manifest says the backend keeps (without it the
    feature backend-metadata is not claimed and these tests do not run)."""
    return dict(backend.manifest.backend_metadata)


@contract("SR-META-001")
def test_tensors_without_metadata_report_none(dt):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.arange(6.0, device=dt)
    with scope("SR-META-001.1"):
        with FakeTensorMode():
            fake = torch.empty(2, 3, device=dt)
    for what, t in (("a new tensor", x), ("a view", x.view(2, 3)[1]), ("an operator's result", x * 2),
                    ("a FakeTensor on the device", fake)):
        with scope("SR-META-001.1"):
            got = metadata_of(t, what)
        check("SR-META-001.1", got == {}, f"get_tensor_metadata of {what} returned {got!r}, not {{}}")


@contract("SR-META-001")
def test_set_metadata_is_read_back(dt, declared):
    x, other = torch.arange(6.0, device=dt), torch.arange(6.0, device=dt)
    with scope("SR-META-001.2"):
        must(lambda: torch._utils.set_tensor_metadata(x, dict(declared)),
             f"torch._utils.set_tensor_metadata(t, {declared!r})")
    got = metadata_of(x, "the tensor")
    check("SR-META-001.2", holds(got, declared),
          f"after set_tensor_metadata(t, {declared!r}) on a device tensor, get_tensor_metadata(t) returned {got!r}")
    untouched = metadata_of(other, "another tensor")
    check("SR-META-001.2", not any(key in untouched for key in declared),
          f"setting metadata on one tensor gave another tensor {untouched!r}")


@contract("SR-META-001")
def test_save_load_and_pickle_restore_metadata(dt, declared):
    x = torch.arange(6.0, device=dt)
    torch._utils.set_tensor_metadata(x, dict(declared))
    module = torch.nn.Linear(3, 2).to(dt)
    torch._utils.set_tensor_metadata(module.weight, dict(declared))
    with scope("SR-META-001.3"):
        loaded = load(save({"t": x, "state": module.state_dict()}), "torch.load of tensors with metadata")
        unpickled = must(lambda: pickle.loads(pickle.dumps(x)), "pickle of a device tensor with metadata")
    for what, t in (("torch.load of a tensor", loaded["t"]), ("torch.load of a state_dict's weight",
                                                              loaded["state"]["weight"]),
                    ("pickle", unpickled)):
        got = metadata_of(t, what)
        check("SR-META-001.3", t.device.type == dt and holds(got, declared),
              f"after {what}, the tensor on {t.device} has metadata {got!r}, not the {declared!r} it was saved with")


@contract("SR-META-001")
def test_shallow_copies_keep_metadata(dt, declared):
    x = torch.arange(6.0, device=dt)
    torch._utils.set_tensor_metadata(x, dict(declared))
    for what, make in (("t.detach()", x.detach), ("t.data", lambda: x.data),
                       ("nn.Parameter(t)", lambda: torch.nn.Parameter(x))):
        with scope("SR-META-001.4"):
            copy = must(make, what)
        got = metadata_of(copy, what)
        check("SR-META-001.4", holds(got, declared), f"{what} has metadata {got!r}, not {declared!r}")


@contract("SR-META-001")
def test_a_second_set_takes_effect(dt, declared):
    """Metadata is set again on tensors that already carry it (a tensor
    loaded with metadata, then marked by the user): the last set wins for
    the keys it names."""
    negated = {key: not value for key, value in declared.items()}
    x, other = torch.arange(6.0, device=dt), torch.arange(6.0, device=dt)
    torch._utils.set_tensor_metadata(other, dict(declared))
    for first, second in ((declared, negated), (negated, declared)):
        with scope("SR-META-001.5"):
            must(lambda: torch._utils.set_tensor_metadata(x, dict(first)),
                 f"torch._utils.set_tensor_metadata(t, {first!r})")
            must(lambda: torch._utils.set_tensor_metadata(x, dict(second)),
                 f"a second torch._utils.set_tensor_metadata(t, {second!r}) on the same tensor")
        got = metadata_of(x, "the tensor")
        check("SR-META-001.5", holds(got, second),
              f"after set_tensor_metadata(t, {first!r}) and then set_tensor_metadata(t, {second!r}), "
              f"get_tensor_metadata(t) returned {got!r}: the second set must win for the keys it names")
    untouched = metadata_of(other, "another tensor")
    check("SR-META-001.5", holds(untouched, declared),
          f"setting metadata twice on one tensor changed another tensor's metadata to {untouched!r} (it was set "
          f"to {declared!r})")
