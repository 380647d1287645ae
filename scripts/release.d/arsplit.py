#!/usr/bin/env python3
"""arsplit.py ARCHIVE OUT_PREFIX PARTS MAX_BYTES: splits a static library (GNU ar) into PARTS
archives OUT_PREFIX-1.a ... OUT_PREFIX-PARTS.a, each under MAX_BYTES, with every member of the
original once, in its order, and a symbol index of its own (ar rcsD: deterministic).

The parts reference each other (Rust's objects do, both ways), so they are linked as one group:
-Wl,--start-group part-1.a ... -Wl,--end-group (bindings/go/link_prebuilt.go). Members are
extracted under names made unique by their position: an archive may hold two members of one
name, which `ar x` would write over each other."""

import os
import subprocess
import sys
import tempfile


def members(path):
    data = open(path, "rb").read()
    if data[:8] != b"!<arch>\n":
        sys.exit(f"arsplit: {path} is not an ar archive")
    pos, names = 8, b""
    while pos < len(data):
        header = data[pos : pos + 60]
        name, size = header[:16].rstrip(b" "), int(header[48:58])
        body = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name in (b"/", b"/SYM64/"):
            continue  # the symbol index: each part gets its own
        if name == b"//":
            names = body  # GNU long names, referenced as /offset
            continue
        if name.startswith(b"/"):
            start = int(name[1:])
            name = names[start : names.index(b"/\n", start)]
        else:
            name = name.rstrip(b"/")
        yield os.path.basename(name.decode()), body


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: arsplit.py ARCHIVE OUT_PREFIX PARTS MAX_BYTES")
    src, prefix, parts, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    found = list(members(src))
    total = sum(len(b) for _, b in found)
    # In order, a part closes once it holds its share of the whole.
    share = total / parts
    groups, size = [[]], 0
    for m in found:
        if size >= share * len(groups) and len(groups) < parts:
            groups.append([])
        groups[-1].append(m)
        size += len(m[1])
    while len(groups) < parts:
        groups.append([])
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for i, group in enumerate(groups, 1):
            d = os.path.join(tmp, str(i))
            os.mkdir(d)
            files = []
            for name, body in group:
                n += 1
                f = os.path.join(d, f"{n:05d}-{name}")
                with open(f, "wb") as out:
                    out.write(body)
                files.append(f)
            out = f"{prefix}-{i}.a"
            if os.path.exists(out):
                os.remove(out)
            subprocess.run(["ar", "rcsD", out] + files, check=True)
            got = os.path.getsize(out)
            print(f"arsplit: {out}: {len(group)} members, {got} bytes")
            if got >= limit:
                sys.exit(f"arsplit: {out} is {got} bytes, not under {limit}: use more parts")
    if n != len(found):
        sys.exit(f"arsplit: wrote {n} members of {len(found)}")


main()
