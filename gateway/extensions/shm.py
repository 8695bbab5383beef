"""Triton's system shared-memory extension, for clients on the same host.

A client registers a region (a POSIX shared-memory object, by its key, and
a window ``offset``/``byte_size`` in it) under a name; an infer request then
names a region for an input (read from there instead of the body) or an
output (written there, answered without data). Both V2 frontends use this
module; the tensors then go to any upstream in its own protocol.

Registrations are visible to every worker process: each is one small file
in a directory of this gateway instance (the supervisor's run directory, or
a private temporary directory of a single process), created atomically with
``link`` (a duplicate name fails) and removed by ``unlink``. Each worker
opens the objects itself and keeps the descriptors, checked against the
registration (device and inode) so a key re-created since is refused.

Data moves by ``pread``/``pwrite`` on the descriptor, never by mapping it:
a client that shrinks its object makes a short read (an error), not a
SIGBUS in the gateway. Keys are opened relative to /dev/shm with
``O_NOFOLLOW`` and must be plain POSIX names (no ``/`` after the first).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gateway.errors import GatewayError, invalid, malformed, unsupported
from gateway.extensions import SHM_REGISTRY_ENV
from gateway.limits import BYTES_ELEMENT_COST, TensorBudget
from gateway.tensors import array_from_raw, array_to_raw
from gateway.types import NUMPY_DTYPES, InferRequest, InferResponse, Tensor

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)

SHM_ROOT = "/dev/shm"
_MAX_NAME = 255  # bytes of a region name (and of a key: NAME_MAX)
# Descriptors a worker keeps before it closes those of regions gone elsewhere.
_SWEEP_AT = 64


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    device: int = 0
    inode: int = 0
    serial: str = ""

    def status(self) -> dict[str, Any]:
        """Triton's status entry of a system region."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@dataclass(frozen=True, slots=True)
class Window:
    """Where one tensor lives: ``offset``/``byte_size`` within a region."""

    region: str
    offset: int
    byte_size: int


def _not_found(name: str) -> GatewayError:
    return invalid(f"Unable to find system shared memory region: '{name[:100]}'")


def _open_key(key: str) -> int:
    """A descriptor of the shared-memory object ``key`` (read and write)."""
    name = key[1:] if key.startswith("/") else key
    if (not name or "/" in name or "\x00" in name or name in (".", "..")
            or len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME):
        raise invalid(f"shared memory key {key[:100]!r} is not a POSIX shared memory name "
                      "('/name', no further '/')")
    root = os.open(SHM_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root)
    except OSError as exc:
        reason = {errno.ENOENT: "no such object", errno.EACCES: "permission denied",
                  errno.ELOOP: "not a shared memory object"}.get(exc.errno or 0, "cannot be opened")
        raise invalid(f"Unable to open shared memory region: key {key[:100]!r}: {reason}") from None
    finally:
        os.close(root)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise invalid(f"Unable to open shared memory region: key {key[:100]!r} is not a shared memory object")
    return fd


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise malformed(f"{what} must be a non-negative integer")
    return value


class Registry:
    """The regions of this gateway instance (see the module's docstring)."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}  # registration serial -> descriptor

    @property
    def directory(self) -> Path:
        with self._lock:
            if self._directory is None:
                private = Path(tempfile.mkdtemp(prefix="gateway-shm-"))
                atexit.register(shutil.rmtree, private, True)
                self._directory = private
            self._directory.mkdir(mode=0o700, exist_ok=True)
            return self._directory

    def _path(self, name: str) -> Path:
        return self.directory / (hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest() + ".json")

    # --- registration ---------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name or len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME:
            raise invalid(f"a region name must have 1 to {_MAX_NAME} bytes")
        fd = _open_key(key)
        try:
            info = os.fstat(fd)
            if offset + byte_size > info.st_size:
                raise invalid(f"shared memory region '{name[:100]}': offset {offset} + byte_size {byte_size} "
                              f"is outside the object {key[:100]!r} of {info.st_size} bytes")
            region = Region(name, key, offset, byte_size, info.st_dev, info.st_ino, uuid.uuid4().hex)
            self._publish(region)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._fds[region.serial] = fd

    def _publish(self, region: Region) -> None:
        target = self._path(region.name)
        temporary = target.with_name(f".{region.serial}.tmp")
        temporary.write_bytes(orjson.dumps({
            "name": region.name, "key": region.key, "offset": region.offset, "byte_size": region.byte_size,
            "device": region.device, "inode": region.inode, "serial": region.serial}))
        try:
            os.link(temporary, target)  # fails if the name is taken, in any worker
        except FileExistsError:
            raise invalid(f"shared memory region '{region.name[:100]}' already in manager") from None
        finally:
            temporary.unlink(missing_ok=True)

    def unregister(self, name: str | None = None) -> None:
        """One region (a name not registered is no error, as on Triton), or all."""
        paths = [self._path(name)] if name is not None else list(self.directory.glob("*.json"))
        for path in paths:
            path.unlink(missing_ok=True)
        self._sweep()

    def status(self, name: str | None = None) -> list[Region]:
        if name is not None:
            return [self.lookup(name)]
        return sorted(self._regions(self.directory), key=lambda r: r.name)

    def _load(self, path: Path) -> Region | None:
        try:
            return Region(**orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError, TypeError):
            return None

    def lookup(self, name: str) -> Region:
        region = self._load(self._path(name))
        if region is None or region.name != name:
            raise _not_found(name)
        return region

    # --- data -------------------------------------------------------------------

    def _descriptor(self, region: Region) -> int:
        """A descriptor of the region's object for one copy, which closes it:
        a duplicate of the kept one, so an unregister closing that meanwhile
        cannot make the copy use a reused descriptor number."""
        with self._lock:
            fd = self._fds.get(region.serial)
            if fd is not None:
                return os.dup(fd)
        fd = _open_key(region.key)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (region.device, region.inode):
            os.close(fd)
            raise invalid(f"shared memory region '{region.name[:100]}': the object {region.key[:100]!r} was "
                          "replaced since it was registered; register the region again")
        with self._lock:
            if len(self._fds) >= _SWEEP_AT:
                self._sweep_locked()
            known = self._fds.setdefault(region.serial, fd)
            copy = os.dup(known)
        if known != fd:
            os.close(fd)
        return copy

    def _sweep(self) -> None:
        with self._lock:
            self._sweep_locked()

    def _sweep_locked(self) -> None:
        """Close the descriptors of regions no longer registered."""
        live = {region.serial for region in self._all_locked()}
        for serial in [s for s in self._fds if s not in live]:
            os.close(self._fds.pop(serial))

    def _all_locked(self) -> list[Region]:
        directory = self._directory
        if directory is None or not directory.exists():
            return []
        return self._regions(directory)

    def _regions(self, directory: Path) -> list[Region]:
        """The registrations readable in ``directory``."""
        return [r for r in (self._load(p) for p in directory.glob("*.json")) if r is not None]

    def window(self, parameters: dict[str, Any], label: str) -> tuple[Region, Window]:
        """The region and window a tensor's parameters name, checked."""
        name = parameters.get(REGION)
        if not isinstance(name, str):
            raise malformed(f"{label}: '{REGION}' must be a string")
        if BYTE_SIZE not in parameters:
            raise malformed(f"{label}: '{REGION}' needs '{BYTE_SIZE}'")
        size = _integer(parameters[BYTE_SIZE], f"{label}: '{BYTE_SIZE}'")
        offset = _integer(parameters.get(OFFSET, 0), f"{label}: '{OFFSET}'")
        region = self.lookup(name)
        if offset + size > region.byte_size:
            raise invalid(f"{label}: offset {offset} + byte size {size} is outside shared memory region "
                          f"'{name[:100]}' of {region.byte_size} bytes")
        return region, Window(name, offset, size)

    def read(self, region: Region, window: Window, label: str) -> bytearray:
        buffer = bytearray(window.byte_size)
        fd = self._descriptor(region)
        try:
            done = os.preadv(fd, [buffer], region.offset + window.offset) if window.byte_size else 0
        finally:
            os.close(fd)
        if done != window.byte_size:
            raise invalid(f"{label}: shared memory region '{window.region[:100]}' ends before the data "
                          "(its object shrank since it was registered)")
        return buffer

    def write(self, region: Region, window: Window, data: Any, label: str) -> None:
        start = region.offset + window.offset
        view = memoryview(data).cast("B")
        fd = self._descriptor(region)
        try:
            if os.fstat(fd).st_size < start + view.nbytes:
                raise invalid(f"{label}: shared memory region '{window.region[:100]}' ends before the data "
                              "(its object shrank since it was registered)")
            while view:
                written = os.pwrite(fd, view, start)
                view, start = view[written:], start + written
        finally:
            os.close(fd)


def cuda_status(name: str) -> list[Region]:
    """CUDA regions: none is ever registered (registering is refused)."""
    if name:
        raise invalid(f"Unable to find cuda shared memory region: '{name[:100]}'")
    return []


def register_request(key: Any, offset: Any, byte_size: Any) -> tuple[str, int, int]:
    """A register request's fields, checked (either protocol)."""
    if not isinstance(key, str):
        raise malformed("Shared memory register request: 'key' must be a string")
    return key, _integer(offset, "Shared memory register request: 'offset'"), \
        _integer(byte_size, "Shared memory register request: 'byte_size'")


_REGISTRY: Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def registry() -> Registry:
    """This process's registry: the supervisor's shared directory, if any."""
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            shared = os.environ.get(SHM_REGISTRY_ENV)
            _REGISTRY = Registry(Path(shared) if shared else None)
        return _REGISTRY


# --- infer requests ------------------------------------------------------------


def in_shared_memory(parameters: dict[str, Any]) -> bool:
    return REGION in parameters


def placeholder(datatype: str) -> np.ndarray:
    """A decoded input's data until :func:`read_inputs` reads it."""
    return np.empty(0, dtype=NUMPY_DTYPES.get(datatype, object))


def _without(parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in parameters.items() if k not in PARAMETERS}


@dataclass(slots=True)
class Plan:
    """A request's use of shared memory, checked before any data moves."""

    inputs: list[tuple[int, Region, Window]]
    outputs: dict[str, tuple[Region, Window]]

    @property
    def input_bytes(self) -> int:
        return sum(window.byte_size for _, _, window in self.inputs)


def plan(request: InferRequest, allowed: str | None) -> Plan:
    """The regions ``request`` names, checked; the requested outputs lose
    their shared-memory parameters (an upstream never sees them).
    ``allowed`` is None when the extension is on, else why it is not."""
    inputs: list[tuple[int, Region, Window]] = []
    outputs: dict[str, tuple[Region, Window]] = {}
    wanted = [i for i, tensor in enumerate(request.inputs) if in_shared_memory(tensor.parameters)]
    asked = [o for o in request.outputs if in_shared_memory(o.parameters)]
    if (wanted or asked) and allowed is not None:
        raise unsupported(allowed)
    store = registry() if wanted or asked else None
    for index in wanted:
        tensor = request.inputs[index]
        assert store is not None
        region, window = store.window(tensor.parameters, f"input '{tensor.name[:100]}'")
        inputs.append((index, region, window))
    for output in asked:
        assert store is not None
        label = f"output '{output.name[:100]}'"
        if "classification" in output.parameters:
            raise invalid(f"{label}: can't set both '{REGION}' and 'classification'")
        outputs[output.name] = store.window(output.parameters, label)
        output.parameters = {k: v for k, v in _without(output.parameters).items() if k != "binary_data"}
    if inputs or outputs:
        request.raw = None  # the client's bytes name regions an upstream cannot read
    return Plan(inputs, outputs)


def read_inputs(request: InferRequest, found: Plan, budget: TensorBudget) -> None:
    """Fill the inputs ``found`` names from their regions (body-sized: the
    caller runs it off the loop when big)."""
    store = registry()
    for index, region, window in found.inputs:
        tensor = request.inputs[index]
        label = f"input '{tensor.name[:100]}'"
        data = store.read(region, window, label)
        count = tensor.element_count
        tensor.data = array_from_raw(memoryview(data), tensor.datatype, tensor.shape, count, label, budget)
        tensor.parameters = _without(tensor.parameters)


def write_outputs(response: InferResponse, found: Plan) -> None:
    """Write the outputs ``found`` names into their regions; each is then
    answered with its name, datatype and shape only (as Triton does)."""
    if not found.outputs:
        return
    store = registry()
    outputs = []
    for tensor in response.outputs:
        target = found.outputs.get(tensor.name)
        if target is None:
            outputs.append(tensor)
            continue
        region, window = target
        label = f"output '{tensor.name[:100]}'"
        raw = array_to_raw(tensor)
        size = memoryview(raw).nbytes
        if size > window.byte_size:
            raise invalid(f"shared memory size specified with the request for {label} ({window.byte_size} "
                          f"bytes) should be at least {size} bytes to hold the results")
        store.write(region, window, raw, label)
        outputs.append(Tensor(tensor.name, tensor.datatype, tensor.shape, placeholder(tensor.datatype),
                              {REGION: window.region}))
    response.outputs = outputs
    response.raw = None  # an upstream's own bytes hold the data


def written(tensor: Tensor) -> bool:
    """Whether an answer's output went to shared memory (no data sent)."""
    return REGION in tensor.parameters


async def run_inputs(request: InferRequest, found: Plan, budget: TensorBudget,
                     grow: Callable[[int], None], offload: Any) -> None:
    """:func:`read_inputs`, its bytes charged to the memory budget first and
    big copies made in the offload pool."""
    if found.inputs:
        size = found.input_bytes
        grow(size)
        await offload.run(size, read_inputs, request, found, budget)


async def run_outputs(response: InferResponse, found: Plan, grow: Callable[[int], None], offload: Any) -> None:
    """:func:`write_outputs`, big copies made in the offload pool. Numbers
    are written from their arrays; BYTES tensors are first put in their
    length-prefixed form, charged to the memory budget before."""
    if found.outputs:
        targets = [t for t in response.outputs if t.name in found.outputs]
        grow(sum(t.data.size * BYTES_ELEMENT_COST for t in targets if t.datatype == "BYTES"))
        await offload.run(sum(t.data.nbytes for t in targets), write_outputs, response, found)
