"""Run the runnable examples of the README and docs/ (the library reference, the learner
guide), in order, in an IPython shell, as a reader would.

A block runs when it launches ranks (dl.launch, %%distributed, %load_ext) and has no `...`
placeholder. tests/launches/test_audit.py runs this file with DPMP_LAB_DEVICE_AUDIT=1, so the
documentation teaches code that is right on a GPU server too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # tests/support/ in the checkout
PAGES = [ROOT / "README.md", ROOT / "docs" / "library.md", ROOT / "docs" / "learner-guide.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def runnable_blocks(text: str) -> list[str]:
    blocks = []
    for block in BLOCK.findall(text):
        launches = any(word in block for word in ("dl.launch(", "%%distributed", "%load_ext"))
        placeholder = any(line.strip().startswith("...") for line in block.splitlines())
        if launches and not placeholder:
            blocks.append(block)
    return blocks


def main() -> int:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    blocks = [(page.relative_to(ROOT), block) for page in PAGES
              for block in runnable_blocks(page.read_text())]
    for i, (page, block) in enumerate(blocks):
        print(f"--- {page}: block {i + 1} of {len(blocks)}", flush=True)
        result = shell.run_cell(block)
        if not result.success:
            print(f"{page}: block {i + 1} failed:\n{block}", flush=True)
            return 1
    print(f"Documentation examples: ok under the device audit ({len(blocks)} blocks)"
          if "DPMP_LAB_DEVICE_AUDIT" in __import__("os").environ
          else f"Documentation examples: ok ({len(blocks)} blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
