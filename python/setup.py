# SPDX-License-Identifier: MIT
"""The wheel's tag; everything else is in pyproject.toml.

A tree with dlock/_lib/libdlock.so.0 (staged by `make wheel`,
scripts/wheel.sh) makes a platform wheel, py3-none-<platform> (e.g.
py3-none-linux_x86_64): it carries machine code, but no extension of
Python's (ctypes loads the library), so any CPython 3 takes it. Not
manylinux: nothing here checks the library against that policy
(auditwheel); it is built against the building system's glibc. Any
other tree makes a pure wheel, py3-none-any, that loads the system's
library.
"""
import os

from setuptools import setup
from setuptools.dist import Distribution

try:  # setuptools >= 70.1
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older: the wheel package's (build-system.requires)
    from wheel.bdist_wheel import bdist_wheel  # type: ignore

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = os.path.isfile(os.path.join(HERE, "dlock", "_lib", "libdlock.so.0"))


class Dist(Distribution):  # type: ignore
    # machine code in the package: a wheel that is not "pure", installed
    # into platlib (bdist_wheel asks this); no extension is built
    def has_ext_modules(self) -> bool:
        return BUNDLED


class BdistWheel(bdist_wheel):  # type: ignore
    # the platform's tag, but none of Python's: ctypes loads the library
    def get_tag(self) -> "tuple[str, str, str]":
        python, abi, plat = super().get_tag()
        if BUNDLED:
            return "py3", "none", plat
        return python, abi, plat


setup(distclass=Dist, cmdclass={"bdist_wheel": BdistWheel})
