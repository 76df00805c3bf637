"""``replayer sim``'s flags are generated from ``SimConfig``: every field made with
``config.flag`` is a flag of its name (or its named alias) that sets that field, with the
field's default, so a new simulator knob is one field."""

from __future__ import annotations

from dataclasses import fields

import pytest

from replayer.sim import SimConfig, main, parser
from replayer.sim.cli import config_from_flags

FLAGGED = [f for f in fields(SimConfig) if "help" in f.metadata]
OTHER = {"model": "m2", "score_usage": "once", "image_token_rule": "llava", "tokenizer": "builtin:gpt2"}
OTHER |= {"otlp_endpoint": "http://127.0.0.1:4318", "engine": "sglang"}


def _other_value(f):
    """A valid value of field ``f`` that is not its default, and the argv that sets it."""
    flag = f.metadata.get("flags", (f"--{f.name.replace('_', '-')}",))[0]
    if isinstance(f.default, bool):
        return not f.default, [flag]
    value = OTHER.get(f.name, f.default + 1 if isinstance(f.default, int | float) else None)
    assert value is not None, f"test: give {f.name} another value"
    return value, [flag, str(value)]


def test_the_defaults_are_the_configs():
    assert config_from_flags(parser().parse_args([])) == SimConfig()


@pytest.mark.parametrize("f", FLAGGED, ids=lambda f: f.name)
def test_each_field_is_a_flag_that_sets_it(f):
    value, argv = _other_value(f)
    cfg = config_from_flags(parser().parse_args(argv))
    assert getattr(cfg, f.name) == value
    assert cfg == SimConfig(**{f.name: value})


def test_every_field_but_the_in_memory_record_is_a_flag():
    assert {f.name for f in fields(SimConfig)} - {f.name for f in FLAGGED} == {"record_requests"}
    assert all(f.metadata["help"].strip() for f in FLAGGED)


def test_a_bad_value_is_named_and_exits_2(capsys):
    assert main(["--kv-block-size", "0", "--port", "0"]) == 2
    assert "kv_block_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["--score-usage", "twice"])
