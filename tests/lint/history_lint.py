#!/usr/bin/env python3
"""Guides and comments say what the code does and why; history lives in lab/.

The docs (docs/**/*.md, README.md, the READMEs of the product's folders) and the comments of the
product's sources may not carry what belongs to the measurement lab (lab/README.md, lab/journal.md):
commit ids, dates, issue numbers, or the remote GPU machine's limits. A comment or guide may point
into lab/ (a results file's path names its date and commit: that path is allowed). Only prose and
comments are read, never code or string literals, so hex constants and format strings pass.

  python3 tests/lint/history_lint.py [--root DIR] [--all] [--self-test]

--all also reads the folders of TEMPORARILY_EXCLUDED (to list what is left to clean there).
Exit status 0: nothing found; 1: findings, one `path:line: what: text` each.
"""
import argparse
import io
import os
import re
import sys
import tokenize

# The product tree whose comments are read (folders, recursively; the root's own CMakeLists.txt).
SOURCE_DIRS = ["core", "kernels", "nn", "optim", "data", "distributed", "train", "apps",
               "experiments", "include", "cmake", "cuda_emu", "perfmodel", "bench", "tools"]
ROOT_FILES = ["CMakeLists.txt"]
# Guides: every line is prose.
DOC_GLOBS = ["README.md", "docs"]

# Never read: the lab, committed results wherever they sit, build output.
EXEMPT = re.compile(r"^(lab/|build[^/]*/|\.git/)|(^|/)results/")

# ---- Temporary exclusions, to be removed by the folders' owners once they are clean. ----------
# Folders whose comments still carry history (run with --all to list the hits). Each entry goes
# away when its folder passes; the list must end up empty.
TEMPORARILY_EXCLUDED: list[str] = []
# ----------------------------------------------------------------------------------------------

CPP_EXT = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
HASH_EXT = {".sh", ".cmake", ".txt", ".in", ".gnuplot"}  # '#' comments (CMakeLists.txt, *.cmake[.in], shell)
PY_EXT = {".py"}

# A path into the lab (a results file, the journal, an anchor in it) may name dates and commits.
LAB_PATH = re.compile(r"(?<![\w/.-])(\.\./)*lab/[^\s)`'\",;\]]*")

RULES = [
    ("commit id", re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}"
                             r"(?![0-9A-Za-z])")),
    ("date", re.compile(r"(?<!\d)(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?!\d)")),
    ("issue number", re.compile(r"\b(?i:issues?)\s*#?\d+|\bPR ?#\d+")),
    ("remote GPU machine's limits", re.compile(
        r"(?i)\bdevice[- ](time|minutes?|budget)\b"
        r"|\bdevice tool\b"
        r"|\b\d+\s*minutes of device\b"
        r"|\bcalls? of at most\b"
        r"|\b(commands?|calls?) of at most \d+"
        r"|\bat most \d+ ?s (a|per) (command|call)\b"
        r"|\bcarr(y|ies|ied|ying)\b\W+(\S+\s+){0,6}?\d+(\.\d+)?\s*MiB"
        r"|\d+(\.\d+)?\s*MiB\b\W+(\S+\s+){0,4}?(carr(y|ies|ied)|travel)"
        r"|\bMiB of the 64\b"
        r"|\b(budget_left_s|give_back|can_start_another)\b")),
]


def cpp_comments(text):
    """(line, comment text) of // and /* */ comments, skipping string and character literals."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text):
    """(line, comment) of '#' comments in shell / CMake: a '#' at a word start outside quotes."""
    out = []
    for lineno, raw in enumerate(text.split("\n"), 1):
        quote, i = None, 0
        while i < len(raw):
            c = raw[i]
            if quote:
                if c == "\\" and quote == '"':
                    i += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "\\":
                i += 1
            elif c == "#" and (i == 0 or raw[i - 1] in " \t;(") :
                if not raw.startswith("#!", 0) or lineno > 1:
                    out.append((lineno, raw[i + 1:]))
                break
            i += 1
    return out


def py_comments(text):
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return hash_comments(text)
    return out


def prose(text):
    return list(enumerate(text.split("\n"), 1))


def check_lines(rel, lines, findings):
    for lineno, s in lines:
        s2 = LAB_PATH.sub(" ", s)
        for name, rx in RULES:
            m = rx.search(s2)
            if m:
                findings.append(f"{rel}:{lineno}: {name} '{m.group(0).strip()}': {s.strip()[:160]}")


def files_under(root, top):
    base = os.path.join(root, top)
    if os.path.isfile(base):
        yield top
        return
    for d, dirs, files in os.walk(base):
        dirs.sort()
        for f in sorted(files):
            yield os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")


SELF_TEST_CPP = r"""
// fixed in 3e335d2, see issue 30 and issue #31, measured 2026-11-26 (lab/results/bench/x_2026-11-26_ab67ceb.md)
const char* s = "abc1234 2026-11-26 issue 5";  // a string literal is code, not prose
uint32_t m = 0xdeadbeef1; int n = 1'000'000; auto r = R"(// not a comment 9f3c2e1)";
/* the check took 15 minutes of device time; the call carried 57.8 MiB of the 64 */
// deadbeef has no digit; 1234567 has no letter; rows [pr0, pr1) are no PR; sha 0123456789abcdef0123456789abcdef0123456789 is 42 long
"""
SELF_TEST_EXPECT = [
    (2, "commit id"), (2, "date"), (2, "issue number"),
    (5, "remote GPU machine's limits"),
]


def self_test():
    found = []
    check_lines("t.cpp", cpp_comments(SELF_TEST_CPP), found)
    got = sorted({(int(f.split(":")[1]), f.split(": ")[1].rsplit(" '", 1)[0]) for f in found})
    want = sorted(SELF_TEST_EXPECT)
    sh = hash_comments('x="a # 1a2b3c4"  # issue 7\necho ${#arr} # fine\n')
    ok = got == want and sh == [(1, " issue 7"), (2, " fine")]
    print("history_lint self-test:", "passed" if ok else f"FAILED: got {got} want {want}; shell {sh}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--all", action="store_true", help="also read the temporarily excluded folders")
    ap.add_argument("--self-test", action="store_true", help="check the scanner on planted lines")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    findings, seen = [], set()

    def wanted(rel):
        if rel in seen or EXEMPT.search(rel):
            return False
        if not args.all and any(rel.startswith(p) for p in TEMPORARILY_EXCLUDED):
            return False
        seen.add(rel)
        return True

    def read(rel):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            return f.read()

    for top in DOC_GLOBS:
        for rel in files_under(root, top):
            if rel.endswith(".md") and wanted(rel):
                check_lines(rel, prose(read(rel)), findings)
    for top in SOURCE_DIRS + ROOT_FILES:
        if not os.path.exists(os.path.join(root, top)):
            continue
        for rel in files_under(root, top):
            if top == "tools" and "/" in rel[len("tools/"):]:
                continue  # tools/*.sh only: the golden generators' folders are not product
            ext = os.path.splitext(rel)[1]
            name = os.path.basename(rel)
            if top == "tools" and ext != ".sh":
                continue
            if ext == ".md":
                if wanted(rel):
                    check_lines(rel, prose(read(rel)), findings)
            elif ext in CPP_EXT and name != "CMakeLists.txt":
                if wanted(rel):
                    check_lines(rel, cpp_comments(read(rel)), findings)
            elif ext in HASH_EXT or name == "CMakeLists.txt":
                if ext == ".txt" and name != "CMakeLists.txt":
                    continue
                if wanted(rel):
                    check_lines(rel, hash_comments(read(rel)), findings)
            elif ext in PY_EXT:
                if wanted(rel):
                    check_lines(rel, py_comments(read(rel)), findings)

    for f in findings:
        print(f)
    if findings:
        print(f"history_lint: {len(findings)} finding(s). Guides and comments say what the code does and "
              "why; dates, commit ids, issue numbers and the GPU lab's limits go to lab/ (results files, "
              "lab/journal.md), which a comment may point to by path.", file=sys.stderr)
        return 1
    print(f"history_lint: {len(seen)} files clean"
          + ("" if args.all else f" (temporarily excluded: {', '.join(TEMPORARILY_EXCLUDED) or 'none'})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
