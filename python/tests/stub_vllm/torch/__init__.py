"""A fake `torch` for the plugin tests (python/tests/test_plugin.py): just what
wload/vllm_plugin.py and vLLM's `_filter_subtensors` call, over numpy memory.

A tensor is a byte array (its storage), a byte offset into it, a shape, strides in elements and a
dtype, so that `data_ptr()`, `narrow`, `is_contiguous` and `copy_` behave as torch's do on the CPU:
the plugin hands `data_ptr()` to wload's engine, which writes real bytes there, and the tests read
those bytes back. A tensor on the meta device has no memory: its addresses are 0, as torch's are,
which is what makes vLLM's `_filter_subtensors` drop such tensors as views of one another.

Only the CPU and meta devices exist here: anything else (CUDA) fails loudly rather than pretending.
"""

import numpy as _np

__all__ = ["Tensor", "device", "dtype", "empty"]


class dtype:
    """A torch dtype: its name (`torch.bfloat16`) and its size in bytes."""

    def __init__(self, name, itemsize):
        self.name = name
        self.itemsize = itemsize

    def __repr__(self):
        return f"torch.{self.name}"

    __str__ = __repr__


bfloat16 = dtype("bfloat16", 2)
float16 = dtype("float16", 2)
half = float16
float32 = dtype("float32", 4)
float64 = dtype("float64", 8)
int8 = dtype("int8", 1)
uint8 = dtype("uint8", 1)
int16 = dtype("int16", 2)
int32 = dtype("int32", 4)
int64 = dtype("int64", 8)
bool = dtype("bool", 1)  # torch.bool: the builtin is not used below
float8_e4m3fn = dtype("float8_e4m3fn", 1)
float8_e5m2 = dtype("float8_e5m2", 1)
float8_e8m0fnu = dtype("float8_e8m0fnu", 1)

_default_dtype = float32


class device:
    """`torch.device("cpu")`, `torch.device("meta")`, `torch.device("cuda", 0)`."""

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if ":" in type:
            type, i = type.split(":", 1)
            index = int(i)
        self.type = type
        self.index = index

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        index = f", index={self.index}" if self.index is not None else ""
        return f"device(type='{self.type}'{index})"


def _contiguous_strides(shape):
    strides, n = [], 1
    for s in reversed(shape):
        strides.append(n)
        n *= s
    return tuple(reversed(strides))


class _Storage:
    def __init__(self, ptr):
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr


class Tensor:
    def __init__(self, buf, offset, shape, strides, dt, dev):
        self._buf = buf  # numpy uint8 array, or None on the meta device
        self._offset = offset  # bytes
        self.shape = tuple(shape)
        self._strides = tuple(strides)  # elements
        self.dtype = dt
        self.device = dev

    # -- what the plugin and vLLM's code read --
    @property
    def data(self):
        return self

    def dim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return self.dtype.itemsize

    def stride(self):
        return self._strides

    def untyped_storage(self):
        return _Storage(0 if self._buf is None else self._buf.ctypes.data)

    def data_ptr(self):
        # On the meta device torch adds the offset to a null base: 0 for a whole tensor.
        return (0 if self._buf is None else self._buf.ctypes.data) + self._offset

    def is_contiguous(self):
        # As torch: dimensions of size 1 have any stride.
        want = _contiguous_strides(self.shape)
        return all(s == 1 or a == b for s, a, b in zip(self.shape, self._strides, want))

    def narrow(self, dim, start, length):
        if not 0 <= start <= start + length <= self.shape[dim]:
            raise IndexError(f"narrow({dim}, {start}, {length}) out of {self.shape}")
        shape = list(self.shape)
        shape[dim] = length
        offset = self._offset + start * self._strides[dim] * self.dtype.itemsize
        return Tensor(self._buf, offset, shape, self._strides, self.dtype, self.device)

    def view(self, *shape):
        if shape != (-1,):
            raise NotImplementedError("the fake torch views only as view(-1)")
        if not self.is_contiguous():
            raise RuntimeError("view size is not compatible with input tensor's size and stride")
        return Tensor(self._buf, self._offset, (self.numel(),), (1,), self.dtype, self.device)

    def __getitem__(self, i):
        if self.dim() != 1 or not isinstance(i, int):
            raise NotImplementedError("the fake torch indexes 1-D tensors by one int only")
        i = i + self.shape[0] if i < 0 else i
        off = self._offset + i * self._strides[0] * self.dtype.itemsize
        return Tensor(self._buf, off, (), (), self.dtype, self.device)

    def detach(self):
        return self

    def copy_(self, src):
        if (src.dtype, src.shape) != (self.dtype, self.shape):
            raise RuntimeError(
                f"the fake torch copies like to like: {src.dtype} {src.shape} into "
                f"{self.dtype} {self.shape}"
            )
        self._bytes_view()[...] = src._bytes_view()
        return self

    # -- for the tests --
    def _bytes_view(self):
        """A numpy view of this tensor's bytes: shape + (itemsize,)."""
        if self._buf is None:
            raise RuntimeError("a tensor on the meta device has no data")
        size = self.dtype.itemsize
        return _np.lib.stride_tricks.as_strided(
            self._buf[self._offset:],
            shape=self.shape + (size,),
            strides=tuple(s * size for s in self._strides) + (1,),
            writeable=True,
        )

    def tobytes(self):
        """The bytes, in logical (row-major) order."""
        return self._bytes_view().tobytes()

    def __repr__(self):
        return f"tensor(shape={list(self.shape)}, dtype={self.dtype}, device={self.device})"


def empty(*size, dtype=None, device=None):
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    dt = dtype or _default_dtype
    dev = globals()["device"](device or "cpu")
    n = 1
    for s in shape:
        n *= s
    if dev.type == "meta":
        buf = None
    elif dev.type == "cpu":
        # At least one byte, so that even an empty tensor has an address of its own.
        buf = _np.empty(max(n * dt.itemsize, 1), dtype=_np.uint8)
    else:
        raise RuntimeError(f"the fake torch has no {dev.type} memory")
    return Tensor(buf, 0, shape, _contiguous_strides(shape), dt, dev)

