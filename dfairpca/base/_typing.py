"""Type aliases of the public API's annotations.

dfairpca reads X in many forms and answers in the form it was given, so these aliases
are wide on purpose; they name what a caller may pass, not what the code narrows to.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import dask.array
    import zarr

__all__ = ["ArrayInput", "ArrayOutput", "ColumnIds", "PathInput", "Seed"]

#: a local path or an fsspec URL ("s3://bucket/faces.zarr")
PathInput: TypeAlias = Union[str, "os.PathLike[str]"]

#: X: what numpy converts (numpy, pandas, xarray, lists), a Dask array or DataFrame, a
#: Zarr array or group, or a Zarr store's path or URL
ArrayInput: TypeAlias = Union[npt.ArrayLike, "dask.array.Array", "zarr.Array", "zarr.Group", PathInput]

#: what transform returns: X's own kind (a numpy or Dask array, a pandas DataFrame, an
#: xarray DataArray), which no narrower type names for every input
ArrayOutput: TypeAlias = Any

#: columns of X named by position or by a DataFrame's column names
ColumnIds: TypeAlias = Union[int, str, Sequence[Union[int, str]]]

#: a seed, or a numpy generator to draw from
Seed: TypeAlias = Union[int, np.random.RandomState, np.random.Generator, None]
