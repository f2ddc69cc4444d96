"""Group labels the estimators must refuse clearly or encode exactly: missing labels of
every pandas and numpy kind, mixed types, numbers in object columns, trailing NULs."""

import numpy as np
import pandas as pd
import pytest

import dfairpca
from dfairpca.inputs._groups import encode_groups


@pytest.fixture(scope="module")
def data(two_groups):
    return two_groups(600, 8, seed=7, shift=0.7, spread=True)


def _na_series(dtype):
    s = pd.Series(np.where(np.arange(600) % 2 == 0, "a", "b"), dtype=dtype)
    s.iloc[[3, 40]] = pd.NA
    return s


@pytest.mark.parametrize("labels", [
    pytest.param(lambda: _na_series(object), id="object"),
    pytest.param(lambda: _na_series("string"), id="string"),
    pytest.param(lambda: _na_series("string[pyarrow]"), id="string[pyarrow]"),
    pytest.param(lambda: pd.Series(np.arange(600) % 2, dtype="Int64").mask(
        pd.Series(np.isin(np.arange(600), [3, 40])), pd.NA), id="Int64"),
    pytest.param(lambda: np.array(["a", "b"] * 150 + [None] + ["a"] * 299, object), id="None"),
    pytest.param(lambda: pd.DataFrame({"sex": _na_series("string")}), id="DataFrame"),
])
def test_pandas_na_and_none_are_missing_labels_not_a_group(data, labels):
    X, z = data
    with pytest.raises(ValueError, match=r"missing labels .* every row needs a group"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=labels())


def test_missing_label_error_names_the_rows(data):
    X, _ = data
    with pytest.raises(ValueError, match=r"in 2 row\(s\) \(rows 3, 40\)"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=_na_series("string[pyarrow]"))


def test_labels_mixing_1_and_text_1_are_refused_showing_both(data):
    X, z = data
    mixed = z.astype(object)
    mixed[mixed == 1] = "1"
    mixed[7] = 1
    with pytest.raises(ValueError, match=r"mixes labels of different types, e.g. 1 \(int\) and '1' \(str\)"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=mixed)
    with pytest.raises(ValueError, match=r"mixes labels"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=pd.Series(mixed))


def test_numbers_in_an_object_column_are_the_groups_numpy_would_give(data):
    X, z = data
    as_objects = z.astype(object)
    as_objects[as_objects == 1] = 1.0  # 1 and 1.0 are one group, as in numpy and pandas
    g = encode_groups(as_objects, len(z))
    np.testing.assert_array_equal(g.categories[0], [0, 1])
    np.testing.assert_array_equal(g.codes[:, 0], z)
    wide = np.array([2**63 + 1, 2**63] * 300, object)  # too wide for float64: kept apart
    assert len(encode_groups(wide, 600).categories[0]) == 2
    with pytest.raises(ValueError, match="would merge"):
        encode_groups(np.array([2**63 + 1, 2**63, 0.5] * 200, object), 600)


def test_text_labels_ending_in_nul_are_refused_not_merged():
    """numpy's fixed-width text drops trailing NULs: 'b' and 'b\\x00' were one group."""
    X = np.random.default_rng(0).normal(size=(30, 4))
    z = np.array(["b", "b\x00", "c"] * 10, dtype=object)
    with pytest.raises(ValueError, match="NUL"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=z)


def test_two_columns_of_one_name_are_refused_naming_the_name(data):
    X, z = data
    twice = pd.DataFrame({"sex": z, "race": 1 - z})
    twice.columns = ["sex", "sex"]
    with pytest.raises(ValueError, match=r"sensitive_features has 2 columns named 'sex' \(columns "
                                         r"0 and 1\): rename or drop"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=twice)
    # as X with sensitive_feature_ids: the duplicate named whether or not it is the sensitive one
    for names, dup in ((["sex", *map(str, range(X.shape[1] - 1)), "sex"], "sex"),
                       (["a", "a", *map(str, range(X.shape[1] - 1))], "a")):
        frame = pd.DataFrame(np.column_stack([z, X]), columns=names)
        with pytest.raises(ValueError, match=rf"X has 2 columns named '{dup}' .*: rename or drop"):
            dfairpca.FairPCA(2, sensitive_feature_ids=["sex"]).fit(frame)


@pytest.mark.parametrize("rows", [
    pytest.param(lambda z: [(int(a), int(1 - a)) for a in z], id="numbers"),
    pytest.param(lambda z: [("m", "x") if a else ("f", "y") for a in z], id="text"),
    pytest.param(lambda z: [[int(a), "x" if a else "y"] for a in z], id="lists"),
])
def test_rows_given_as_a_list_of_tuples_name_the_form_to_use(data, rows):
    # a list is read as p label vectors (one per attribute); n rows of p labels is another form
    X, z = data
    with pytest.raises(ValueError, match=r"a list of 600 rows of 2 labels.*an \(n, p\) array.*DataFrame"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=rows(z))
    fitted = dfairpca.FairPCA(2).fit(X, sensitive_features=np.asarray(rows(z), dtype=object))
    assert fitted.n_components_ == 2
