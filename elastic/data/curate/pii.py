"""PII redaction (not removal): e-mail addresses, public IPv4/IPv6 addresses and phone numbers
are replaced by placeholders, counted per kind. E-mail and IPv4 patterns and placeholders are
datatrove's PIIFormatter's (example.com/org addresses; IPs that did not answer pings); IPv6 uses
the documentation prefix and phones the fictional 555-01xx range. Placeholders cycle per
document, so a document's redaction never depends on what else a worker saw.

Phone numbers are found by Google's libphonenumber (the `phonenumbers` port, as Presidio does):
a number written with + in any country's format, and national numbers of the regions in
`curate.pii_phone_regions`."""

from __future__ import annotations

import functools
import ipaddress
import itertools
import re
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import phonenumbers
from phonenumbers import Leniency, PhoneMetadata, PhoneNumberMatcher

from elastic.data.curate.base import Stage, StageResult, register

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)(?![\d.])")
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,7}|[0-9A-Fa-f]{1,4})(?![\w:])")

# Phones. VALID (Presidio's default): the digits must form a number libphonenumber's metadata
# calls valid (right length and prefix for its country and type), in any grouping. It redacts
# every format of tests/test_curate_stages.py's 16-country table; dates, times, versions and
# ISBN-13s are not valid numbers. STRICT_GROUPING would also reject real numbers grouped
# unofficially ("+49 30 9018 20", "+44 2079 460958"), and a missed number leaks PII; POSSIBLE
# (length only) redacts dates, version numbers and plain integers (15.01.2024, 3.11.4, 12000).
PHONE_LENIENCY = Leniency.VALID
# National numbers (no +) are read in these regions unless curate.pii_phone_regions says otherwise.
DEFAULT_PHONE_REGIONS = ("US",)
# What VALID alone does not rule out, dropped: a dotted quad that is a valid IPv4 address (an
# IP, redacted or kept by the ip kind, never a phone: 93.184.216.34 is a valid US number); an
# ISBN-10 (0-306-40615-2 is valid in several European regions); and digits that are part of a
# larger numeral, the commonest false find in real text: a decimal (0.333333333 is a valid
# German number), the digits after a decimal point or a minus sign (1000000.0050045159,
# -2147483648) or before a decimal point.
_ISBN_BEFORE = re.compile(r"ISBN(?:-1[03])?:?\s*$", re.IGNORECASE)
_DECIMAL = re.compile(r"[+-]?\d+[.,]\d+")
_DIGIT = re.compile(r"\d")
_NUMBER_TYPES = ("fixed_line", "mobile", "toll_free", "premium_rate", "shared_cost", "personal_number", "voip",
                 "pager", "uan", "voicemail")

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


def _min_valid_length(md) -> int:
    """The fewest national significant digits of a valid number in this metadata (validity
    checks the type's possible lengths before its pattern, so no valid number is shorter)."""
    lens = []
    for t in _NUMBER_TYPES:
        desc = getattr(md, t, None)
        if desc is not None and desc.national_number_pattern:
            lens += [n for n in (desc.possible_length or md.general_desc.possible_length or ()) if n > 0]
    return min(lens) if lens else 99


def _added_digits(md) -> int:
    """Digits a national-prefix transform rule writes in (its literal digits, not \\1 references)."""
    return sum(c.isdigit() for c in re.sub(r"\\\d", "", md.national_prefix_transform_rule or ""))


@functools.lru_cache(maxsize=None)
def min_phone_digits(regions: Tuple[str, ...]) -> int:
    """A text with fewer digits holds no phone number the matcher would find: the shortest valid
    number written with + (country code and national number) or nationally in one of `regions`.
    A number is valid in any region of its country code (+44: GB, GG, IM, JE), and a region's
    national-prefix rule may add digits to what was written (GG: 6 written, 1481 added), so
    both are counted. The pre-checks below skip such texts and candidates, same result."""
    mds = [PhoneMetadata.metadata_for_region(r) for r in phonenumbers.SUPPORTED_REGIONS]
    mds += [PhoneMetadata.metadata_for_nongeo_region(cc) for cc in phonenumbers.COUNTRY_CODES_FOR_NON_GEO_REGIONS]
    shortest: Dict[int, int] = {}
    added: Dict[int, int] = {}
    for md in mds:
        if md is None:
            continue
        cc = md.country_code
        shortest[cc] = min(shortest.get(cc, 99), _min_valid_length(md))
        added[cc] = max(added.get(cc, 0), _added_digits(md))
    plus = min(len(str(cc)) + shortest[cc] - added[cc] for cc in shortest)
    national = []
    for r in regions:
        md = PhoneMetadata.metadata_for_region(r)
        national.append(shortest[md.country_code] - _added_digits(md))
    return max(1, min([plus] + national))


def _part_of_numeral(text: str, a: int, b: int) -> bool:
    if _DECIMAL.fullmatch(text, a, b):
        return True
    before, after = text[max(0, a - 2):a], text[b:b + 2]
    return (before[-1:] in ("-", "\u2212") or (len(before) == 2 and before[1] in ".," and before[0].isdigit())
            or (len(after) == 2 and after[0] in ".," and after[1].isdigit()))


def phone_spans(text: str, regions: Sequence[str]) -> List[Tuple[int, int]]:
    """(start, end) of each phone number in `text`, in order, overlapping finds merged. One
    matcher pass per region (each also finds + numbers); none given: one region-less pass, which
    finds + numbers only."""
    found = []
    # Candidates shorter than the shortest valid number are skipped unparsed (same result);
    # max_tries bounds the invalid candidates tried: a text has fewer than len(text) of them.
    shortest = min_phone_digits(tuple(regions))
    for region in regions or (phonenumbers.UNKNOWN_REGION,):
        for m in PhoneNumberMatcher(text, region, leniency=PHONE_LENIENCY, max_tries=max(65535, len(text)),
                                    min_candidate_length=shortest):
            found.append((m.start, m.end))
    if not found:
        return []
    ips = [m.span() for m in IPV4.finditer(text)]
    found = [(a, b) for a, b in found
             if not any(a < ie and ia < b for ia, ie in ips) and not _ISBN_BEFORE.search(text, max(0, a - 12), a)
             and not _part_of_numeral(text, a, b)]
    merged: List[Tuple[int, int]] = []
    for a, b in sorted(found):
        if merged and a < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _regions(cfg, phone_regions: Optional[Iterable[str]]) -> Tuple[str, ...]:
    if phone_regions is None:
        phone_regions = getattr(cfg, "pii_phone_regions", DEFAULT_PHONE_REGIONS)
    return tuple(r.upper() for r in phone_regions)


@register("pii")
class PIIRedaction(Stage):
    def __init__(self, cfg=None, kinds=None, public_ips_only=None, phone_regions=None):
        super().__init__(cfg)
        self.kinds = tuple(kinds if kinds is not None else (getattr(cfg, "pii_kinds", None) or KINDS))
        public = public_ips_only if public_ips_only is not None else getattr(cfg, "pii_public_ips_only", True)
        self.phone_regions = _regions(cfg, phone_regions)
        self._phone_min_digits = min_phone_digits(self.phone_regions)
        self._patterns: Dict[str, Tuple[re.Pattern, Optional[Callable[[str], bool]]]] = {
            "email": (EMAIL, None),
            "ip": (IPV4, lambda s: _public_ip(s, public)),
            "ipv6": (IPV6, lambda s: ":" in s and _public_ip(s, public)),
        }

    def _redact_phones(self, text: str) -> Tuple[str, int]:
        # Fewer digits than the shortest valid number: nothing to find (most documents).
        if next(itertools.islice(_DIGIT.finditer(text), self._phone_min_digits - 1, None), None) is None:
            return text, 0
        spans = phone_spans(text, self.phone_regions)
        if not spans:
            return text, 0
        reps = REPLACEMENTS["phone"]
        out, pos = [], 0
        for i, (a, b) in enumerate(spans):
            out += [text[pos:a], reps[i % len(reps)]]
            pos = b
        out.append(text[pos:])
        return "".join(out), len(spans)

    def redact(self, text: str) -> Tuple[str, Dict[str, int]]:
        counts: Dict[str, int] = {}
        for kind in self.kinds:
            if kind == "phone":
                text, n_phone = self._redact_phones(text)
                if n_phone:
                    counts[kind] = n_phone
                continue
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
