"""Our generated protobuf modules against tritonclient's: same wire format, same service.

seqserve generates its own modules from protos/ (tritonclient is a test dependency only). Everything
that reaches the wire (package, service and rpc names, field numbers, types, labels, oneof members,
enum values) must equal the descriptors tritonclient ships, recursively. Our model_config.proto may
add extension fields numbered >= 1000 (and the nested types they use) and does not wrap the
scheduling fields in a oneof, which is the same on the wire.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, json_format
from tritonclient.grpc import model_config_pb2 as t_config_pb2
from tritonclient.grpc import service_pb2 as t_service_pb2

from seqserve._proto import (
    POOL,
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    model_config_pb2,
)

EXTENSION_MIN = 1000
# Fields that are oneof members in Triton's model_config.proto but plain fields in ours (documented
# in protos/model_config.proto): a oneof member and a plain singular message field encode alike.
UNWRAPPED_ONEOFS = {("inference.ModelConfig", "scheduling_choice")}


# ------------------------------------------------------------------------------------------------
# Descriptor comparison


def _file_proto(module) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _field_sig(msg: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto):
    oneof = msg.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return {
        "number": field.number,
        "label": field.label,
        "type": field.type,
        "type_name": field.type_name,
        "default_value": field.default_value,
        "proto3_optional": field.proto3_optional,
        "oneof": oneof,
        "options": field.options.SerializeToString(deterministic=True),
    }


def _compare_enum(theirs, ours, scope: str, problems: list[str]) -> None:
    t_values = {v.name: v.number for v in theirs.value}
    o_values = {v.name: v.number for v in ours.value}
    if t_values != o_values:
        problems.append(f"enum {scope}: values {o_values} != tritonclient's {t_values}")


def _compare_message(theirs, ours, scope: str, problems: list[str], extensions: bool) -> None:
    """Append to `problems` every difference of `ours` from `theirs` (DescriptorProtos)."""
    if theirs.options.map_entry != ours.options.map_entry:
        problems.append(f"{scope}: map_entry differs")
    t_fields = {f.name: f for f in theirs.field}
    o_fields = {f.name: f for f in ours.field}
    for name, t_field in t_fields.items():
        o_field = o_fields.get(name)
        if o_field is None:
            problems.append(f"{scope}.{name}: missing")
            continue
        t_sig, o_sig = _field_sig(theirs, t_field), _field_sig(ours, o_field)
        if extensions and (scope, t_sig["oneof"]) in UNWRAPPED_ONEOFS and o_sig["oneof"] is None:
            t_sig["oneof"] = None
        if t_sig != o_sig:
            diff = {k: (o_sig[k], t_sig[k]) for k in t_sig if t_sig[k] != o_sig[k]}
            problems.append(f"{scope}.{name}: (ours, tritonclient's) differ in {diff}")
    t_numbers = {f.number for f in theirs.field}
    for name in o_fields.keys() - t_fields.keys():
        number = o_fields[name].number
        if not extensions or number < EXTENSION_MIN:
            problems.append(f"{scope}.{name} = {number}: extra field")
        elif number in t_numbers:
            problems.append(f"{scope}.{name} = {number}: reuses a tritonclient field number")

    o_nested = {m.name: m for m in ours.nested_type}
    for t_nested in theirs.nested_type:
        if t_nested.name not in o_nested:
            problems.append(f"{scope}.{t_nested.name}: nested message missing")
        else:
            _compare_message(t_nested, o_nested[t_nested.name], f"{scope}.{t_nested.name}", problems, extensions)
    if not extensions:
        extra = {m.name for m in ours.nested_type} - {m.name for m in theirs.nested_type}
        problems.extend(f"{scope}.{name}: extra nested message" for name in sorted(extra))

    o_enums = {e.name: e for e in ours.enum_type}
    for t_enum in theirs.enum_type:
        if t_enum.name not in o_enums:
            problems.append(f"{scope}.{t_enum.name}: nested enum missing")
        else:
            _compare_enum(t_enum, o_enums[t_enum.name], f"{scope}.{t_enum.name}", problems)
    if not extensions:
        extra = {e.name for e in ours.enum_type} - {e.name for e in theirs.enum_type}
        problems.extend(f"{scope}.{name}: extra nested enum" for name in sorted(extra))


def _compare_file(theirs_module, ours_module, extensions: bool) -> list[str]:
    theirs, ours = _file_proto(theirs_module), _file_proto(ours_module)
    problems: list[str] = []
    for attr in ("name", "package", "syntax", "dependency"):
        if getattr(theirs, attr) != getattr(ours, attr):
            problems.append(f"file {attr}: {getattr(ours, attr)!r} != {getattr(theirs, attr)!r}")
    o_messages = {m.name: m for m in ours.message_type}
    for t_msg in theirs.message_type:
        if t_msg.name not in o_messages:
            problems.append(f"message {t_msg.name}: missing")
        else:
            _compare_message(t_msg, o_messages[t_msg.name], f"{theirs.package}.{t_msg.name}", problems, extensions)
    o_enums = {e.name: e for e in ours.enum_type}
    for t_enum in theirs.enum_type:
        if t_enum.name not in o_enums:
            problems.append(f"enum {t_enum.name}: missing")
        else:
            _compare_enum(t_enum, o_enums[t_enum.name], t_enum.name, problems)
    if not extensions:
        extra = {m.name for m in ours.message_type} - {m.name for m in theirs.message_type}
        problems.extend(f"message {name}: extra" for name in sorted(extra))
    return problems


def test_service_messages_match_tritonclient():
    assert _compare_file(t_service_pb2, grpc_service_pb2, extensions=False) == []


def test_model_config_matches_tritonclient():
    assert _compare_file(t_config_pb2, model_config_pb2, extensions=True) == []


def test_model_config_extensions_are_numbered_from_1000():
    """The comparison above allows extras; make sure it saw the ones we know of (it is not vacuous)."""
    fields = model_config_pb2.ModelDynamicBatching.DESCRIPTOR.fields_by_name
    assert "default_batch_size" in fields
    assert "default_batch_size" not in t_config_pb2.ModelDynamicBatching.DESCRIPTOR.fields_by_name
    assert fields["default_batch_size"].number >= EXTENSION_MIN


def test_comparison_detects_differences():
    theirs = _file_proto(t_service_pb2)
    ours = _file_proto(grpc_service_pb2)
    msg = next(m for m in ours.message_type if m.name == "InferParameter")
    next(f for f in msg.field if f.name == "uint64_param").number = 6
    msg.field.add(name="extra", number=1001, type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL)
    t_msg = next(m for m in theirs.message_type if m.name == "InferParameter")
    problems: list[str] = []
    _compare_message(t_msg, msg, "inference.InferParameter", problems, extensions=False)
    assert len(problems) == 2, problems
    problems.clear()
    _compare_message(t_msg, msg, "inference.InferParameter", problems, extensions=True)
    assert len(problems) == 1, problems


def test_service_rpcs_match_tritonclient():
    theirs = t_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"

    def sig(method):
        return (
            method.input_type.full_name,
            method.output_type.full_name,
            method.client_streaming,
            method.server_streaming,
        )

    t_methods = {m.name: sig(m) for m in theirs.methods}
    o_methods = {m.name: sig(m) for m in ours.methods}
    assert o_methods == t_methods
    assert o_methods["ModelStreamInfer"] == (
        "inference.ModelInferRequest",
        "inference.ModelStreamInferResponse",
        True,
        True,
    )
    servicer = grpc_service_pb2_grpc.GRPCInferenceServiceServicer
    assert all(hasattr(servicer, name) for name in t_methods)


def test_health_proto():
    assert health_pb2.DESCRIPTOR.package == "grpc.health.v1"
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert service.full_name == "grpc.health.v1.Health"
    check = service.methods_by_name["Check"]
    assert check.input_type.full_name == "grpc.health.v1.HealthCheckRequest"
    assert check.output_type.full_name == "grpc.health.v1.HealthCheckResponse"
    assert not check.client_streaming and not check.server_streaming
    assert health_pb2.HealthCheckRequest.DESCRIPTOR.fields_by_name["service"].number == 1
    assert health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"].number == 1
    status = health_pb2.HealthCheckResponse.ServingStatus
    assert dict(status.items()) == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }
    assert hasattr(health_pb2_grpc, "add_HealthServicer_to_server")


def test_descriptors_live_in_our_pool():
    for module in (grpc_service_pb2, health_pb2, model_config_pb2):
        assert module.DESCRIPTOR.pool is POOL
    assert t_service_pb2.DESCRIPTOR.pool is not POOL
    assert grpc_service_pb2.ModelInferRequest is not t_service_pb2.ModelInferRequest


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours-first", "tritonclient-first"])
def test_import_alongside_tritonclient(ours_first):
    ours = (
        "from seqserve._proto import grpc_service_pb2, grpc_service_pb2_grpc, health_pb2, "
        "health_pb2_grpc, model_config_pb2"
    )
    theirs = (
        "import tritonclient.grpc, tritonclient.grpc.aio\n"
        "from tritonclient.grpc import service_pb2, service_pb2_grpc, model_config_pb2 as t_config"
    )
    check = textwrap.dedent(
        """
        assert grpc_service_pb2.ModelInferRequest is not service_pb2.ModelInferRequest
        assert model_config_pb2.ModelConfig is not t_config.ModelConfig
        grpc_service_pb2.ModelInferRequest(model_name="m")
        service_pb2.ModelInferRequest(model_name="m")
        """
    )
    code = "\n".join([ours, theirs] if ours_first else [theirs, ours]) + check
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------------
# Round trips through the wire format


def _assert_same(ours_msg, theirs_msg) -> None:
    """Equal content, and equal bytes once both are re-serialized deterministically."""
    assert json_format.MessageToDict(ours_msg) == json_format.MessageToDict(theirs_msg)
    assert ours_msg.SerializeToString(deterministic=True) == theirs_msg.SerializeToString(deterministic=True)


PARAMS = {
    "sequence_start": ("bool_param", True),
    "sequence_id": ("int64_param", -(2**62)),
    "name": ("string_param", "héllo"),
    "scale": ("double_param", 0.25),
    "priority": ("uint64_param", 2**64 - 1),
}


def test_infer_request_tritonclient_to_ours():
    req = t_service_pb2.ModelInferRequest(model_name="accum", model_version="3", id="req-1")
    for key, (kind, value) in PARAMS.items():
        setattr(req.parameters[key], kind, value)
    tensor = req.inputs.add(name="IN", datatype="FP32", shape=[2, 3])
    tensor.parameters["shared_memory_offset"].int64_param = 16
    tensor.contents.fp32_contents.extend([1.5, 2.5])
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    out = req.outputs.add(name="OUT")
    out.parameters["classification"].int64_param = 2
    raw_in = np.arange(6, dtype=np.float32).tobytes()
    raw_text = len(b"abc").to_bytes(4, "little") + b"abc"
    req.raw_input_contents.extend([raw_in, raw_text])

    ours = grpc_service_pb2.ModelInferRequest.FromString(req.SerializeToString())

    assert (ours.model_name, ours.model_version, ours.id) == ("accum", "3", "req-1")
    for key, (kind, value) in PARAMS.items():
        assert ours.parameters[key].WhichOneof("parameter_choice") == kind
        assert getattr(ours.parameters[key], kind) == value
    assert [i.name for i in ours.inputs] == ["IN", "TEXT"]
    assert list(ours.inputs[0].shape) == [2, 3]
    assert ours.inputs[0].parameters["shared_memory_offset"].int64_param == 16
    assert list(ours.inputs[0].contents.fp32_contents) == [1.5, 2.5]
    assert ours.outputs[0].parameters["classification"].int64_param == 2
    assert list(ours.raw_input_contents) == [raw_in, raw_text]
    _assert_same(ours, req)


def _populated_response(pb2):
    resp = pb2.ModelInferResponse(model_name="accum", model_version="1", id="req-1")
    for key, (kind, value) in PARAMS.items():
        setattr(resp.parameters[key], kind, value)
    resp.parameters["triton_final_response"].bool_param = True
    out = resp.outputs.add(name="OUT", datatype="INT32", shape=[2, 2])
    out.parameters["binary_data_size"].int64_param = 16
    resp.outputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a", b"bc"])
    resp.outputs.add(name="EMPTY", datatype="FP32", shape=[0])
    resp.raw_output_contents.extend(
        [np.array([[1, -2], [3, 4]], dtype=np.int32).tobytes(), b"\x01\x00\x00\x00a\x02\x00\x00\x00bc", b""]
    )
    return resp


def test_infer_response_ours_to_tritonclient():
    ours = _populated_response(grpc_service_pb2)
    theirs = t_service_pb2.ModelInferResponse.FromString(ours.SerializeToString())
    _assert_same(ours, theirs)
    assert theirs.parameters["priority"].uint64_param == 2**64 - 1
    assert theirs.parameters["scale"].double_param == 0.25
    assert list(theirs.raw_output_contents) == list(ours.raw_output_contents)

    from tritonclient.grpc import InferResult

    result = InferResult(theirs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), np.array([[1, -2], [3, 4]], dtype=np.int32))
    np.testing.assert_array_equal(result.as_numpy("TEXT"), np.array([b"a", b"bc"], dtype=object))
    assert result.as_numpy("EMPTY").shape == (0,)


def test_stream_response_ours_to_tritonclient():
    ok = grpc_service_pb2.ModelStreamInferResponse(infer_response=_populated_response(grpc_service_pb2))
    theirs = t_service_pb2.ModelStreamInferResponse.FromString(ok.SerializeToString())
    _assert_same(ok, theirs)
    assert theirs.error_message == ""
    assert theirs.infer_response.parameters["triton_final_response"].bool_param is True

    failed = grpc_service_pb2.ModelStreamInferResponse(error_message="Request for unknown model: 'x'")
    failed.infer_response.id = "req-2"
    failed.infer_response.model_name = "x"
    theirs = t_service_pb2.ModelStreamInferResponse.FromString(failed.SerializeToString())
    _assert_same(failed, theirs)
    assert theirs.error_message == "Request for unknown model: 'x'"
    assert theirs.infer_response.id == "req-2"


def test_other_messages_round_trip_both_ways():
    ours_stats = grpc_service_pb2.ModelStatisticsResponse()
    stats = ours_stats.model_stats.add(name="m", version="1", last_inference=123, inference_count=7)
    stats.inference_stats.success.count = 7
    stats.batch_stats.add(batch_size=4).compute_infer.ns = 99
    stats.memory_usage.add(type="GPU", id=-1, byte_size=2**40)
    stats.response_stats["0"].cancel.count = 3
    theirs_stats = t_service_pb2.ModelStatisticsResponse.FromString(ours_stats.SerializeToString())
    _assert_same(ours_stats, theirs_stats)
    assert theirs_stats.model_stats[0].response_stats["0"].cancel.count == 3

    theirs_load = t_service_pb2.RepositoryModelLoadRequest(model_name="m")
    theirs_load.parameters["config"].string_param = "{}"
    theirs_load.parameters["file:1/model.py"].bytes_param = b"\x00\xff"
    ours_load = grpc_service_pb2.RepositoryModelLoadRequest.FromString(theirs_load.SerializeToString())
    _assert_same(ours_load, theirs_load)
    assert ours_load.parameters["file:1/model.py"].bytes_param == b"\x00\xff"

    theirs_log = t_service_pb2.LogSettingsRequest()
    theirs_log.settings["log_verbose_level"].uint32_param = 2
    theirs_log.settings["log_info"].bool_param = False
    theirs_log.settings["log_file"].string_param = "x.log"
    ours_log = grpc_service_pb2.LogSettingsRequest.FromString(theirs_log.SerializeToString())
    _assert_same(ours_log, theirs_log)
    assert ours_log.settings["log_info"].WhichOneof("parameter_choice") == "bool_param"

    ours_cfg = grpc_service_pb2.ModelConfigResponse()
    ours_cfg.config.name = "accum"
    ours_cfg.config.max_batch_size = 8
    ours_cfg.config.sequence_batching.max_sequence_idle_microseconds = 5_000_000
    ours_cfg.config.input.add(name="IN", data_type=model_config_pb2.TYPE_INT32, dims=[-1])
    theirs_cfg = t_service_pb2.ModelConfigResponse.FromString(ours_cfg.SerializeToString())
    _assert_same(ours_cfg, theirs_cfg)
    assert theirs_cfg.config.WhichOneof("scheduling_choice") == "sequence_batching"
