# SPDX-License-Identifier: MIT
"""check_errors.py CC SOURCE_DIR -- every list of dlock's return codes
says what include/dlock.h's DLOCK_ERRNO_MAP says.

The map is the one list of the codes: X(NAME, value, text), DLOCK_<NAME>
the code, text what dlock_strerror() says. The C library is made from it
(src/core/error.c); what cannot be made from it is checked here:

  - the map itself: DLOCK_OK first, then each code one below the last
    (codes are only appended, never renumbered), names and words unique,
    and each code also #defined (`#ifdef DLOCK_ECANCELED` works);
  - docs/errors.md: one table row per code, in the map's order, with its
    value and, in the dlock_strerror() column, its words;
  - python/dlock/_errors.py: one exception class per code, whose `code`
    is the value and whose docstring opens with the code's name;
  - python/dlock/_native.py: the constants EOK, EBUSY, ... with the values.

The map is read through the C preprocessor (CC -E), so what is checked is
what a compiler sees. Each failure says which file lacks what; the exit
status is 1 then, 0 when everything agrees.
"""
import ast
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

Row = Tuple[str, int, str]  # NAME (without DLOCK_), value, text

ROW_RE = re.compile(
    r'dlock_check_row\s*\(\s*"(\w*)"\s*,\s*\(?\s*(-?)\s*(\d+)\s*\)?\s*,'
    r'\s*("(?:[^"\\]|\\.)*")\s*\)')


def preprocess(cc: str, include: str, source: str) -> str:
    try:
        out = subprocess.run([cc, "-E", "-P", "-I", include, "-x", "c", "-"],
                             input=source, capture_output=True, text=True,
                             timeout=60, check=False)
    except OSError as e:
        sys.exit("check_errors: cannot run the C compiler %r: %s" % (cc, e))
    if out.returncode != 0:
        sys.exit("check_errors: %s -E failed on include/dlock.h:\n%s"
                 % (cc, out.stderr))
    return out.stdout


def header_map(cc: str, include: str) -> List[Row]:
    text = preprocess(cc, include, "#include <dlock.h>\n"
                      "#define X(name, value, text) "
                      "dlock_check_row(#name, value, text)\n"
                      "DLOCK_ERRNO_MAP(X)\n")
    rows = []
    for m in ROW_RE.finditer(text):
        value = int(m.group(3)) * (-1 if m.group(2) else 1)
        rows.append((m.group(1), value, ast.literal_eval(m.group(4))))
    if text.count("dlock_check_row") != len(rows):
        sys.exit("check_errors: a row of DLOCK_ERRNO_MAP is not "
                 "X(NAME, integer, \"text\"):\n%s" % text)
    return rows


def check_map(rows: List[Row], cc: str, include: str,
              header: str) -> List[str]:
    bad = []
    if not rows or rows[0][:2] != ("OK", 0):
        bad.append("include/dlock.h: DLOCK_ERRNO_MAP must open with "
                   "X(OK, 0, ...)")
    for i, (name, value, text) in enumerate(rows):
        if not re.fullmatch(r"OK|E[A-Z0-9]+", name):
            bad.append("include/dlock.h: DLOCK_%s: a code's name is E and "
                       "capitals (DLOCK_E...)" % name)
        if value != -i:
            bad.append("include/dlock.h: DLOCK_%s is %d, the row after %s "
                       "must be %d (codes are only appended, never "
                       "renumbered)" % (name, value,
                                        rows[i - 1][0] if i else "none", -i))
        if not text:
            bad.append("include/dlock.h: DLOCK_%s has no words" % name)
        for other in rows[:i]:
            if other[0] == name:
                bad.append("include/dlock.h: DLOCK_%s is listed twice" % name)
            if other[2] == text:
                bad.append("include/dlock.h: DLOCK_%s and DLOCK_%s share the "
                           "words \"%s\"" % (other[0], name, text))
    # each code #defined to itself (the enum constant), for #ifdef
    probe = "#include <dlock.h>\n"
    for name, _, _ in rows:
        probe += ('#ifdef DLOCK_%s\ndlock_check_def("%s", DLOCK_%s)\n'
                  '#endif\n' % (name, name, name))
    defined = dict(re.findall(r'dlock_check_def\("(\w+)",\s*(.*?)\)',
                              preprocess(cc, include, probe)))
    for name, _, _ in rows:
        if name not in defined:
            bad.append("include/dlock.h: DLOCK_%s has no `#define DLOCK_%s "
                       "DLOCK_%s` after the enum (#ifdef would not see it)"
                       % (name, name, name))
        elif defined[name] != "DLOCK_" + name:
            bad.append("include/dlock.h: DLOCK_%s is #defined to %s, not to "
                       "itself (the map's value)" % (name, defined[name]))
    # a code added the old way, as a number beside the map
    listed = {"DLOCK_" + r[0] for r in rows}
    for m in re.finditer(r"^\s*#\s*define\s+(DLOCK_E\w*)\s+\(?\s*-\s*\d+",
                         header, re.M):
        if m.group(1) not in listed:
            bad.append("include/dlock.h: %s is #defined to a number but not "
                       "in DLOCK_ERRNO_MAP: add it there as a row"
                       % m.group(1))
    return bad


def check_doc(rows: List[Row], path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rel = "docs/errors.md"
    bad = []
    if "`DLOCK_OK` (0)" not in text:
        bad.append("%s: does not say `DLOCK_OK` (0)" % rel)
    table = re.findall(r"^\|\s*`DLOCK_(\w+)`\s*\|\s*(-?\d+)\s*\|([^|]*)\|",
                       text, re.M)
    found = [(n, int(v), t.strip()) for n, v, t in table]
    want = [r for r in rows if r[1] != 0]
    names = [r[0] for r in found]
    for name, value, words in want:
        if name not in names:
            bad.append("%s: no row for DLOCK_%s; add, in the table after "
                       "the row of the code before it: | `DLOCK_%s` | %d | "
                       "%s | (when it comes) | (what to do) |"
                       % (rel, name, name, value, words))
    for name, value, words in found:
        row = next((r for r in want if r[0] == name), None)
        if row is None:
            bad.append("%s: a row for DLOCK_%s, which include/dlock.h does "
                       "not have" % (rel, name))
            continue
        if value != row[1]:
            bad.append("%s: DLOCK_%s is %d there, %d in include/dlock.h"
                       % (rel, name, value, row[1]))
        if words != row[2]:
            bad.append("%s: DLOCK_%s's dlock_strerror() column says \"%s\", "
                       "the library \"%s\"" % (rel, name, words, row[2]))
        if names.count(name) > 1:
            bad.append("%s: DLOCK_%s has %d rows"
                       % (rel, name, names.count(name)))
    order = [n for n in names if n in {r[0] for r in want}]
    if not bad and order != [r[0] for r in want]:
        bad.append("%s: the rows are not in the header's order: %s"
                   % (rel, ", ".join(order)))
    return bad


def literal_int(node: ast.AST) -> Optional[int]:
    try:
        v = ast.literal_eval(node)
    except ValueError:
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_python_errors(rows: List[Row], path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    rel = "python/dlock/_errors.py"
    bad = []
    classes: Dict[str, List[str]] = {}  # code's NAME -> classes
    values = {r[0]: r[1] for r in rows}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        code = None
        for stmt in node.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == "code"):
                code = literal_int(stmt.value)
                if code is None:
                    bad.append("%s: %s.code is not a number"
                               % (rel, node.name))
        if code is None or code == 0:  # a subclass, or the base class
            continue
        m = re.match(r"DLOCK_(\w+)[:.]", ast.get_docstring(node) or "")
        if m is None:
            bad.append("%s: %s (code %d): its docstring does not open with "
                       "the code's name (\"DLOCK_E...: ...\")"
                       % (rel, node.name, code))
            continue
        name = m.group(1)
        if name not in values:
            bad.append("%s: %s is for DLOCK_%s, which include/dlock.h does "
                       "not have" % (rel, node.name, name))
        elif values[name] != code:
            bad.append("%s: %s (DLOCK_%s) has code %d, include/dlock.h %d"
                       % (rel, node.name, name, code, values[name]))
        classes.setdefault(name, []).append(node.name)
    for name, value, words in rows:
        if value == 0:
            continue
        if name not in classes:
            bad.append("%s: no exception class for DLOCK_%s; add one, "
                       "deriving from DlockError, with code = %d and a "
                       "docstring opening \"DLOCK_%s: %s\""
                       % (rel, name, value, name, words))
        elif len(classes[name]) > 1:
            bad.append("%s: DLOCK_%s has classes %s: one has the code, "
                       "the others derive from it"
                       % (rel, name, ", ".join(classes[name])))
    return bad


def check_python_native(rows: List[Row], path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    rel = "python/dlock/_native.py"
    consts: Dict[str, Optional[int]] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        pairs: List[Tuple[ast.expr, ast.expr]]
        if isinstance(target, ast.Name):
            pairs = [(target, node.value)]
        elif (isinstance(target, ast.Tuple)
              and isinstance(node.value, ast.Tuple)
              and len(target.elts) == len(node.value.elts)):
            pairs = list(zip(target.elts, node.value.elts))
        else:
            continue
        for t, v in pairs:
            if isinstance(t, ast.Name) and re.fullmatch(r"E[A-Z0-9]+", t.id):
                consts[t.id] = literal_int(v)
    bad = []
    want = {("E" + n if n == "OK" else n): v for n, v, _ in rows}
    for const, value in want.items():
        if const not in consts:
            bad.append("%s: no constant %s = %d (beside EOK, EBUSY, ...)"
                       % (rel, const, value))
        elif consts[const] != value:
            bad.append("%s: %s is %s, include/dlock.h says %d"
                       % (rel, const, consts[const], value))
    for const in sorted(set(consts) - set(want)):
        bad.append("%s: %s, a code include/dlock.h does not have"
                   % (rel, const))
    return bad


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit("usage: check_errors.py CC SOURCE_DIR")
    cc, src = sys.argv[1], sys.argv[2]
    include = os.path.join(src, "include")
    with open(os.path.join(include, "dlock.h"), encoding="utf-8") as f:
        header = f.read()
    rows = header_map(cc, include)
    bad = check_map(rows, cc, include, header)
    bad += check_doc(rows, os.path.join(src, "docs", "errors.md"))
    bad += check_python_errors(
        rows, os.path.join(src, "python", "dlock", "_errors.py"))
    bad += check_python_native(
        rows, os.path.join(src, "python", "dlock", "_native.py"))
    for line in bad:
        print("FAIL " + line)
    if bad:
        print("check_errors: %d problem(s); include/dlock.h's "
              "DLOCK_ERRNO_MAP is the list the others follow" % len(bad))
        return 1
    print("check_errors: %d codes (DLOCK_OK .. DLOCK_%s) in include/dlock.h; "
          "docs/errors.md, python/dlock/_errors.py and _native.py agree"
          % (len(rows), rows[-1][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
