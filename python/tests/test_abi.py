# SPDX-License-Identifier: MIT
"""The ctypes structures of python/dlock/_native.py against
include/dlock.h: a C compiler prints each struct's size and each field's
offset and size, and the Python side must say the same (ctypes reads no
header: a field added, moved or resized in C and not here would have
the library read and write the wrong bytes). ctest runs it as part of
python.install (Debian's python3, DLOCK_LIBRARY set)."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

from dlock import _native as N  # noqa: E402

# the C struct of each ctypes Structure, with its fields in order
STRUCTS = {
    "dlock_client_options": N.ClientOptions,
    "dlock_options": N.Options,
    "dlock_info": N.Info,
    "dlock_listed": N.Listed,
    "dlock_list_page": N.ListPage,
    "dlock_finding": N.Finding,
    "dlock_check": N.Check,
    "dlock_leader": N.LeaderC,
}


def c_layout():
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (scripts/install-deps.sh build)")
    lines = ["#include <stdio.h>", "#include <stddef.h>",
             '#include "dlock.h"', "int main(void) {"]
    for cname, py in STRUCTS.items():
        lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
        for f in py._fields_:
            lines.append('printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), '
                         'sizeof(((%s *)0)->%s));'
                         % (cname, f[0], cname, f[0], cname, f[0]))
    lines.append("return 0; }")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "abi.c")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        exe = os.path.join(d, "abi")
        subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"),
                        src, "-o", exe], check=True, timeout=60)
        out = subprocess.run([exe], check=True, capture_output=True,
                             text=True, timeout=30).stdout
    got = {}
    for line in out.splitlines():
        k, *v = line.split()
        got[k] = [int(x) for x in v]
    return got


def test_the_structures_are_the_header_s():
    c = c_layout()
    for cname, py in STRUCTS.items():
        assert ctypes.sizeof(py) == c[cname][0], cname
        for f in py._fields_:
            desc = getattr(py, f[0])
            assert [desc.offset, desc.size] == c["%s.%s" % (cname, f[0])], \
                "%s.%s" % (cname, f[0])


def test_every_field_of_the_header_is_here():
    """The C structs have no field the Python ones lack (sizes alone
    would miss a field added in padding)."""
    import re
    with open(os.path.join(ROOT, "include", "dlock.h")) as f:
        text = f.read()
    for cname, py in STRUCTS.items():
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (cname, cname),
                      text, re.S)
        assert m, cname
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
        names = re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*;", body)
        assert names == [f[0] for f in py._fields_], cname
