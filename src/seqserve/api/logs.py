"""The process's log: Triton's line shapes (``default``, ``ISO8601``) or one JSON object per
line, to standard error or a file; Triton's switches (verbose level, info, warning, error),
which the logging extension (``/v2/logging``, gRPC ``LogSettings``) changes while serving.

Only seqserve's loggers (``seqserve`` and below) become verbose: the root logger stays at
INFO, so a library (hpack, h2, asyncio, httptools...) never logs at DEBUG because of
``--log-verbose``. Every line passes through the redactor, which replaces registered secrets
(restricted-API header values, TLS material) and the values of credential-like headers.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any, TextIO

from seqserve.engine import Code, InferenceError

LOGGER = "seqserve"
FORMATS = ("default", "ISO8601", "json")
REDACTED = "<redacted>"

#: a logging level per Triton verbose level: 1 is DEBUG (10), 2 is 9, ...
VERBOSE_1 = logging.DEBUG
VERBOSE_2 = logging.DEBUG - 1

#: header names whose values are credentials, in a log line "name: value", "name=value" or
#: hpack's "(b'name', b'value')"
_CREDENTIAL = re.compile(
    r"(?i)((?:proxy-)?authorization|cookie|set-cookie|x-api-key|api[-_]key|[a-z0-9-]*token|[a-z0-9-]*secret|"
    r"[a-z0-9-]*password)(['\"]?\s*(?:[:=]\s*['\"]?|,\s*(?-i:b)?['\"]))([^'\"\s,)]+(?: [^'\"\s,)]+)?)"
)


def verbose_logging_level(verbose: int) -> int:
    """The level of seqserve's loggers for a Triton verbose level (0: INFO)."""
    return logging.INFO if verbose <= 0 else max(logging.DEBUG + 1 - verbose, 1)


@dataclass(frozen=True, slots=True)
class LogSettings:
    """Triton's log settings (the logging extension's names, less the log_ prefix)."""

    verbose: int = 0
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"  # one of FORMATS
    file: str = ""  # "" is standard error
    tracebacks: bool = False  # a model failure's traceback goes with its line

    def as_triton(self) -> dict[str, Any]:
        """The logging extension's document."""
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": self.format,
        }


class SettingError(ValueError):
    """A logging-extension request that cannot be applied; ``unsupported`` when the setting
    exists but cannot change over the network (Triton's UNSUPPORTED: log_file)."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def changed_settings(current: LogSettings, changes: dict[str, Any]) -> LogSettings:
    """``current`` with the logging extension's ``changes`` applied (null: unchanged), or
    SettingError for an unknown name or a value of the wrong type."""
    update: dict[str, Any] = {}
    for name, value in changes.items():
        if value is None:
            continue
        if name == "log_file":
            raise SettingError("log file location can not be updated through network protocol", unsupported=True)
        if name in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise SettingError(f"{name} must be a boolean")
            update[name.removeprefix("log_")] = value
        elif name == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SettingError("log_verbose_level must be an integer >= 0")
            update["verbose"] = value
        elif name == "log_format":
            if value not in FORMATS:
                raise SettingError(f"invalid argument for --log_format, got: {value}")
            update["format"] = value
        else:
            raise SettingError(f"unknown log setting '{name}'")
    return dataclasses.replace(current, **update)


class Redactor:
    """Replaces secrets in log text: the values registered (restricted-API keys, TLS key
    material) and the values of credential-like headers."""

    def __init__(self) -> None:
        self._secrets: tuple[str, ...] = ()

    def add(self, *secrets: str) -> None:
        # longest first, so that a secret containing another is replaced whole
        found = {s for s in (*self._secrets, *secrets) if s and len(s) >= 3}
        self._secrets = tuple(sorted(found, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _CREDENTIAL.sub(rf"\1\2{REDACTED}", text)


class _Switches(logging.Filter):
    """Triton's --log-info/--log-warning/--log-error."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s, level = self.settings, record.levelno
        if level >= logging.ERROR:
            return s.error
        if level >= logging.WARNING:
            return s.warning
        if level >= logging.INFO:
            return s.info
        return True  # verbose: the loggers' level decides


class LineFormatter(logging.Formatter):
    """One record as one line in the chosen format, redacted. A traceback (exc_info) follows
    its line only when the settings ask for tracebacks; otherwise the line names the
    exception."""

    def __init__(self, settings: LogSettings, redact: Redactor) -> None:
        super().__init__()
        self.settings = settings
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        message = self.redact(record.getMessage())
        trace = ""
        if record.exc_info and record.exc_info[1] is not None:
            if self.settings.tracebacks:
                trace = self.redact(self.formatException(record.exc_info))
            else:
                first = one_line(self.redact(str(record.exc_info[1])))
                if first not in message:  # the line names the exception, once
                    message += f" ({type(record.exc_info[1]).__name__}: {first})"
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        fmt = self.settings.format
        if fmt == "json":
            doc: dict[str, Any] = {
                "time": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "level": record.levelname if record.levelno >= logging.INFO else "VERBOSE",
                "pid": record.process,
                "logger": record.name,
                "file": f"{record.filename}:{record.lineno}",
                "message": message,
            }
            fields = getattr(record, "fields", None)
            if isinstance(fields, dict):
                doc.update({k: v for k, v in fields.items() if k not in doc})
            if trace:
                doc["traceback"] = trace
            return json.dumps(doc, default=str)
        letter = _severity(record.levelno)
        text = json.dumps(message) if "\n" not in message else message  # Triton escapes single-line messages
        if fmt == "ISO8601":
            line = f"{when:%Y-%m-%dT%H:%M:%S}Z {letter} {record.process} {record.filename}:{record.lineno}] {text}"
        else:
            line = (
                f"{letter}{when:%m%d %H:%M:%S}.{when.microsecond:06d} {record.process} "
                f"{record.filename}:{record.lineno}] {text}"
            )
        return f"{line}\n{trace}" if trace else line


def one_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


def _severity(level: int) -> str:
    if level >= logging.ERROR:
        return "E"
    if level >= logging.WARNING:
        return "W"
    return "I"  # Triton writes verbose lines as I


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record comes (a test may have swapped it)."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # always sys.stderr


class LogControl:
    """The process's log handler and settings. ``configure`` installs them (again: replaces
    the previous handler), ``update`` applies the logging extension's changes."""

    def __init__(self) -> None:
        self.redact = Redactor()
        self._settings = LogSettings()
        self._handler: logging.Handler | None = None
        self._switches = _Switches(self._settings)
        self._formatter = LineFormatter(self._settings, self.redact)
        self._lock = threading.Lock()

    @property
    def settings(self) -> LogSettings:
        return self._settings

    def configure(self, settings: LogSettings, stream: TextIO | None = None) -> None:
        """Send the log where ``settings`` say (OSError when the log file cannot be opened)."""
        handler: logging.Handler
        if settings.file:
            handler = logging.FileHandler(settings.file, encoding="utf-8")
        else:
            handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
        handler.addFilter(self._switches)
        handler.setFormatter(self._formatter)
        root = logging.getLogger()
        with self._lock:
            if self._handler is not None:
                root.removeHandler(self._handler)
                self._handler.close()
            self._handler = handler
            root.addHandler(handler)
            root.setLevel(logging.INFO)  # libraries (and models' own loggers): never verbose
            self._apply(settings)

    def update(self, changes: dict[str, Any]) -> LogSettings:
        """The logging extension: apply ``changes`` (SettingError when one cannot apply, and
        then none does) and return the settings now in force."""
        with self._lock:
            self._apply(changed_settings(self._settings, changes))
            return self._settings

    def _apply(self, settings: LogSettings) -> None:
        self._settings = settings
        self._switches.settings = settings
        self._formatter.settings = settings
        logging.getLogger(LOGGER).setLevel(verbose_logging_level(settings.verbose))


#: the one log of the process (the command line configures it; the routes read and change it)
log_control = LogControl()


def log_settings_request(changes: Any) -> dict[str, Any]:
    """The logging extension on either front-end: apply ``changes`` (a dict of Triton's
    setting names; {} reads) to the process's log and return the settings in force, or
    InferenceError (INVALID_ARG) naming what cannot apply."""
    if not isinstance(changes, dict):
        raise InferenceError(Code.INVALID_ARG, "the log settings must be a JSON object")
    try:
        settings = log_control.update(changes) if changes else log_control.settings
    except SettingError as e:
        raise InferenceError(Code.INVALID_ARG, str(e)) from None
    if changes:
        logging.getLogger(LOGGER).info("log settings changed: %s", ", ".join(f"{k}={v}" for k, v in changes.items()))
    return settings.as_triton()
