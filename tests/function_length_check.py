"""ctest's size check: no C++ function (or lambda) of the project is longer than 120 lines and no
libcurv or Python-package source or header longer than 600 (docs/library.md#layout).

A function is a brace block opened at the end of a line that closes a parameter list, ") {",
") const {", ") -> T {", ") : member(x) {", that is not a control statement (if, for, while,
switch, catch). Comments, strings and character literals are blanked first, so braces inside
them do not count.

Run: python3 function_length_check.py REPO_ROOT
     python3 function_length_check.py --self-test   (the check on a tree made to fail it)
"""

import pathlib
import re
import sys
import tempfile

MAX_FUNCTION_LINES = 120
MAX_FILE_LINES = 600
FUNCTION_OPENER = re.compile(
    r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(->\s*[^{;]+)?(:\s*[^;{]*(\([^;]*\)|\{\}))?"
    r"\s*(mutable\s*)?\{\s*$"
)
CONTROL = re.compile(r"^\s*(\}\s*)?(else\s+)?(if|for|while|switch|catch)\b")


def blank(text: str) -> str:
    """Comments and literals replaced by spaces, line breaks kept."""
    keep_lines = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    text = re.sub(r'R"([^(\s]*)\((.*?)\)\1"', keep_lines, text, flags=re.S)
    text = re.sub(r"/\*.*?\*/", keep_lines, text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])*'", "''", text)
    return text


def long_functions(path: pathlib.Path):
    lines = blank(path.read_text(encoding="utf-8")).split("\n")
    stack = []
    for number, line in enumerate(lines, start=1):
        for char in line:
            if char == "{":
                opener = FUNCTION_OPENER.search(line) and not CONTROL.search(line)
                stack.append((number, bool(opener)))
            elif char == "}" and stack:
                start, is_function = stack.pop()
                length = number - start + 1
                if is_function and length > MAX_FUNCTION_LINES:
                    yield start, length


def self_test() -> int:
    """A function one line too long and a file one line too long are both reported, and a
    function of exactly the limit, a long comment and braces in strings are not."""
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        source = root / "libcurv" / "src" / "core" / "sizes.cpp"
        source.parent.mkdir(parents=True)
        body = lambda name, n: [f"int {name}(int x) {{"] + ["  ++x;"] * (n - 3) + [
            "  return x;", "}"]
        lines = body("long_function", MAX_FUNCTION_LINES + 1)
        lines += body("fits", MAX_FUNCTION_LINES)
        lines += ["const char* braces = \"{{{\";", "/*"] + ["{"] * 20 + ["*/"]
        lines += ["// padding"] * (MAX_FILE_LINES + 1 - len(lines))
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        report = check(root)
    expected = [f"libcurv/src/core/sizes.cpp:1: function of {MAX_FUNCTION_LINES + 1} lines "
                f"(at most {MAX_FUNCTION_LINES})",
                f"libcurv/src/core/sizes.cpp: {MAX_FILE_LINES + 1} lines (at most {MAX_FILE_LINES})"]
    if report != expected:
        print("self-test failed: expected", expected, "got", report)
        return 1
    print("self-test: the check reports a function and a file one line over their limits")
    return 0


def check(root: pathlib.Path):
    failures = []
    for folder in ("libcurv", "tools", "bench", "examples", "fuzz", "python"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cpp", ".h", ".cu", ".cuh"):
                continue
            name = path.relative_to(root)
            for start, length in long_functions(path):
                failures.append(f"{name}:{start}: function of {length} lines "
                                f"(at most {MAX_FUNCTION_LINES})")
            if folder in ("libcurv", "python"):
                count = len(path.read_text(encoding="utf-8").split("\n")) - 1
                if count > MAX_FILE_LINES:
                    failures.append(f"{name}: {count} lines (at most {MAX_FILE_LINES})")
    return failures


def main() -> int:
    if sys.argv[1] == "--self-test":
        return self_test()
    failures = check(pathlib.Path(sys.argv[1]))
    for failure in failures:
        print(failure)
    if failures:
        print(f"size check failed: {len(failures)} functions or files too long")
        return 1
    print(f"size check: functions within {MAX_FUNCTION_LINES} lines, "
          f"libcurv and python/ files within {MAX_FILE_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
