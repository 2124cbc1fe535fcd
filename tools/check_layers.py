#!/usr/bin/env python3
"""The structure check: no circles and no arrows back up among the C files
of src/, include/ and molgen/ (Python 3 standard library only).

A room is a file's stem in its folder (train.c and train.h are the room
molgen/train/train). A room X points at room Y when a file of X
  - includes a file of Y (#include "..."), or
  - uses a name that only Y defines where X can see it: a header's macros,
    types, struct/enum tags, enum constants, functions and variables; a .c
    file's non-static functions and variables (the call graph, from the
    source). A name several rooms define (a template's parameters such as
    vf and VL of sdpa_fused_<isa>.c, static helpers of the same name) points
    nowhere.
The check fails (exit 1, one line per finding) on
  - a circle: rooms that reach one another;
  - an arrow up: from a room of a lower layer to a higher one (layer_of:
    the attn library, then molgen's engine folders in ENGINE_FOLDERS'
    order, then molgen's commands);
  - an engine file outside ENGINE_FOLDERS (directly in molgen/, or in a
    folder the list does not name);
  - a command's own room used by another command (COMMAND_OWNED);
  - a command room (COMMAND_STEMS: cmd_*, main, cli_*, commands) outside
    molgen/cli/;
  - a function of molgen (FUNCTION_FILES: the engine and the commands)
    longer than FUNCTION_MAX_LINES, unless LONG_FUNCTIONS names it, and
    then longer than FUNCTION_HARD_MAX; a LONG_FUNCTIONS entry that no
    longer needs its exception.
ALLOWED lists the arrows known to be wrong today; they are reported and
left out of the check, and the list is to be emptied as they are fixed.

  python3 tools/check_layers.py [--root DIR] [--arrows] [--floors]
    --arrows  print every arrow with the names behind it
    --floors  print the rooms by floor (1 + the highest floor they point at)
"""
import argparse
import os
import re
import sys

SCAN = ["src", "include", "molgen"]  # folders scanned, recursively
SKIP_DIRS = {"tests", "__pycache__"}  # not part of the structure

# molgen's engine folders are its layers, bottom to top: a file may use its
# own folder and the folders before it, never one after it. One sentence
# each (docs/architecture.md says the same).
ENGINE_FOLDERS = [
    ("base", "errors, utilities, JSON, the safetensors file format, option "
             "tables and MPI transport: no molecule and no model"),
    ("chem", "molecules as text: tokenizer, SMILES grammar, constrained "
             "decoding masks, data files, conditions"),
    ("nn", "the network: layers, packed products, the model, the optimizer, "
           "checkpoint value checks"),
    ("gen", "running a model: decoder, KV decoding, sampling, NLL scoring, "
            "attention maps"),
    ("train", "`molgen train`: its settings table, checkpoints, the training run"),
    ("rl", "`molgen optimize`: reinforcement learning on a reward"),
    ("harness", "measurement and test harnesses: bench, gradient and DAP dumps"),
]
# The command-line front (molgen/cli/, and the fuzz drivers of molgen/fuzz/)
# sits above every engine folder.
COMMAND_DIRS = ("molgen/cli/", "molgen/fuzz/")
# The names of command rooms: a file so named belongs in molgen/cli/.
COMMAND_STEMS = re.compile(r"^(cmd_\w+|main|cli_\w+|commands)$")


ENGINE_NAMES = [name for name, _ in ENGINE_FOLDERS]
COMMAND_LAYER = len(ENGINE_FOLDERS) + 1
LAYER_NAMES = (["attn library (src/, include/)"] +
               ["molgen/%s/" % name for name in ENGINE_NAMES] + ["molgen commands"])


def layer_of(room):
    """Layers, bottom to top: an arrow may point down or sideways, never up.
    None: an engine room outside the layer folders (itself a failure)."""
    if not room.startswith("molgen/"):
        return 0  # the attn library: src/, include/
    if room.startswith(COMMAND_DIRS):
        return COMMAND_LAYER  # molgen's commands (and its fuzz drivers)
    parts = room.split("/")
    if len(parts) == 3 and parts[1] in ENGINE_NAMES:
        return 1 + ENGINE_NAMES.index(parts[1])
    return None

# Rooms that belong to one command: no other command may use them.
COMMAND_OWNED = {
    "molgen/train/train_settings": "molgen/cli/cmd_train",  # the `molgen train` settings table
}

# Known violations, allowed until fixed; each is (from, to): reason. Issue
# 24's are fixed, so it is empty; an entry that no longer matches is
# reported.
ALLOWED = {}

# The longest function (lines from its head to its closing brace) in the
# files of FUNCTION_FILES, molgen's engine and commands: a function is one
# step a reader can hold (a command is parse -> engine -> print).
FUNCTION_FILES = re.compile(r"^molgen/(?:cli|%s)/\w+\.c$" % "|".join(ENGINE_NAMES))
FUNCTION_MAX_LINES = 80
# The exceptions, (file, function): why it stays whole. Each is at most
# FUNCTION_HARD_MAX lines; an entry at or under FUNCTION_MAX_LINES fails
# (remove it).
FUNCTION_HARD_MAX = 100
LONG_FUNCTIONS = {
    ("molgen/chem/smiles_check.c", "bracket_ok"):
        "a bracket atom's fields read left to right in one pass (isotope, symbol, "
        "chirality, hydrogens, charge, class): each field's check needs the ones before it",
    ("molgen/chem/smiles_check.c", "kekule_ok"):
        "the Kekule look-ahead's atom roles from the prefix's commitments (bond symbol, "
        "open branch, open rings, per-atom reach), one pass over shared work arrays "
        "feeding kk_solve",
}

IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = set(
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while _Bool _Static_assert __attribute__ __typeof__ "
    "defined".split())


def strip(text, strings=True):
    """The text with comments removed (and string / char literals emptied)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append(" ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c if strings else text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


FDEF = re.compile(r"(\w+)\s*\(((?:[^()]|\([^()]*\))*)\)\s*"
                  r"(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)*\{@\d+\}")


class Source:
    """One file: what it includes, defines (exported: visible to other
    files; local: its own) and uses."""

    def __init__(self, rel, text):
        self.rel = rel
        self.room = os.path.splitext(rel)[0]
        self.header = rel.endswith(".h")
        self.includes = re.findall(r'^\s*#\s*include\s*"([^"]+)"', strip(text, False), re.M)
        lines = strip(text).replace("\\\n", " ").split("\n")
        self.exported, self.local, self.uses = set(), set(), set()
        code, cplusplus = [], 0  # lines inside #ifdef __cplusplus are skipped
        for line in lines:
            if cplusplus:
                if re.match(r"\s*#\s*if", line):
                    cplusplus += 1
                elif re.match(r"\s*#\s*endif", line):
                    cplusplus -= 1
                continue
            if re.match(r"\s*#\s*ifdef\s+__cplusplus\b", line):
                cplusplus = 1
                continue
            m = re.match(r"\s*#\s*define\s+(\w+)(.*)", line)
            if m:
                (self.exported if self.header else self.local).add(m.group(1))
                self.uses |= set(IDENT.findall(m.group(2)))
            elif re.match(r"\s*#\s*(if|elif)", line):
                self.uses |= set(IDENT.findall(line))
            elif not line.lstrip().startswith("#"):
                code.append(line)
        self._scan("\n".join(code))
        self.uses -= KEYWORDS

    def _def(self, name, static=False):
        (self.exported if self.header or not static else self.local).add(name)

    def _scan(self, code):
        """File-scope definitions and the uses outside declarations."""
        flat, bodies, depth, start = [], [], 0, 0
        for i, c in enumerate(code):
            if c == "{":
                if depth == 0:
                    start = i + 1
                depth += 1
            elif c == "}" and depth > 0:
                depth -= 1
                if depth == 0:
                    bodies.append(code[start:i])
                    flat.append("{@%d}" % (len(bodies) - 1))
            elif depth == 0:
                flat.append(c)
        flat = "".join(flat)
        for b in bodies:
            self.uses |= set(IDENT.findall(b))
        pos, segments = 0, []
        for m in FDEF.finditer(flat):  # function definitions: parameters, then a body
            before = flat[pos:m.start()]
            cut = max(before.rfind(";"), before.rfind("}")) + 1  # the head: its return type
            head = before[cut:]
            self._def(m.group(1), bool(re.search(r"\bstatic\b", head)))
            self.uses |= set(IDENT.findall(head + flat[m.start():m.end()])) - {m.group(1)}
            segments.append(before[:cut])
            pos = m.end()
        segments.append(flat[pos:])
        for seg in ";".join(segments).split(";"):
            seg = seg.strip()
            if not seg:
                continue
            words = set(IDENT.findall(re.sub(r"\{@\d+\}", " ", seg)))
            static = "static" in words
            for m in re.finditer(r"\benum\b[^{;]*\{@(\d+)\}", seg):
                for item in bodies[int(m.group(1))].split(","):
                    im = re.match(r"\s*([A-Za-z_]\w*)", item)
                    if im:
                        self._def(im.group(1), True)
            for m in re.finditer(r"\b(?:struct|enum|union)\s+(\w+)\s*\{@", seg):
                self._def(m.group(1), True)
            tail = re.sub(r"\{@\d+\}", "", seg).strip()
            if "typedef" in words:
                m = (re.search(r"\(\s*\*\s*(\w+)\s*\)\s*\([^()]*\)\s*$", tail) or
                     re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", tail))
                if m:
                    self._def(m.group(1), True)
                    words.discard(m.group(1))
                self.uses |= words
                continue
            decl = re.match(r"(?:[^()=]*?)\b(\w+)\s*\(", tail)
            if "extern" in words or ("=" not in tail and tail.endswith(")") and decl):
                # a declaration (prototype, extern): uses its types, not its name
                name = decl.group(1) if decl and "extern" not in words else None
                if "extern" in words:
                    m = re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", tail)
                    name = m.group(1) if m else None
                self.uses |= words - {name}
                continue
            m = (re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*=", tail) or
                 re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", tail))
            if m and m.group(1) not in KEYWORDS:
                self._def(m.group(1), static)
                words.discard(m.group(1))
            self.uses |= words


def load(root):
    files = {}
    for top in SCAN:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
            for name in sorted(names):
                if name.endswith((".c", ".h")):
                    rel = os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
                    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                        files[rel] = Source(rel, f.read())
    return files


def resolve(files, src, inc):
    """The scanned file an #include "inc" of src names, or None (outside)."""
    here = os.path.normpath(os.path.join(os.path.dirname(src), inc)).replace(os.sep, "/")
    if here in files:
        return here
    for top in SCAN:
        cand = top + "/" + inc
        if cand in files:
            return cand
    same = [f for f in files if f.endswith("/" + inc)]
    return same[0] if len(same) == 1 else None


def arrows(files):
    """{(room_from, room_to): set of reasons}. A header's names are seen by
    the files of the translation units that include it; a .c file's
    exported names by every file (the linker's view)."""
    incs = {f.rel: [t for t in (resolve(files, f.rel, i) for i in f.includes) if t]
            for f in files.values()}
    visible = {rel: set() for rel in files}  # the files that share a unit with rel
    for unit in (r for r in files if r.endswith(".c")):
        closure, todo = set(), [unit]
        while todo:
            r = todo.pop()
            if r not in closure:
                closure.add(r)
                todo.extend(incs[r])
        for r in closure:
            visible[r] |= closure
    owners = {}
    for f in files.values():
        for name in f.exported:
            owners.setdefault(name, set()).add(f.rel)
    out = {}
    for f in files.values():
        for inc, tgt in ((i, resolve(files, f.rel, i)) for i in f.includes):
            if tgt and files[tgt].room != f.room:
                out.setdefault((f.room, files[tgt].room), set()).add('#include "%s"' % inc)
        for name in f.uses - f.local:
            rooms = {files[o].room for o in owners.get(name, ())
                     if not files[o].header or o in visible[f.rel]}
            if len(rooms) == 1:
                (room,) = rooms
                if room != f.room:
                    out.setdefault((f.room, room), set()).add(name)
    return out


def components(nodes, edges):
    """Strongly connected components of more than one room (Tarjan)."""
    succ = {n: sorted(b for (a, b) in edges if a == n) for n in nodes}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        work = [(v, iter(succ[v]))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(succ[nxt])))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return comps


def a_cycle(comp, edges, start):
    """The shortest circle through start inside the component, as rooms."""
    inside = set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for (a, b) in sorted(edges):
            if a != v or b not in inside:
                continue
            if b == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if b not in prev:
                prev[b] = v
                queue.append(b)
    return comp


def why(reasons):
    r = sorted(reasons, key=lambda s: (not s.startswith("#"), s))
    return ", ".join(r[:4]) + (", ..." if len(r) > 4 else "")


def floors(nodes, edges):
    floor = {}

    def f(n, seen=()):
        if n not in floor:
            below = [b for (a, b) in edges if a == n and b not in seen]
            floor[n] = 1 + max((f(b, seen + (n,)) for b in below), default=0)
        return floor[n]

    for n in nodes:
        f(n)
    return floor


def function_table(root):
    """(file, function, lines) of every function of FUNCTION_FILES: from the
    line of its name to its closing brace, comments and string literals
    blanked (their newlines kept)."""
    out = []
    for top in SCAN:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
                if FUNCTION_FILES.match(rel):
                    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                        out += [(rel, fn, n) for fn, n in function_lengths(f.read())]
    return out


def long_function_failures(root):
    """The failures of the function-length rule (module comment)."""
    bad, seen = [], set()
    for rel, fn, n in function_table(root):
        if (rel, fn) in LONG_FUNCTIONS:
            seen.add((rel, fn))
            if n > FUNCTION_HARD_MAX:
                bad.append("function longer than %d lines (the most for an exception): "
                           "%s: %s (%d lines)" % (FUNCTION_HARD_MAX, rel, fn, n))
            elif n <= FUNCTION_MAX_LINES:
                bad.append("LONG_FUNCTIONS entry %s: %s is %d lines now: remove it" % (
                    rel, fn, n))
        elif n > FUNCTION_MAX_LINES:
            bad.append("function longer than %d lines: %s: %s (%d lines)" % (
                FUNCTION_MAX_LINES, rel, fn, n))
    for rel, fn in sorted(set(LONG_FUNCTIONS) - seen):
        bad.append("LONG_FUNCTIONS entry %s: %s matches no function: remove it" % (rel, fn))
    return bad


def function_lengths(text):
    """[(name, lines)] of the function definitions of a C file."""
    blank = re.sub(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
                   lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    blank = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*",  # directives (continued lines too)
                   lambda m: re.sub(r"[^\n]", " ", m.group(0)), blank, flags=re.M)
    out, depth, head, line, name, start = [], 0, "", 1, None, 0
    for c in blank:
        if c == "{":
            if depth == 0:
                # a function: NAME (PARAMS) right before the brace, not an
                # initializer (= ...) nor a struct / enum / union body
                m = re.search(r"(\w+)\s*\([^;{}]*\)\s*$", head)
                before = head[:m.start()] if m else ""
                name = m.group(1) if m and not re.search(
                    r"=\s*$|\b(struct|enum|union)\b[^(]*$", before) else None
                start = line - head[m.start():].count("\n") if name else None
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                if name:
                    out.append((name, line - start + 1))
                head = ""
        elif depth == 0:
            head = "" if c == ";" else head + c
        if c == "\n":
            line += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--arrows", action="store_true")
    ap.add_argument("--floors", action="store_true")
    args = ap.parse_args()
    files = load(os.path.abspath(args.root))
    edges = arrows(files)
    rooms = {f.room for f in files.values()}
    bad = [("place", r, r, "a command room outside molgen/cli/: %s" % r) for r in sorted(rooms)
           if layer_of(r) != COMMAND_LAYER and r.startswith("molgen/")
           and COMMAND_STEMS.match(os.path.basename(r))]
    bad += [("place", r, r, "an engine room outside the layer folders (molgen/{%s}/): %s" % (
        ",".join(ENGINE_NAMES), r)) for r in sorted(rooms) if layer_of(r) is None]
    for (a, b), rs in sorted(edges.items()):
        if layer_of(a) is None or layer_of(b) is None:
            continue  # reported above
        if layer_of(a) < layer_of(b):
            bad.append(("up", a, b, "arrow up: %s (%s) -> %s (%s): %s" % (
                a, LAYER_NAMES[layer_of(a)], b, LAYER_NAMES[layer_of(b)], why(rs))))
        owner = COMMAND_OWNED.get(b)
        if owner and a != owner and layer_of(a) == COMMAND_LAYER:
            bad.append(("owned", a, b, "another command's room: %s -> %s (of %s): %s" % (
                a, b, owner, why(rs))))
    allowed_used = set()
    checked = {}
    for e, rs in edges.items():
        if e in ALLOWED:
            allowed_used.add(e)
        else:
            checked[e] = rs
    bad = [b for b in bad if (b[1], b[2]) not in ALLOWED]
    for comp in components(rooms, checked):
        seen = set()
        for start in comp:  # the shortest circle through each of its rooms
            cyc = a_cycle(comp, checked, start)
            key = frozenset(zip(cyc, cyc[1:]))
            if key in seen:
                continue
            seen.add(key)
            steps = " -> ".join("%s [%s]" % (cyc[i], why(checked[(cyc[i], cyc[i + 1])]))
                                for i in range(len(cyc) - 1))
            bad.append(("cycle", start, start, "circle in %s: %s -> %s" % (
                ", ".join(comp), steps, cyc[-1])))
    if args.arrows:
        for (a, b), rs in sorted(edges.items()):
            print("arrow %s -> %s: %s" % (a, b, why(rs)))
    if args.floors:
        fl = floors(rooms, checked)
        for n in range(max(fl.values(), default=0), 0, -1):
            print("floor %2d: %s" % (n, " ".join(sorted(r for r in fl if fl[r] == n))))
    for e in sorted(ALLOWED):
        if e in allowed_used:
            print("allowed for now (known, ALLOWED): %s -> %s: %s [%s]" % (
                e[0], e[1], why(edges[e]), ALLOWED[e]))
        else:
            print("note: ALLOWED entry %s -> %s matches nothing now: remove it" % e)
    for msg in long_function_failures(os.path.abspath(args.root)):
        bad.append(("long", "", "", msg))
    for b in bad:
        print("FAIL " + b[3])
    print("check_layers: %d files, %d rooms, %d arrows, %d allowed, %d failures" % (
        len(files), len(rooms), len(edges), len(allowed_used), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
