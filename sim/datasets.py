"""Datasets for xnortrain: file readers, loaders, preprocessing and minibatching.

Everything here is plain NumPy; no downloads happen. Four datasets are known:

``mnist``
    IDX files (gzip or raw). A 22,699-image training subset of MNIST plus the
    official 10,000-image test set is vendored in ``sim/data/mnist`` (see the
    ``ATTRIBUTION.md`` there) and is used when no path is given. Point ``path``
    at a folder with the official files to train on the full 60,000 images.
``fashion_mnist``
    Same IDX layout and file names as MNIST; not vendored.
``cifar10``
    The *binary* CIFAR-10 distribution (``data_batch_1.bin`` .. ``data_batch_5.bin``,
    ``test_batch.bin``); not vendored.
``svhn``
    SVHN cropped digits (``train_32x32.mat``, ``test_32x32.mat``); not vendored.
    Read with ``scipy.io.loadmat`` (:func:`read_mat`; the ``datasets`` extra).

All loaders return a :class:`Dataset` with images as ``uint8 [N, C, H, W]`` and
labels as ``int64 [N]``. :func:`preprocess` turns the images into what the trainer
or the hardware consumes; :func:`batches` and :func:`split_dev` draw all their
randomness from a caller-supplied :class:`numpy.random.Generator`.

Every problem with a file raises :class:`DatasetError` (a :class:`ValueError`)
whose message names the file and says what is wrong with it.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

__all__ = [
    "DatasetError",
    "Dataset",
    "DATASETS",
    "VENDORED_MNIST_DIR",
    "read_idx",
    "write_idx",
    "read_mat",
    "load_mnist",
    "load_cifar10",
    "load_svhn",
    "load_dataset",
    "preprocess",
    "PREPROCESS_MODES",
    "batches",
    "split_dev",
]

VENDORED_MNIST_DIR = Path(__file__).resolve().parent / "data" / "mnist"

DATASETS = ("mnist", "fashion_mnist", "cifar10", "svhn")

MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch.bin"
SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}

DIGIT_CLASSES = tuple(str(i) for i in range(10))
FASHION_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip


class DatasetError(ValueError):
    """A dataset file is missing, malformed, or inconsistent with its partner file."""


@dataclass(frozen=True, repr=False)
class Dataset:
    """Images and labels of one dataset, split into train and test.

    ``x_*`` are ``uint8 [N, C, H, W]``; ``y_*`` are ``int64 [N]`` in ``0 .. len(classes)-1``.
    ``source`` says where the data came from (and, for the vendored MNIST, that the
    training set is a subset), so reports can state which training set a figure used.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str
    classes: tuple[str, ...]
    source: str

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one image."""
        return tuple(int(d) for d in self.x_train.shape[1:])

    def take(self, train_limit: int = 0, test_limit: int = 0) -> Dataset:
        """The first ``train_limit`` / ``test_limit`` images of each split (0 keeps the whole split)."""
        for what, n in (("train_limit", train_limit), ("test_limit", test_limit)):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise ValueError(f"{what} = {n!r}: expected an integer >= 0 (0 = all)")
        tr = slice(None) if train_limit == 0 else slice(0, int(train_limit))
        te = slice(None) if test_limit == 0 else slice(0, int(test_limit))
        note = []
        if train_limit and train_limit < len(self.x_train):
            note.append(f"first {train_limit} train")
        if test_limit and test_limit < len(self.x_test):
            note.append(f"first {test_limit} test")
        source = self.source + (f" [limited to {', '.join(note)}]" if note else "")
        return replace(
            self,
            x_train=self.x_train[tr],
            y_train=self.y_train[tr],
            x_test=self.x_test[te],
            y_test=self.y_test[te],
            source=source,
        )

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, train={len(self.x_train)}, test={len(self.x_test)}, "
            f"input_shape={self.input_shape}, classes={self.num_classes}, source={self.source!r})"
        )


# --------------------------------------------------------------------------- IDX

_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_NAMES = {0x08: "ubyte", 0x09: "byte", 0x0B: "short", 0x0C: "int", 0x0D: "float", 0x0E: "double"}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_maybe_gzip(path: Path) -> bytes:
    """File contents, gunzipped when the file starts with the gzip magic (whatever its name)."""
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except EOFError as e:
        raise DatasetError(
            f"{path}: gzip stream ends before its end marker (truncated download?); "
            f"the file is {len(raw)} bytes compressed"
        ) from e
    except (OSError, zlib.error) as e:
        raise DatasetError(f"{path}: corrupt gzip data ({e}); re-download the file") from e


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST / Fashion-MNIST format), gzip-compressed or raw.

    Compression is detected from the first two bytes, not from the file name. The
    header is ``00 00 <type> <ndim>`` followed by ``ndim`` big-endian uint32 sizes;
    type codes 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float, 0x0E double.
    Returns a writable array of that shape in native byte order.

    Raises :class:`DatasetError` on a bad magic number, an unknown type code, no or
    zero-size dimensions, a header or data section shorter than declared
    (truncation), bytes past the declared data, or corrupt gzip data.
    """
    path = Path(path)
    data = _read_maybe_gzip(path)
    if len(data) < 4:
        raise DatasetError(f"{path}: only {len(data)} bytes, too short for the 4-byte IDX magic number")
    if data[0] != 0 or data[1] != 0:
        raise DatasetError(
            f"{path}: bad magic number 0x{data[:4].hex()}: an IDX file starts with two zero bytes "
            f"(not an IDX file, or a different format)"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_TYPES:
        known = ", ".join(f"0x{c:02X} {n}" for c, n in _IDX_NAMES.items())
        raise DatasetError(
            f"{path}: bad magic number 0x{data[:4].hex()}: unknown data type code 0x{code:02X} (known: {known})"
        )
    if ndim == 0:
        raise DatasetError(f"{path}: magic number 0x{data[:4].hex()} declares 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DatasetError(
            f"{path}: header declares {ndim} dimensions ({header_len} header bytes) but the file has "
            f"only {len(data)} bytes (truncated?)"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    shape_txt = "x".join(str(d) for d in dims)
    if 0 in dims:
        raise DatasetError(f"{path}: header declares shape {shape_txt}; dimension {dims.index(0)} is zero")
    dtype = _IDX_TYPES[code]
    expected = math.prod(dims) * dtype.itemsize
    present = len(data) - header_len
    what = (
        f"{shape_txt} = {expected} bytes"
        if dtype.itemsize == 1
        else (f"{shape_txt} {_IDX_NAMES[code]} ({dtype.itemsize} bytes each) = {expected} bytes")
    )
    if present < expected:
        raise DatasetError(f"{path}: header says {what} of data but only {present} are present (truncated?)")
    if present > expected:
        raise DatasetError(
            f"{path}: header says {what} of data but {present} are present: {present - expected} "
            f"trailing bytes (wrong header, or several files joined together?)"
        )
    arr = np.frombuffer(data, dtype=dtype, count=math.prod(dims), offset=header_len)
    return arr.astype(dtype.newbyteorder("="), copy=True).reshape(dims)


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file; gzip it when ``compress`` is true (default: name ends in ``.gz``).

    Handy for making subsets or test fixtures that :func:`read_idx` and the loaders accept.
    The gzip header carries no timestamp, so equal arrays give byte-identical files.
    """
    path = Path(path)
    array = np.asarray(array)
    codes = {np.dtype(d).newbyteorder("="): c for c, d in _IDX_TYPES.items()}
    key = array.dtype.newbyteorder("=")
    if key not in codes:
        raise ValueError(
            f"write_idx: dtype {array.dtype} has no IDX type code (use uint8, int8, int16, int32, float32 or float64)"
        )
    if array.ndim == 0 or array.ndim > 255 or 0 in array.shape:
        raise ValueError(f"write_idx: shape {array.shape} cannot be stored (need 1..255 non-zero dimensions)")
    code = codes[key]
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + np.ascontiguousarray(array, dtype=_IDX_TYPES[code]).tobytes()
    if compress is None:
        compress = path.name.endswith(".gz")
    if compress:
        payload = gzip.compress(payload, mtime=0)
    path.write_bytes(payload)
    return path


# --------------------------------------------------------------------------- MNIST / Fashion-MNIST


def _find_idx_file(folder: Path, stem: str) -> Path | None:
    # The official names, gzipped or not, and the "train-images.idx3-ubyte" spelling some mirrors use.
    dotted = stem.replace("-idx", ".idx")
    for name in (stem + ".gz", stem, dotted + ".gz", dotted):
        p = folder / name
        if p.is_file():
            return p
    return None


def _check_folder(path, dataset: str, expected: list[str]) -> Path:
    folder = Path(path).expanduser()
    if not folder.exists():
        raise DatasetError(f"{dataset}: {folder} does not exist; expected a folder containing {', '.join(expected)}")
    if not folder.is_dir():
        raise DatasetError(f"{dataset}: {folder} is a file; pass the folder that contains {', '.join(expected)}")
    return folder


def _check_pair(dataset, x, y, x_path, y_path, num_classes):
    if len(x) != len(y):
        raise DatasetError(
            f"{dataset}: {x_path.name} holds {len(x)} images but {y_path.name} holds {len(y)} labels; "
            f"the two files do not belong together"
        )
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        bad = int(np.flatnonzero((y < 0) | (y >= num_classes))[0])
        raise DatasetError(
            f"{dataset}: {y_path.name}: label {int(y[bad])} at index {bad} is outside 0..{num_classes - 1}"
        )


def load_mnist(path: str | os.PathLike | None = None, kind: str = "mnist") -> Dataset:
    """Load MNIST or Fashion-MNIST from a folder of the four standard IDX files.

    The files may be gzipped (``*.gz``) or not. ``path=None`` loads the vendored MNIST
    (22,699 training images: the first 22,699 of the official 60,000; the full official
    10,000-image test set). ``kind`` is ``"mnist"`` or ``"fashion_mnist"``; the latter
    has no vendored copy and needs ``path``.
    """
    if kind not in ("mnist", "fashion_mnist"):
        raise DatasetError(f"load_mnist: kind = {kind!r}; expected 'mnist' or 'fashion_mnist'")
    expected = [stem + "[.gz]" for stem in MNIST_FILES.values()]
    vendored = False
    if path is None or str(path) == "":
        if kind != "mnist":
            raise DatasetError(
                f"{kind} is not bundled with xnortrain; pass the folder that contains {', '.join(expected)}"
            )
        path, vendored = VENDORED_MNIST_DIR, True
    folder = _check_folder(path, kind, expected)
    found = {key: _find_idx_file(folder, stem) for key, stem in MNIST_FILES.items()}
    missing = [stem + "[.gz]" for key, stem in MNIST_FILES.items() if found[key] is None]
    if missing:
        raise DatasetError(f"{kind}: {folder} lacks {', '.join(missing)} (expected all of {', '.join(expected)})")

    arrays = {}
    for key, p in found.items():
        a = read_idx(p)
        want_ndim = 3 if key.startswith("x") else 1
        if a.dtype != np.uint8 or a.ndim != want_ndim:
            what = "images [N, H, W]" if want_ndim == 3 else "labels [N]"
            raise DatasetError(f"{p}: holds {a.dtype} data of shape {a.shape}; expected unsigned-byte {what}")
        arrays[key] = a
    for split in ("train", "test"):
        _check_pair(kind, arrays[f"x_{split}"], arrays[f"y_{split}"], found[f"x_{split}"], found[f"y_{split}"], 10)
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DatasetError(
            f"{kind}: training images are {arrays['x_train'].shape[1:]} but test images are "
            f"{arrays['x_test'].shape[1:]}"
        )

    n_train = len(arrays["x_train"])
    if vendored:
        source = (
            f"vendored MNIST subset in {folder}: the first {n_train} of the official 60,000 training "
            f"images and the official {len(arrays['x_test'])} test images"
        )
    else:
        source = f"{kind} IDX files in {folder} ({n_train} train, {len(arrays['x_test'])} test)"
    return Dataset(
        x_train=arrays["x_train"][:, None],
        y_train=arrays["y_train"].astype(np.int64),
        x_test=arrays["x_test"][:, None],
        y_test=arrays["y_test"].astype(np.int64),
        name=kind,
        classes=DIGIT_CLASSES if kind == "mnist" else FASHION_CLASSES,
        source=source,
    )


# --------------------------------------------------------------------------- CIFAR-10

_CIFAR_RECORD = 1 + 3 * 32 * 32


def _read_cifar_batch(p: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = p.read_bytes()
    if len(raw) == 0:
        raise DatasetError(f"cifar10: {p} is empty")
    whole, rest = divmod(len(raw), _CIFAR_RECORD)
    if rest:
        hint = ""
        if len(raw) % (_CIFAR_RECORD + 1) == 0:
            hint = "; the size fits 3074-byte records, i.e. the CIFAR-100 binary format (2 label bytes)"
        raise DatasetError(
            f"cifar10: {p}: {len(raw)} bytes is not a whole number of {_CIFAR_RECORD}-byte records "
            f"(1 label byte + 3072 pixel bytes): {whole} records and {rest} bytes left over "
            f"(truncated or not the CIFAR-10 binary version?){hint}"
        )
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(whole, _CIFAR_RECORD)
    y = rec[:, 0].astype(np.int64)
    if y.max() > 9:
        bad = int(np.flatnonzero(y > 9)[0])
        raise DatasetError(f"cifar10: {p}: record {bad} has label byte {int(y[bad])}; expected 0..9")
    # Each record stores the red, green and blue 32x32 planes in turn, rows first: already C, H, W.
    x = rec[:, 1:].reshape(whole, 3, 32, 32).copy()
    return x, y


def load_cifar10(path: str | os.PathLike) -> Dataset:
    """Load the binary version of CIFAR-10 from a folder.

    The folder holds ``data_batch_1.bin`` .. ``data_batch_5.bin`` and ``test_batch.bin``
    (each record: 1 label byte, then 1024 red, 1024 green, 1024 blue bytes). The
    ``cifar-10-batches-bin`` folder the archive unpacks to may also be given by its parent.
    """
    names = [*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE]
    folder = _check_folder(path, "cifar10", names)
    if not (folder / CIFAR10_TEST_FILE).is_file() and (folder / "cifar-10-batches-bin").is_dir():
        folder = folder / "cifar-10-batches-bin"
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        hint = ""
        if (folder / "data_batch_1").is_file() or (folder / "cifar-10-batches-py").is_dir():
            hint = " (this looks like the Python/pickle version; the binary version is needed)"
        raise DatasetError(f"cifar10: {folder} lacks {', '.join(missing)}{hint}; expected {', '.join(names)}")
    train = [_read_cifar_batch(folder / n) for n in CIFAR10_TRAIN_FILES]
    x_test, y_test = _read_cifar_batch(folder / CIFAR10_TEST_FILE)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return Dataset(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        name="cifar10",
        classes=CIFAR10_CLASSES,
        source=f"CIFAR-10 binary batches in {folder} ({len(x_train)} train, {len(x_test)} test)",
    )


# --------------------------------------------------------------------------- MAT v5 (for SVHN)

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
#: What a skipped variable is, by the type SciPy reads it as (numeric arrays are kept).
_MAT_KINDS = {"U": "char", "S": "char", "O": "cell", "V": "struct"}


def read_mat(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read the numeric arrays of a MATLAB v5 (``-v6`` / ``-v7``) MAT-file with ``scipy.io.loadmat`` (the
    ``datasets`` extra: SVHN is the only dataset in this format, and a board never reads it).

    Arrays come back in MATLAB's shape and type (``X(i,j,k)`` is ``arr[i-1, j-1, k-1]``, no squeezing). Cell
    arrays, structs, strings, sparse matrices and the like are skipped; asking :func:`load_svhn` for one gives an
    error naming its class. HDF5-based v7.3 files and files SciPy cannot read are refused in one line naming the file.
    """
    return _read_mat(Path(path))[0]


def _read_mat(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """:func:`read_mat`, plus the names and classes of the variables it skipped."""
    with open(path, "rb") as fh:
        head = fh.read(520)
    if head.startswith(_HDF5_MAGIC) or head[512:520] == _HDF5_MAGIC:
        raise DatasetError(
            f"{path}: this is a MATLAB v7.3 (HDF5) MAT-file, which this reader does not "
            f"handle; re-save it with save(..., '-v7')"
        )
    try:
        from scipy.io import loadmat
    except ImportError:
        raise DatasetError(f"{path}: reading a MAT-file needs SciPy: pip install 'xnortrain[datasets]'") from None
    try:
        raw = loadmat(path, squeeze_me=False, chars_as_strings=False, mat_dtype=False)
    except Exception as e:  # noqa: BLE001 (SciPy raises ValueError, TypeError, zlib.error, ... on a damaged file)
        raise DatasetError(f"{path}: not a readable MAT v5 file ({type(e).__name__}: {e})") from None
    out: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    for name, value in raw.items():
        if name.startswith("__"):  # the header, version and globals SciPy adds
            continue
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
            out[name] = value
        else:
            kind = getattr(value, "dtype", None)
            skipped[name] = _MAT_KINDS.get(kind.kind, str(kind)) if kind is not None else type(value).__name__
    return out, skipped


# --------------------------------------------------------------------------- SVHN


def _svhn_split(p: Path) -> tuple[np.ndarray, np.ndarray]:
    mat, skipped = _read_mat(p)
    for var in ("X", "y"):
        if var not in mat:
            extra = f" ({var!r} is a {skipped[var]}, not a numeric array)" if var in skipped else ""
            raise DatasetError(f"svhn: {p}: no numeric variable {var!r}{extra}; found {sorted(mat) or 'none'}")
    X, y = mat["X"], mat["y"]
    if X.ndim != 4 or X.shape[2] != 3:
        raise DatasetError(f"svhn: {p}: X has shape {X.shape}; expected [height, width, 3, N]")
    n = X.shape[3]
    if y.size != n or (y.ndim == 2 and 1 not in y.shape) or y.ndim > 2:
        raise DatasetError(f"svhn: {p}: X holds {n} images but y has shape {y.shape}; expected [{n}, 1]")
    if X.dtype != np.uint8:
        if np.iscomplexobj(X) or not np.all((X >= 0) & (X <= 255) & (X == np.round(X))):
            raise DatasetError(f"svhn: {p}: X is {X.dtype} with values that are not whole numbers 0..255")
        X = X.astype(np.uint8)
    y = y.reshape(-1)
    if np.iscomplexobj(y) or not np.all((y == np.round(y)) & (y >= 0) & (y <= 10)):
        bad = int(np.flatnonzero(~((y == np.round(y)) & (y >= 0) & (y <= 10)))[0])
        raise DatasetError(
            f"svhn: {p}: label {y[bad].item():g} at index {bad}; expected whole numbers 1..10 (10 stands for digit 0)"
        )
    y = y.astype(np.int64)
    y[y == 10] = 0
    x = np.ascontiguousarray(X.transpose(3, 2, 0, 1))  # [H, W, C, N] -> [N, C, H, W]
    return x, y


def load_svhn(path: str | os.PathLike) -> Dataset:
    """Load SVHN cropped digits (format 2) from a folder with ``train_32x32.mat`` and ``test_32x32.mat``.

    In the files ``X`` is ``[32, 32, 3, N]`` and ``y`` is ``[N, 1]`` with 10 meaning the
    digit 0; the result has images ``[N, 3, 32, 32]`` and labels 0..9 (digit = label).
    The optional ``extra_32x32.mat`` is not loaded.
    """
    names = list(SVHN_FILES.values())
    folder = _check_folder(path, "svhn", names)
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DatasetError(
            f"svhn: {folder} lacks {', '.join(missing)}; expected {', '.join(names)} "
            f"(the cropped-digits 'format 2' files)"
        )
    x_train, y_train = _svhn_split(folder / SVHN_FILES["train"])
    x_test, y_test = _svhn_split(folder / SVHN_FILES["test"])
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetError(f"svhn: training images are {x_train.shape[1:]} but test images are {x_test.shape[1:]}")
    return Dataset(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        name="svhn",
        classes=DIGIT_CLASSES,
        source=f"SVHN cropped digits in {folder} ({len(x_train)} train, {len(x_test)} test)",
    )


# --------------------------------------------------------------------------- dispatch


def load_dataset(name: str, path: str | os.PathLike | None = None) -> Dataset:
    """Load a dataset by name: ``mnist``, ``fashion_mnist``, ``cifar10`` or ``svhn``.

    ``path`` is the folder with the dataset's files; ``None`` or ``""`` means the vendored
    copy, which exists for ``mnist`` only.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if key in ("mnist", "fashion_mnist"):
        return load_mnist(path, kind=key)
    if path is None or str(path) == "":
        files = {
            "cifar10": ", ".join([*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE]) + " (the CIFAR-10 binary version)",
            "svhn": ", ".join(SVHN_FILES.values()) + " (SVHN cropped digits)",
        }[key]
        raise DatasetError(f"{key} is not bundled with xnortrain; give the path of a folder containing {files}")
    return load_cifar10(path) if key == "cifar10" else load_svhn(path)


# --------------------------------------------------------------------------- preprocessing

PREPROCESS_MODES = ("pm1", "binarize", "uint8", "int8")


def binarize_dithered(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``uint8`` images -> float32 +-1 with a fresh random threshold per pixel (``data.dither``).

    Each pixel is compared with its own threshold drawn uniformly from the levels 1..254: ``+1`` where
    ``x >= t``. A pixel of level ``x`` is +1 with probability ``x / 254`` (0 stays -1, 254 and 255 stay
    +1), so the expected input keeps the grey levels that a fixed threshold throws away. Used for training
    batches only; evaluation binarises with the fixed ``data.binarize_threshold``.
    """
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"binarize_dithered: expected uint8 images, got {x.dtype}")
    t = rng.integers(1, 255, size=x.shape, dtype=np.uint8)
    return np.where(x >= t, 1.0, -1.0).astype(np.float32)


def preprocess(x: np.ndarray, mode: str, threshold: float = 0.5) -> np.ndarray:
    """Turn ``uint8`` images into network input.

    ``"pm1"``
        float32 in [-1, 1]: ``x / 127.5 - 1`` (0 -> -1, 255 -> +1).
    ``"binarize"``
        float32 +-1: ``+1`` where ``x / 255 >= threshold``, else ``-1``. ``threshold`` is on
        the [0, 1] pixel scale; it is only used by this mode but is checked for every mode.
    ``"uint8"`` / ``"int8"``
        The hardware's 8-bit input path: the pixel re-centred on zero, ``x - 128``, as
        int16 with values in [-128, 127]. The values fit int8 exactly (``.astype(np.int8)``
        is lossless); int16 leaves headroom for arithmetic on them. Both names give the same result.

    The output has the input's shape; the input is not modified.
    """
    if mode not in PREPROCESS_MODES:
        raise ValueError(f"preprocess: unknown mode {mode!r}; choose one of {', '.join(PREPROCESS_MODES)}")
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float, np.integer, np.floating))
        or not (0.0 <= float(threshold) <= 1.0)
    ):
        raise ValueError(f"preprocess: threshold = {threshold!r}; expected a number in [0, 1] (pixel / 255)")
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"preprocess: expected uint8 images, got {x.dtype}")
    levels = np.arange(256)
    if mode == "pm1":
        lut = (levels / 127.5 - 1.0).astype(np.float32)
    elif mode == "binarize":
        lut = np.where(levels / 255.0 >= float(threshold), 1.0, -1.0).astype(np.float32)
    else:
        lut = (levels - 128).astype(np.int16)
    return lut[x]


# --------------------------------------------------------------------------- batching


def _check_xy(x, y, who):
    if len(x) != len(y):
        raise ValueError(f"{who}: x has {len(x)} samples but y has {len(y)}")


def _check_rng(rng, who):
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{who}: rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng).__name__}"
        )


def batches(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    rng: np.random.Generator | None,
    drop_last: bool = True,
    shuffle: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Minibatches ``(x[idx], y[idx])`` for one pass over the data.

    With ``shuffle`` the order is one ``rng.permutation`` drawn when this function is
    called (not when iteration starts), so the same generator state gives the same
    batches. ``rng`` may be ``None`` only when ``shuffle`` is false. With ``drop_last``
    a final partial batch is left out, and asking for a batch larger than the data is
    an error (it would silently yield nothing).
    """
    _check_xy(x, y, "batches")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batches: batch_size = {batch_size!r}; expected a positive integer")
    n = len(x)
    if drop_last and batch_size > n:
        raise ValueError(
            f"batches: batch_size {batch_size} is larger than the {n} samples and drop_last "
            f"is set, so there would be no batch"
        )
    if shuffle:
        _check_rng(rng, "batches")
        order = rng.permutation(n)
    else:
        order = np.arange(n)
    stop = n - n % batch_size if drop_last else n

    def gen():
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield x[idx], y[idx]

    return gen()


def split_dev(
    x: np.ndarray, y: np.ndarray, dev_size: int | float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hold out a random development subset: returns ``(x_train, y_train, x_dev, y_dev)``.

    ``dev_size`` is a number of samples (``0`` holds out nothing) or a fraction in (0, 1).
    Which samples go to dev is chosen with ``rng``; both parts keep the original order.
    """
    _check_xy(x, y, "split_dev")
    n = len(x)
    if isinstance(dev_size, bool):
        raise ValueError(f"split_dev: dev_size = {dev_size!r}; expected a count or a fraction")
    if isinstance(dev_size, (int, np.integer)):
        k = int(dev_size)
    elif isinstance(dev_size, (float, np.floating)) and 0.0 < dev_size < 1.0:
        k = int(round(dev_size * n))
    else:
        raise ValueError(f"split_dev: dev_size = {dev_size!r}; expected a count 0..{n - 1} or a fraction in (0, 1)")
    if not 0 <= k < n:
        raise ValueError(f"split_dev: dev_size {dev_size!r} leaves no training data ({n} samples in all)")
    _check_rng(rng, "split_dev")
    dev_mask = np.zeros(n, dtype=bool)
    dev_mask[rng.permutation(n)[:k]] = True
    return x[~dev_mask], y[~dev_mask], x[dev_mask], y[dev_mask]
