"""GPU instances: where instances run (placement), and the device-resident implicit state of
``KIND_GPU`` instances (a per-slot store in device memory, gathered and scattered by one kernel
per batch on the instance's CUDA stream), through cuda-python. Nothing here imports CUDA until
a GPU instance is placed: the CPU install never needs it (docs/gpu.md)."""
