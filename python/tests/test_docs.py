# docs/python.md's DeepNVMe examples, run in order as one script (they are written for PyTorch).
import os
import re

import pytest

pytest.importorskip("torch", reason="docs/python.md's examples use PyTorch tensors")

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "python.md")


def test_tutorial_examples_run():
    text = open(DOC).read()
    section = text.split("## DeepNVMe's tutorial, on cutrain", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 5
    exec(compile("\n".join(blocks), DOC, "exec"), {})
