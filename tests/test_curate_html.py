"""HTML pages and WARC archives as curation input (elastic/data/curate/reader.py, trafilatura and
warcio): one document per page / per HTML response record, its main text (navigation and
footer stripped), id = the file name or the record's WARC-Target-URI; a page with no text is
removed as "html:no_text"; a broken record is a bad row "<file>:record<n>"."""

from __future__ import annotations

import dataclasses
import io
import json
import os

import pytest

from elastic.config.schema import CurateSection
from tests.curate_helpers import prose

NAV = "Home About Products Contact Login Register"
FOOTER = "Copyright 2026 Example Corporation. All rights reserved. Privacy policy"


def page(body: str, title: str = "A page") -> str:
    paras = "".join(f"<p>{line}</p>" for line in body.split("\n"))
    links = "".join(f'<li><a href="/{w.lower()}">{w}</a></li>' for w in NAV.split())
    return (f"<html><head><title>{title}</title></head><body>"
            f"<header><nav><ul>{links}</ul></nav></header>"
            f"<main><article><h1>{title}</h1>{paras}</article></main>"
            f"<footer><p>{FOOTER}</p></footer></body></html>")


EMPTY = "<html><head><title>x</title></head><body><script>var x = 1;</script><img src='a.png'></body></html>"


def write_warc(path, records, corrupt_tail=False):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=str(path).endswith(".gz"))
        for uri, ctype, html in records:
            http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(uri, "response", payload=io.BytesIO(html.encode("utf-8")),
                                                http_headers=http))
        w.write_record(w.create_warc_record("urn:x", "metadata", payload=io.BytesIO(b"k: v"),
                                            warc_content_type="application/warc-fields"))
        if corrupt_tail:
            f.write(b"WARC/1.0\r\nWARC-Type: response\r\nContent-Length: 99999\r\n\r\nshort")


def test_extract_main_text():
    from elastic.data.curate.reader import extract_main_text

    body = prose(1)
    text = extract_main_text(page(body))
    assert "The " in text and body.split("\n")[0] in text
    assert "Products" not in text and "Copyright" not in text and "Register" not in text
    assert extract_main_text(EMPTY) == ""


def test_read_html_and_warc(tmp_path):
    from elastic.data.curate.reader import InputFile, read_file
    from elastic.data.documents import BadRows

    html = tmp_path / "a.html"
    html.write_text(page(prose(2)))
    bad = BadRows(keep=5)
    [d] = read_file(InputFile(0, str(html), "html", "a.html", html.stat().st_size), "text", "id", bad)
    assert d["id"] == "a.html" and "Copyright" not in d["text"] and "reason" not in d
    warc = tmp_path / "c.warc.gz"
    write_warc(warc, [("https://example.com/one", "text/html; charset=utf-8", page(prose(3))),
                      ("https://example.com/img", "image/png", "not a page"),
                      ("https://example.com/empty", "text/html", EMPTY),
                      ("https://example.com/two", "text/html", page(prose(4)))])
    docs = read_file(InputFile(1, str(warc), "warc", "c.warc.gz", warc.stat().st_size), "text", "id", bad)
    assert [d["id"] for d in docs] == ["https://example.com/one", "https://example.com/empty", "https://example.com/two"]
    assert [d.get("reason", "") for d in docs] == ["", "html:no_text", ""]
    assert prose(4).split("\n")[0] in docs[2]["text"] and "Copyright" not in docs[2]["text"]
    assert [d["order"] & 0xFFFFFFFF for d in docs] == [0, 2, 3] and bad.to_dict()["counts"] == {}


def test_job_on_html_and_warc(ray_local, tmp_path):
    import pyarrow.parquet as pq

    from elastic.launch.curate import read_curated, run_curation

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.html").write_text(page(prose(10)))
    (src / "b.htm").write_text(EMPTY)
    write_warc(src / "c.warc", [("https://example.com/one", "text/html", page(prose(11))),
                                ("https://example.com/empty", "text/html", EMPTY)], corrupt_tail=True)
    write_warc(src / "d.warc.gz", [("https://example.com/two", "text/html; charset=utf-8", page(prose(12)))])
    cs = dataclasses.replace(CurateSection(), source=str(src), output=str(tmp_path / "out"),
                             stages=["unicode", "langid", "gopher_quality", "exact_dedup"], workers=1)
    res = run_curation(cs, say=lambda s: None)
    out = read_curated(res.data_dir).to_pylist()
    assert [r["id"] for r in out] == ["a.html", "https://example.com/one", "https://example.com/two"]
    for r, seed in zip(out, (10, 11, 12)):
        assert prose(seed).split("\n")[0] in r["text"] and "Copyright" not in r["text"] and "Products" not in r["text"]
    rdir = os.path.join(res.output, "removed")
    removed = [r for p in sorted(os.listdir(rdir)) for r in pq.read_table(os.path.join(rdir, p)).to_pylist()]
    assert {r["id"]: r["reason"] for r in removed} == {"b.htm": "html:no_text", "https://example.com/empty": "html:no_text"}
    rep = json.loads(open(res.report_path).read())
    assert rep["docs_in"] == 5 and rep["docs_out"] == 3 and rep["removed_by_reason"] == {"html:no_text": 2}
    assert rep["bad_rows"]["counts"] == {"bad_warc_record": 1} and "c.warc:record3" in rep["bad_rows"]["examples"][0]
    assert rep["funnel"][1] == {"stage": "html", "removed": 2, "docs": 3} and rep["funnel"][-1]["docs"] == 3
