"""tests/ is laid out like the package below its first level: a folder of tests under tests/<room>/ stands where a
package of soft_mm/<room>/ stands (tests/ops/soft/backends/triton/ tests soft_mm/ops/soft/backends/triton/), so the
tests of a module are found by its path. The first level also holds what is not a package room (the tools, configs,
benchmarks, the shared helpers)."""
from helpers.repo import ROOT

NOT_PACKAGE_ROOMS = {'benchmarks', 'configs', 'helpers', 'tools'}


def test_every_test_folder_stands_where_a_package_folder_stands():
    tests = ROOT / 'tests'
    folders = [path for path in tests.rglob('*') if path.is_dir() and path.name != '__pycache__'
               and not any(part in NOT_PACKAGE_ROOMS for part in path.relative_to(tests).parts)
               and any(path.glob('test_*.py'))]
    assert folders, 'no test folder found'
    strays = [str(path.relative_to(ROOT)) for path in folders
              if not (ROOT / 'soft_mm' / path.relative_to(tests) / '__init__.py').is_file()]
    assert not strays, f'test folders with no package folder of soft_mm at the same path: {strays}'
    # and the package's nested folders with tests of their own are the ones the op layer's tests are split by
    assert {str(path.relative_to(tests)) for path in folders} >= {
        'ops', 'ops/soft', 'ops/soft/backends', 'ops/soft/backends/triton', 'ops/functional', 'ops/precision',
        'models', 'models/official'}
