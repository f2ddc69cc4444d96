"""Write a packaged ``<name>_lee2022.npz`` from Lee et al.'s CSV files (maintainers only).

    python -m dfairpca.datasets._make_data SOURCE_DIR OUT.npz

SOURCE_DIR holds ``train_0.csv.gz`` ... ``test_9.csv.gz`` as in the datasets/<Name> folders of
github.com/nick-jhlee/fair-manifold-pca (gzip the .csv files there): each row the standardized
features, then the 0/1 label, then the 0/1 protected attribute.  The features are kept bit for
bit (``numpy.savetxt``'s 19 significant digits read back to the same float64).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ._lee2022 import N_SPLITS
from ..errors import InvalidInputError, PathNotFoundError


def _binary(col: np.ndarray, what: str, path: Path) -> np.ndarray:
    """A 0/1 column as uint8, or an error: the layout was not the one expected."""
    if not np.isin(col, (0.0, 1.0)).all():
        raise InvalidInputError(f"{path}: the {what} column (second to last is the label, last the "
                         "protected attribute) must be 0/1")
    return col.astype(np.uint8)


def convert(source: Path | str, out: Path | str) -> None:
    """Read the ten splits' CSV files of ``source`` and write them to the .npz ``out``."""
    source = Path(source)
    paths = {(part, i): source / f"{part}_{i}.csv.gz" for i in range(N_SPLITS) for part in ("train", "test")}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:  # before reading anything
        raise PathNotFoundError(f"{source} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: "
                                f"expected train_i.csv.gz and test_i.csv.gz for i = 0 to {N_SPLITS - 1}")
    arrays: dict[str, Any] = {}  # Any: numpy's stub would match the **dict against allow_pickle
    for part in ("train", "test"):
        rows = [np.loadtxt(paths[part, i], delimiter=",", ndmin=2) for i in range(N_SPLITS)]
        # (d, n) per split: a column's few distinct values sit together and deflate better
        arrays[f"X_{part}"] = np.stack([np.ascontiguousarray(r[:, :-2].T) for r in rows])
        arrays[f"y_{part}"] = np.stack([_binary(r[:, -2], "label", paths[part, i]) for i, r in enumerate(rows)])
        arrays[f"sensitive_{part}"] = np.stack(
            [_binary(r[:, -1], "protected attribute", paths[part, i]) for i, r in enumerate(rows)])
    np.savez_compressed(out, **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2])
