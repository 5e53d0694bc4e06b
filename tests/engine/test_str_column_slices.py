"""A string column is saved as one joined buffer and rebuilt slice by slice (the GIL changes hands between
slices while a restore reads): whatever falls on a slice's edge comes back whole and in order."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spotwarp_jupyter.engine import pickling
from spotwarp_jupyter.engine.pickling import data


def _round_trip(value):
    pickled = pickling.dumps(value)
    buffers = [bytearray(b) for b in pickled.buffers]
    assert buffers, "the column went in band: the joined-buffer route was not taken"
    return pickling.loads(pickled.codec, pickled.data, buffers)


@pytest.mark.parametrize("kind", ["ascii", "multibyte", "long-strings", "empty-strings", "surrogates"])
def test_a_column_spanning_many_slices_comes_back_whole(kind):
    count = 150_000
    if kind == "ascii":
        strings = [f"item-{i:09d}-{(i * 7919) % 100_003}" for i in range(count)]
    elif kind == "multibyte":  # 2-, 3- and 4-byte characters fall on slice edges
        strings = [f"é{i}€{'𝄞' * (i % 5)}ü" for i in range(count)]
    elif kind == "long-strings":  # one string longer than a slice, and several separator searches long
        strings = ["x" * (3 * data.STR_SLICE + 17)] + [f"s{i}" for i in range(count)] + ["y" * 9000]
    elif kind == "empty-strings":
        strings = ["" if i % 3 else f"value-{i}" for i in range(count)] + ["", ""]
    else:
        strings = [f"bad\udcff{i}" for i in range(count)]
    assert sum(len(s.encode("utf-8", "surrogatepass")) for s in strings) > 2 * data.STR_SLICE
    back = _round_trip(np.array(strings, dtype=object))
    assert back.dtype == object and back.shape == (len(strings),)
    assert back.tolist() == strings


def test_a_two_dimensional_fortran_ordered_column_keeps_its_shape_and_order():
    grid = np.array([[f"r{r}c{c}" for c in range(4)] for r in range(30_000)], dtype=object).copy(order="F")
    back = _round_trip(grid)
    assert back.shape == grid.shape and back.flags.f_contiguous
    assert (back == grid).all()


def test_a_dataframe_string_column_comes_back_equal():
    frame = pd.DataFrame({"n": np.arange(50_000), "label": [f"label-{i}-ñ" for i in range(50_000)]})
    pd.testing.assert_frame_equal(_round_trip(frame), frame)


@pytest.mark.parametrize("odd", ["separator", "not-a-str"])
def test_a_column_whose_odd_value_lies_past_the_first_joined_slice_is_pickled_the_usual_way(odd):
    # the column is joined STR_ITEMS strings at a time: a value that cannot be joined, found in a later slice,
    # still sends the whole column the usual way
    strings: list = [f"v{i}" for i in range(3 * data.STR_ITEMS)]
    strings[2 * data.STR_ITEMS + 5] = "a\x00b" if odd == "separator" else 7
    pickled = pickling.dumps(np.array(strings, dtype=object))
    assert not pickled.buffers
    assert pickling.loads(pickled.codec, pickled.data, []).tolist() == strings
