"""Where instances run (engine/device/placement.py), for every instance_group kind, with and
without GPUs (a GpuProbe is plain data: these run on the CPU)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.device.placement import place_instances
from seqserve.engine.device.probe import GpuProbe, probe_gpus
from seqserve.engine.errors import InferenceError

NO_GPU = GpuProbe(reason="the CUDA driver reports no device")
TWO_GPUS = GpuProbe(names=("H200", "H200"))


def cfg(groups: str) -> mc.ModelConfig:
    return text_format.Parse(f'name: "m" {groups}', mc.ModelConfig())


def devices(groups: str, probe: GpuProbe, backend_gpu: str = "", **kw: bool) -> list[tuple[str, str]]:
    placed = place_instances(cfg(groups), probe=probe, backend_gpu=backend_gpu, **kw)
    return [(p.name, p.device) for p in placed.instances]


def test_kind_gpu_places_count_instances_on_each_listed_gpu():
    groups = 'instance_group [ { name: "g" count: 2 kind: KIND_GPU gpus: [ 1, 0 ] } ]'
    assert devices(groups, TWO_GPUS) == [("g_0", "cuda:1"), ("g_1", "cuda:1"), ("g_2", "cuda:0"), ("g_3", "cuda:0")]


def test_kind_gpu_without_gpus_uses_every_gpu():
    assert devices('instance_group [ { name: "g" kind: KIND_GPU } ]', TWO_GPUS) == [
        ("g_0", "cuda:0"),
        ("g_1", "cuda:1"),
    ]


def test_kind_gpu_without_a_gpu_is_an_error_naming_the_reason_and_the_flag():
    with pytest.raises(InferenceError) as e:
        devices('instance_group [ { name: "g" kind: KIND_GPU } ]', NO_GPU)
    assert "instance group 'g' is KIND_GPU" in str(e.value)
    assert "reports no device" in str(e.value) and "--kind-gpu-on-cpu" in str(e.value)


def test_a_backend_without_gpu_support_is_named_in_the_error():
    with pytest.raises(InferenceError, match="the 'onnxruntime' backend does not run on a GPU"):
        devices(
            'instance_group [ { name: "g" kind: KIND_GPU } ]',
            TWO_GPUS,
            backend_gpu="the 'onnxruntime' backend does not run on a GPU",
        )


def test_kind_gpu_on_cpu_falls_back_with_one_warning_per_model():
    groups = 'instance_group [ { name: "a" kind: KIND_GPU count: 2 }, { name: "b" kind: KIND_GPU } ]'
    placed = place_instances(cfg(groups), probe=NO_GPU, backend_gpu="", kind_gpu_on_cpu=True)
    assert [p.device for p in placed.instances] == ["cpu", "cpu", "cpu"]
    assert len(placed.warnings) == 1 and "running it on the CPU" in placed.warnings[0]


def test_a_gpu_ordinal_the_machine_lacks_is_an_error():
    with pytest.raises(InferenceError, match="asks for GPU 2, but this server has 2"):
        devices('instance_group [ { name: "g" kind: KIND_GPU gpus: [ 2 ] } ]', TWO_GPUS)


def test_kind_auto_takes_the_gpu_when_there_is_one_and_the_backend_can():
    groups = 'instance_group [ { name: "g" kind: KIND_AUTO } ]'
    assert devices(groups, TWO_GPUS) == [("g_0", "cuda:0"), ("g_1", "cuda:1")]
    assert devices(groups, NO_GPU) == [("g_0", "cpu")]
    assert devices(groups, TWO_GPUS, backend_gpu="no") == [("g_0", "cpu")]


def test_kind_cpu_ignores_gpus_with_a_warning_and_kind_model_is_the_models():
    placed = place_instances(
        cfg('instance_group [ { name: "c" kind: KIND_CPU gpus: [ 0 ] }, { name: "x" kind: KIND_MODEL } ]'),
        probe=NO_GPU,
        backend_gpu="",
    )
    assert [(p.name, p.device) for p in placed.instances] == [("c_0", "cpu"), ("x_0", "model")]
    assert "ignored" in placed.warnings[0]


def test_passive_groups_are_skipped_and_no_instance_is_an_error():
    with pytest.raises(InferenceError, match="no \\(non-passive\\) instances"):
        devices('instance_group [ { name: "p" kind: KIND_CPU passive: true } ]', NO_GPU)


def test_probe_without_cuda_python_says_how_to_get_it():
    probe = probe_gpus()
    if probe.count:
        pytest.skip("this machine has a GPU")
    assert probe.reason  # e.g. "cuda-python is not installed (pip install 'seqserve[gpu]')"


def test_onnxruntime_without_its_cuda_provider_says_so():
    import onnxruntime

    from seqserve.engine.backends.onnxrt_gpu import cuda_provider_missing

    why = cuda_provider_missing(onnxruntime)
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        assert why == ""
    else:
        assert "install onnxruntime-gpu" in why
