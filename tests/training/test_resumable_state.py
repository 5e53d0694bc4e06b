"""`resumable(..., state=...)` outside a process group, and its bad input: one line, nothing started."""

from __future__ import annotations

import pytest
import torch

import spotwarp


def test_state_in_one_process_is_a_plain_resumable_loop() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = spotwarp.resumable([1, 2, 3], name="one-process", state={"model": model, "optim": opt})
    assert list(loop) == [1, 2, 3]


@pytest.mark.parametrize("state, error", [
    ({"model": [1, 2]}, "resumable state 'model': a list has no state_dict()/load_state_dict()"),
    ([torch.nn.Linear(2, 1)], "resumable state must map names to objects with state_dict(), got list"),
    ({"": torch.nn.Linear(2, 1)}, "resumable state: bad name ''"),
])
def test_bad_state_is_refused_in_one_line(state, error: str) -> None:
    with pytest.raises(ValueError) as refused:
        spotwarp.resumable([1], name="bad", state=state)
    assert str(refused.value).startswith(error) and "\n" not in str(refused.value)
