"""Fidelity on real notebooks: kernel A snapshots and dies (SIGKILL), kernel B in another folder restores.

Objects shared through NumPy object arrays and pandas object columns stay shared (matplotlib's
`axes` array, a dict in a DataFrame cell); classes defined in the notebook come back without their
bases' `__init_subclass__` running twice (scikit-learn's set_output wrapping, a registry); tensors
that were part of an autograd graph are reported as changed rather than silently.
"""

from __future__ import annotations

import ast

import numpy as np
import pandas as pd
import pytest

from spotwarp_jupyter.engine.variables.grouping import shared_groups

AGG = {"MPLBACKEND": "Agg"}


def _report(kernel, code: str) -> dict:
    """Run `code` that prints one `@@{...}` line; return that dict."""
    out = kernel.run(code)
    line = [ln for ln in out.splitlines() if ln.startswith("@@")][-1]
    return ast.literal_eval(line[2:])


# -- item 16: references inside object arrays -------------------------------------------------

SHARED_WORK = r'''
%load_ext spotwarp
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
fig, axes = plt.subplots(1, 4)
ax = axes[3]
grid_fig, grid = plt.subplots(2, 2)
cell = grid[1, 0]
meta = {"source": "sensor-7", "unit": "K"}
df = pd.DataFrame({"reading": [1.5, 2.5, 3.5], "meta": [meta, meta, {"source": "other"}]})
labels = pd.Index([meta, "plain"], dtype=object)
tags = np.array([meta, None], dtype=object)
%spotwarp snapshot -m "shared through object arrays"
'''

SHARED_CHECKS = r'''
import io
axes[1].plot([0, 1, 2], [3, 1, 2])
png = io.BytesIO()
fig.savefig(png, format="png")
meta["unit"] = "C"
print("@@" + repr({
    "ax_is_axes3": ax is axes[3],
    "axes_figure_is_fig": all(a.figure is fig for a in axes),
    "fig_holds_axes": all(a is b for a, b in zip(fig.axes, axes)),
    "drawing_reaches_fig": len(fig.axes[1].lines),
    "fig_renders": png.getvalue()[:4] == b"\x89PNG",
    "grid_cell": cell is grid[1, 0] and grid[0, 1].figure is grid_fig,
    "df_cells_share_meta": df.loc[0, "meta"] is meta and df.loc[1, "meta"] is meta,
    "df_sees_change": df.loc[1, "meta"]["unit"],
    "other_cell": df.loc[2, "meta"],
    "index_shares_meta": labels[0] is meta,
    "tags_share_meta": tags[0] is meta,
    "readings": df["reading"].tolist(),
}))
'''

SHARED_EXPECTED = {
    "ax_is_axes3": True,
    "axes_figure_is_fig": True,
    "fig_holds_axes": True,
    "drawing_reaches_fig": 1,
    "fig_renders": True,
    "grid_cell": True,
    "df_cells_share_meta": True,
    "df_sees_change": "C",
    "other_cell": {"source": "other"},
    "index_shares_meta": True,
    "tags_share_meta": True,
    "readings": [1.5, 2.5, 3.5],
}


def test_objects_shared_through_object_arrays_stay_shared_on_a_new_host(start_kernel):
    a = start_kernel("hostA", **AGG)
    assert "SpotWarp snapshot" in a.run(SHARED_WORK)
    a.kill()
    b = start_kernel("hostB", **AGG)
    b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert _report(b, SHARED_CHECKS) == SHARED_EXPECTED


def test_grouping_sees_into_object_arrays_and_pandas_objects():
    shared = {"k": 1}
    frame = pd.DataFrame({"obj": [shared, 2]})
    structured = np.zeros(2, dtype=[("n", "i4"), ("o", "O")])
    structured["o"][1] = shared
    other = pd.Series([{"k": 2}], dtype=object)
    groups = shared_groups({"frame": frame, "shared": shared, "structured": structured, "other": other,
                            "numbers": np.arange(10), "strings": np.array(["a", "b"] * 600, dtype=object)})
    assert sorted(map(sorted, groups)) == [["frame", "shared", "structured"], ["numbers"], ["other"], ["strings"]]


# -- item 17: notebook classes and their bases' __init_subclass__ -------------------------------

CLASSES_WORK = r'''
%load_ext spotwarp
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin, OneToOneFeatureMixin
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.linear_model import Ridge
import plugins

class Clipper(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    def __init__(self, limit=3.0):
        self.limit = limit
    def fit(self, X, y=None):
        self.n_features_in_ = np.asarray(X).shape[1]
        return self
    def transform(self, X):
        return np.clip(np.asarray(X, dtype=float), -self.limit, self.limit) * 2.0

class Registry:
    calls = 0
    names = []
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Registry.calls += 1
        Registry.names.append(cls.__name__)

class CsvReader(Registry):
    pass

class JsonReader(Registry):
    pass

class NotebookPlugin(plugins.Plugin):
    pass

rng = np.random.default_rng(0)
X = rng.normal(size=(40, 3)) * 4
y = X @ np.array([1.0, -2.0, 0.5])
pipe = Pipeline([("clip", Clipper(2.5)), ("scale", StandardScaler()), ("ridge", Ridge())]).fit(X, y)
prep = Pipeline([("clip", Clipper()), ("scale", StandardScaler())]).set_output(transform="pandas").fit(X)
reader = CsvReader()
%spotwarp snapshot -m "notebook classes"
'''

CLASSES_CHECKS = r'''
def _depth(f):
    n = 0
    while hasattr(f, "__wrapped__"):
        f, n = f.__wrapped__, n + 1
    return n
framed = prep.transform(X)
print("@@" + repr({
    "predict": pipe.predict(X).round(10).tolist(),
    "prep": framed.round(10).values.tolist(),
    "prep_columns": list(framed.columns),
    "transform_wraps": _depth(Clipper.transform),
    "fit_transform_wraps": _depth(Clipper.fit_transform),
    "registry_calls": Registry.calls,
    "registry_names": list(Registry.names),
    "reader_type": type(reader) is CsvReader and isinstance(reader, Registry),
    "library_registry": list(plugins.REGISTRY),
}))
'''

PLUGINS_MODULE = '''
REGISTRY = []

class Plugin:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        REGISTRY.append(cls.__name__)
'''


def test_notebook_classes_come_back_without_running_init_subclass_again(start_kernel, tmp_path):
    for host in ("hostA", "hostB"):  # a library module importable on both hosts
        (tmp_path / host).mkdir()
        (tmp_path / host / "plugins.py").write_text(PLUGINS_MODULE)
    a = start_kernel("hostA")
    assert "SpotWarp snapshot" in a.run(CLASSES_WORK)
    on_a = _report(a, CLASSES_CHECKS)
    assert on_a["transform_wraps"] == 1 and on_a["registry_calls"] == 2
    assert on_a["library_registry"] == ["NotebookPlugin"]
    a.kill()

    b = start_kernel("hostB")
    b.run("%load_ext spotwarp\n%spotwarp restore latest")
    assert _report(b, CLASSES_CHECKS) == on_a
    # the restored registry still works for classes defined after the restore
    assert b.value("[type('XmlReader', (Registry,), {}).__name__, Registry.calls, Registry.names]") == [
        "XmlReader", 3, ["CsvReader", "JsonReader", "XmlReader"]]


# -- item 18: tensors that were part of an autograd graph -----------------------------------------

AUTOGRAD_WORK = r'''
%load_ext spotwarp
import torch
w = torch.ones(3, requires_grad=True)
x = torch.arange(3.0)
out = (w * x).sum()
hidden = {"act": torch.relu(w * 2), "plain": torch.zeros(2)}
loss_value = out.item()
%spotwarp snapshot -m "autograd"
'''


def test_tensors_that_lose_their_autograd_graph_are_reported(start_kernel):
    a = start_kernel("hostA")
    out = a.run(AUTOGRAD_WORK)
    assert "changed hidden, out (see %spotwarp status)" in out
    status = a.run("%spotwarp status")
    assert "changed" in status
    lines = {ln.split(":")[0].strip(): ln for ln in status.splitlines() if ln.startswith("    ")}
    assert "autograd graph" in lines["out"] and "SumBackward0" in lines["out"]
    assert "autograd graph" in lines["hidden"] and "ReluBackward0" in lines["hidden"]
    assert "w" not in lines and "x" not in lines and "loss_value" not in lines
    a.kill()

    b = start_kernel("hostB")
    restored = b.run("%load_ext spotwarp\n%spotwarp restore latest")
    warnings = [ln for ln in restored.splitlines() if ln.strip().startswith("warning:")]
    assert any("out" in ln and "autograd graph" in ln for ln in warnings), restored
    assert any("hidden" in ln and "autograd graph" in ln for ln in warnings), restored
    assert not any(" w " in ln or "loss_value" in ln for ln in warnings)
    assert b.value("[out.item(), out.grad_fn is None, w.requires_grad, w.is_leaf, hidden['act'].tolist()]") == [
        3.0, True, True, True, [2.0, 2.0, 2.0]]


CLASS_SHAPES = r'''
import abc, json, typing
from spotwarp_jupyter.engine import pickling

calls = []
class Reg:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        calls.append(cls.__name__)
class Slotted(Reg):
    __slots__ = ("a",)
class SlotBase:
    __slots__ = ("x",)
    def __init_subclass__(cls, **kwargs):
        calls.append(cls.__name__)
class OnlySlots(SlotBase):
    __slots__ = ("y",)
class Mapping(dict, Reg):
    pass
class Number(int, Reg):
    pass
class Failure(Exception, Reg):
    pass
class Shape(abc.ABC, Reg):
    @abc.abstractmethod
    def area(self): ...
T = typing.TypeVar("T")
class Box(typing.Generic[T], Reg):
    pass

report = {}
for cls in (Slotted, OnlySlots, Mapping, Number, Failure, Shape, Box):
    before = len(calls)
    p = pickling.dumps({cls.__name__: cls}, by_value=(cls,))
    new = pickling.loads(p.codec, p.data, p.buffers)[cls.__name__]
    report[cls.__name__] = {
        "new_class": new is not cls, "same_bases": new.__bases__ == cls.__bases__,
        "hook_runs": len(calls) - before, "has_dict": "__dict__" in dir(new(*([] if cls is not Number else [7])))
        if cls is not Shape else None,
        "abstract": sorted(getattr(new, "__abstractmethods__", ())),
        "parameters": [str(t) for t in getattr(new, "__parameters__", ())],
    }
report["number"] = int(pickling.loads(*(lambda p: (p.codec, p.data, p.buffers))(
    pickling.dumps({"n": Number}, by_value=(Number,))))["n"](7)) + 1
print(json.dumps(report))
'''


@pytest.mark.process
def test_class_shapes_rebuild_without_init_subclass(tmp_path):
    """Slots, builtin bases (dict, int, Exception), ABCs and Generic keep their layout and attributes."""
    import json
    import subprocess
    import sys

    script = tmp_path / "shapes.py"
    script.write_text(CLASS_SHAPES)  # run as __main__: the classes are notebook-like, saved by value
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    expected_dict = {"Slotted": True, "OnlySlots": False, "Mapping": True, "Number": True, "Failure": True}
    for name, facts in report.items():
        if name == "number":
            continue
        assert facts["new_class"] and facts["same_bases"] and facts["hook_runs"] == 0, (name, facts)
        if name in expected_dict:
            assert facts["has_dict"] is expected_dict[name], name
    assert report["Shape"]["abstract"] == ["area"]
    assert report["Box"]["parameters"] == ["~T"]
    assert report["number"] == 8
