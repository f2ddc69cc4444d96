"""xarray DataArrays in and out: a Dask-backed one stays lazy, its row coordinate survives."""

import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import dfairpca
from dfairpca import FairKernelPCA, FairPCA
from oracle import make_data


def _array(X, lazy):
    data = da.from_array(X, chunks=(100, -1)) if lazy else X
    return xr.DataArray(data, dims=("sample", "feature"),
                        coords={"sample": np.arange(len(X)) * 10,
                                "feature": [f"f{i}" for i in range(X.shape[1])]})


@pytest.fixture
def never_loaded(monkeypatch):
    """Any np.asarray / .values of a DataArray fails: the estimators must take ``.data``."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a DataArray was loaded into memory")

    monkeypatch.setattr(xr.DataArray, "__array__", refuse)
    monkeypatch.setattr(xr.DataArray, "values", property(refuse))


@pytest.mark.parametrize("lazy", [True, False])
def test_dataarray_in_dataarray_out(lazy, never_loaded):
    X, (z,) = make_data(400, 6, (2,), seed=1)
    xa = _array(X, lazy)
    est = FairPCA(3).fit(xa, sensitive_features=z)
    ref = FairPCA(3).fit(X, sensitive_features=z)
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-10)
    out = est.transform(xa)
    assert isinstance(out, xr.DataArray) and out.dims == ("sample", "component")
    assert isinstance(out.data, da.Array) is lazy
    if lazy:
        assert out.data.chunks[0] == xa.data.chunks[0]
    np.testing.assert_array_equal(out.coords["sample"].data, np.arange(400) * 10)
    assert list(out.coords["component"].data) == ["fairpca0", "fairpca1", "fairpca2"]
    got = out.data.compute() if lazy else out.data
    np.testing.assert_allclose(got, ref.transform(X), atol=1e-10)
    pca = dfairpca.PCA(2).fit(xa)
    assert isinstance(pca.transform(xa).data, da.Array) is lazy
    assert out.name == "representation"
    back = est.inverse_transform(out)
    assert isinstance(back, xr.DataArray) and back.name == "reconstruction"
    assert back.dims == ("sample", "feature") and isinstance(back.data, da.Array) is lazy
    np.testing.assert_array_equal(back.coords["sample"].data, np.arange(400) * 10)
    got = back.data.compute() if lazy else back.data
    np.testing.assert_allclose(got, ref.inverse_transform(ref.transform(X)), atol=1e-10)


def test_dataarray_sensitive_feature_ids_by_coordinate_label():
    X, (z,) = make_data(300, 6, (2,), seed=2)
    xa = _array(np.column_stack([X, z]), lazy=True)
    xa = xa.assign_coords(feature=[f"f{i}" for i in range(6)] + ["sex"])
    est = FairPCA(2, sensitive_feature_ids=["sex"]).fit(xa)
    ref = FairPCA(2).fit(X, sensitive_features=z)
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-9)
    kern = FairKernelPCA(2, sensitive_feature_ids=["sex"]).fit(xa)
    out = kern.transform(xa)
    assert out.dims == ("sample", "component") and isinstance(out.data, da.Array)
    kref = FairKernelPCA(2).fit(X, sensitive_features=z)
    np.testing.assert_allclose(out.data.compute(), kref.transform(X), atol=1e-8)


def test_progress_bar_for_numpy_input(capsys):
    X, (z,) = make_data(300, 5, (2,), seed=3)
    quiet = FairPCA(2).fit(X, sensitive_features=z)
    assert "pass" not in capsys.readouterr().err
    shown = FairPCA(2, progress=True).fit(X, sensitive_features=z)
    err = capsys.readouterr().err  # not a terminal: whole lines
    assert "pass: 1 of 1 block done in" in err and "\r" not in err
    np.testing.assert_array_equal(shown.components_, quiet.components_)


@pytest.mark.parametrize("color", [False, True], ids=["grey", "colour"])
def test_xarray_opens_the_stores_dfairpca_writes(tmp_path, color, client):
    """Every array dfairpca writes names its dimensions, the rows' one shared: xarray opens
    a synthetic store and a transform's output (representation, and reconstructed faces)."""
    from dfairpca.celeba import synth_celeba
    from dfairpca.cli import main

    store = synth_celeba(tmp_path / "s.zarr", n=60, size=8, color=color, chunk_rows=32,
                         progress=False, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no "Failed to open" warning
        ds = xr.open_zarr(store)
    assert ds["images"].dims == ("row", "height", "width") + (("channel",) if color else ())
    assert ds["attributes"].dims == ("row", "attribute") and ds["partition"].dims == ("row",)
    assert ds.sizes["row"] == 60
    faces = dfairpca.from_zarr(store, "images")
    glasses = dfairpca.celeba.attribute_column(store, "Eyeglasses")
    dfairpca.FairPCA(3).fit(faces, sensitive_features=glasses).save(tmp_path / "m")
    for extra, name, dims in [((), "representation", ("row", "component")),
                              (("--reconstruct",), "images", ds["images"].dims)]:
        out = tmp_path / f"out{len(extra)}.zarr"
        assert main(["transform", str(tmp_path / "m"), str(store), "--out", str(out),
                     "--scheduler", client.scheduler.address, *extra]) == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rep = xr.open_zarr(out)
        assert rep[name].dims == dims and rep["attributes"].dims == ("row", "attribute")
        # the attributes' names are their dimension's coordinate, copied with them
        np.testing.assert_array_equal(rep["attributes"].sel(attribute="Eyeglasses"), glasses)


def test_a_store_written_before_the_attribute_coordinate_still_reads_and_its_copy_gains_it(
        tmp_path):
    """Older stores hold the names only in ``attributes.attrs["names"]``: they read as
    before, and the labels copied from them (a transform's output) carry the coordinate."""
    import shutil

    import zarr

    from dfairpca.celeba import attribute_column, open_celeba, synth_celeba
    from dfairpca.celeba.schema import copy_labels, open_group
    from dfairpca.io._marker import consolidate

    store = synth_celeba(tmp_path / "s.zarr", n=40, size=8, progress=False, n_jobs=1)
    ds = xr.open_zarr(store)
    assert list(ds["attribute"].values[:3]) == ["5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive"]
    glasses = attribute_column(store, "Eyeglasses")
    np.testing.assert_array_equal(ds["attributes"].sel(attribute="Eyeglasses"), glasses)
    shutil.rmtree(store / "attribute")  # as an older dfairpca wrote it
    consolidate(str(store))
    assert "attribute" not in xr.open_zarr(store).coords
    np.testing.assert_array_equal(attribute_column(store, "Eyeglasses"), glasses)
    assert open_celeba(store)[2][15] == "Eyeglasses"
    copy = zarr.open_group(str(tmp_path / "c.zarr"), mode="w")
    copy_labels(open_group(store), copy)
    consolidate(str(tmp_path / "c.zarr"))
    np.testing.assert_array_equal(
        xr.open_zarr(tmp_path / "c.zarr")["attributes"].sel(attribute="Eyeglasses"), glasses)
