"""Signal rows, the uploaded row on every token, the overview and the jump keys of the episode
page, against the real server in headless Chromium: pixels read from the canvases where the
layout puts each token, clicks and key presses as a user makes them, waits on conditions."""

from __future__ import annotations

import pytest

from tests.browser.browser_util import shot, upload, url_has, wait_ready

pytestmark = pytest.mark.browser

KINDS = ["prompt"] * 2 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 3 + ["tool"] + ["policy"] * 2
T = len(KINDS)
#          p    p    P0    P1    P2    t    t    P3    P4   P5    t    P6    P7
LOGP = [0.0, 0.0, -0.5, -2.0, -1.0, 0.0, 0.0, -0.1, -1.0, 0.0, 0.0, -0.3, -0.4]
REF = [0.0, 0.0, -0.5, -2.0, -1.5, 0.0, 0.0, -0.1, -1.0, 0.5, 0.0, -0.3, -0.4]  # kl +0.5 at 4, −0.5 at 9
ROLL = [
    0.0,
    0.0,
    -0.5,
    -2.0,
    -1.0,
    0.0,
    0.0,
    -0.3,
    -1.0,
    0.0,
    0.0,
    -0.1,
    -0.4,
]  # log-ratio +0.2 at 7, −0.2 at 11
ENT = [0.0, 0.0, 0.5, 2.0, 0.3, 0.0, 0.0, 0.1, 1.0, 0.2, 0.0, 0.4, 0.6]
# The trainer's advantages: −0.5 on tool token 6 (a bug the uploaded row must outline).
ADV = [0.0, 0.0, 1.0, 0.5, -1.0, 0.0, -0.5, 0.2, 0.2, 0.2, 0.0, -0.3, 0.3]

ORANGE, PURPLE = [166, 54, 3], [84, 39, 143]
BROWN, TEAL = [140, 81, 10], [1, 102, 94]
MAGENTA, GREEN = [197, 27, 125], [77, 146, 33]
TOOL_GRAY, BLACK, BLUE = [150, 150, 150], [0, 0, 0], [33, 102, 172]


def _short() -> dict:
    return {
        "tokens": [f"w{i}" for i in range(T)],
        "kinds": KINDS,
        "reward": 1.0,
        "logprobs": LOGP,
        "ref_logprobs": REF,
        "rollout_logprobs": ROLL,
        "entropy": ENT,
        "advantages": ADV,
        "group": "s",
        "meta": {"task": "signal rows"},
    }


N_CALLS, POL, TOOL = 60, 24, 16
BIG = {37: 0.9, 12: -0.8}  # the calls with the largest |uploaded advantage|, in that order
NEG = (5, 20)  # calls where uploaded < 0 while returns > 0 (call 12 too): the sign disagreements


def _long() -> dict:
    kinds, adv = ["prompt"] * 10, [0.0] * 10
    for c in range(N_CALLS):
        a = BIG.get(c, -0.3 if c in NEG else 0.1 + 0.001 * c)
        kinds += ["policy"] * POL + ["tool"] * TOOL
        adv += [a] * POL + [0.0] * TOOL
    n = len(kinds)
    return {
        "tokens": [f"x{i % 97}" for i in range(n)],
        "kinds": kinds,
        "reward": 1.0,
        "advantages": adv,
        "group": "l",
        "meta": {"task": "long agent episode"},
    }


def _call_start(c: int) -> int:
    return 10 + c * (POL + TOOL)


@pytest.fixture(scope="module")
def slugs(server) -> dict:
    short = upload(server, "signal-rows", [_short()])["episodes"][0]["slug"]
    long = upload(server, "signal-long", [_long()])["episodes"][0]["slug"]
    return {"short": short, "long": long}


def px(page, i: int, row: int) -> list[int]:
    return page.evaluate(f"window.__strip.pixelAt({i}, {row})")[:3]


def test_signal_rows_draw_their_own_scales_and_the_uploaded_row_outlines_a_tool_token(page, slugs):
    page.goto(f"/e/{slugs['short']}?scheme=uploaded&signal=logprob,entropy,kl,ratio")
    wait_ready(page)
    names = page.evaluate("window.__strip.rows.map(r => r.name)")
    assert names == ["uploaded", "logprob", "entropy", "kl", "ratio"]
    # Every signal is on offer, the uploaded box is shown (the API says the episode has advantages).
    assert (
        page.evaluate(
            "[...document.querySelectorAll('input[name=signal]')].filter(b => !b.closest('label').hidden).length"
        )
        == 4
    )
    assert page.is_hidden("#no-signals")
    assert not page.evaluate("document.querySelector('input[value=uploaded]').closest('label').hidden")
    # Sequential rows: the largest surprise (logp −2 at token 3) and entropy (2.0 at token 3) are full colour.
    assert px(page, 3, 1) == ORANGE
    assert px(page, 3, 2) == PURPLE
    assert px(page, 8, 2) == [170, 147, 199]  # entropy 1.0 = half of 2.0
    # KL diverges around 0: +0.5 at token 4 brown, −0.5 at token 9 teal; 0 at token 2 white.
    assert px(page, 4, 3) == BROWN
    assert px(page, 9, 3) == TEAL
    assert px(page, 2, 3) == [255, 255, 255]
    # The ratio diverges around 1 on a log scale: e^0.2 magenta, e^−0.2 green.
    assert px(page, 7, 4) == MAGENTA
    assert px(page, 11, 4) == GREEN
    # Tool cells stay gray in the signal rows; in the uploaded row the collapsed span holding
    # tool token 6 (−0.5) is outlined in black, and says why in its panel.
    assert px(page, 5, 3) == TOOL_GRAY
    cell = page.evaluate("window.__strip.cellAt(6)")
    assert cell["type"] == "span" and cell["rows"][0]["outlined"] is True
    assert [r["outlined"] for r in cell["rows"][1:]] == [False] * 4
    assert px(page, 6, 0) == BLACK
    assert not page.evaluate("window.__strip.cellAt(2).rows[0].outlined")
    assert page.is_visible("#legend-off")
    box = cell["rows"][0]["rect"]
    page.mouse.move(box["x"] + box["w"] / 2, box["y"] + box["h"] / 2)
    panel = page.locator(".hover-panel")
    panel.wait_for(state="visible")
    assert "nonzero on 1 of these tokens" in panel.text_content()
    # Expanded, the tool token itself is outlined and its tooltip shows the value.
    page.mouse.click(box["x"] + box["w"] / 2, box["y"] + box["h"] / 2)
    page.wait_for_function("() => window.__strip.cellAt(6).type === 'tok'")
    assert page.evaluate("window.__strip.cellAt(6).rows[0].outlined") is True
    assert page.evaluate("window.__strip.cellAt(5).rows[0].outlined") is False  # 0 there
    assert px(page, 6, 0) == BLACK
    # The tooltip of a policy token lists every signal with its value.
    page.mouse.move(0, 0)  # the panel follows the pointer first, then the keyboard cursor
    page.focus(".strip-canvas")
    page.evaluate("window.__strip.setCursor(4)")
    text = panel.text_content()
    assert "KL (logp − ref)" in text and "0.500" in text and "ratio train/rollout" in text
    # The legend gives each signal row its own scale.
    assert (
        page.text_content('[data-signal="ratio"]')
        .replace("\u00a0", " ")
        .startswith("ratio train/rollout: 0.819")
    )
    shot(page, "signal-rows")
    assert not page.probe.errors and not page.probe.csp_violations()


def test_signal_rows_in_the_csv_export(page, slugs):
    page.goto(f"/e/{slugs['short']}?scheme=uploaded&signal=kl,ratio")
    wait_ready(page)
    with page.expect_download() as dl:
        page.click('[data-export="csv"]')
    lines = open(dl.value.path(), encoding="utf-8").read().splitlines()
    head = lines[0].split(",")
    assert head[-3:] == ["uploaded", "kl", "ratio"]
    row4 = lines[1 + 4].split(",")
    assert float(row4[-2]) == pytest.approx(0.5) and float(row4[-1]) == pytest.approx(1.0)
    row6 = lines[1 + 6].split(",")  # a tool token: the uploaded value is exported, no signals
    assert float(row6[-3]) == -0.5 and row6[-2:] == ["", ""]


def test_signal_boxes_hidden_without_the_data(page, slugs):
    page.goto(f"/e/{slugs['long']}?scheme=uploaded&signal=kl")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["uploaded"]
    assert page.evaluate(
        "[...document.querySelectorAll('input[name=signal]')].every(b => b.closest('label').hidden)"
    )
    assert page.is_visible("#no-signals") or page.evaluate("!document.getElementById('no-signals').hidden")


def test_overview_one_column_per_call_and_a_click_scrolls_the_strips(page, slugs):
    page.goto(f"/e/{slugs['long']}?scheme=uploaded,returns")
    wait_ready(page)
    segs = page.evaluate("window.__overview.segs.map(s => s.target)")
    assert segs == [_call_start(c) for c in range(N_CALLS)]
    # Shared scale: returns are 1 everywhere (full blue in lane 1); call 37's uploaded 0.9 is
    # 90 % of the way from white to blue in lane 0.
    assert page.evaluate("window.__overview.pixelAt(37, 0)")[:3] == [55, 117, 180]
    assert page.evaluate("window.__overview.pixelAt(3, 1)")[:3] == BLUE
    assert page.evaluate("window.__strip.scroller.scrollTop") == 0
    pt = page.evaluate("window.__overview.pointOf(45)")
    page.mouse.click(pt["x"], pt["y"])
    target = _call_start(45)
    page.wait_for_function(f"() => window.__strip.cursor === {target}")
    url_has(page, f"tok={target}")
    seen = page.evaluate(
        f"""() => {{ const s = window.__strip, L = s.items[s.itemOf[{target}]].line;
             return [L * s.blockH, s.scroller.scrollTop, s.scroller.clientHeight]; }}"""
    )
    y, top, h = seen
    assert top > 0 and top <= y < top + h
    # The overview frames what the strips show.
    page.wait_for_function(
        f"() => window.__overview.view && window.__overview.view[0] <= {target} && {target} < window.__overview.view[1]"
    )
    shot(page, "overview-long")
    assert not page.probe.errors


def test_keys_jump_by_largest_advantage_and_to_sign_disagreements(page, slugs):
    page.goto(f"/e/{slugs['long']}?scheme=uploaded,returns")
    wait_ready(page)
    cursor = "() => window.__strip.cursor"

    def press(key: str, expect: int) -> None:
        page.keyboard.press(key)
        page.wait_for_function(f"() => window.__strip.cursor === {expect}")

    press("n", _call_start(37))  # |0.9|
    press("n", _call_start(12))  # |−0.8|
    press("Shift+N", _call_start(37))
    assert "call 37" in page.text_content("#overview-status")
    # Sign disagreements (uploaded < 0 < returns): the starts of calls 5, 12 and 20, wrapping around.
    page.evaluate("window.__strip.setCursor(0)")
    press("d", _call_start(5))
    press("d", _call_start(12))
    press("d", _call_start(20))
    press("d", _call_start(5))
    press("Shift+D", _call_start(20))
    assert page.evaluate(cursor) == _call_start(20)
    url_has(page, f"tok={_call_start(20)}")
    # Typing in a field does not jump.
    page.focus("#gamma-num")
    page.keyboard.press("n")
    assert page.evaluate(cursor) == _call_start(20)
    assert not page.probe.errors


def test_ticking_a_signal_adds_its_row_and_writes_the_url(page, slugs):
    page.goto(f"/e/{slugs['short']}?scheme=uploaded")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["uploaded"]
    page.click("#schemes-box > summary")
    page.check('input[name="signal"][value="ratio"]')
    page.check('input[name="signal"][value="kl"]')
    page.wait_for_function("() => window.__strip.rows.map(r => r.name).join() === 'uploaded,ratio,kl'")
    assert page.url.endswith("&signal=ratio,kl")
    assert page.text_content("#n-rows") == "3"
    # The link reopens the same rows.
    page.goto(page.url)
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["uploaded", "ratio", "kl"]
