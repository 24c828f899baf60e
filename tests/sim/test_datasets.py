"""Tests of sim.datasets: IDX / CIFAR-10 / MAT v5 readers, loaders, preprocessing, batching.

Every fixture file is written here with small writers of our own (struct + zlib + gzip),
independent of the writer in sim.datasets, so a reader bug is not mirrored by the fixture.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from sim import datasets as ds
from sim.datasets import DatasetError

# ----------------------------------------------------------------------------- writers used by the tests

_IDX_CODES = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}


def idx_bytes(arr: np.ndarray) -> bytes:
    kind = arr.dtype.str[1:]
    head = bytes([0, 0, _IDX_CODES[kind], arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return head + arr.astype(">" + kind).tobytes()


def write_file(path: Path, payload: bytes, gz: bool) -> Path:
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def write_mnist_dir(folder: Path, n_train=6, n_test=4, gz=True, rng=None, labels=None):
    rng = rng or np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    if labels is not None:
        data["y_train"] = np.asarray(labels, dtype=np.uint8)
    for key, stem in ds.MNIST_FILES.items():
        write_file(folder / (stem + (".gz" if gz else "")), idx_bytes(data[key]), gz)
    return data


def cifar_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    return b"".join(bytes([int(label)]) + img.tobytes() for img, label in zip(x, y, strict=True))


_MI = {"i1": 1, "u1": 2, "i2": 3, "u2": 4, "i4": 5, "u4": 6, "f4": 7, "f8": 9}
_MX = {"f8": 6, "f4": 7, "i1": 8, "u1": 9, "i2": 10, "u2": 11, "i4": 12, "u4": 13}


def mat_element(bo: str, mdtype: int, payload: bytes) -> bytes:
    n = len(payload)
    if n <= 4:  # MATLAB's small data element format
        return struct.pack(bo + "I", (n << 16) | mdtype) + payload.ljust(4, b"\0")
    return struct.pack(bo + "II", mdtype, n) + payload + b"\0" * (-n % 8)


def mat_variable(bo: str, name: str, arr, store_as: str | None = None, cls: int | None = None) -> bytes:
    arr = np.asarray(arr)
    kind = arr.dtype.str[1:]
    store = store_as or kind
    body = (
        mat_element(bo, 6, struct.pack(bo + "II", cls or _MX[kind], 0))
        + mat_element(bo, 5, struct.pack(bo + f"{arr.ndim}i", *arr.shape))
        + mat_element(bo, 1, name.encode())
        + mat_element(bo, _MI[store], arr.astype(bo + store if store[1] != "1" else store).tobytes(order="F"))
    )
    return struct.pack(bo + "II", 14, len(body)) + body


def write_mat(path: Path, variables: list[bytes], bo: str = "<", compress: bool = False) -> Path:
    text = b"MATLAB 5.0 MAT-file, written by the xnortrain tests".ljust(116, b" ")
    out = text + b"\0" * 8 + struct.pack(bo + "HH", 0x0100, 0x4D49)
    for v in variables:
        if compress:
            z = zlib.compress(v)
            out += struct.pack(bo + "II", 15, len(z)) + z
        else:
            out += v
    path.write_bytes(out)
    return path


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, dtype, gz):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((5, 3, 4)) * 100).astype(dtype)
    p = write_file(tmp_path / "a.idx", idx_bytes(arr), gz)  # compression detected without a .gz name
    out = ds.read_idx(p)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    assert out.shape == (5, 3, 4)
    np.testing.assert_array_equal(out, arr)
    out[0, 0, 0] = 7  # writable


def test_idx_raw_file_with_gz_name_is_read_raw(tmp_path):
    arr = np.arange(12, dtype=np.uint8)
    p = write_file(tmp_path / "labels.gz", idx_bytes(arr), gz=False)
    np.testing.assert_array_equal(ds.read_idx(p), arr)


def test_write_idx_matches_independent_writer(tmp_path):
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 3
    p = ds.write_idx(tmp_path / "x.idx", arr)
    assert p.read_bytes() == idx_bytes(arr)
    g = ds.write_idx(tmp_path / "x.idx.gz", arr)
    assert gzip.decompress(g.read_bytes()) == idx_bytes(arr)
    assert ds.write_idx(tmp_path / "y.idx.gz", arr).read_bytes() == g.read_bytes()  # no timestamp
    with pytest.raises(ValueError, match="no IDX type code"):
        ds.write_idx(tmp_path / "z.idx", np.zeros(3, dtype=np.uint16))


def test_dataset_error_is_value_error():
    assert issubclass(DatasetError, ValueError)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_truncated_names_file_and_sizes(tmp_path, gz):
    payload = bytes([0, 0, 8, 3]) + struct.pack(">3I", 60000, 28, 28) + bytes(1234)
    p = write_file(tmp_path / "train-images-idx3-ubyte.gz", payload, gz)
    with pytest.raises(DatasetError) as e:
        ds.read_idx(p)
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg
    assert "60000x28x28 = 47040000 bytes" in msg and "only 1234" in msg and "truncated" in msg


def test_idx_truncated_header(tmp_path):
    p = write_file(tmp_path / "h.idx", bytes([0, 0, 8, 3]) + struct.pack(">2I", 10, 28), gz=False)
    with pytest.raises(DatasetError, match=r"h\.idx: header declares 3 dimensions.*only 12 bytes.*truncated"):
        ds.read_idx(p)


def test_idx_float_truncation_mentions_item_size(tmp_path):
    arr = np.ones((3, 4), dtype=np.float32)
    p = write_file(tmp_path / "f.idx", idx_bytes(arr)[:-5], gz=False)
    with pytest.raises(DatasetError, match=r"3x4 float \(4 bytes each\) = 48 bytes of data but only 43"):
        ds.read_idx(p)


def test_idx_trailing_garbage(tmp_path):
    p = write_file(tmp_path / "t.idx", idx_bytes(np.zeros((2, 3), np.uint8)) + b"junk", gz=True)
    with pytest.raises(DatasetError, match=r"t\.idx: header says 2x3 = 6 bytes of data but 10 .*4 trailing bytes"):
        ds.read_idx(p)


@pytest.mark.parametrize(
    "head, pattern",
    [
        (b"\x01\x00\x08\x01", r"bad magic number 0x01000801.*two zero bytes"),
        (b"\x00\x00\x0a\x01", r"bad magic number 0x00000a01: unknown data type code 0x0A"),
        (b"PK\x03\x04", r"bad magic number 0x504b0304"),
    ],
)
def test_idx_bad_magic(tmp_path, head, pattern):
    p = write_file(tmp_path / "m.idx", head + struct.pack(">I", 4) + bytes(4), gz=False)
    with pytest.raises(DatasetError, match=r"m\.idx: " + pattern):
        ds.read_idx(p)


def test_idx_too_short_for_magic(tmp_path):
    p = write_file(tmp_path / "s.idx", b"\x00\x00", gz=False)
    with pytest.raises(DatasetError, match="too short"):
        ds.read_idx(p)


def test_idx_zero_dims(tmp_path):
    p = write_file(tmp_path / "z0.idx", bytes([0, 0, 8, 0]), gz=False)
    with pytest.raises(DatasetError, match=r"z0\.idx: .*declares 0 dimensions"):
        ds.read_idx(p)
    p = write_file(tmp_path / "z1.idx", bytes([0, 0, 8, 2]) + struct.pack(">2I", 5, 0), gz=False)
    with pytest.raises(DatasetError, match=r"z1\.idx: header declares shape 5x0; dimension 1 is zero"):
        ds.read_idx(p)


def test_idx_corrupt_and_truncated_gzip(tmp_path):
    good = gzip.compress(idx_bytes(np.arange(4000, dtype=np.int32)))
    bad = bytearray(good)
    bad[len(bad) // 2 : len(bad) // 2 + 16] = bytes(16)
    p = tmp_path / "c.gz"
    p.write_bytes(bytes(bad))
    with pytest.raises(DatasetError, match=r"c\.gz: corrupt gzip"):
        ds.read_idx(p)
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(DatasetError, match=r"c\.gz: gzip stream ends .*truncated"):
        ds.read_idx(p)


# ----------------------------------------------------------------------------- MNIST loaders


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_from_folder(tmp_path, gz):
    data = write_mnist_dir(tmp_path / "m", gz=gz)
    d = ds.load_mnist(tmp_path / "m")
    assert d.name == "mnist" and d.classes == tuple("0123456789") and d.num_classes == 10
    assert d.x_train.shape == (6, 1, 28, 28) and d.x_train.dtype == np.uint8
    assert d.x_test.shape == (4, 1, 28, 28) and d.input_shape == (1, 28, 28)
    assert d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.x_train[:, 0], data["x_train"])
    np.testing.assert_array_equal(d.y_test, data["y_test"])
    assert str(tmp_path / "m") in d.source and "vendored" not in d.source


def test_load_fashion_mnist_uses_same_names(tmp_path):
    write_mnist_dir(tmp_path / "f")
    d = ds.load_dataset("fashion_mnist", tmp_path / "f")
    assert d.name == "fashion_mnist" and d.classes[0] == "T-shirt/top" and d.classes[9] == "Ankle boot"
    assert ds.load_dataset("Fashion-MNIST", str(tmp_path / "f")).name == "fashion_mnist"


def test_load_mnist_count_mismatch(tmp_path):
    write_mnist_dir(tmp_path / "m", n_train=6)
    write_file(tmp_path / "m" / "train-labels-idx1-ubyte.gz", idx_bytes(np.zeros(5, np.uint8)), gz=True)
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte\.gz holds 6 images but "
                       r"train-labels-idx1-ubyte\.gz holds 5 labels"):  # fmt: skip
        ds.load_mnist(tmp_path / "m")


def test_load_mnist_label_out_of_range(tmp_path):
    write_mnist_dir(tmp_path / "m", labels=[1, 2, 3, 10, 4, 5])
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte\.gz: label 10 at index 3 is outside 0\.\.9"):
        ds.load_mnist(tmp_path / "m")


def test_load_mnist_wrong_kind_of_file(tmp_path):
    write_mnist_dir(tmp_path / "m")
    write_file(tmp_path / "m" / "t10k-labels-idx1-ubyte.gz", idx_bytes(np.zeros((4, 2), np.uint8)), gz=True)
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte\.gz: holds uint8 data of shape \(4, 2\)"):
        ds.load_mnist(tmp_path / "m")


def test_load_mnist_missing_files(tmp_path):
    write_mnist_dir(tmp_path / "m")
    (tmp_path / "m" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match=r"lacks t10k-labels-idx1-ubyte\[\.gz\]"):
        ds.load_mnist(tmp_path / "m")
    with pytest.raises(DatasetError, match="does not exist; expected a folder containing train-images"):
        ds.load_mnist(tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="is a file"):
        ds.load_mnist(tmp_path / "m" / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DatasetError, match=r"fashion_mnist is not bundled.*train-images-idx3-ubyte\[\.gz\]"):
        ds.load_dataset("fashion_mnist")


# ----------------------------------------------------------------------------- vendored MNIST

VENDORED_MD5 = {
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "train-images-idx3-ubyte.gz": "c38d27193911be9c01fcd6373edcb2d3",
    "train-labels-idx1-ubyte.gz": "ba01e8fbdafe25809c67d97782b42156",
}


@pytest.fixture(scope="module")
def vendored():
    return ds.load_dataset("mnist")


def test_vendored_md5_and_attribution():
    for name, md5 in VENDORED_MD5.items():
        assert hashlib.md5((ds.VENDORED_MNIST_DIR / name).read_bytes()).hexdigest() == md5, name
    attribution = (ds.VENDORED_MNIST_DIR / "ATTRIBUTION.md").read_text()
    for md5 in VENDORED_MD5.values():
        assert md5 in attribution
    assert "CC BY-SA 3.0" in attribution and "22,699" in attribution


def test_vendored_mnist_contents(vendored):
    d = vendored
    assert d.name == "mnist" and "vendored" in d.source and "22699" in d.source
    assert d.x_train.shape == (22699, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64
    assert d.x_train.min() == 0 and d.x_train.max() == 255
    counts = [2258, 2581, 2215, 2369, 2222, 2010, 2235, 2356, 2163, 2290]
    assert np.bincount(d.y_train, minlength=10).tolist() == counts
    assert np.bincount(d.y_test, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    # The official files start with these labels; checks the order was kept.
    assert d.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert d.y_test[:5].tolist() == [7, 2, 1, 0, 4]


def test_vendored_is_default_for_empty_path(vendored):
    d = ds.load_mnist("")
    np.testing.assert_array_equal(d.y_train, vendored.y_train)


def test_dataset_take(vendored):
    d = vendored.take(train_limit=100, test_limit=0)
    assert len(d.x_train) == 100 and len(d.y_train) == 100 and len(d.x_test) == 10000
    assert "first 100 train" in d.source
    with pytest.raises(ValueError, match="train_limit"):
        vendored.take(train_limit=-1)
    assert "train=22699" in repr(vendored)


# ----------------------------------------------------------------------------- CIFAR-10


def write_cifar_dir(folder: Path, per_batch=3, n_test=2, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for name in [*ds.CIFAR10_TRAIN_FILES, ds.CIFAR10_TEST_FILE]:
        n = n_test if name == ds.CIFAR10_TEST_FILE else per_batch
        x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, n)
        (folder / name).write_bytes(cifar_bytes(x, y))
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], ys[5]


def test_load_cifar10(tmp_path):
    x_tr, y_tr, x_te, y_te = write_cifar_dir(tmp_path / "c")
    d = ds.load_dataset("cifar10", tmp_path / "c")
    assert d.x_train.shape == (15, 3, 32, 32) and d.x_test.shape == (2, 3, 32, 32)
    np.testing.assert_array_equal(d.x_train, x_tr)
    np.testing.assert_array_equal(d.y_train, y_tr)
    np.testing.assert_array_equal(d.x_test, x_te)
    np.testing.assert_array_equal(d.y_test, y_te)
    assert d.classes[0] == "airplane" and d.classes[9] == "truck" and d.y_train.dtype == np.int64


def test_cifar10_pixel_layout(tmp_path):
    write_cifar_dir(tmp_path / "c")
    # A record whose red plane is all 1, green 2, blue 3, and pixel (row 0, col 1) of red is 200.
    rec = bytearray([7] + [1] * 1024 + [2] * 1024 + [3] * 1024)
    rec[1 + 1] = 200
    (tmp_path / "c" / "test_batch.bin").write_bytes(bytes(rec))
    d = ds.load_cifar10(tmp_path / "c")
    assert d.y_test.tolist() == [7]
    assert d.x_test[0, 1].min() == d.x_test[0, 1].max() == 2 and d.x_test[0, 2].max() == 3
    assert d.x_test[0, 0, 0, 1] == 200 and d.x_test[0, 0, 1, 0] == 1


def test_cifar10_archive_subfolder(tmp_path):
    write_cifar_dir(tmp_path / "cifar-10-batches-bin")
    assert len(ds.load_cifar10(tmp_path).x_train) == 15


def test_cifar10_record_size_mismatch(tmp_path):
    write_cifar_dir(tmp_path / "c")
    p = tmp_path / "c" / "data_batch_3.bin"
    p.write_bytes(p.read_bytes() + b"\x00" * 10)
    with pytest.raises(DatasetError, match=r"data_batch_3\.bin: 9229 bytes is not a whole number of 3073-byte "
                       r"records .*3 records and 10 bytes left over"):  # fmt: skip
        ds.load_cifar10(tmp_path / "c")
    p.write_bytes(bytes(3074 * 2))
    with pytest.raises(DatasetError, match="CIFAR-100"):
        ds.load_cifar10(tmp_path / "c")


def test_cifar10_bad_label_and_missing(tmp_path):
    write_cifar_dir(tmp_path / "c")
    (tmp_path / "c" / "test_batch.bin").write_bytes(bytes([12]) + bytes(3072))
    with pytest.raises(DatasetError, match=r"test_batch\.bin: record 0 has label byte 12"):
        ds.load_cifar10(tmp_path / "c")
    (tmp_path / "c" / "data_batch_5.bin").unlink()
    with pytest.raises(DatasetError, match=r"lacks data_batch_5\.bin"):
        ds.load_cifar10(tmp_path / "c")


# ----------------------------------------------------------------------------- MAT v5 / SVHN


def svhn_arrays(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)  # what the loader should return
    digits = rng.integers(0, 10, n)
    digits[0] = 0
    X = np.ascontiguousarray(x.transpose(2, 3, 1, 0))  # [H, W, C, N] as in the .mat file
    y = np.where(digits == 0, 10, digits).astype(np.float64).reshape(n, 1)
    return x, digits, X, y


@pytest.mark.parametrize("bo", ["<", ">"])
@pytest.mark.parametrize("compress", [False, True])
def test_load_svhn(tmp_path, bo, compress):
    folder = tmp_path / "s"
    folder.mkdir()
    x_tr, d_tr, X_tr, y_tr = svhn_arrays(5, 0)
    x_te, d_te, X_te, y_te = svhn_arrays(3, 1)
    write_mat(folder / "train_32x32.mat", [mat_variable(bo, "X", X_tr), mat_variable(bo, "y", y_tr)], bo, compress)
    # Test file: y of class double stored as uint8 (3 bytes: small data element), like MATLAB does.
    write_mat(folder / "test_32x32.mat", [mat_variable(bo, "y", y_te, store_as="u1"), mat_variable(bo, "X", X_te)],
              bo, compress)  # fmt: skip
    d = ds.load_dataset("svhn", folder)
    assert d.name == "svhn" and d.classes == tuple("0123456789")
    assert d.x_train.shape == (5, 3, 32, 32) and d.x_train.dtype == np.uint8 and d.x_train.flags.c_contiguous
    np.testing.assert_array_equal(d.x_train, x_tr)
    np.testing.assert_array_equal(d.x_test, x_te)
    assert d.y_train.dtype == np.int64 and d.y_train.tolist() == d_tr.tolist() and d_tr[0] == 0
    assert d.y_test.tolist() == d_te.tolist()


def test_read_mat_column_major_and_types(tmp_path):
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    b = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    char = mat_variable("<", "txt", np.array([[104, 105]], dtype=np.uint16), cls=4)  # a char array: skipped
    long_name = mat_variable(">", "a_longer_name", a)  # 13-byte name: a padded, not a small, element
    p = write_mat(tmp_path / "v.mat", [mat_variable("<", "a", a), char, mat_variable("<", "bb", b)])
    m = ds.read_mat(p)
    assert sorted(m) == ["a", "bb"]
    np.testing.assert_array_equal(ds.read_mat(write_mat(tmp_path / "w.mat", [long_name], ">"))["a_longer_name"], a)
    np.testing.assert_array_equal(m["a"], a)
    assert m["a"].dtype == np.int16 and m["bb"].dtype == np.float32
    np.testing.assert_array_equal(m["bb"], b)


def test_svhn_errors(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    x, d, X, y = svhn_arrays(4, 0)
    write_mat(folder / "train_32x32.mat", [mat_variable("<", "X", X), mat_variable("<", "y", y[:3])])
    write_mat(folder / "test_32x32.mat", [mat_variable("<", "X", X), mat_variable("<", "y", y)])
    with pytest.raises(DatasetError, match=r"train_32x32\.mat: X holds 4 images but y has shape \(3, 1\)"):
        ds.load_svhn(folder)
    y_bad = y.copy()
    y_bad[2] = 11
    write_mat(folder / "train_32x32.mat", [mat_variable("<", "X", X), mat_variable("<", "y", y_bad)])
    with pytest.raises(DatasetError, match=r"label 11 at index 2; expected whole numbers 1\.\.10"):
        ds.load_svhn(folder)
    write_mat(folder / "train_32x32.mat", [mat_variable("<", "y", y)])
    with pytest.raises(DatasetError, match=r"train_32x32\.mat: no numeric variable 'X'; found \['y'\]"):
        ds.load_svhn(folder)
    write_mat(folder / "train_32x32.mat", [mat_variable("<", "X", np.zeros((1, 2), np.uint16), cls=4),
                                           mat_variable("<", "y", y)])  # fmt: skip
    with pytest.raises(DatasetError, match=r"'X' is a char"):
        ds.load_svhn(folder)
    (folder / "test_32x32.mat").unlink()
    with pytest.raises(DatasetError, match=r"lacks test_32x32\.mat"):
        ds.load_svhn(folder)


def test_read_mat_without_scipy_names_the_extra(tmp_path, monkeypatch):
    p = write_mat(tmp_path / "v.mat", [mat_variable("<", "a", np.arange(3, dtype=np.int16))])
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # as on a board: the datasets extra is not installed
    with pytest.raises(DatasetError, match=r"v\.mat: reading a MAT-file needs SciPy: pip install 'xnortrain\[datasets"):
        ds.read_mat(p)


def test_read_mat_rejects_bad_files(tmp_path):
    p = tmp_path / "h.mat"
    p.write_bytes(b"MATLAB 7.3 MAT-file".ljust(512, b" ") + b"\x89HDF\r\n\x1a\n" + bytes(64))
    with pytest.raises(DatasetError, match=r"h\.mat: .*v7\.3 \(HDF5\)"):
        ds.read_mat(p)
    p.write_bytes(bytes(200))
    with pytest.raises(DatasetError, match=r"h\.mat: not a readable MAT v5 file"):
        ds.read_mat(p)
    v = mat_variable("<", "X", np.arange(100, dtype=np.float64))
    write_mat(p, [v])
    p.write_bytes(p.read_bytes()[:-20])
    with pytest.raises(DatasetError, match=r"h\.mat: not a readable MAT v5 file"):  # truncated
        ds.read_mat(p)
    write_mat(p, [v], compress=True)
    raw = bytearray(p.read_bytes())
    raw[140:150] = b"\xff" * 10
    p.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match=r"h\.mat: not a readable MAT v5 file"):  # corrupt zlib stream
        ds.read_mat(p)


# ----------------------------------------------------------------------------- dispatch


def test_load_dataset_unknown_and_unbundled():
    with pytest.raises(DatasetError, match="unknown dataset 'imagenet'; choose one of mnist, fashion_mnist, "
                       "cifar10, svhn"):  # fmt: skip
        ds.load_dataset("imagenet")
    with pytest.raises(DatasetError, match=r"cifar10 is not bundled.*data_batch_1\.bin.*test_batch\.bin"):
        ds.load_dataset("cifar10")
    with pytest.raises(DatasetError, match=r"svhn is not bundled.*train_32x32\.mat, test_32x32\.mat"):
        ds.load_dataset("svhn", "")


# ----------------------------------------------------------------------------- preprocessing

PIXELS = np.array([[0, 1, 127, 128, 254, 255]], dtype=np.uint8)


def test_preprocess_pm1():
    out = ds.preprocess(PIXELS, "pm1")
    assert out.dtype == np.float32 and out.shape == PIXELS.shape
    np.testing.assert_allclose(out, PIXELS / 127.5 - 1, rtol=0, atol=1e-7)
    assert out[0, 0] == -1.0 and out[0, -1] == 1.0


def test_preprocess_binarize():
    out = ds.preprocess(PIXELS, "binarize")
    assert out.dtype == np.float32
    assert out.tolist() == [[-1, -1, -1, 1, 1, 1]]  # 127/255 < 0.5 <= 128/255
    assert ds.preprocess(PIXELS, "binarize", threshold=0.0).tolist() == [[1] * 6]
    assert ds.preprocess(PIXELS, "binarize", threshold=1.0).tolist() == [[-1] * 5 + [1]]
    assert ds.preprocess(PIXELS, "binarize", threshold=1 / 255).tolist() == [[-1] + [1] * 5]


@pytest.mark.parametrize("mode", ["uint8", "int8"])
def test_preprocess_8bit(mode):
    out = ds.preprocess(PIXELS, mode)
    assert out.dtype == np.int16
    assert out.tolist() == [[-128, -127, -1, 0, 126, 127]]
    assert PIXELS.tolist() == [[0, 1, 127, 128, 254, 255]]  # input untouched


def test_preprocess_errors():
    with pytest.raises(ValueError, match="unknown mode 'sign'; choose one of pm1, binarize, uint8, int8"):
        ds.preprocess(PIXELS, "sign")
    for bad in (1.5, -0.1, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="threshold"):
            ds.preprocess(PIXELS, "binarize", threshold=bad)
    with pytest.raises(ValueError, match="expected uint8 images, got float32"):
        ds.preprocess(PIXELS.astype(np.float32), "pm1")


# ----------------------------------------------------------------------------- batching / dev split


def toy(n=23):
    x = np.arange(n * 2).reshape(n, 2)
    return x, x[:, 0] // 2  # y[i] == i, so index consistency is visible


def test_batches_reproducible_and_consistent():
    x, y = toy()
    a = list(ds.batches(x, y, 5, np.random.default_rng(3)))
    b = list(ds.batches(x, y, 5, np.random.default_rng(3)))
    c = list(ds.batches(x, y, 5, np.random.default_rng(4)))
    assert len(a) == 4 and all(len(xb) == 5 for xb, _ in a)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa[:, 0] // 2, ya)
        np.testing.assert_array_equal(xa[:, 1], xa[:, 0] + 1)
    assert not all(np.array_equal(ya, yc) for (_, ya), (_, yc) in zip(a, c, strict=True))
    seen = np.concatenate([yb for _, yb in a])
    assert len(np.unique(seen)) == 20


def test_batches_keep_last_and_no_shuffle():
    x, y = toy()
    got = list(ds.batches(x, y, 5, np.random.default_rng(0), drop_last=False))
    assert [len(yb) for _, yb in got] == [5, 5, 5, 5, 3]
    assert sorted(np.concatenate([yb for _, yb in got]).tolist()) == list(range(23))
    plain = list(ds.batches(x, y, 10, None, drop_last=False, shuffle=False))
    assert [yb.tolist() for _, yb in plain] == [list(range(10)), list(range(10, 20)), [20, 21, 22]]


def test_batches_draws_permutation_at_call():
    x, y = toy()
    rng = np.random.default_rng(9)
    it = ds.batches(x, y, 4, rng)
    rng.random(100)  # consuming the generator afterwards must not change the batches
    first = next(it)[1]
    assert first.tolist() == next(iter(ds.batches(x, y, 4, np.random.default_rng(9))))[1].tolist()


def test_batches_errors():
    x, y = toy()
    with pytest.raises(ValueError, match="x has 23 samples but y has 22"):
        ds.batches(x, y[:-1], 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="batch_size"):
        ds.batches(x, y, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="larger than the 23 samples"):
        ds.batches(x, y, 24, np.random.default_rng(0))
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        ds.batches(x, y, 4, 0)


def test_split_dev():
    x, y = toy(50)
    xt, yt, xd, yd = ds.split_dev(x, y, 10, np.random.default_rng(5))
    assert len(xt) == len(yt) == 40 and len(xd) == len(yd) == 10
    assert sorted(np.concatenate([yt, yd]).tolist()) == list(range(50))
    np.testing.assert_array_equal(xt[:, 0] // 2, yt)
    np.testing.assert_array_equal(xd[:, 0] // 2, yd)
    again = ds.split_dev(x, y, 10, np.random.default_rng(5))
    np.testing.assert_array_equal(again[3], yd)
    assert len(ds.split_dev(x, y, 0.2, np.random.default_rng(5))[3]) == 10
    xt0, _, xd0, _ = ds.split_dev(x, y, 0, np.random.default_rng(5))
    assert len(xt0) == 50 and len(xd0) == 0
    for bad in (50, -1, 1.0, True):
        with pytest.raises(ValueError, match="dev_size"):
            ds.split_dev(x, y, bad, np.random.default_rng(5))
