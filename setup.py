"""Build hook: ship configs/, tools/ and model-index.yml as ``soft_mm/.mim/``, where openmim looks for them.

Everything else (name, version, dependencies, packages) is declared in pyproject.toml. ``mim train soft_mm
CONFIG.py``, ``mim test`` and ``mim search soft_mm`` look up
``<installed soft_mm>/.mim/{configs,tools,model-index.yml}``:

- a wheel (``pip wheel``, ``pip install .``, ``python -m build``) gets copies, written into the build folder only;
- an editable install (``pip install -e .``, ``tools/install.sh``, ``mim install -e .``) gets relative symbolic links
  ``soft_mm/.mim/configs -> ../../configs`` (and so on) in the checkout, so edited configs are seen at once; where
  the file system has no symbolic links, copies, refreshed by the next editable install. Its ``top_level.txt`` names
  the checkout's package folder first, where openmim looks for ``.mim`` (:class:`EditableWheelWithMim`).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).resolve().parent
PACKAGE = 'soft_mm'
MIM_RESOURCES = ('configs', 'tools', 'model-index.yml')  # relative to ROOT; the same names under soft_mm/.mim
NOT_SHIPPED = shutil.ignore_patterns('__pycache__', '*.py[cod]')


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def write_mim_resources(mim_dir: Path, *, link: bool) -> None:
    """(Re)create ``mim_dir`` holding each of :data:`MIM_RESOURCES`, as relative links (``link=True``) or copies."""
    missing = [name for name in MIM_RESOURCES if not (ROOT / name).exists()]
    if missing:
        raise FileNotFoundError(f'{", ".join(missing)} not found in {ROOT}: soft_mm ships them as {PACKAGE}/.mim '
                                'for openmim; build from a checkout or from an sdist that includes them (MANIFEST.in)')
    mim_dir.mkdir(parents=True, exist_ok=True)
    for name in MIM_RESOURCES:
        source, target = ROOT / name, mim_dir / name
        _remove(target)
        if link:
            try:
                target.symlink_to(os.path.relpath(source, mim_dir), target_is_directory=source.is_dir())
                continue
            except OSError:  # no symbolic links here (e.g. Windows without the privilege): copy instead
                pass
        if source.is_dir():
            shutil.copytree(source, target, ignore=NOT_SHIPPED)
        else:
            shutil.copy2(source, target)


def write_checkout_egg_info(distribution) -> None:
    """Write ``soft_mm.egg-info`` into the checkout, as the legacy ``setup.py develop`` did.

    openmim 0.3.9 finds an installed package at ``<distribution location>/soft_mm``; for a PEP 660 editable install
    that location is site-packages, which has no ``soft_mm`` folder, unless the checkout's own egg-info comes first on
    ``sys.path`` (``mim search soft_mm`` run from the checkout). An editable build without build isolation (the
    installer's) writes its egg-info only into a temporary folder, so it is written here too.
    """
    from setuptools.command.egg_info import egg_info

    command = egg_info(distribution)
    command.egg_base = str(ROOT)
    command.ensure_finalized()
    command.run()


class BuildPyWithMim(build_py):
    """build_py, then soft_mm/.mim: copies in the build folder for a wheel, links in the checkout (and its egg-info)
    when editable."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            write_mim_resources(ROOT / PACKAGE / '.mim', link=True)
            write_checkout_egg_info(self.distribution)
        else:
            write_mim_resources(Path(self.build_lib) / PACKAGE / '.mim', link=False)


def point_mim_at_checkout(dist_info: Path) -> None:
    """Name the checkout's package folder (absolute) first in the editable distribution's ``top_level.txt``.

    openmim 0.3.9 (``mim search soft_mm``, ``mim train soft_mm NAME.py``) looks for ``<location>/soft_mm/.mim``, where
    ``<location>`` is the folder that holds the distribution's metadata: site-packages, for a PEP 660 editable
    install, which has no ``soft_mm`` folder (the package is found by setuptools' import hook). Failing that it
    takes ``<location>/<first line of top_level.txt>``; ``os.path.join`` of site-packages and an absolute path is that
    path, the checkout's ``soft_mm``, whose ``.mim`` links to the checkout's own configs, tools and model index. The
    second line names the import package as usual (``importlib.metadata.packages_distributions``). Nothing is
    written outside the wheel, so ``pip uninstall`` removes it with the rest.
    """
    (dist_info / 'top_level.txt').write_text(f'{ROOT / PACKAGE}\n{PACKAGE}\n')


class EditableWheelWithMim(editable_wheel):
    """The editable wheel, its ``top_level.txt`` pointing openmim at the checkout (:func:`point_mim_at_checkout`)."""

    def _ensure_dist_info(self) -> None:  # setuptools 64-81: where the wheel's metadata folder is made or checked
        super()._ensure_dist_info()
        point_mim_at_checkout(Path(self.dist_info_dir))


class DevelopWithMim(develop):
    """The legacy ``setup.py develop``: links in the checkout, as for a PEP 660 editable install."""

    def run(self) -> None:
        super().run()
        write_mim_resources(ROOT / PACKAGE / '.mim', link=True)


setup(cmdclass={'build_py': BuildPyWithMim, 'develop': DevelopWithMim, 'editable_wheel': EditableWheelWithMim})
