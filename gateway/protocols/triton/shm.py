"""Triton's system shared-memory extension, for clients on the same host.

A client registers a region (a POSIX shared-memory object, by its key, and
a window ``offset``/``byte_size`` in it) under a name; an infer request then
names a region for an input (read from there instead of the body) or an
output (written there, answered without data). Both V2 frontends use this
module; the tensors then go to any upstream in its own protocol.

Regions belong to the listener and credential that registered them
(:func:`owner`): another tenant's are not seen, used or unregistered.
Registrations are visible to every worker process: each is one small file
in the owner's folder of a directory of this gateway instance (the
supervisor's run directory, or a private temporary directory of a single
process), created atomically with ``link`` (a duplicate name fails) under
a lock that bounds the count, and removed by ``unlink``. No descriptor is
kept between requests: each copy opens the object and checks it is the one
registered (device and inode), so a key re-created since is refused.

Data moves by ``pread``/``pwrite`` on the descriptor, never by mapping it:
a client that shrinks its object makes a short read (an error), not a
SIGBUS in the gateway. Keys are opened relative to /dev/shm with
``O_NOFOLLOW`` and must be plain POSIX names (no ``/`` after the first).
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import fcntl
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson

from gateway.core.errors import ErrorKind, GatewayError, invalid, malformed
from gateway.core.limits import BYTES_ELEMENT_COST, TensorAllowance
from gateway.core.tensors import array_from_raw, array_to_raw
from gateway.core.types import NUMPY_DTYPES, InferRequest, InferResponse, Tensor
from gateway.protocols.triton import SHM_REGISTRY_ENV
from gateway.runtime.offload import Offloader

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)

SHM_ROOT = "/dev/shm"
_MAX_NAME = 255  # bytes of a region name (and of a key: NAME_MAX)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    device: int = 0
    inode: int = 0

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
    try:
        root = os.open(SHM_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root)
        finally:
            os.close(root)
    except OSError as exc:
        refusal = _out_of_resources(exc)
        if refusal is not None:
            raise refusal from None
        reason = {errno.ENOENT: "no such object", errno.EACCES: "permission denied",
                  errno.ELOOP: "not a shared memory object"}.get(exc.errno or 0, "cannot be opened")
        raise invalid(f"Unable to open shared memory region: key {key[:100]!r}: {reason}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise invalid(f"Unable to open shared memory region: key {key[:100]!r} is not a shared memory object")
    return fd


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise malformed(f"{what} must be a non-negative integer")
    return value


def owner(listener: str, credential: str) -> str:
    """Who a region belongs to: the listener and the credential it was
    registered with (a digest: the token itself is never written down)."""
    text = f"{listener}\x00{credential}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(text).hexdigest()


def _out_of_resources(exc: OSError) -> GatewayError | None:
    """A refusal for an exhausted resource of this host (never a 500)."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return GatewayError(ErrorKind.OVERLOADED, "the gateway has no file descriptor free for shared memory; "
                                                  "retry later")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return GatewayError(ErrorKind.OVERLOADED, "the gateway has no space left to record the region")
    return None


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` among the workers (flock)."""
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class Registry:
    """The regions of this gateway instance (see the module's docstring).

    Every call on the registration files runs in the registry's own thread
    (:meth:`run`), never on the event loop; each reads or writes one
    owner's folder only, so another tenant's registrations cost nothing.
    Data copies (:meth:`read`, :meth:`write`) go with the request's other
    body-sized work (``run_inputs``, ``run_outputs``)."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def directory(self) -> Path:
        with self._lock:
            if self._directory is None:
                private = Path(tempfile.mkdtemp(prefix="gateway-shm-"))
                atexit.register(shutil.rmtree, private, True)
                self._directory = private
            self._directory.mkdir(mode=0o700, exist_ok=True)
            return self._directory

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the registry's thread: one at a time in this
        process, so a burst of calls queues there, not on the loop."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="gateway-shm")
            pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))
        except OSError as exc:
            refusal = _out_of_resources(exc)
            if refusal is None:
                raise
            raise refusal from None

    def _folder(self, owner: str) -> Path:
        return self.directory / owner

    def _path(self, owner: str, name: str) -> Path:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
        return self._folder(owner) / f"{digest}.json"

    # --- registration ---------------------------------------------------------

    def register(self, owner: str, name: str, key: str, offset: int, byte_size: int, limit: int) -> None:
        if not name or len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME:
            raise invalid(f"a region name must have 1 to {_MAX_NAME} bytes")
        fd = _open_key(key)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        if offset + byte_size > info.st_size:
            raise invalid(f"shared memory region '{name[:100]}': offset {offset} + byte_size {byte_size} "
                          f"is outside the object {key[:100]!r} of {info.st_size} bytes")
        folder = self._folder(owner)
        folder.mkdir(mode=0o700, exist_ok=True)
        with _folder_lock(folder):  # the count and the new file, one worker at a time
            if sum(1 for entry in os.scandir(folder) if entry.name.endswith(".json")) >= limit:
                raise GatewayError(ErrorKind.OVERLOADED, f"shared memory region '{name[:100]}': {limit} regions "
                                   "are registered, the limit (server.max_shared_memory_regions); "
                                   "unregister one first")
            self._publish(self._path(owner, name), Region(name, key, offset, byte_size, info.st_dev, info.st_ino))

    @staticmethod
    def _publish(target: Path, region: Region) -> None:
        temporary = target.with_name(f".{uuid.uuid4().hex}.tmp")
        temporary.write_bytes(orjson.dumps({
            "name": region.name, "key": region.key, "offset": region.offset, "byte_size": region.byte_size,
            "device": region.device, "inode": region.inode}))
        try:
            os.link(temporary, target)  # fails if the name is taken, in any worker
        except FileExistsError:
            raise invalid(f"shared memory region '{region.name[:100]}' already in manager") from None
        finally:
            temporary.unlink(missing_ok=True)

    def unregister(self, owner: str, name: str | None = None) -> None:
        """One region (a name not registered is no error, as on Triton), or all."""
        if name is not None:
            self._path(owner, name).unlink(missing_ok=True)
            return
        folder = self._folder(owner)
        for path in folder.glob("*.json") if folder.is_dir() else ():
            path.unlink(missing_ok=True)

    def status(self, owner: str, name: str | None = None) -> list[Region]:
        if name is not None:
            return [self.lookup(owner, name)]
        folder = self._folder(owner)
        found = (self._load(path) for path in folder.glob("*.json")) if folder.is_dir() else ()
        return sorted((r for r in found if r is not None), key=lambda r: r.name)

    @staticmethod
    def _load(path: Path) -> Region | None:
        try:
            return Region(**orjson.loads(path.read_bytes()))
        except (FileNotFoundError, orjson.JSONDecodeError, TypeError):
            return None

    def lookup(self, owner: str, name: str) -> Region:
        region = self._load(self._path(owner, name))
        if region is None or region.name != name:
            raise _not_found(name)
        return region

    # --- data -------------------------------------------------------------------

    @staticmethod
    def _descriptor(region: Region) -> int:
        """A descriptor of the region's object, opened for one copy: nothing
        is kept open between requests, and an object deleted and created
        again under the key is refused (its registration named the old one)."""
        fd = _open_key(region.key)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (region.device, region.inode):
            os.close(fd)
            raise invalid(f"shared memory region '{region.name[:100]}': the object {region.key[:100]!r} was "
                          "replaced since it was registered; register the region again")
        return fd

    def window(self, owner: str, parameters: dict[str, Any], label: str) -> tuple[Region, Window]:
        """The region and window a tensor's parameters name, checked."""
        name = parameters.get(REGION)
        if not isinstance(name, str):
            raise malformed(f"{label}: '{REGION}' must be a string")
        if BYTE_SIZE not in parameters:
            raise malformed(f"{label}: '{REGION}' needs '{BYTE_SIZE}'")
        size = _integer(parameters[BYTE_SIZE], f"{label}: '{BYTE_SIZE}'")
        offset = _integer(parameters.get(OFFSET, 0), f"{label}: '{OFFSET}'")
        region = self.lookup(owner, name)
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


def named(request: InferRequest) -> bool:
    """Whether ``request`` names a region for an input or an output. Asked of
    every V2 infer request: plain loops, no generator or call per tensor."""
    for tensor in request.inputs:
        if REGION in tensor.parameters:
            return True
    for output in request.outputs:
        if REGION in output.parameters:
            return True
    return False


def plan(request: InferRequest, owner: str) -> Plan:
    """The regions ``request`` names, checked, among ``owner``'s (file
    reads: run it in the registry's thread); the requested outputs lose
    their shared-memory parameters (an upstream never sees them)."""
    store = registry()
    inputs: list[tuple[int, Region, Window]] = []
    outputs: dict[str, tuple[Region, Window]] = {}
    for index, tensor in enumerate(request.inputs):
        if in_shared_memory(tensor.parameters):
            region, window = store.window(owner, tensor.parameters, f"input '{tensor.name[:100]}'")
            inputs.append((index, region, window))
    for output in request.outputs:
        if not in_shared_memory(output.parameters):
            continue
        label = f"output '{output.name[:100]}'"
        if "classification" in output.parameters:
            raise invalid(f"{label}: can't set both '{REGION}' and 'classification'")
        outputs[output.name] = store.window(owner, output.parameters, label)
        output.parameters = {k: v for k, v in _without(output.parameters).items() if k != "binary_data"}
    if inputs or outputs:
        request.raw = None  # the client's bytes name regions an upstream cannot read
    return Plan(inputs, outputs)


def read_inputs(request: InferRequest, found: Plan, allowance: TensorAllowance) -> None:
    """Fill the inputs ``found`` names from their regions (body-sized: the
    caller runs it off the loop when big)."""
    store = registry()
    for index, region, window in found.inputs:
        tensor = request.inputs[index]
        label = f"input '{tensor.name[:100]}'"
        data = store.read(region, window, label)
        count = tensor.element_count
        tensor.data = array_from_raw(memoryview(data), tensor.datatype, tensor.shape, count, label, allowance)
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


async def run_inputs(request: InferRequest, found: Plan, allowance: TensorAllowance,
                     grow: Callable[[int], None], offload: Offloader) -> None:
    """:func:`read_inputs`, its bytes charged to the memory budget first and
    big copies made in the offload pool."""
    if found.inputs:
        size = found.input_bytes
        grow(size)
        await offload.run(size, read_inputs, request, found, allowance)


async def run_outputs(response: InferResponse, found: Plan, grow: Callable[[int], None], offload: Offloader) -> None:
    """:func:`write_outputs`, big copies made in the offload pool. Numbers
    are written from their arrays; BYTES tensors are first put in their
    length-prefixed form, charged to the memory budget before."""
    if found.outputs:
        targets = [t for t in response.outputs if t.name in found.outputs]
        grow(sum(t.data.size * BYTES_ELEMENT_COST for t in targets if t.datatype == "BYTES"))
        await offload.run(sum(t.data.nbytes for t in targets), write_outputs, response, found)
