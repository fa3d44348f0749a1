"""Types of `wload._wload`, the Rust extension (python/src/) that `wload` re-exports.

Checked in the suite (python/tests/test_typing.py): `mypy.stubtest` against the built module, and
`mypy --strict` over a typed use of the package.
"""

import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, TypedDict, TypeVar, final, overload, type_check_only

__all__ = ["plan", "fetch", "Plan", "Tensor", "LoadReport", "WloadError", "PlanError", "__version__"]

__version__: str

_T = TypeVar("_T")
# A path argument: a str or an os.PathLike of one (pathlib.Path).
_Path = str | os.PathLike[str]
# A value of `LoadReport` read as a mapping.
_Value = int | float | str

@type_check_only
class Problem(TypedDict):
    """One problem of a `PlanError`, as wload's JSON lists it (None when not about one)."""

    message: str
    fix: str | None
    file: str | None
    tensor: str | None
    parameter: str | None
    shape: list[int] | None
    expected_shape: list[int] | None

class WloadError(RuntimeError):
    """A wload failure that is not the checkpoint's or the caller's: I/O, network, a source that
    changed while being read. After a failed load the destinations hold partial data."""

class PlanError(ValueError):
    """wload cannot plan the source with these options (vLLM would refuse it too): str() is
    wload's full message, `.problems` each problem as wload's JSON lists it."""

    problems: list[Problem]

@final
class Tensor:
    """One tensor a rank holds: vLLM's parameter name, safetensors dtype (and torch's name for it),
    shape and size."""

    @property
    def name(self) -> str:
        """vLLM's parameter name."""

    @property
    def dtype(self) -> str:
        """The safetensors spelling: "BF16", "F32", "F8_E4M3", "I32", "U8", ..."""

    @property
    def torch_dtype(self) -> str | None:
        """torch's name for the dtype ("bfloat16", "float8_e4m3fn"), for
        `getattr(torch, t.torch_dtype)`; None for F4 and F6, which torch has no one-element type
        for."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...

@type_check_only
class _CudaFigures(TypedDict, total=False):
    device_copy_s: float
    staging_wait_s: float
    staging_bytes: int

@type_check_only
class LoadReportDict(_CudaFigures):
    """`LoadReport.to_dict()`: the dict `Plan.load` returned before it returned a `LoadReport`;
    the CUDA figures only for a load onto a GPU."""

    rank: int
    device: str
    tensors: int
    bytes: int
    seconds: float
    gbps: float
    io: Literal["buffered", "direct", "mmap"]
    io_why: str
    cache_s: float
    transfer_s: float
    sync_s: float
    read_s: float
    convert_s: float
    copy_s: float
    bytes_read: int
    direct_read_bytes: int
    direct_read_s: float
    host_copy_bytes: int
    host_copy_s: float

@final
class LoadReport:
    """What one `Plan.load` did: the rank, where its bytes went, how long each stage took.

    Also a read-only mapping of the same names (`report["bytes"]`, `keys()`, `items()`,
    `to_dict()`), as the dict `Plan.load` returned before; the CUDA figures are keys only for a
    load onto a GPU."""

    @property
    def rank(self) -> int:
        """The global rank loaded (`pp_rank * tp + tp_rank`)."""

    @property
    def device(self) -> str:
        """Where the bytes went: "cpu" or "cuda:N"."""

    @property
    def tensors(self) -> int:
        """How many tensors were filled."""

    @property
    def bytes(self) -> int:
        """The bytes of all the rank's tensors."""

    @property
    def seconds(self) -> float:
        """Wall time of the whole load."""

    @property
    def gbps(self) -> float:
        """`bytes` over `transfer_s + sync_s`, in GB/s."""

    @property
    def io(self) -> Literal["buffered", "direct", "mmap"]:
        """The read mode used (`io="auto"` chooses by page-cache residency)."""

    @property
    def io_why(self) -> str:
        """Why that mode, in a sentence: the residency `auto` saw, and with `auto` reading direct,
        the bytes other ranks read too, read through the page cache so that a node of ranks
        loading apart takes them from storage once."""

    @property
    def cache_s(self) -> float:
        """Measuring the page-cache residency that `io="auto"` decides by."""

    @property
    def transfer_s(self) -> float:
        """The engine's run: reading, converting, copying."""

    @property
    def sync_s(self) -> float:
        """Waiting for the last GPU copies to land (0 for host memory)."""

    @property
    def read_s(self) -> float:
        """Reading, summed over worker threads."""

    @property
    def convert_s(self) -> float:
        """Converting dtypes, summed over worker threads."""

    @property
    def copy_s(self) -> float:
        """Handing bytes to the destinations, summed over worker threads."""

    @property
    def bytes_read(self) -> int:
        """Bytes read from the source files (for an object store: fetched by ranged GETs), the
        direct reads among them, each byte counted once."""

    @property
    def direct_read_bytes(self) -> int:
        """Bytes read straight into the destinations or the staging slots."""

    @property
    def direct_read_s(self) -> float:
        """Seconds with at least one of those reads in progress."""

    @property
    def host_copy_bytes(self) -> int:
        """Bytes copied on the host: into host destinations, or into staging for a GPU."""

    @property
    def host_copy_s(self) -> float:
        """Seconds with at least one of those copies in progress."""

    @property
    def device_copy_s(self) -> float | None:
        """The GPU copies' time as CUDA events measured it; None for host memory."""

    @property
    def staging_wait_s(self) -> float | None:
        """Waiting for a staging slot whose copy had not landed (the GPU was the slower stage);
        None for host memory."""

    @property
    def staging_bytes(self) -> int | None:
        """Pinned memory held for staging; None for host memory."""

    @overload
    def __getitem__(self, key: Literal["device", "io", "io_why"], /) -> str: ...
    @overload
    def __getitem__(
        self,
        key: Literal[
            "rank",
            "tensors",
            "bytes",
            "bytes_read",
            "direct_read_bytes",
            "host_copy_bytes",
            "staging_bytes",
        ],
        /,
    ) -> int: ...
    @overload
    def __getitem__(
        self,
        key: Literal[
            "seconds",
            "gbps",
            "cache_s",
            "transfer_s",
            "sync_s",
            "read_s",
            "convert_s",
            "copy_s",
            "direct_read_s",
            "host_copy_s",
            "device_copy_s",
            "staging_wait_s",
        ],
        /,
    ) -> float: ...
    @overload
    def __getitem__(self, key: str, /) -> _Value: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...
    def keys(self) -> list[str]:
        """The keys, in order: the attributes' names, the CUDA figures' only for a GPU load."""

    def values(self) -> list[_Value]: ...
    def items(self) -> list[tuple[str, _Value]]: ...
    @overload
    def get(self, key: str, /) -> _Value | None: ...
    @overload
    def get(self, key: str, default: _T, /) -> _Value | _T: ...
    def to_dict(self) -> LoadReportDict:
        """The report as the dict `Plan.load` used to return (for `json.dumps`, say)."""

@final
class Plan:
    """A source planned for a TP × PP layout: what every rank holds, and how to fill it."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def expert_parallel(self) -> bool: ...
    @property
    def dtype(self) -> str:
        """The model's dtype as wload spells it ("BF16")."""

    @property
    def architecture(self) -> str: ...
    @property
    def root(self) -> str:
        """The resolved folder the tensors are read from."""

    @property
    def kind(self) -> Literal["checkpoint", "pre-sharded"]:
        """"checkpoint" or "pre-sharded"."""

    @property
    def warnings(self) -> list[str]:
        """What `wload load` would warn about (a pre-sharded file's dtype that vLLM converts, ...)."""

    @property
    def note(self) -> str | None:
        """Options taken from a pre-sharded folder's wload.json, in a sentence; None otherwise."""

    def tensors(self, rank: int) -> list[Tensor]:
        """Rank `rank`'s tensors, in the plan's order."""

    def load(
        self,
        rank: int,
        dests: dict[str, int],
        device: str = "cpu",
        device_index: int | None = None,
        stream: int = 0,
        io: str = "auto",
    ) -> LoadReport:
        """Reads rank `rank`'s tensors into `dests` (name → address of a writable, contiguous buffer
        of exactly the tensor's nbytes): host memory with device "cpu", memory of GPU
        `device_index` with device "cuda" (or "cuda:N"), the copies queued on `stream` (torch's
        `current_stream().cuda_stream`; 0 is the legacy default stream) and landed when this
        returns. Unsafe like any raw-pointer API: the caller guarantees the sizes and keeps the
        buffers alive and untouched until this returns."""

def plan(
    source: _Path,
    tp: int | None = 1,
    pp: int | None = 1,
    expert_parallel: bool = False,
    dtype: str | None = "auto",
    hf_overrides: dict[str, Any] | str | None = None,
    revision: str | None = None,
    download_dir: _Path | None = None,
    language_model_only: bool = False,
    mm_encoder_tp_mode: str = "weights",
    pp_partition: str | Sequence[int] | None = None,
    config_format: str = "auto",
    moe_backend: str | None = None,
    load_format: str = "auto",
    mapping: _Path | None = None,
) -> Plan:
    """Resolves and plans `source` as `wload load` does: a checkpoint folder or hub repo id is
    planned for the layout, a pre-sharded folder (wload's or vLLM's) is checked against it and
    its files copied whole. `tp`, `pp` and `dtype` may be None to take a pre-sharded folder's
    recorded values."""

def fetch(
    source: _Path,
    revision: str | None = None,
    download_dir: _Path | None = None,
    config_format: str = "auto",
    load_format: str = "auto",
) -> str:
    """The local folder vLLM reads `source`'s config and tokenizer from: a folder as it is; for an
    object-store URL (`s3://`, `gs://`, `az://`) or a hub repo id, the cache folder `plan` reads
    it through, with its config, index and side files (tokenizer, generation config, chat
    template, ...) fetched into it. Of the weight files only the headers are fetched: the weights
    stay where they are, for `Plan.load` to read by range. The folder is what vLLM's
    `--load-format runai_streamer` pulls with the Run:ai streamer (config/model.py:1204-1248)."""

# The console script's body (wload/_cli.py), not re-exported by `wload`.
__all__ += ["main"]

def main(argv: list[str]) -> int:
    """Runs the command line `argv` (the program's name first, as `sys.argv`) as the `wload`
    binary would, writing to the process's stdout and stderr, and returns its exit status. Once
    per process, and only from the console script: it may install wload's own SIGINT, SIGTERM
    and SIGHUP handlers, and a second signal ends the process."""
