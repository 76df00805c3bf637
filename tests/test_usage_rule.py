"""The usage audit's rule is one (replayer.core.usage): its per-request form (the live metrics)
and its columnar form (the summary) agree on every combination of known and unknown counts."""

from __future__ import annotations

import itertools

import numpy as np

from replayer.core import usage


def test_the_per_request_and_the_columnar_forms_agree():
    values = (None, 0, 9, 10, 11)
    cases = list(itertools.product(values, values, (0, 2), values))  # prompt, completion, images, text
    got = usage.of_columns(
        *(np.array([np.nan if c[k] is None else c[k] for c in cases], dtype=np.float64) for k in (0, 1)),
        np.full(len(cases), 10.0),
        np.full(len(cases), 10.0),
        images=np.array([c[2] for c in cases], dtype=np.float64),
        text_tokens=np.array([np.nan if c[3] is None else c[3] for c in cases], dtype=np.float64),
    )
    drift = iter(got.drift.tolist())
    for i, (prompt, completion, images, text) in enumerate(cases):
        one = usage.of_request(prompt, completion, 10, 10, images=images, text_tokens=text)
        assert one == (got.missing[i], got.prompt[i], got.completion[i]), (prompt, completion, images, text)
        counted = text if images else prompt
        if prompt is not None and counted is not None:
            assert next(drift) == counted - 10
    assert next(drift, None) is None


def test_an_image_request_is_audited_on_its_text_tokens():
    assert usage.of_request(1034, 10, 10, 10, images=1, text_tokens=10) == (False, False, False)
    assert usage.of_request(1034, 10, 10, 10, images=1, text_tokens=None) == (False, False, False)  # no split
    assert usage.of_request(1034, 10, 10, 10) == (False, True, False)
    assert usage.of_request(None, 10, 10, 10) == (True, False, False)
    assert usage.of_request(10, None, 10, 10) == (True, False, False)  # no completion count: missing too
