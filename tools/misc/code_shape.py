"""Print the longest functions and the functions with the most parameters in the package, the benchmarks and the tools:
the figures a restructure reports before and after (docs/advanced/architecture.md).

    python tools/misc/code_shape.py [--top N] [PATH ...]

A function's length counts its lines from its first decorator (or ``def``) to its last statement, less its docstring;
its parameters count every name it takes (``self`` and ``cls`` included, ``*args`` and ``**kwargs`` one each).
"""
from __future__ import annotations

import argparse
import ast
import os
import os.path as osp

DEFAULT_PATHS = ('soft_mm', 'benchmarks', 'tools')


def python_files(paths: list[str]) -> list[str]:
    files = []
    for path in paths:
        if osp.isfile(path):
            files.append(path)
            continue
        if not osp.isdir(path):
            raise SystemExit(f'code_shape: PATH {path!r} is neither a file nor a folder')
        for folder, _, names in os.walk(path):
            files.extend(osp.join(folder, name) for name in names if name.endswith('.py'))
    return sorted(files)


def parameter_count(args: ast.arguments) -> int:
    named = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return named + (args.vararg is not None) + (args.kwarg is not None)


def functions(path: str) -> list[tuple[int, int, str]]:
    """(lines, parameters, 'path:line name') of every function in the file, nested ones included."""
    with open(path, encoding='utf-8') as handle:
        tree = ast.parse(handle.read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            doc = node.body[0]
            has_doc = (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                       and isinstance(doc.value.value, str))
            doc_lines = doc.end_lineno - doc.lineno + 1 if has_doc else 0
            found.append((node.end_lineno - first + 1 - doc_lines, parameter_count(node.args),
                          f'{path}:{node.lineno} {node.name}'))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description='The longest functions and the largest parameter counts.')
    parser.add_argument('paths', nargs='*', default=list(DEFAULT_PATHS), help='files or folders (default: %(default)s)')
    parser.add_argument('--top', type=int, default=5, help='how many of each to print (default: %(default)s)')
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f'--top must be at least 1, got {args.top}')
    found = [entry for path in python_files(args.paths) for entry in functions(path)]
    print(f'{len(found)} functions in {", ".join(args.paths)}')
    print('longest (lines, less the docstring):')
    for lines, _, where in sorted(found, key=lambda e: (-e[0], e[2]))[:args.top]:
        print(f'  {lines:5d}  {where}')
    print('most parameters:')
    for _, count, where in sorted(found, key=lambda e: (-e[1], e[2]))[:args.top]:
        print(f'  {count:5d}  {where}')


if __name__ == '__main__':
    main()
