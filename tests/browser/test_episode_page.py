"""Episode page in a real browser: upload from the form -> episode -> change λ -> copy link ->
the link reopens the same view; colours; tool spans; keyboard; XSS; a 32k-token episode."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import ROOT, shot, upload, url_has, wait_ready

pytestmark = pytest.mark.browser

# The hand-built row, λ = 0, γ = 1: token-level GAE is the masked TD error
# δ_i = r_i + V(next policy position) − V_i (V = 0 after the end), with
# V = [0.5, 0.4, ·, ·, ·, 0.6, 0.7, ·, ·, 0.8] and r = [0, −0.1, ·, ·, ·, 0, −0.1, ·, ·, −0.1 + 1]:
TD_HANDBUILT = {
    0: 0.0 + 0.4 - 0.5,  # −0.1: the negative token
    1: -0.1 + 0.6 - 0.4,  # 0.1: bootstraps from position 5, not the 9 at position 2
    5: 0.0 + 0.7 - 0.6,  # 0.1
    6: -0.1 + 0.8 - 0.7,  # 0.0
    9: 0.9 - 0.8,  # 0.1
}


def strip_numbers(page) -> dict:
    """Every shown row's advantages as the page holds them."""
    return page.evaluate(
        "() => ({rows: window.__strip.rows.map(r => [r.name, r.advantages]),"
        " query: document.getElementById('strip').dataset.query})"
    )


def test_upload_form_to_episode_change_lambda_copy_link_reopens_same_view(page, tmp_path):
    # A group of two attempts so the outcome row has something to compare.
    second = {**data.handbuilt(), "reward": 0.0}
    f = tmp_path / "two attempts.jsonl"
    f.write_text(data.jsonl([{**data.handbuilt(), "group": "g"}, {**second, "group": "g"}]))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.fill("#up-name", "flow")
    page.click("#upload-btn")
    page.wait_for_selector(".file-item.good a.episode-link")
    assert page.text_content(".file-item .fname") == "two attempts.jsonl"
    shot(page, "home-after-upload")

    page.click(".file-item.good a.episode-link >> nth=0")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["outcome", "token_gae", "turn_gae"]
    # RLOO with G = 2: A = r_i − r_other. Scores: 1 − 0.3 = 0.7 and 0 − 0.3 = −0.3 -> +1.0.
    assert page.evaluate("window.__strip.cellAt(1).rows[0].value") == pytest.approx(1.0, abs=1e-6)

    page.fill("#lam-num", "0")
    page.dispatch_event("#lam-num", "change")
    page.wait_for_function("() => document.getElementById('strip').dataset.query.includes('lam=0&')")
    wait_ready(page)
    assert "lam=0&" in page.url
    assert page.input_value("#lam-range") == "0"
    for i, want in TD_HANDBUILT.items():
        got = page.evaluate(f"window.__strip.cellAt({i}).rows[1].value")
        assert got == pytest.approx(want, abs=1e-6), i
    # The hover panel shows the numbers for the token under the pointer.
    cell = page.evaluate("window.__strip.cellAt(1)")
    page.mouse.move(cell["x"] + 4, cell["y"] + 4)
    panel = page.locator(".hover-panel")
    panel.wait_for(state="visible")
    text = panel.text_content()
    assert '"</call>"' in text and "TD error" in text and "0.100" in text
    shot(page, "episode-lam0-hover")
    before = strip_numbers(page)

    page.click("#copy-link")
    page.wait_for_function("() => document.getElementById('copy-status').textContent.length > 0")
    link = page.input_value("#link-field")
    assert link == page.url
    assert page.evaluate("navigator.clipboard.readText()") == link

    other = page.context.new_page()
    other.goto(link)
    wait_ready(other)
    assert other.input_value("#lam-num") == "0"
    assert other.input_value("#gamma-num") == "1"
    assert other.input_value("#baseline") == "rloo"
    assert strip_numbers(other) == before
    shot(other, "episode-reopened-link")
    assert not page.probe.errors and not page.probe.csp_violations()


@pytest.fixture(scope="module")
def handbuilt_slug(server) -> str:
    return upload(server, "handbuilt-colours", [data.handbuilt()])["episodes"][0]["slug"]


def test_colour_of_known_positive_and_negative_tokens(page, handbuilt_slug):
    page.goto(f"/e/{handbuilt_slug}?scheme=token_gae&lam=0")
    wait_ready(page)
    # Shared scale = max |adv| = 0.1, so ±0.1 are full blue / full red, 0 is white.
    assert page.text_content("#legend-max") == "+0.100"
    pos = page.evaluate("window.__strip.pixelAt(1, 0)")
    neg = page.evaluate("window.__strip.pixelAt(0, 0)")
    zero = page.evaluate("window.__strip.pixelAt(6, 0)")
    assert pos[:3] == pytest.approx([33, 102, 172], abs=3)
    assert neg[:3] == pytest.approx([178, 24, 43], abs=3)
    assert zero[:3] == pytest.approx([255, 255, 255], abs=3)
    shot(page, "episode-colours")


def test_tool_cells_gray_collapsed_and_expand_on_click(page, handbuilt_slug):
    page.goto(f"/e/{handbuilt_slug}?scheme=token_gae&lam=0")
    wait_ready(page)
    cell = page.evaluate("window.__strip.cellAt(3)")
    assert cell["type"] == "span" and (cell["start"], cell["end"]) == (2, 5)
    assert "tool: 3 tokens" in cell["text"]
    assert page.evaluate("window.__strip.pixelAt(3, 0)")[:3] == [150, 150, 150]
    # Both tool spans are one cell each: 5 policy cells + 2 tool cells.
    assert page.evaluate("window.__strip.items.length") == 7

    page.mouse.click(cell["x"] + 5, cell["y"] + 5)
    page.wait_for_function("() => window.__strip.cellAt(3).type === 'tok'")
    url_has(page, "open=2")
    assert page.evaluate("window.__strip.items.length") == 9  # 5 policy + 3 tool + 1 span
    assert page.evaluate("window.__strip.pixelAt(3, 0)")[:3] == [150, 150, 150]
    shot(page, "episode-tool-expanded")

    # The expanded state is in the URL: reopening shows it expanded; clicking a tool token collapses.
    page.goto(page.url)
    wait_ready(page)
    assert page.evaluate("window.__strip.cellAt(4).type") == "tok"
    c4 = page.evaluate("window.__strip.cellAt(4)")
    page.mouse.click(c4["x"] + 3, c4["y"] + 5)
    page.wait_for_function("() => window.__strip.cellAt(4).type === 'span'")
    assert "open=" not in page.url


def test_keyboard_cursor_moves_and_shows_panel(page, handbuilt_slug):
    page.goto(f"/e/{handbuilt_slug}?scheme=returns,token_gae&lam=1")
    wait_ready(page)
    page.focus(".strip-canvas")
    page.keyboard.press("ArrowRight")
    url_has(page, "tok=0")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # the collapsed span counts as one step
    page.keyboard.press("ArrowRight")
    url_has(page, "tok=5")
    panel = page.locator(".hover-panel")
    assert panel.is_visible()
    # Returns-to-go at position 5 with γ = 1: −0.1 + 0.9 = 0.8.
    assert '"edit"' in panel.text_content() and "0.800" in panel.text_content()
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("Enter")  # expands the span under the cursor
    page.wait_for_function("() => window.__strip.items.length === 9")
    shot(page, "episode-keyboard")


def test_xss_tokens_are_text_and_never_run(page, tmp_path):
    f = tmp_path / "x<img src=x onerror=alert(3)>.jsonl"
    f.write_text(data.jsonl([data.xss_episode()]))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.click("#upload-btn")
    page.wait_for_selector(".file-item.good a.episode-link")
    assert page.text_content(".file-item .fname") == f.name
    page.click(".file-item.good a.episode-link")
    wait_ready(page)
    assert page.text_content("#ep-task") == "<b>bold</b><script>alert(2)</script>"
    for i, tok in [(2, "<script>alert(1)</script>"), (3, '"onmouseover=alert(1)')]:
        cell = page.evaluate(f"window.__strip.cellAt({i})")
        page.mouse.move(cell["x"] + 5, cell["y"] + 5)
        # The panel updates on mousemove; wait for this token's text rather than a fixed time.
        page.wait_for_function(
            "t => (document.querySelector('.hover-panel')?.textContent || '').includes(t)",
            arg=json.dumps(tok),
        )
        assert json.dumps(tok) in page.text_content(".hover-panel")
    assert "<script>alert(1)</script>" in page.text_content("#calls")
    # Only our own module scripts exist, nothing from the data became an element or ran.
    assert page.evaluate("document.querySelectorAll('img, b').length") == 0
    assert (
        page.evaluate(
            "[...document.scripts].filter(s => s.src === '' && s.type !== 'application/json').length"
        )
        == 0
    )
    shot(page, "episode-xss")
    assert page.probe.dialogs == []
    assert not page.probe.errors


def test_32k_token_episode_opens_and_scrolls_with_the_wheel(page, server):
    # How fast it opens is measured by `make bench` (bench/page.py), not asserted here.
    slug = upload(server, "long", [data.long_episode(32_768)])["episodes"][0]["slug"]
    page.goto(f"/e/{slug}")
    wait_ready(page, timeout=30_000)
    assert page.evaluate("window.__strip.data.n_tokens") == 32_768
    # Virtualised: the canvas is one viewport tall, not the whole strip.
    sizes = page.evaluate(
        "({canvas: window.__strip.canvas.clientHeight, total: window.__strip.sizer.clientHeight,"
        " nodes: document.getElementsByTagName('*').length})"
    )
    assert sizes["total"] > 20 * sizes["canvas"]
    assert sizes["nodes"] < 2000  # no per-token DOM
    # The user's path: the mouse wheel over the strip, down to the end.
    box = page.evaluate("window.__strip.canvas.getBoundingClientRect().toJSON()")
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    at_end = (
        "() => { const s = window.__strip.scroller;"
        " return s.scrollTop > 0 && s.scrollTop + s.clientHeight >= s.scrollHeight - 1; }"
    )
    for _ in range(200):
        page.mouse.wheel(0, sizes["total"])
        if page.evaluate(at_end):
            break
    page.wait_for_function(at_end)
    # ...and the canvas was redrawn at the new scroll position (draw() moves it there).
    page.wait_for_function(
        "() => window.__strip.canvas.style.top === window.__strip.scroller.scrollTop + 'px'"
    )
    scrolled = page.evaluate("window.__strip.scroller.scrollTop")
    # cellAt/pixelAt scroll to the token when it is off screen; the wheel must have brought the
    # last token into view already, so the scroll position must not move.
    last = page.evaluate("window.__strip.cellAt(32767)")
    assert page.evaluate("window.__strip.scroller.scrollTop") == scrolled
    box = page.evaluate("window.__strip.canvas.getBoundingClientRect().toJSON()")
    assert box["top"] <= last["y"] <= box["bottom"]
    assert page.evaluate("window.__strip.pixelAt(32767, 0)")[:3] != [255, 255, 255]
    assert page.evaluate("window.__strip.scroller.scrollTop") == scrolled
    shot(page, "episode-32k")


def test_exports_png_svg_csv_json(page, server):
    import csv
    import io
    import xml.etree.ElementTree as ET

    slug = upload(server, "exports", [data.xss_episode()])["episodes"][0]["slug"]
    page.goto(f"/e/{slug}?scheme=returns,token_gae&lam=0")
    wait_ready(page)
    api = httpx.get(f"{server}/api/episodes/{slug}/advantages?scheme=returns,token_gae&lam=0").json()
    files = {}
    for kind in ("png", "svg", "csv", "json"):
        with page.expect_download() as dl:
            page.click(f'button[data-export="{kind}"]')
        files[kind] = open(dl.value.path(), "rb").read()
        assert dl.value.suggested_filename == f"creditlens-{slug}-lam0.{kind}"
    assert files["png"][:8] == b"\x89PNG\r\n\x1a\n"
    svg = files["svg"].decode()
    root = ET.fromstring(svg)  # well-formed XML: token text was escaped
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "<script>alert…" in texts  # display text, clipped to 14 characters
    assert "<script" not in svg.replace("&lt;script", "")
    rows = list(csv.DictReader(io.StringIO(files["csv"].decode())))
    assert [r["token"] for r in rows] == api["tokens"]
    assert [r["kind"] for r in rows] == api["kinds"]
    gae = api["schemes"][1]["advantages"]
    assert [float(r["token_gae"]) if r["token_gae"] else None for r in rows] == gae
    body = json.loads(files["json"])
    assert body["data"] == api and body["view"]["lam"] == 0


def test_per_call_chart_loads_plotly_only_on_demand(page, handbuilt_slug):
    page.goto(f"/e/{handbuilt_slug}?scheme=returns&gamma=1")
    wait_ready(page)
    assert page.evaluate("typeof window.Plotly") == "undefined"
    page.click("#calls-chart-box summary")
    page.wait_for_selector('#calls-chart[data-ready="1"]')
    # Returns-to-go per call with γ = 1 (the hand-built row): call 1 = 0.7 on both tokens, call 2 = 0.8, call 3 = 0.9.
    ys = page.evaluate("document.getElementById('calls-chart').data[0].y")
    assert ys == pytest.approx([0.7, 0.8, 0.9])
    assert not page.probe.csp_violations()
    assert "chart=1" in page.url
    shot(page, "episode-calls-chart")
    page.goto(page.url)  # the open chart is part of the shared view
    page.wait_for_selector('#calls-chart[data-ready="1"]')


@pytest.fixture(scope="module")
def demo_bugfix_slugs(server) -> list[str]:
    """The committed sampled BugFix demo batch (fixtures/demo/bugfix.jsonl), uploaded for real."""
    raw = (ROOT / "fixtures" / "demo" / "bugfix.jsonl").read_bytes()
    # Its own name: the shared server's home-search test expects exactly one batch named "bugfix".
    r = httpx.post(f"{server}/api/uploads", files={"file": ("gigpo-demo.jsonl", raw)}, timeout=120)
    assert r.status_code == 201, r.text
    return [e["slug"] for e in r.json()["episodes"]]


def test_gigpo_row_tooltip_shows_the_step_group_size(page, server, demo_bugfix_slugs):
    """The sampled BugFix batch has repeated states: a GiGPO row whose tooltip names the size of
    the token's step group, the number the API computed for that token."""
    for slug in demo_bugfix_slugs[1::3]:
        body = httpx.get(
            f"{server}/api/episodes/{slug}/advantages", params={"scheme": "gigpo"}, timeout=60
        ).json()
        sizes = body["schemes"][0]["extras"]["step_group_size"]
        # A later turn (not the shared prompt) whose tool output other attempts also saw.
        hits = [i for i, s in enumerate(sizes) if s is not None and s > 1 and body["turn_ids"][i] > 0]
        if hits:
            break
    i = hits[0]
    page.goto(f"/e/{slug}?scheme=gigpo,turn_loo,monte_carlo")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["gigpo", "turn_loo", "monte_carlo"]
    # The BugFix episodes carry meta.turn_values, so the Monte Carlo row is offered.
    hidden = "document.querySelector('input[name=scheme][value=monte_carlo]').closest('label').hidden"
    assert page.evaluate(hidden) is False
    cell = page.evaluate(f"window.__strip.cellAt({i})")
    page.mouse.move(cell["x"] + 3, cell["y"] + 3)
    page.wait_for_function(
        "t => (document.querySelector('.hover-panel')?.textContent || '').includes(t)", arg="step group size"
    )
    rows = page.evaluate(
        "() => [...document.querySelectorAll('.hover-panel tr.hp-extra')].map(tr => [tr.cells[0].textContent, tr.cells[1].textContent])"
    )
    assert ["step group size", str(int(sizes[i]))] in rows
    shot(page, "episode-gigpo-step-group")
    assert not page.probe.errors and not page.probe.csp_violations()
