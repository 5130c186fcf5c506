#!/usr/bin/env python3
"""Build the demo LSTM: src/seqserve/examples/models/lstm/1/model.onnx (and its TorchScript twin).

One LSTM cell step per request (input 8, hidden 16), written with MatMul / Sigmoid / Tanh
ops so the graph is easy to read and to check:

    z = INPUT @ W + H_IN @ R + B              # [B, 64]; gates in the order i, f, g, o
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);  g = tanh(z_g)
    C_OUT = f * C_IN + i * g
    H_OUT = o * tanh(C_OUT);  OUTPUT = H_OUT

H_IN/C_IN -> H_OUT/C_OUT are the model's implicit state (see config.pbtxt), so the server
carries h and c from step to step. The weights are fixed random numbers (numpy seed below),
stored as the initializers W, R and B; nothing is downloaded.

When torch is installed, the same cell (same weights, same math, float32) is also exported as
TorchScript for the pytorch backend, by default to bench/models/lstm_torchscript/1/model.pt
(config.pbtxt there is a committed file: same input/output/state names and shapes as the ONNX
model). forward(INPUT, H_IN, C_IN) returns (OUTPUT, H_OUT, C_OUT). bench/models/lstm_onnx is a
copy of the demo model under another name, so one server (--model-repository bench/models)
serves both; refresh it with `cp src/seqserve/examples/models/lstm/1/model.onnx bench/models/lstm_onnx/1/`.

Needs the `onnx` package (pip install onnx), only to regenerate the files:
    python tools/make_lstm.py [--out PATH] [--torchscript PATH | --no-torchscript]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

INPUT_SIZE = 8
HIDDEN = 16
SEED = 20240607
IR_VERSION = 8  # loadable by onnxruntime >= 1.17
OPSET = 17
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "seqserve" / "examples" / "models" / "lstm" / "1" / "model.onnx"
TORCHSCRIPT_OUT = ROOT / "bench" / "models" / "lstm_torchscript" / "1" / "model.pt"


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    scale = 1.0 / np.sqrt(HIDDEN)
    return {
        "W": rng.uniform(-scale, scale, (INPUT_SIZE, 4 * HIDDEN)).astype(np.float32),
        "R": rng.uniform(-scale, scale, (HIDDEN, 4 * HIDDEN)).astype(np.float32),
        "B": rng.uniform(-scale, scale, (4 * HIDDEN,)).astype(np.float32),
    }


def build() -> onnx.ModelProto:
    n = helper.make_node
    nodes = [
        n("MatMul", ["INPUT", "W"], ["xw"]),
        n("MatMul", ["H_IN", "R"], ["hr"]),
        n("Add", ["xw", "hr"], ["xwhr"]),
        n("Add", ["xwhr", "B"], ["z"]),
        n("Split", ["z", "split"], ["z_i", "z_f", "z_g", "z_o"], axis=1),
        n("Sigmoid", ["z_i"], ["i"]),
        n("Sigmoid", ["z_f"], ["f"]),
        n("Tanh", ["z_g"], ["g"]),
        n("Sigmoid", ["z_o"], ["o"]),
        n("Mul", ["f", "C_IN"], ["fc"]),
        n("Mul", ["i", "g"], ["ig"]),
        n("Add", ["fc", "ig"], ["C_OUT"]),
        n("Tanh", ["C_OUT"], ["tc"]),
        n("Mul", ["o", "tc"], ["H_OUT"]),
        n("Identity", ["H_OUT"], ["OUTPUT"]),
    ]
    init = [numpy_helper.from_array(v, k) for k, v in weights().items()]
    init.append(numpy_helper.from_array(np.full(4, HIDDEN, np.int64), "split"))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "lstm_cell",
        [
            vi("INPUT", TP.FLOAT, ["batch", INPUT_SIZE]),
            vi("H_IN", TP.FLOAT, ["batch", HIDDEN]),
            vi("C_IN", TP.FLOAT, ["batch", HIDDEN]),
        ],
        [
            vi("OUTPUT", TP.FLOAT, ["batch", HIDDEN]),
            vi("H_OUT", TP.FLOAT, ["batch", HIDDEN]),
            vi("C_OUT", TP.FLOAT, ["batch", HIDDEN]),
        ],
        initializer=init,
    )
    model = helper.make_model(
        graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="seqserve"
    )
    onnx.checker.check_model(model)
    return model


def build_torchscript() -> Any:
    """The same cell as `build`, as a scripted torch module (needs torch)."""
    import torch
    from torch import Tensor

    class LSTMCellStep(torch.nn.Module):
        def __init__(self, w: dict[str, np.ndarray]) -> None:
            super().__init__()
            self.W = torch.from_numpy(w["W"].copy())  # [INPUT_SIZE, 4 * HIDDEN]
            self.R = torch.from_numpy(w["R"].copy())  # [HIDDEN, 4 * HIDDEN]
            self.B = torch.from_numpy(w["B"].copy())  # [4 * HIDDEN]

        def forward(self, INPUT: Tensor, H_IN: Tensor, C_IN: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            z = INPUT @ self.W + H_IN @ self.R + self.B
            z_i, z_f, z_g, z_o = z.chunk(4, dim=1)  # gates i, f, g, o, HIDDEN columns each
            c = torch.sigmoid(z_f) * C_IN + torch.sigmoid(z_i) * torch.tanh(z_g)
            h = torch.sigmoid(z_o) * torch.tanh(c)
            return h, h, c

    return torch.jit.script(LSTMCellStep(weights()).eval())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--torchscript",
        type=Path,
        default=None,
        help=f"also write the cell as TorchScript here (default when torch is installed: {TORCHSCRIPT_OUT})",
    )
    ap.add_argument("--no-torchscript", action="store_true", help="write only the ONNX model")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401

        ts: Path | None = None if args.no_torchscript else args.torchscript or TORCHSCRIPT_OUT
    except ImportError:
        if args.torchscript is not None and not args.no_torchscript:
            ap.error("--torchscript needs torch (pip install torch)")
        print("torch is not installed: TorchScript export skipped")
        ts = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    if ts is not None:
        ts.parent.mkdir(parents=True, exist_ok=True)
        build_torchscript().save(str(ts))
        print(f"wrote {ts} ({ts.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
