#!/usr/bin/env python3
"""Re-run the README's ```console blocks on a copy of sample_data/ and paste their real output back.

    python tools/refresh_readme.py        # rewrites README.md in place

tests/test_e2e.py::test_readme_walkthrough_output_is_real fails when the README and reality differ;
this script is how the README is brought back in line (after changing the sample run or the output).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    path = os.path.join(ROOT, "README.md")
    text = open(path, encoding="utf-8").read()
    work = tempfile.mkdtemp(prefix="gradtool-readme-")
    shutil.copytree(os.path.join(ROOT, "sample_data"), os.path.join(work, "sample_data"))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))

    def refresh(match: re.Match) -> str:
        lines = match.group(1).rstrip("\n").split("\n")
        cmd_lines = []
        while lines and (lines[0].startswith("$ ") or (cmd_lines and cmd_lines[-1].endswith("\\"))):
            cmd_lines.append(lines.pop(0))
        cmd = "\n".join(line.removeprefix("$ ") for line in cmd_lines)
        out = subprocess.run(["bash", "-c", "{ " + cmd + "\n} 2>&1"], cwd=work, capture_output=True, text=True,
                             env=env).stdout
        body = "\n".join(line.rstrip() for line in out.rstrip("\n").split("\n"))
        return "```console\n" + "\n".join(cmd_lines) + "\n" + body + "\n```"

    new = re.sub(r"```console\n(.*?)```", refresh, text, flags=re.S)
    shutil.rmtree(work, ignore_errors=True)
    if new != text:
        open(path, "w", encoding="utf-8").write(new)
        print("README.md updated")
    else:
        print("README.md already matches")


if __name__ == "__main__":
    main()
