"""Reading a config: ``config.pbtxt`` (protobuf text format) or JSON from the load API, and
the JSON the model-config endpoint serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from seqserve._proto.model_config_pb2 import (
    ModelConfig,
)
from seqserve.engine.config.defaults import normalize_config
from seqserve.engine.config.names import CONFIG_FILENAME
from seqserve.engine.config.validate import validate_config
from seqserve.engine.errors import Code, ModelConfigError


def load_model_config(model_dir: Path, *, name: str | None = None) -> ModelConfig:
    """Read, normalize and validate ``<model_dir>/config.pbtxt``.

    ``name`` is the model name to expect (default: the directory name). A
    missing file gives a config holding only the name, for backends that can
    complete the config themselves (see ``parse_model_config``).
    """
    cfg = parse_model_config(model_dir, name=name)
    finish_model_config(cfg, model_dir)
    return cfg


def parse_model_config(model_dir: Path, *, name: str | None = None) -> ModelConfig:
    """The first step of ``load_model_config``: read ``config.pbtxt`` and check the name,
    without defaults or validation, so that a backend can complete the config first."""
    model_dir = Path(model_dir)
    expected = name if name is not None else model_dir.name
    path = model_dir / CONFIG_FILENAME
    cfg = _parse_config_file(path) if path.is_file() else ModelConfig()
    if not cfg.name:
        cfg.name = expected
    elif cfg.name != expected:
        where = "the expected model name" if name is not None else "the model directory name"
        raise ModelConfigError(f"model name '{cfg.name}' in {path} does not match {where} '{expected}'")
    return cfg


def finish_model_config(cfg: ModelConfig, model_dir: Path) -> None:
    """The last step of loading a config: apply defaults, then validate."""
    normalize_config(cfg)
    validate_config(cfg, Path(model_dir))


def config_from_json(text: str, model_dir: Path, *, name: str) -> ModelConfig:
    """A config given as JSON (the repository load API's 'config' parameter), checked like a
    config.pbtxt."""
    cfg = parse_config_json(text, name=name)
    finish_model_config(cfg, model_dir)
    return cfg


def parse_config_json(text: str, *, name: str) -> ModelConfig:
    """The first step of ``config_from_json``: parse and check the name only."""
    try:
        cfg = json_format.Parse(text, ModelConfig())
    except json_format.ParseError as e:
        raise ModelConfigError(f"failed to parse the 'config' parameter for model '{name}': {e}") from e
    if not cfg.name:
        cfg.name = name
    elif cfg.name != name:
        raise ModelConfigError(f"model name '{cfg.name}' in the 'config' parameter does not match '{name}'")
    return cfg


def _parse_config_file(path: Path) -> ModelConfig:
    # INTERNAL, as Triton reports unreadable config files; protobuf's own
    # message carries the line:column and the offending field.
    prefix = f"failed to read text proto from {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{prefix}: {e}", Code.INTERNAL) from e
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as e:
        raise ModelConfigError(f"{prefix}: {e}", Code.INTERNAL) from e


def config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The config as the HTTP model-config endpoint returns it.

    Like Triton: snake_case field names, every field without presence
    printed (defaults included), enums by name, and 64-bit integers as JSON
    numbers rather than the strings protobuf's JSON mapping uses. seqserve's
    own fields (numbers from ``EXTENSION_FIELD_MIN``) appear only when the
    config sets them, so that a client parsing the JSON strictly with Triton's
    ``model_config.proto`` accepts every config that uses none of them.
    """
    out = json_format.MessageToDict(
        cfg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    desc = cast(Descriptor, cfg.DESCRIPTOR)
    _drop_unset_extensions(out, cfg, desc)
    _unquote_int64(out, desc)
    return out


#: seqserve's config extensions use field numbers from here on (protos/model_config.proto)
EXTENSION_FIELD_MIN = 1000


def _drop_unset_extensions(obj: dict[str, Any], msg: Any, desc: Descriptor) -> None:
    """Remove from ``obj`` (``msg`` as a dict) each seqserve field that ``msg`` leaves at its
    default; descend into the message fields both hold."""
    for key in list(obj):
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        value = getattr(msg, key)
        extension = field.number >= EXTENSION_FIELD_MIN and not field.is_repeated and not field.has_presence
        if extension and value == field.default_value:
            del obj[key]
            continue
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if _is_repeated(field):
            for item_obj, item_msg in zip(obj[key], value, strict=True):
                _drop_unset_extensions(item_obj, item_msg, field.message_type)
        else:
            _drop_unset_extensions(obj[key], value, field.message_type)


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _unquote_int64(obj: dict[str, Any], desc: Descriptor) -> None:
    for key, value in obj.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                value[map_key] = _unquote_value(item, value_field)
        elif _is_repeated(field):
            obj[key] = [_unquote_value(item, field) for item in value]
        else:
            obj[key] = _unquote_value(value, field)


def _unquote_value(value: Any, field: FieldDescriptor) -> Any:
    if field.message_type is not None:
        _unquote_int64(value, field.message_type)
        return value
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 7 removed FieldDescriptor.label; is_repeated replaces it.
    return bool(field.is_repeated)
