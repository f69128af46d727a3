"""Cross-checks the HDF5 file layer against h5py, used by tests/h5_file_test.cpp.

check_h5.py check FILE  -- verifies the file written by write_fixture() in h5_file_test.cpp
check_h5.py write FILE  -- writes h5py-native types (float32, fixed strings, scalars) for the
                           C++ reader to read back
check_h5.py same A B    -- verifies that two files hold the same tree: groups, datasets (dtype,
                           shape, values, compression) and attributes (dtype, shape, values)
check_h5.py unsupported DIR -- writes one file per kind of content H5Writer::load rejects
Exits non-zero with a message on the first mismatch.
"""
import sys

import h5py
import numpy as np


def fail(message):
    sys.exit("check_h5.py: " + message)


def expect(condition, message):
    if not condition:
        fail(message)


def decode(values):
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]


def check(path):
    with h5py.File(path, "r") as f:
        expect(int(f.attrs["version"]) == 3, "root attribute version")
        expect(f.attrs["tool"] == "ndsprobe", "root attribute tool: %r" % f.attrs["tool"])

        nds = f["/runs/adamw/step_100/blocks/nds"][()]
        expect(nds.dtype == np.float64, "nds dtype %s" % nds.dtype)
        expect(nds.shape == (4,), "nds shape %s" % (nds.shape,))
        expect(nds[0] == 0.5 and nds[1] == -1.25 and np.isnan(nds[2]) and nds[3] == 1e300,
               "nds values %r" % nds)

        matrix = f["/runs/adamw/matrix"][()]
        expect(matrix.shape == (2, 3), "matrix shape %s" % (matrix.shape,))
        expect((matrix == np.arange(1, 7).reshape(2, 3)).all(), "matrix values %r" % matrix)
        expect(f["/runs/adamw/matrix"].attrs["unit"] == "\u03bb", "matrix attribute unit")

        ids = f["/runs/adamw/ids"][()]
        expect(ids.dtype == np.int64, "ids dtype %s" % ids.dtype)
        expect(list(ids) == [-3, 0, np.iinfo(np.int64).max], "ids values %r" % ids)

        names = f["/runs/adamw/names"].asstr()[()]
        expect(list(names) == ["alpha", "", "\u00e9t\u00e9 \u2207"], "names %r" % names)

        expect(f["/empty/doubles"].shape == (0,), "empty doubles shape")
        expect(f["/empty/strings"].shape == (0,), "empty strings shape")
        expect(f["/empty/matrix"].shape == (0, 4), "empty matrix shape")

        big = f["/big"]
        expect(big.shape == (5000, 3), "big shape %s" % (big.shape,))
        expect(big.compression == "gzip" and big.compression_opts == 4,
               "big compression %s %s" % (big.compression, big.compression_opts))
        expect(big.chunks is not None, "big is not chunked")
        expect(np.allclose(big[()].ravel(), 0.001 * np.arange(15000), rtol=0, atol=1e-12),
               "big values")
        expect(f["/runs/adamw/matrix"].chunks is None, "small dataset is chunked")

        run = f["/runs/adamw"].attrs
        expect(run["lr"] == 1e-3, "lr %r" % run["lr"])
        expect(int(run["steps"]) == 100, "steps %r" % run["steps"])
        eigs = run["eigs"]
        expect(eigs[0] == 3.5 and np.isnan(eigs[1]), "eigs %r" % eigs)
        expect(decode(run["blocks"]) == ["conv1", "fc\u00e9"], "blocks %r" % run["blocks"])

        results = f["/results"]
        columns = decode(results.attrs["columns"])
        expect(columns == ["step", "block", "nds"], "columns %r" % columns)
        table = {c: results[c][()] for c in columns}
        expect(list(table["step"]) == [100, 100, 200], "step column %r" % table["step"])
        expect(decode(table["block"]) == ["conv1", "fc", "conv1"], "block column")
        nds_col = table["nds"]
        expect(nds_col[0] == 0.1 and np.isnan(nds_col[1]) and nds_col[2] == 0.3, "nds column")


def write(path):
    with h5py.File(path, "w") as f:
        f["f32"] = np.array([0.5, 1.5, -2.0], dtype=np.float32)
        f["i32"] = np.array([-1, 2, 3], dtype=np.int32)
        f["u8"] = np.array([0, 255], dtype=np.uint8)
        f["scalar"] = np.float64(2.5)
        f["fixed"] = np.array([b"ab", b"c", b""], dtype="S2")
        f.create_dataset("vlen", data=["x", "\u00e9", ""], dtype=h5py.string_dtype())
        f.attrs["fixed_attr"] = np.bytes_(b"hello")
        f.attrs["str_attr"] = "w\u00f6rld"
        f.attrs["int_attr"] = np.int16(42)
        f.attrs["float_attr"] = np.float32(0.25)
        f.attrs["array_attr"] = np.array([1, 2], dtype=np.int32)
        f.attrs["names_attr"] = np.array(["p", "qq"], dtype=h5py.string_dtype())


def describe_dtype(dtype):
    string = h5py.check_string_dtype(dtype)
    if string is not None:
        return ("string", string.encoding, string.length)
    return (dtype.kind, dtype.itemsize)


def same_values(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(np.isnan(a), np.isnan(b)) and
                    (a[~np.isnan(a)] == b[~np.isnan(b)]).all())
    return bool((a == b).all())


def same_attrs(where, a, b):
    expect(sorted(a.keys()) == sorted(b.keys()),
           "%s attribute names %s != %s" % (where, sorted(a.keys()), sorted(b.keys())))
    for name in a.keys():
        x, y = a.get_id(name), b.get_id(name)
        what = "%s attribute %r" % (where, name)
        expect(describe_dtype(x.dtype) == describe_dtype(y.dtype),
               "%s dtype %s != %s" % (what, x.dtype, y.dtype))
        expect(x.shape == y.shape, "%s shape %s != %s" % (what, x.shape, y.shape))
        expect(same_values(a[name], b[name]), "%s values %r != %r" % (what, a[name], b[name]))


def same(path_a, path_b):
    with h5py.File(path_a, "r") as a, h5py.File(path_b, "r") as b:
        names_a, names_b = [], []
        a.visit(names_a.append)
        b.visit(names_b.append)
        expect(sorted(names_a) == sorted(names_b),
               "object names %s != %s" % (sorted(names_a), sorted(names_b)))
        same_attrs("/", a.attrs, b.attrs)
        for name in names_a:
            x, y = a[name], b[name]
            expect(type(x) is type(y), "/%s is a %s and a %s" % (name, type(x), type(y)))
            same_attrs("/" + name, x.attrs, y.attrs)
            if isinstance(x, h5py.Dataset):
                what = "dataset /" + name
                expect(describe_dtype(x.dtype) == describe_dtype(y.dtype),
                       "%s dtype %s != %s" % (what, x.dtype, y.dtype))
                expect(x.shape == y.shape, "%s shape %s != %s" % (what, x.shape, y.shape))
                expect((x.compression, x.chunks) == (y.compression, y.chunks),
                       "%s storage %s %s != %s %s" %
                       (what, x.compression, x.chunks, y.compression, y.chunks))
                expect(same_values(x[()], y[()]), "%s values differ" % what)


def unsupported(directory):
    with h5py.File(directory + "/compound.h5", "w") as f:
        f["ok/pairs"] = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    with h5py.File(directory + "/bool_attr.h5", "w") as f:
        f.create_group("g/h").attrs["flag"] = np.bool_(True)  # an HDF5 enum
    with h5py.File(directory + "/soft_link.h5", "w") as f:
        f["data"] = np.arange(3.0)
        f["alias"] = h5py.SoftLink("/data")
    with h5py.File(directory + "/null_attr.h5", "w") as f:
        f["d"] = np.arange(3.0)
        f["d"].attrs["nothing"] = h5py.Empty("f8")
    with h5py.File(directory + "/attr_2d.h5", "w") as f:
        f.create_group("m").attrs["grid"] = np.ones((2, 2))


def main():
    modes = {"check": (check, 1), "write": (write, 1), "same": (same, 2),
             "unsupported": (unsupported, 1)}
    if len(sys.argv) < 2 or sys.argv[1] not in modes or len(sys.argv) != 2 + modes[sys.argv[1]][1]:
        fail("usage: check_h5.py check|write FILE, same A B or unsupported DIR")
    function, _ = modes[sys.argv[1]]
    try:
        function(*sys.argv[2:])
    except (OSError, KeyError) as e:
        fail("%s: %s" % (" ".join(sys.argv[2:]), e))


if __name__ == "__main__":
    main()
