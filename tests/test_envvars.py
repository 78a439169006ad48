"""Operator settings from the environment (specviz.serving.envvars): an unreadable value falls back to the
default with a warning that names the variable and the value, instead of stopping the app."""

from __future__ import annotations

import importlib
import importlib.util
import logging

import pytest

from specviz.serving.envvars import env_choice, env_int, env_number

BAD = ("abc", "-3", "0", "nan", "inf", "-inf", "1e999", "  ", "")


@pytest.mark.parametrize("raw", BAD)
def test_an_unreadable_value_falls_back_to_the_default(monkeypatch, caplog, raw):
    monkeypatch.setenv("SPECVIZ_SOMETHING", raw)
    with caplog.at_level(logging.WARNING, logger="specviz.env"):
        assert env_int("SPECVIZ_SOMETHING", 7) == 7
        assert env_number("SPECVIZ_SOMETHING", 2.5) == 2.5
    if raw.strip():  # set to something unusable: say so, naming the variable and the value
        assert len(caplog.records) == 2
        assert all("SPECVIZ_SOMETHING" in r.getMessage() and repr(raw) in r.getMessage() for r in caplog.records)
    else:  # empty is the same as unset: nothing to warn about
        assert not caplog.records


def test_good_values_are_read(monkeypatch, caplog):
    monkeypatch.delenv("SPECVIZ_SOMETHING", raising=False)
    assert env_int("SPECVIZ_SOMETHING", 7) == 7
    for raw, as_int, as_float in (("16", 16, 16.0), (" 3 ", 3, 3.0), ("2.5", 7, 2.5), ("1e3", 7, 1000.0)):
        monkeypatch.setenv("SPECVIZ_SOMETHING", raw)
        got = env_int("SPECVIZ_SOMETHING", 7)
        assert got == as_int and type(got) is int  # "2.5" or "1e3" is not a count: the default
        assert env_number("SPECVIZ_SOMETHING", 1.0) == as_float


def test_a_choice_is_read_without_case_and_an_unknown_one_falls_back(monkeypatch, caplog):
    choices = ("auto", "bf16", "int8")
    monkeypatch.delenv("SPECVIZ_SOMETHING", raising=False)
    assert env_choice("SPECVIZ_SOMETHING", choices, "auto") == "auto"
    for raw, want in ((" INT8 ", "int8"), ("bf16", "bf16"), ("", "auto")):
        monkeypatch.setenv("SPECVIZ_SOMETHING", raw)
        assert env_choice("SPECVIZ_SOMETHING", choices, "auto") == want
    assert not caplog.records
    monkeypatch.setenv("SPECVIZ_SOMETHING", "int4")
    with caplog.at_level(logging.WARNING, logger="specviz.env"):
        assert env_choice("SPECVIZ_SOMETHING", choices, "auto") == "auto"
    (record,) = caplog.records
    assert "SPECVIZ_SOMETHING" in record.getMessage() and "'int4'" in record.getMessage()
    assert "auto, bf16, int8" in record.getMessage()  # says what it accepts


@pytest.mark.parametrize("name,attr,default", [
    ("SPECVIZ_SESSIONS", "SESSIONS", 128), ("SPECVIZ_QUEUE_SIZE", "QUEUE_SIZE", 64),
    ("SPECVIZ_WORKERS", "RUN_WORKERS", 32),
])
def test_the_app_starts_with_a_bad_setting(monkeypatch, caplog, name, attr, default):
    import app

    try:
        for raw in ("abc", "-3"):
            monkeypatch.setenv(name, raw)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="specviz.env"):
                assert getattr(importlib.reload(app), attr) == default
            assert any(name in r.getMessage() and repr(raw) in r.getMessage() for r in caplog.records)
        monkeypatch.setenv(name, "5")
        assert getattr(importlib.reload(app), attr) == 5
    finally:
        monkeypatch.delenv(name, raising=False)
        importlib.reload(app)


@pytest.mark.parametrize("module,name,read", [
    ("specviz.serving.replay", "SPECVIZ_CACHE_ENTRIES", lambda m: m.CACHE_ENTRIES == 64),
    ("specviz.serving.replay", "SPECVIZ_CACHE_MB", lambda m: m.CACHE_BYTES == 32 * 2**20),
    ("specviz.serving.replay", "SPECVIZ_MAX_REPLAY_S", lambda m: m.MAX_REPLAY_S == 60.0),
    ("specviz.serving.replay", "SPECVIZ_MAX_WAITING", lambda m: m.LiveGate().max_waiting == 8),
    ("specviz.ui.store", "SPECVIZ_STORE_MB", lambda m: m.STORE_BYTES == 24 * 2**20),
])
def test_the_other_settings_read_at_import_fall_back_too(monkeypatch, caplog, module, name, read):
    """These were read with bare int()/float(): "abc" stopped the import, "inf" overflowed int()."""
    mod = importlib.import_module(module)
    for raw in ("abc", "inf"):
        monkeypatch.setenv(name, raw)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specviz.env"):
            if name == "SPECVIZ_MAX_WAITING":  # read when a gate is made, not at import
                assert read(mod)
            else:
                source = importlib.util.find_spec(module)
                fresh = importlib.util.module_from_spec(source)  # a fresh copy: the app's own stays as it is
                source.loader.exec_module(fresh)
                assert read(fresh)
        assert any(name in r.getMessage() and repr(raw) in r.getMessage() for r in caplog.records)
