"""Loaders of the Lee et al. (2022) train/test splits packaged in ``data/``.

Each ``data/<name>_lee2022.npz`` holds all ten splits of one data set, written by
:mod:`dfairpca.datasets._make_data` from the source CSV files, bit for bit:

    X_train (n_splits, d, n_train) float64      y_train, sensitive_train (n_splits, n_train) uint8
    X_test  (n_splits, d, n_test)  float64      y_test,  sensitive_test  (n_splits, n_test)  uint8

The features are stored column by column because a standardized column holds few distinct
values (one-hot columns two): deflate then finds them close together, and the three files
take 0.72 MB instead of 1.0 MB row by row (2.2 MB as the source's gzipped CSV).
"""

from __future__ import annotations

import io
import numbers
from dataclasses import dataclass
from importlib import resources

import numpy as np
from sklearn.utils import Bunch

from ._paper import PAPER_TABLES
from ..errors import InvalidInputError, InvalidTypeError

# Deferred imports: pandas (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

#: every data set comes in ten random 70/30 train/test splits
N_SPLITS = 10
#: the arrays of each .npz file (see the module docstring for their shapes)
ARRAYS = ("X_train", "X_test", "y_train", "y_test", "sensitive_train", "sensitive_test")
_LICENCE = "data/LICENSE-fair-manifold-pca"


def _one_hot(column: str, values: str) -> list[str]:
    """AIF360's one-hot names ``column=value`` for the (alphabetically sorted) values."""
    return [f"{column}={v}" for v in values.split("|")]


# The source files carry no column names.  These are AIF360's (StandardDataset: the kept
# columns in the raw file's order, then pandas.get_dummies blocks, values sorted), with the
# protected attribute named by its 0/1 meaning.  tests/test_datasets.py checks them against the
# data: one hot entry per block and record, education-num against education, husbands male,
# age_cat against age, German's category counts against UCI's german.doc.
_ADULT = [
    "age", "education-num", "sex=Male", "capital-gain", "capital-loss", "hours-per-week",
    *_one_hot("workclass", "Federal-gov|Local-gov|Private|Self-emp-inc|Self-emp-not-inc|State-gov|"
              "Without-pay"),
    *_one_hot("education", "10th|11th|12th|1st-4th|5th-6th|7th-8th|9th|Assoc-acdm|Assoc-voc|"
              "Bachelors|Doctorate|HS-grad|Masters|Preschool|Prof-school|Some-college"),
    *_one_hot("marital-status", "Divorced|Married-AF-spouse|Married-civ-spouse|"
              "Married-spouse-absent|Never-married|Separated|Widowed"),
    *_one_hot("occupation", "Adm-clerical|Armed-Forces|Craft-repair|Exec-managerial|"
              "Farming-fishing|Handlers-cleaners|Machine-op-inspct|Other-service|Priv-house-serv|"
              "Prof-specialty|Protective-serv|Sales|Tech-support|Transport-moving"),
    *_one_hot("relationship", "Husband|Not-in-family|Other-relative|Own-child|Unmarried|Wife"),
    *_one_hot("native-country", "Cambodia|Canada|China|Columbia|Cuba|Dominican-Republic|Ecuador|"
              "El-Salvador|England|France|Germany|Greece|Guatemala|Haiti|Holand-Netherlands|"
              "Honduras|Hong|Hungary|India|Iran|Ireland|Italy|Jamaica|Japan|Laos|Mexico|"
              "Nicaragua|Outlying-US(Guam-USVI-etc)|Peru|Philippines|Poland|Portugal|"
              "Puerto-Rico|Scotland|South|Taiwan|Thailand|Trinadad&Tobago|United-States|"
              "Vietnam|Yugoslavia"),
]
# German's categories keep UCI's codes (german.doc explains them); A47 never occurs
_GERMAN = [
    "month", "credit_amount", "investment_as_income_percentage", "residence_since", "age>=25",
    "number_of_credits", "people_liable_for",
    *_one_hot("status", "A11|A12|A13|A14"),
    *_one_hot("credit_history", "A30|A31|A32|A33|A34"),
    *_one_hot("purpose", "A40|A41|A410|A42|A43|A44|A45|A46|A48|A49"),
    *_one_hot("savings", "A61|A62|A63|A64|A65"),
    *_one_hot("employment", "A71|A72|A73|A74|A75"),
    *_one_hot("other_debtors", "A101|A102|A103"),
    *_one_hot("property", "A121|A122|A123|A124"),
    *_one_hot("installment_plans", "A141|A142|A143"),
    *_one_hot("housing", "A151|A152|A153"),
    *_one_hot("skill_level", "A171|A172|A173|A174"),
    *_one_hot("telephone", "A191|A192"),
    *_one_hot("foreign_worker", "A201|A202"),
]
_COMPAS = [
    "age", "race=Caucasian", "juv_fel_count", "juv_misd_count", "juv_other_count", "priors_count",
    *_one_hot("age_cat", "25 - 45|Greater than 45|Less than 25"),
    *_one_hot("c_charge_degree", "F|M"),
]


@dataclass(frozen=True)
class _Spec:
    """What the loader needs to know of one data set beyond its arrays."""

    key: str
    feature_names: tuple[str, ...]
    sensitive_name: str  # also a column of X (AIF360 keeps the protected attribute)
    target_name: str

    @property
    def stem(self) -> str:
        return f"data/{self.key}_lee2022"


_SPECS = {
    "adult": _Spec("adult", tuple(_ADULT), "sex=Male", "income>50K"),
    "german": _Spec("german", tuple(_GERMAN), "age>=25", "bad_credit"),
    "compas": _Spec("compas", tuple(_COMPAS), "race=Caucasian", "two_year_recid"),
}


def data_files() -> tuple[str, ...]:
    """Every file the loaders read, as paths relative to the ``dfairpca.datasets`` package.

    Returns
    -------
    tuple of str
        The data (.npz) and description (.md) of each data set, and the licence.
    """
    return (*(spec.stem + ext for spec in _SPECS.values() for ext in (".npz", ".md")), _LICENCE)


def _check_split(split) -> int:
    """The split index as an int, or a one-line error naming the valid range."""
    if isinstance(split, bool) or not isinstance(split, numbers.Integral):
        raise InvalidTypeError(f"split must be an integer from 0 to {N_SPLITS - 1}; got {split!r}")
    if not 0 <= int(split) < N_SPLITS:
        raise InvalidInputError(f"split={split} is out of range: the Lee et al. (2022) data sets have "
                         f"{N_SPLITS} splits, 0 to {N_SPLITS - 1}")
    return int(split)


def _read(path: str) -> bytes:
    return resources.files(__package__).joinpath(path).read_bytes()


def _load(key: str, split, as_frame) -> Bunch:
    """The Bunch of one split of data set ``key`` (see :func:`load_adult`)."""
    split = _check_split(split)
    if not isinstance(as_frame, bool):
        raise InvalidTypeError(f"as_frame must be True or False; got {as_frame!r}")
    spec = _SPECS[key]
    with np.load(io.BytesIO(_read(spec.stem + ".npz")), allow_pickle=False) as z:
        arrays = {name: z[name][split] for name in ARRAYS}
    out = {}
    for part in ("train", "test"):
        X = np.ascontiguousarray(arrays[f"X_{part}"].T)  # stored (d, n): see the module docstring
        y = arrays[f"y_{part}"].astype(np.int64)
        s = arrays[f"sensitive_{part}"].astype(np.int64)
        if as_frame:
            import pandas as pd

            X = pd.DataFrame(X, columns=list(spec.feature_names))
            y, s = pd.Series(y, name=spec.target_name), pd.Series(s, name=spec.sensitive_name)
        out.update({f"X_{part}": X, f"y_{part}": y, f"sensitive_{part}": s})
    descr = _read(spec.stem + ".md").decode("utf-8") + "\n" + _read(_LICENCE).decode("utf-8")
    return Bunch(
        **out,
        feature_names=list(spec.feature_names),
        target_name=spec.target_name,
        sensitive_name=spec.sensitive_name,
        sensitive_feature_index=spec.feature_names.index(spec.sensitive_name),
        split=split,
        n_splits=N_SPLITS,
        paper_table=dict(PAPER_TABLES[key]),
        DESCR=descr,
    )


_RETURNS = """
    Parameters
    ----------
    split : int, default 0
        Which of the ten random 70/30 train/test splits, 0 to 9.
    as_frame : bool, default False
        Features as a pandas DataFrame (columns ``feature_names``), labels and groups as
        Series; otherwise numpy arrays.

    Returns
    -------
    sklearn.utils.Bunch
        ``X_train``, ``X_test``: float64 (n, d), standardized with the train split's mean and
        std.  ``y_train``, ``y_test``: the task label {target} (0/1).  ``sensitive_train``,
        ``sensitive_test``: the protected attribute {sensitive} (0/1), also the standardized
        column ``X[:, sensitive_feature_index]`` of the features.  ``feature_names``,
        ``target_name``, ``sensitive_name``, ``split``, ``n_splits``; ``paper_table``: the
        paper's Table {table}, {{(k, method): PaperFigure}} (every column, mean and std);
        ``DESCR``: provenance and licences.
"""


def load_adult(split: int = 0, *, as_frame: bool = False) -> Bunch:
    return _load("adult", split, as_frame)


def load_german(split: int = 0, *, as_frame: bool = False) -> Bunch:
    return _load("german", split, as_frame)


def load_compas(split: int = 0, *, as_frame: bool = False) -> Bunch:
    return _load("compas", split, as_frame)


load_adult.__doc__ = """Adult Income: 2,261 records (5% of UCI Adult), 97 features.
""" + _RETURNS.format(target="income > 50K", sensitive="sex (1 = male)", table=1) + """
    Examples
    --------
    >>> from dfairpca.datasets import load_adult
    >>> b = load_adult(split=0)
    >>> b.X_train.shape, b.X_test.shape, b.sensitive_name
    ((1582, 97), (679, 97), 'sex=Male')
"""
load_german.__doc__ = """German Credit: the 1,000 records of UCI Statlog German Credit, 57 features.
""" + _RETURNS.format(target="bad credit (1) / good (0)", sensitive="age >= 25 (1)", table=2) + """
    Examples
    --------
    >>> from dfairpca.datasets import load_german
    >>> load_german(split=9).X_test.shape
    (300, 57)
"""
load_compas.__doc__ = """COMPAS: 2,468 records (40% of ProPublica's two-year data), 11 features.
""" + _RETURNS.format(target="two-year recidivism", sensitive="race (1 = Caucasian)", table=3) + """
    Examples
    --------
    >>> from dfairpca.datasets import load_compas
    >>> load_compas().feature_names[:2]
    ['age', 'race=Caucasian']
"""
