"""Which ``Conv2d`` strategy of the fast clipper is fastest (run ``benchmarks/conv_strategies.py``).

For each layer shape below, every strategy of ``FastGradientClipper(conv_strategy=...)``
(``ghost``, ``unfold``, ``grouped``, ``polyphase`` where it applies, and ``auto``, the choice
of ``heuristic_conv_strategy``) computes the layer's per-sample squared norms and its clipped
sum from one captured forward pass (``FastGradientClipper.clip_records`` with a random output
gradient: the norm pass and the clipped-sum pass of that layer, nothing else). The strategies
of a shape run interleaved round by round (``benchmarks/timing.py``), one thread, pinned; the
summary names the fastest one and how far ``auto`` is from it. Per-sample gradients are kept
for the ``c @ G`` sum when they fit ``keep_bytes`` (default 64 MiB; ``--keep-bytes 0`` never
keeps them), as in the clipper.

Usage::

    python benchmarks/conv_strategies.py               # all shapes, N = 500 (128 for CIFAR)
    python benchmarks/conv_strategies.py --rounds 20   # more rounds on a busy machine
    python benchmarks/conv_strategies.py --only mnist  # the MNIST CNN's two layers
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

from timing import compare, per_core

#: name -> (in, out, kernel, stride, padding, dilation, groups, input size, N).
SHAPES: dict[str, tuple[int, int, int, int, int, int, int, int, int]] = {
    "mnist cnn conv1": (1, 16, 8, 2, 3, 1, 1, 28, 500),
    "mnist cnn conv2": (16, 32, 4, 2, 0, 1, 1, 13, 500),
    "mnist cnn_small conv1": (1, 8, 8, 2, 3, 1, 1, 28, 500),
    "mnist cnn_small conv2": (8, 16, 4, 2, 0, 1, 1, 13, 500),
    "cifar 3->32 k3 32x32": (3, 32, 3, 1, 1, 1, 1, 32, 128),
    "cifar 32->64 k3 16x16": (32, 64, 3, 1, 1, 1, 1, 16, 128),
    "cifar 64->128 k3 8x8": (64, 128, 3, 1, 1, 1, 1, 8, 128),
    "cifar 128->128 k3 4x4": (128, 128, 3, 1, 1, 1, 1, 4, 128),
    "strided 32->64 k3 s2 16x16": (32, 64, 3, 2, 1, 1, 1, 16, 128),
    "strided 32->64 k4 s2 13x13": (32, 64, 4, 2, 0, 1, 1, 13, 128),
    "strided 64->128 k4 s2 9x9": (64, 128, 4, 2, 0, 1, 1, 9, 128),
    "dilated 8->12 k3 d2 g2 12x12": (8, 12, 3, 1, 1, 2, 2, 12, 128),
    "depthwise 32 k3 16x16": (32, 32, 3, 1, 1, 1, 32, 16, 128),
}
STRATEGIES = ("ghost", "unfold", "grouped", "polyphase", "auto")


def contenders(shape: tuple[int, ...], keep_bytes: int) -> tuple[dict[str, Any], str]:
    """One callable per applicable strategy, and the strategy ``auto`` picks for the shape."""
    import torch
    from torch import nn

    from shuffle_opacus.engine.clipping import FastGradientClipper

    cin, cout, k, stride, pad, dil, groups, size, n = shape
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(cin, cout, k, stride=stride, padding=pad, dilation=dil, groups=groups)
    )
    x = torch.randn(n, cin, size, size)
    out: dict[str, Any] = {}
    picked = ""
    for strategy in STRATEGIES:
        clipper = FastGradientClipper(model, conv_strategy=strategy, keep_bytes=keep_bytes)  # type: ignore[arg-type]
        with clipper._capturing() as records:
            y = model(x)
        run = functools.partial(clipper.clip_records, list(records), y, torch.randn_like(y), 1.0, n)
        run()
        chosen = clipper.chosen_strategies["0"]
        if strategy == "auto":
            picked = chosen
        elif chosen != strategy:
            continue  # not applicable to this shape (it fell back to another strategy)
        out[strategy] = run
    return out, picked


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (default 10)")
    parser.add_argument("--keep-bytes", type=int, default=64 * 2**20, help="the clipper's")
    parser.add_argument("--only", help="only shapes whose name contains this")
    args = parser.parse_args(argv)
    per_core(1)
    import torch

    torch.set_num_threads(1)
    lines = []
    for name, shape in SHAPES.items():
        if args.only and args.only not in name:
            continue
        fns, picked = contenders(shape, args.keep_bytes)
        result = compare(
            fns, rounds=args.rounds, warmup=2, title=f"{name}, N = {shape[-1]}", progress=False
        )
        medians = {k: v["median"] for k, v in result["contenders"].items()}
        best = min((k for k in medians if k != "auto"), key=medians.__getitem__)
        busy = " (busy)" if result["busy"] else ""
        lines.append(
            f"{name}: fastest {best} {medians[best] * 1e3:.2f} ms; auto = {picked}, "
            f"{medians['auto'] / medians[best]:.2f} x fastest{busy}"
        )
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
