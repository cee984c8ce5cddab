"""Pull the program out of a model completion.

Rule (documented in datasets/README.md): the *last* fenced block whose tag is ``c``,
``cpp``, ``c++``, ``cc``, ``cxx`` or empty is the program (models often show a draft, then
the final answer). The tag decides the language (``c`` -> C, the C++ tags -> C++); an untagged
block takes the problem's language. Blocks with other tags (``python``, ``text``...) are
ignored. A completion with no such block yields ``None``, which the evaluator reports as
``compile_error`` with reason "no code block found".
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
_TAGS = {"c": "c", "h": "c", "cpp": "cpp", "c++": "cpp", "cc": "cpp", "cxx": "cpp", "hpp": "cpp"}


def extract_code(completion: str, default_language: str) -> Optional[Tuple[str, str]]:
    """(language, source) of the last C/C++ or untagged fenced block, or None."""
    found: Optional[Tuple[str, str]] = None
    for m in _FENCE.finditer(completion):
        tag = m.group(2).lower()
        if tag == "":
            lang = default_language
        elif tag in _TAGS:
            lang = _TAGS[tag]
        else:
            continue
        body = m.group(3)
        if body.strip():
            found = (lang, body)
    return found
