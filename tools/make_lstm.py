#!/usr/bin/env python3
"""Build the demo LSTM: seqserve/examples/models/lstm/1/model.onnx.

One LSTM cell step per request (input 8, hidden 16), written with MatMul / Sigmoid / Tanh
ops so the graph is easy to read and to check:

    z = INPUT @ W + H_IN @ R + B              # [B, 64]; gates in the order i, f, g, o
    i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);  g = tanh(z_g)
    C_OUT = f * C_IN + i * g
    H_OUT = o * tanh(C_OUT);  OUTPUT = H_OUT

H_IN/C_IN -> H_OUT/C_OUT are the model's implicit state (see config.pbtxt), so the server
carries h and c from step to step. The weights are fixed random numbers (numpy seed below),
stored as the initializers W, R and B; nothing is downloaded.

Needs the `onnx` package (pip install onnx), only to regenerate the file:
    python tools/make_lstm.py [--out PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

INPUT_SIZE = 8
HIDDEN = 16
SEED = 20240607
IR_VERSION = 8  # loadable by onnxruntime >= 1.17
OPSET = 17
OUT = Path(__file__).resolve().parents[1] / "seqserve" / "examples" / "models" / "lstm" / "1" / "model.onnx"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
