"""PII redaction (not removal): e-mail addresses, public IPv4/IPv6 addresses and phone numbers
are replaced by placeholders, counted per kind. E-mail and IPv4 patterns and placeholders are
datatrove's PIIFormatter's (example.com/org addresses; IPs that did not answer pings); IPv6 uses
the documentation prefix and phones the fictional 555-01xx range. Placeholders cycle per
document, so a document's redaction never depends on what else a worker saw."""

from __future__ import annotations

import ipaddress
import re
from typing import Callable, Dict, Optional, Tuple

from elastic.data.curate.base import Stage, StageResult, register

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)(?![\d.])")
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,7}|[0-9A-Fa-f]{1,4})(?![\w:])")
# North-American style and international numbers with separators: +1 (555) 123-4567, 030 1234 5678.
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)|\d{2,4})[\s.-]\d{3,4}[\s.-]\d{3,4}(?![\w-])")

REPLACEMENTS = {
    "email": ("email@example.com", "firstname.lastname@example.org"),
    "ip": ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11", "18.104.22.168"),
    "ipv6": ("2001:db8::1", "2001:db8::2"),
    "phone": ("555-0100", "555-0101"),
}
KINDS = ("email", "ip", "ipv6", "phone")


def _public_ip(s: str, public_only: bool) -> bool:
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:
        return False
    return ip.is_global or not public_only


def _phone_ok(s: str) -> bool:
    digits = sum(c.isdigit() for c in s)
    return 9 <= digits <= 15


@register("pii")
class PIIRedaction(Stage):
    def __init__(self, cfg=None, kinds=None, public_ips_only=None):
        super().__init__(cfg)
        self.kinds = tuple(kinds if kinds is not None else (getattr(cfg, "pii_kinds", None) or KINDS))
        public = public_ips_only if public_ips_only is not None else getattr(cfg, "pii_public_ips_only", True)
        self._patterns: Dict[str, Tuple[re.Pattern, Optional[Callable[[str], bool]]]] = {
            "email": (EMAIL, None),
            "ip": (IPV4, lambda s: _public_ip(s, public)),
            "ipv6": (IPV6, lambda s: ":" in s and _public_ip(s, public)),
            "phone": (PHONE, _phone_ok),
        }

    def redact(self, text: str) -> Tuple[str, Dict[str, int]]:
        counts: Dict[str, int] = {}
        for kind in self.kinds:
            pat, ok = self._patterns[kind]
            if kind == "email" and "@" not in text:
                continue
            reps = REPLACEMENTS[kind]
            n = [0]

            def sub(m, ok=ok, reps=reps, n=n):
                s = m.group(0)
                if ok is not None and not ok(s):
                    return s
                n[0] += 1
                return reps[(n[0] - 1) % len(reps)]

            text = pat.sub(sub, text)
            if n[0]:
                counts[kind] = n[0]
        return text, counts

    def process(self, docs):
        total = {f"pii_{k}": 0 for k in self.kinds}
        docs_redacted = 0
        for d in docs:
            d["text"], c = self.redact(d["text"])
            if c:
                docs_redacted += 1
            for k, v in c.items():
                total[f"pii_{k}"] += v
        total["pii_docs"] = docs_redacted
        return StageResult(kept=docs, counts=total)
