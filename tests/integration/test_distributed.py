"""Fits on a real distributed cluster (scheduler + 2 worker processes on loopback)."""

import dask.array as da
import numpy as np
import zarr

import dfairpca
from oracle import make_data, max_angle_deg


def test_fit_on_cluster_equals_local_fit_and_reads_zarr_in_workers(client, tmp_path):
    X, g = make_data(3000, 40, (2, 3), seed=21)
    Xu8 = np.clip(X * 8 + 128, 0, 255).astype(np.uint8)
    store = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    store.create_array("images", shape=(3000, 5, 8), chunks=(250, 5, 8), dtype="uint8")[:] = Xu8.reshape(3000, 5, 8)
    Xz = dfairpca.from_zarr(tmp_path / "s.zarr", "images", rows_per_chunk=250)
    labels = np.column_stack(g)
    local = dfairpca.FairPCA(6, compute_dtype="float64").fit(Xu8, sensitive_features=labels)
    remote = dfairpca.FairPCA(6, compute_dtype="float64", split_every=3).fit(Xz, sensitive_features=labels)
    assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6
    # the work ran on the workers: their task logs record the chunk tasks
    logs = client.run(lambda dask_worker: [str(k) for k in dask_worker.state.log])
    assert sum("_fold" in str(entry) for log in logs.values() for entry in log) >= 12
    Y = remote.transform(Xz)
    assert isinstance(Y, da.Array)
    Yc = Y.compute()
    for j, m in enumerate((2, 3)):
        means = np.stack([Yc[g[j] == c].mean(0) for c in range(m)])
        assert np.abs(means - means[0]).max() < 1e-4 * np.abs(Yc).max()  # float32 output
