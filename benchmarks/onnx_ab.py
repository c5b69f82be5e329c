"""Two or more ONNX files of one model timed side by side in one onnxruntime process, rounds interleaved: the A/B of a
change to an exported graph (e.g. the same backbone exported before and after a change to its export path).

    python tools/deployment/export_onnx.py backbone --arch small --soft-norm --out before.onnx   # at one commit
    python tools/deployment/export_onnx.py backbone --arch small --soft-norm --out after.onnx    # at the next
    python benchmarks/onnx_ab.py before.onnx after.onnx --size 800x1344 --rounds 15

Every file gets a session of onnxruntime's CPU provider (all graph optimizations, as many threads as PyTorch uses) and
the same random float32 input of ``--size`` (batch 1, the first input's channels); then ``--rounds`` rounds, each
running every file ``--repeats`` times after a warm-up, the files interleaved round by round. A file's time is the
median over the rounds; the table gives each one's time over the first file's. Each file's op counts (nodes of the
file and of onnxruntime's optimized graph: Transpose, the NCHWc reorders) are listed beside it. Run it under the
allocator setting the other benchmarks use (``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
from harness import (
    add_rounds_arguments,
    check_positive,
    cpu_model,
    glibc_malloc_note,
    interleaved_medians,
    write_results,
)

from soft_mm.utils.sizes import size_arg

COUNTED_OPS = ('Transpose', 'ReorderInput', 'ReorderOutput')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('files', nargs='+', help='ONNX files of one model (two or more; the first is the baseline)')
    parser.add_argument('--size', type=size_arg, default=(800, 1344), help='input H or HxW (default: 800x1344)')
    add_rounds_arguments(parser, 'work_dirs/onnx_ab')
    args = parser.parse_args(argv)
    check_positive(parser, args)
    if len(args.files) < 2:
        parser.error(f'files: give two or more ONNX files to compare, got {len(args.files)}')
    missing = [f for f in args.files if not Path(f).is_file()]
    if missing:
        parser.error(f'files: no such file: {", ".join(missing)}')
    return args


def session(path: str, optimized: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if optimized is not None:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def op_counts(path: str | Path) -> dict[str, int]:
    """``{op type: nodes}`` of the ONNX file at ``path``, for :data:`COUNTED_OPS`."""
    import onnx

    counts = Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)
    return {op: counts.get(op, 0) for op in COUNTED_OPS}


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    args = parse_args(argv)
    sessions, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(args.files):
            optimized = str(Path(tmp) / f'{i}.onnx')
            sessions[path] = session(path, optimized)
            rows.append(dict(file=path, ops=op_counts(path), optimized_ops=op_counts(optimized)))
    first = next(iter(sessions.values())).get_inputs()[0]
    x = np.random.default_rng(0).standard_normal((1, first.shape[1], *args.size)).astype(np.float32)
    feeds = {path: {s.get_inputs()[0].name: x} for path, s in sessions.items()}
    times = interleaved_medians({path: lambda path=path: sessions[path].run(None, feeds[path]) for path in sessions},
                                args.rounds, args.repeats, torch.device('cpu'))
    allocator = 'tuned' if os.environ.get('MALLOC_MMAP_THRESHOLD_') else 'default'
    header = (f'onnxruntime CPU, {torch.get_num_threads()} threads, {cpu_model()}, {glibc_malloc_note(allocator)}; '
              f'input 1x{first.shape[1]}x{args.size[0]}x{args.size[1]}; median of {args.repeats} runs per round, '
              f'median of {args.rounds} interleaved rounds')
    baseline = times[args.files[0]]
    counted = ' | '.join(f'{op} (file / optimized)' for op in COUNTED_OPS)
    lines = [header, '', f'| file | s | first file / this | {counted} |', '|---' * (3 + len(COUNTED_OPS)) + '|']
    for row in rows:
        row['s'] = times[row['file']]
        counts = ' | '.join(f"{row['ops'][op]} / {row['optimized_ops'][op]}" for op in COUNTED_OPS)
        lines.append(f"| {row['file']} | {row['s']:.4f} | {baseline / row['s']:.3f}x | {counts} |")
    write_results(args.out, 'onnx_ab', '\n'.join(lines) + '\n', args, header=header, rows=rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
