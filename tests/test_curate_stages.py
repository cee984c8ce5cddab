"""The curation stages, each against hand-made documents (pure Python, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from elastic.config import ConfigError
from elastic.config.schema import CurateSection
from elastic.data.curate import STAGES, DocPipeline, check_curate_config
from elastic.data.curate.c4 import C4Quality
from elastic.data.curate.dedup import MinHasher, content_hash, exact_duplicates, jaccard, jaccard_estimate, near_duplicates
from elastic.data.curate.fineweb import FineWebQuality
from elastic.data.curate.gopher import GopherQuality, GopherRepetition
from elastic.data.curate.langid import LanguageID
from elastic.data.curate.pii import PIIRedaction
from elastic.data.curate.toxicity import Toxicity
from elastic.data.curate.unicode import UnicodeRepair
from tests.curate_helpers import ENGLISH, FRENCH, GERMAN, near_copy, prose


def reason(stage, text):
    res = stage([{"id": "x", "text": text, "order": 0}])
    return res.removed[0][1] if res.removed else None


def test_registry_has_every_stage():
    assert {"unicode", "langid", "gopher_quality", "gopher_repetition", "c4", "fineweb", "toxicity", "pii",
            "perplexity"} <= set(STAGES)


def test_good_prose_passes_every_rule():
    for stage in (GopherQuality(), GopherRepetition(), C4Quality(), FineWebQuality(), Toxicity()):
        for seed in range(20):
            assert reason(stage, prose(seed)) is None, (stage.name, seed)


def test_gopher_quality_rules():
    g = GopherQuality()
    assert reason(g, "The cat and the dog.") == "gopher:min_doc_words"
    assert reason(g, " ".join(["a", "of", "the", "to"] * 30)) == "gopher:min_mean_word_length"
    assert reason(g, " ".join(["extraordinarily", "the", "of", "incomprehensibilities"] * 30)) == "gopher:max_mean_word_length"
    assert reason(g, prose(1) + " #tag" * 40) == "gopher:max_hash_word_ratio"
    assert reason(g, "\n".join(f"- the garden {w} of the village station" for w in range(80))) == "gopher:max_bullet_lines_ratio"
    assert reason(g, "\n".join(f"the history of the village market {w} continues..." for w in range(80))) in (
        "gopher:max_ellipsis_word_ratio", "gopher:max_ellipsis_lines_ratio")
    assert reason(g, " ".join(f"{1000 + i} 45.678 the history" for i in range(60))) == "gopher:min_alpha_words_ratio"
    assert reason(g, " ".join(["river garden window station market"] * 20)) == "gopher:min_stop_words"
    # thresholds are configurable, rules can be skipped
    assert reason(GopherQuality(min_doc_words=3), "The cat and the dog sat.") is None
    assert reason(GopherQuality(CurateSection(skip_rules=["gopher:min_doc_words"])), "The cat and the dog sat.") is None


def test_gopher_repetition_rules():
    g = GopherRepetition()
    line = "The quiet river of the town carried a boat with the farmer and teacher."
    assert reason(g, "\n".join([line] * 10)) == "gopher_rep:dup_line_frac"
    assert reason(g, "\n\n".join([prose(1), prose(1), prose(2)])) == "gopher_rep:dup_para_frac"
    assert reason(g, prose(3) + " " + "buy now " * 60) == "gopher_rep:top_2_gram"
    assert reason(GopherRepetition(top_2_gram=0.9, top_3_gram=0.9, top_4_gram=0.9), prose(3) + " " + "buy now " * 60) \
        == "gopher_rep:dup_5_gram"


def test_c4_rules():
    c = C4Quality()
    assert reason(c, prose(1) + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.") == "c4:lorem_ipsum"
    assert reason(c, prose(1) + "\nThe value is {x} in this sentence of the text.") == "c4:curly_bracket"
    assert reason(c, "One short sentence here.\nTwo more sentences here.") == "c4:min_sentences"
    # line rules rewrite the page (as C4): javascript, policy and unpunctuated lines go
    d = {"id": "x", "order": 0, "text": prose(2) + "\nPlease enable JavaScript to view this page.\nMenu Home About\n"
         "This site uses cookies to improve the experience."}
    res = c([d])
    assert not res.removed and res.kept[0]["text"] == prose(2) and res.counts["c4_lines_dropped"] == 3
    assert reason(C4Quality(curly_bracket=0), prose(1) + "\nThe value is {x} in this sentence of the text.") is None


def test_fineweb_rules():
    f = FineWebQuality()
    assert reason(f, "\n".join(f"Item number {i} of the list of many things here" for i in range(20))) == "fineweb:line_punct_ratio"
    assert reason(f, "\n".join(f"Short line {i}." for i in range(20))) == "fineweb:short_line_ratio"
    assert reason(f, prose(1) + "\n" + prose(1).splitlines()[0]) == "fineweb:char_dup_ratio"
    assert reason(f, "\n".join(f"A{i} b." for i in range(3)) + "\n" + "\n".join(
        f"Word {i} is here at the end." for i in range(4)) + "\n" + "\n".join(f"x{i}." for i in range(10))
        ) in ("fineweb:list_ratio", "fineweb:short_line_ratio")
    assert reason(FineWebQuality(short_line_ratio=1.0), "\n".join(f"Ok {i}." for i in range(20))) == "fineweb:list_ratio"


def test_unicode_repair():
    u = UnicodeRepair()
    res = u([{"id": "a", "text": "The cafÃ© is open &amp; busy.", "order": 0}])
    assert res.kept[0]["text"] == "The café is open & busy." and res.counts["unicode_fixed"] == 1
    # datatrove's FTFYFormatter settings: quotes and line breaks stay; the ASCII fast path agrees with ftfy
    assert u.fix("“quoted”\r\nnext") == "“quoted”\r\nnext"
    for t in ("plain ascii\r\n\tline\f", "esc\x1b[31mred", "ctl\x00\x07\x0b\x7f", "x &amp; y", "a & b"):
        assert u.fix(t) == u._fix(t, config=u._config), repr(t)


def test_langid_german_french_english():
    lid = LanguageID(languages=["en"], min_score=0.65)
    assert lid.classify(GERMAN)[0] == "de" and lid.classify(FRENCH)[0] == "fr"
    lang, score = lid.classify(ENGLISH)
    assert lang == "en" and score > 0.9
    assert reason(lid, GERMAN) == "lang:de" and reason(lid, FRENCH) == "lang:fr" and reason(lid, ENGLISH) is None
    assert reason(LanguageID(languages=["en", "de"]), GERMAN) is None
    assert reason(LanguageID(languages=["en"], min_score=0.999999), "ok ok 12 34") == "lang:low_score" or \
        reason(LanguageID(languages=["en"], min_score=0.999999), "ok ok 12 34").startswith("lang:")


def test_pii_redaction_counts_and_placeholders():
    p = PIIRedaction(phone_regions=["US", "DE"])  # 030 1234 5678 is a German national number
    text = ("Mail john.doe@gmail.com or jane@corp.example.net, server 8.8.8.8 and 2001:4860:4860::8888, "
            "call +1 (415) 555-2671 or 030 1234 5678. Local 192.168.1.10 stays, version 3.11.4 stays, "
            "and 127.0.0.1 stays.")
    res = p([{"id": "a", "text": text, "order": 0}])
    out = res.kept[0]["text"]
    assert "john.doe" not in out and "jane@" not in out and "8.8.8.8" not in out and "4860" not in out
    assert "555-2671" not in out and "1234 5678" not in out
    assert "email@example.com" in out and "firstname.lastname@example.org" in out and "2001:db8::1" in out
    assert "192.168.1.10" in out and "3.11.4" in out and "127.0.0.1" in out
    assert res.counts == {"pii_email": 2, "pii_ip": 1, "pii_ipv6": 1, "pii_phone": 2, "pii_docs": 1}
    assert not res.removed  # redaction, never removal
    # placeholders restart per document: the same document redacts the same way anywhere
    assert PIIRedaction().redact("a@b.com x@y.org")[0] == p.redact("a@b.com x@y.org")[0]
    assert "192.168.1.10" not in PIIRedaction(public_ips_only=False).redact("at 192.168.1.10 now")[0]


# (text, region): numbers as each country writes them. region None: written with +, found by the
# default stage (and region-less, below); else the stage is given that region for national numbers.
PHONES = [
    ("+1 (415) 555-2671", None), ("(415) 555-2671", "US"), ("415.555.2671", "US"), ("1-800-555-0199", "US"),
    ("+44 20 7946 0958", None), ("020 7946 0958", "GB"), ("+44 (0)20 7946 0958", None),
    ("+49 30 901820", None), ("030 901820", "DE"), ("030/901820", "DE"), ("0049 30 901820", "DE"),
    ("+33 1 42 68 53 00", None), ("01 42 68 53 00", "FR"), ("01.42.68.53.00", "FR"), ("+33.1.42.68.53.00", None),
    ("+39 06 4991 1111", None), ("06 4991 1111", "IT"),
    ("+34 912 34 56 78", None), ("912-345-678", "ES"),
    ("+31 20 555 1234", None), ("(020) 555 1234", "NL"),
    ("+81 3-1234-5678", None), ("03-1234-5678", "JP"),
    ("+61 2 9876 5432", None), ("(02) 9876 5432", "AU"),
    ("+91 98765 43210", None), ("098765 43210", "IN"), ("98765-43210", "IN"),
    ("+55 11 91234-5678", None), ("(11) 91234-5678", "BR"),
    ("+41 44 668 18 00", None), ("044 668 18 00", "CH"),
    ("+7 (495) 123-45-67", None), ("+86 138 0013 8000", None), ("+82 2-312-3456", None), ("021 123 4567", "ZA"),
]


@pytest.mark.parametrize("number,region", PHONES)
def test_pii_phone_formats_by_country(number, region):
    stages = [PIIRedaction()] if region is None else [PIIRedaction(phone_regions=[region])]
    if region is None:
        stages.append(PIIRedaction(phone_regions=[]))  # region-less: + numbers only
    for st in stages:
        out, counts = st.redact(f"Call our office at {number} today, ask for Anna.")
        assert out == "Call our office at 555-0100 today, ask for Anna.", (number, out)
        assert counts == {"phone": 1}


LOOKALIKES = ["released 2024-01-15, due 15.01.2024 or 01/15/2024", "version 1.2.3, then v10.4.12 and 3.11.4",
              "see ISBN 978-3-16-148410-0 and ISBN 0-306-40615-2", "pi is 3.14159265358979, e is 2.718281828459045",
              "host 192.168.10.12 and 10.0.0.1, mask 255.255.255.0", "at 12:30:45 or 2024-01-15 12:30:45",
              "in 1999 we sold 12000 units, 1,234,567.89 dollars in all", "page 123-456 of 12 345 678",
              # digits inside larger numerals (0.333333333 is a valid German number, 2147483648 a US one)
              "x = 0.333333333, min -2147483648, sum 1000000.0050045159"]
ALL_REGIONS = sorted({r for _, r in PHONES if r})


@pytest.mark.parametrize("text", LOOKALIKES)
def test_pii_phone_lookalikes_are_left_alone(text):
    for st in (PIIRedaction(), PIIRedaction(phone_regions=ALL_REGIONS)):
        assert st.redact(text) == (text, {}), text
    # an IP address is never a phone number, also when IPs are not redacted or are redacted first
    for kinds in (["phone"], ["ip", "phone"]):
        out, counts = PIIRedaction(kinds=kinds, phone_regions=ALL_REGIONS).redact("hosts 93.184.216.34 and 203.0.113.195")
        assert "phone" not in counts and "555-01" not in out


def test_pii_phone_mixed_document_counts_and_placeholders():
    text = ("Write to anna.berg@example-mail.de, server 93.184.216.34; Berlin +49 30 901820, "
            "Paris +33 1 42 68 53 00.")
    res = PIIRedaction()([{"id": "a", "text": text, "order": 0}])
    assert res.kept[0]["text"] == ("Write to email@example.com, server 22.214.171.124; Berlin 555-0100, "
                                   "Paris 555-0101.")
    assert res.counts == {"pii_email": 1, "pii_ip": 1, "pii_ipv6": 0, "pii_phone": 2, "pii_docs": 1}


def test_toxicity_threshold(tmp_path):
    own = tmp_path / "words.txt"
    own.write_text("# my list\ngarden\nbad phrase\n")
    assert reason(Toxicity(words_file=str(own)), prose(1)) == "toxic"  # "garden" is on this list
    assert reason(Toxicity(words_file=str(own)), "A bad phrase here.") == "toxic"
    assert reason(Toxicity(words_file=str(own)), "What the fuck.") is None
    t = Toxicity()
    assert reason(t, prose(1)) is None
    assert reason(t, prose(1) + " What the fuck.") == "toxic"
    assert reason(Toxicity(threshold=0.02), prose(1) + " What the fuck.") is None
    assert reason(Toxicity(threshold=0.02), "shit " * 10 + prose(1)) == "toxic"


def test_minhash_jaccard_estimates():
    h = MinHasher(14, 8, 5, seed=1)
    a = prose(7, sentences=40)
    for every, lo, hi in ((50, 0.8, 1.0), (10, 0.25, 0.6), (4, 0.0, 0.2)):
        b = near_copy(a, every)
        true = jaccard(a, b)
        assert lo <= true <= hi, (every, true)
        est = jaccard_estimate(h.signature(a), h.signature(b))
        assert abs(est - true) < 0.12, (every, true, est)  # 112 permutations: sd ~0.045
    assert jaccard_estimate(h.signature(a), h.signature(prose(8, sentences=40))) < 0.05
    # deterministic: a fresh hasher with the same seed gives the same signature and bands
    assert np.array_equal(h.signature(a), MinHasher(14, 8, 5, seed=1).signature(a))
    assert len(h.band_keys(h.signature(a))) == 14 and h.band_keys(h.signature("")) == []


def test_dedup_keeps_earliest_and_ignores_order_of_arrival():
    assert content_hash("Hello,   World!") == content_hash("hello world")
    assert exact_duplicates([5, 2, 9], [b"a", b"a", b"b"]) == {5: 2}
    bands = np.array([[1, 10], [2, 10], [2, 30], [4, 40], [5, 41]], dtype=np.uint64)
    orders = [30, 10, 20, 50, 40]
    want = {30: 10, 20: 10}  # 30~10 via band 1, 10~20 via band 0: one component, 10 survives
    assert near_duplicates(orders, bands) == want
    perm = [4, 2, 0, 3, 1]
    assert near_duplicates([orders[i] for i in perm], bands[perm]) == want


def test_pipeline_first_reason_wins_and_counts_every_doc():
    cs = CurateSection()
    docs = [{"id": str(i), "text": t, "order": i} for i, t in enumerate([prose(1), GERMAN * 5, ENGLISH.split(". ")[0] + "."])]
    out, counts = DocPipeline(cs).run(docs)
    assert [d["reason"] for d in out] == ["", "lang:de", "gopher:min_doc_words"]
    assert len(out[0]["bands"]) == 14 and len(out[0]["content_hash"]) == 16


def test_bad_config_is_one_line():
    for kw, key in ((dict(stages=["unicode", "nope"]), "curate.stages"), (dict(c4={"nope": 1}), "curate.c4.nope"),
                    (dict(skip_rules=["c4:nope"]), "curate.skip_rules"), (dict(workers=0), "curate.workers"),
                    (dict(pii_kinds=["ssn"]), "curate.pii_kinds"), (dict(stages=["perplexity"]), "curate.perplexity_scorer"),
                    (dict(pii_phone_regions=["US", "XX"]), "curate.pii_phone_regions")):
        with pytest.raises(ConfigError, match=key) as e:
            check_curate_config(CurateSection(**kw))
        assert "\n" not in str(e.value)


def test_perplexity_hook():
    from elastic.data.curate.perplexity import Perplexity

    st = Perplexity(scorer=lambda texts: [float(len(t)) for t in texts], max_perplexity=10)
    res = st([{"id": "a", "text": "short", "order": 0}, {"id": "b", "text": "much longer text", "order": 1}])
    assert [d["id"] for d in res.kept] == ["a"] and res.removed[0][1] == "perplexity"


def test_large_files_split_into_blocks_with_whole_file_lines(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from elastic.data.curate.reader import InputFile, plan_blocks, read_block, read_file
    from elastic.data.documents import BadRows

    p = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"document number {i} " * (1 + i % 7)}) for i in range(500)]
    lines[321] = "{broken"
    p.write_text("\n".join(lines) + "\n")
    f = InputFile(0, str(p), "jsonl", "big.jsonl", p.stat().st_size)
    whole_bad, split_bad = BadRows(keep=10), BadRows(keep=10)
    whole = read_file(f, "text", "id", whole_bad)
    blocks = plan_blocks([f], 2000)
    assert len(blocks) > 5 and all(b.files[0].start < b.files[0].end for b in blocks)
    split = [d for b in blocks for d in read_block(b, "text", "id", split_bad)]
    assert split == whole and len(whole) == 499
    assert whole[0]["id"] == "big.jsonl:1" and whole[-1]["id"] == "big.jsonl:500"
    assert split_bad.examples == whole_bad.examples == ["bad_json at big.jsonl:322 (Expecting property name enclosed in double quotes)"]

    q = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": [f"row {i} text" for i in range(400)]}), q, row_group_size=50)
    g = InputFile(1, str(q), "parquet", "big.parquet", q.stat().st_size)
    pb = plan_blocks([g], 1)
    assert len(pb) == 8
    rows = [d for b in pb for d in read_block(b, "text", "id", BadRows())]
    assert rows == read_file(g, "text", "id", BadRows()) and rows[399]["id"] == "big.parquet:row399"
