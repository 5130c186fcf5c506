"""seqserve.api.logs without a server: Triton's line shapes and JSON lines, the switches and
verbose levels, the redactor, the logging extension's changes, and that libraries never
become verbose."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from seqserve.api.logs import (
    REDACTED,
    LogControl,
    LogSettings,
    Redactor,
    SettingError,
    changed_settings,
    verbose_logging_level,
)


@pytest.fixture
def control() -> Iterator[tuple[LogControl, io.StringIO]]:
    """A LogControl writing to a buffer; the root and seqserve loggers put back afterwards."""
    root, ours = logging.getLogger(), logging.getLogger("seqserve")
    saved = (root.level, ours.level, list(root.handlers))
    stream = io.StringIO()
    c = LogControl()
    yield c, stream
    for h in list(root.handlers):
        if h not in saved[2]:
            root.removeHandler(h)
    root.setLevel(saved[0])
    ours.setLevel(saved[1])


def test_default_and_iso8601_lines(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(), stream)
    logging.getLogger("seqserve.test").info("loaded model '%s'", "m")
    logging.getLogger("seqserve.test").warning("careful")
    c.update({"log_format": "ISO8601"})
    logging.getLogger("seqserve.test").error("broken")
    first, second, third = stream.getvalue().splitlines()
    assert re.fullmatch(r"I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ test_logs\.py:\d+\] \"loaded model 'm'\"", first)
    assert second.startswith("W") and second.endswith('] "careful"')
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ E \d+ test_logs\.py:\d+\] "broken"', third)


def test_json_lines_carry_fields(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(format="json", verbose=1), stream)
    logging.getLogger("seqserve.requests").debug("a request", extra={"fields": {"model": "m", "sequence_id": 7}})
    doc = json.loads(stream.getvalue())
    assert doc["message"] == "a request" and doc["model"] == "m" and doc["sequence_id"] == 7
    assert doc["level"] == "VERBOSE" and doc["logger"] == "seqserve.requests"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", doc["time"])


def test_switches_and_verbose_levels(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(info=False, verbose=1), stream)
    log = logging.getLogger("seqserve.test")
    log.info("no info")
    log.warning("a warning")
    log.debug("verbose 1")
    log.log(verbose_logging_level(2), "verbose 2")
    text = stream.getvalue()
    assert "no info" not in text and "a warning" in text and "verbose 1" in text and "verbose 2" not in text
    c.update({"log_verbose_level": 2, "log_warning": False})
    log.warning("hidden")
    log.log(verbose_logging_level(2), "now verbose 2")
    assert "hidden" not in stream.getvalue() and "now verbose 2" in stream.getvalue()


def test_libraries_never_verbose(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(verbose=9), stream)
    for name in ("hpack", "hpack.hpack", "h2", "asyncio", "httptools", "grpc"):
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
        logging.getLogger(name).debug("Decoded (b'triton-grpc-protocol-admin', b'S3cr3tValue')")
    assert stream.getvalue() == ""
    logging.getLogger("hpack").warning("a library warning still shows")
    logging.getLogger("a_models_own_logger").info("a model's own INFO line shows")
    assert "a model's own INFO line shows" in stream.getvalue()
    assert "a library warning still shows" in stream.getvalue()


def test_redactor() -> None:
    r = Redactor()
    r.add("S3cr3tValue", "ab")  # too short to redact safely: ignored
    assert r("key S3cr3tValue here") == f"key {REDACTED} here"
    assert r("Decoded (b'authorization', b'Bearer abc.def')") == f"Decoded (b'authorization', b'{REDACTED}')"
    assert r("Authorization: Bearer abc.def") == f"Authorization: {REDACTED}"
    assert r("x-api-key=k123") == f"x-api-key={REDACTED}"
    assert r("nothing to see, ab") == "nothing to see, ab"


def test_redaction_covers_tracebacks(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(tracebacks=True), stream)
    c.redact.add("S3cr3tValue")
    try:
        raise ValueError("the key was S3cr3tValue")
    except ValueError:
        logging.getLogger("seqserve.test").exception("failed with S3cr3tValue")
    assert "S3cr3tValue" not in stream.getvalue() and "Traceback" in stream.getvalue()


def test_exception_named_once_without_tracebacks(control: tuple[LogControl, io.StringIO]) -> None:
    c, stream = control
    c.configure(LogSettings(), stream)
    try:
        raise KeyError("k")
    except KeyError:
        logging.getLogger("seqserve.test").exception("lookup failed")
    assert stream.getvalue().count("\n") == 1 and "(KeyError: 'k')" in stream.getvalue()


def test_changed_settings() -> None:
    s = LogSettings()
    assert changed_settings(s, {"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"}) == LogSettings(
        info=False, verbose=2, format="ISO8601"
    )
    assert changed_settings(s, {"log_info": None}) == s
    for bad in ({"log_info": "yes"}, {"log_verbose_level": -1}, {"log_verbose_level": True}, {"nothing": 1}):
        with pytest.raises(SettingError):
            changed_settings(s, bad)
    with pytest.raises(SettingError, match="log file location can not be updated") as e:
        changed_settings(s, {"log_file": "/tmp/x"})
    assert e.value.unsupported
