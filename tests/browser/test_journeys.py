"""A first-time user's journeys through the pages, with real clicks on a server started with the
demo data (two 40-step runs from the simulator, one with a tool-token credit bug on steps 18-23,
app/sim/demo_runs.py): the user's own numbers first, "Rows shown" with a mouse and a keyboard,
the bug followed from the run page to the token, the home page, ranking, the tokenizer upload,
narrow and dark screens, and comparing runs by name."""

from __future__ import annotations

import re

import httpx
import pytest

from app.sim import demo_runs
from tests.browser import browser_data as data
from tests.browser.browser_util import ROOT, shot, wait_ready
from tests.live_server import Server
from tests.page_probe import PageProbe

pytestmark = pytest.mark.browser

BUGGY = demo_runs.RUNS[1].name
CLEAN = demo_runs.RUNS[0].name


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """A real server on a fresh database with the demo data: {base, runs: name -> id}."""
    tmp = tmp_path_factory.mktemp("demo")
    with Server(tmp / "demo.db", tmp / "server.log", CREDITLENS_DEMO="1") as srv:
        runs = httpx.get(f"{srv.base}/api/runs", timeout=60).json()
        yield {"base": srv.base, "runs": {r["name"]: r["id"] for r in runs}}


@pytest.fixture
def dpage(browser, demo):
    """A fresh 1400 × 900 page on the demo server, with a probe at ``page.probe``."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=demo["base"])
    ctx.set_default_timeout(60_000)
    pg = ctx.new_page()
    pg.probe = PageProbe(pg)
    failed: list[str] = []
    pg.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    pg.failed = failed
    yield pg
    ctx.close()


def settled(page) -> None:
    """Wait until the strips show what the URL says (a control's change is debounced)."""
    page.wait_for_function(
        "() => { const s = document.getElementById('strip');"
        " return s.dataset.ready === '1' && s.dataset.query === location.search.slice(1); }"
    )


def flagged_episode_from_run_search(page, run_id: int) -> None:
    """The run page's episode search, filtered to credit off the policy tokens; "open" on the first."""
    page.goto(f"/r/{run_id}?nonpolicy_abs_adv_share__gt=0#run-episodes")
    page.wait_for_selector('#episodes[data-ready="1"]')
    page.locator("#episodes tbody tr").first.get_by_role("link", name="open").click()
    wait_ready(page)


def test_a_flagged_episode_opens_on_the_uploaded_row_and_the_token_that_was_flagged(dpage, demo):
    flagged_episode_from_run_search(dpage, demo["runs"][BUGGY])
    # What the user brought first, then the audit's reference and where the two differ.
    assert dpage.evaluate("window.__strip.rows.map(r => r.name)") == [
        "uploaded",
        "audit_reference",
        "audit_diff",
    ]
    # The cursor is on the first token the warning names: a tool token, its span opened.
    tok = dpage.evaluate("window.__strip.cursor")
    cell = dpage.evaluate(f"window.__strip.cellAt({tok})")
    assert cell["type"] == "tok" and dpage.evaluate(f"window.__strip.data.kinds[{tok}]") == "tool"
    assert cell["mark"] == "warning" and "credit_on_non_policy_tokens" in cell["findings"]
    status = dpage.text_content("#overview-status")
    assert "credit_on_non_policy_tokens" in status and "warning" in status
    assert f"tok={tok}" in dpage.url
    # The controls that change none of these rows say so.
    assert dpage.text_content("#baseline-note") == "applies to the outcome row (not shown)"
    assert dpage.text_content("#critic-note") == "no row shown reads the critic"
    assert dpage.text_content("#gamma-note") == "applies to no row shown"
    assert dpage.probe.errors == [] and dpage.failed == []


def test_rows_shown_works_with_a_mouse_a_keyboard_and_a_screen_reader(dpage, demo):
    flagged_episode_from_run_search(dpage, demo["runs"][BUGGY])
    dpage.get_by_text("Rows shown").click()
    # Grouped, each group a named fieldset with its one-line explanation.
    for group in ("The trainer's", "Audit", "Outcome", "Token", "Turn", "Signals"):
        assert dpage.get_by_role("group", name=group, exact=True).is_visible()
    # The boxes that sat under another fieldset take a real mouse click (Playwright refuses a click
    # that another element would receive).
    for name in ("returns", "td", "uploaded", "audit_diff", "turn_gae", "grpo"):
        box = dpage.locator(f'input[name="scheme"][value="{name}"]')
        before = box.is_checked()
        box.click()
        assert box.is_checked() is not before, name
        settled(dpage)
    rows = dpage.evaluate("window.__strip.rows.map(r => r.name)")
    assert rows == ["audit_reference", "returns", "td", "turn_gae", "grpo"]
    # The trainers' own estimators: collapsed, opened with a click, one ticked; ':' stays in the URL.
    dialects = dpage.locator("#rows-trainer-dialects")
    assert dialects.get_attribute("open") is None
    dialects.locator("summary").click()
    first = dialects.locator('input[name="scheme"]').first
    name = first.get_attribute("value")
    first.click()
    settled(dpage)
    assert f",{name}&" in dpage.url and ":" in name
    # Keyboard: Tab from one box reaches the next, Space ticks it.
    dpage.locator('input[name="scheme"][value="returns"]').focus()
    dpage.keyboard.press("Tab")
    assert dpage.evaluate("document.activeElement.value") == "td"
    dpage.keyboard.press("Space")
    settled(dpage)
    assert "td" not in dpage.evaluate("window.__strip.rows.map(r => r.name)")
    # A screen reader reads each box by its label.
    assert dpage.get_by_role("checkbox", name=re.compile(r"^returns-to-go returns$")).is_checked()
    shot(dpage, "journey-rows-shown")
    assert dpage.probe.errors == [] and dpage.probe.csp_violations() == []


def test_an_upload_with_advantages_opens_on_them(page, server):
    ep = {
        **data.handbuilt(),
        "advantages": [0.7 if k == "policy" else 0.0 for k in data.handbuilt()["kinds"]],
    }
    slug = httpx.post(
        f"{server}/api/uploads",
        files={"file": ("adv.jsonl", data.jsonl([ep]), "application/x-ndjson")},
        timeout=60,
    ).json()["episodes"][0]["slug"]
    page.goto(f"/e/{slug}")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)")[0] == "uploaded"
    assert page.evaluate("window.__strip.cellAt(0).rows[0].value") == pytest.approx(0.7)
    # Without advantages: the reference rows, as before.
    plain = httpx.post(
        f"{server}/api/uploads",
        files={"file": ("plain.jsonl", data.jsonl([data.handbuilt()]), "application/x-ndjson")},
        timeout=60,
    ).json()["episodes"][0]["slug"]
    page.goto(f"/e/{plain}")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["outcome", "token_gae", "turn_gae"]


def test_the_demo_bug_from_the_run_page_to_the_token_with_one_meaning_of_severity(dpage, demo):
    page = dpage
    page.goto(f"/r/{demo['runs'][BUGGY]}")
    page.wait_for_selector('#timeline[data-drawn="all"]')
    # The audit figure counts findings by severity: a warning on each bug step, no error.
    audit = page.evaluate(
        "document.getElementById('fig-audit').data.map(t => ({name: t.name, x: t.x, y: t.y}))"
    )
    series = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in audit}
    bug = set(demo_runs.BUG_STEPS)
    assert series["warning findings"] == {s: int(s in bug) for s in range(demo_runs.STEPS)}
    assert set(series["error findings"].values()) == {0}
    # The steps table says the same, with the share of |A| off the policy tokens beside it.
    head = page.locator("#steps thead th").all_text_contents()
    assert "audit findings" in head and "share of |A| off policy" in head
    row = page.locator("#steps tbody tr").filter(
        has=page.locator("td:first-child", has_text=re.compile(r"^18$"))
    )
    cells = row.locator("td").all_text_contents()
    assert cells[head.index("audit findings")] == "1 warning"
    assert cells[head.index("share of |A| off policy")] != "0%"
    clean = page.locator("#steps tbody tr").filter(
        has=page.locator("td:first-child", has_text=re.compile(r"^30$"))
    )
    assert clean.locator("td").all_text_contents()[head.index("audit findings")] == "0"
    # The step's batch page: the finding is a headline card on the first screen.
    row.get_by_role("link").click()
    page.wait_for_selector('#audit-box[data-ready="1"]')
    card = page.locator("#audit-card")
    assert card.locator(".big").text_content() == "1 warning"
    assert "credit_on_non_policy_tokens" in card.text_content()
    assert card.bounding_box()["y"] + card.bounding_box()["height"] < 900
    assert page.locator("#audit-findings tbody tr").first.get_attribute("data-severity") == "warning"
    # Its words fit the best match (GRPO, one number per episode), not verl's GAE.
    assert page.text_content("#audit-best").startswith("Best match: grpo")
    message = page.locator("#audit-findings tbody tr").first.locator("td").nth(2).text_content()
    assert "verl's GAE" not in message and "spread over every response token" in message
    # The finding opens the episode on its first token; the page calls it a warning too.
    page.locator("a.finding-link").first.click()
    wait_ready(page)
    tok = page.evaluate("window.__strip.cursor")
    assert page.evaluate(f"window.__strip.data.kinds[{tok}]") == "tool"
    assert page.evaluate(f"window.__strip.cellAt({tok}).mark") == "warning"
    assert "bug" not in page.text_content("#legend-off")
    cell = page.evaluate(f"window.__strip.cellAt({tok})")
    page.mouse.move(cell["x"] + 3, cell["y"] + 3)
    panel = page.locator(".hover-panel")
    panel.wait_for(state="visible")
    assert panel.locator(".hp-finding.sev-error").count() == 0
    assert panel.locator(".hp-finding.sev-warning").count() >= 1
    shot(page, "journey-demo-bug-token")
    assert page.probe.errors == [] and page.failed == []


def test_the_home_page_starts_with_the_runs_and_where_to_start(dpage, demo):
    page = dpage
    page.goto("/")
    page.wait_for_selector('#runs-table[data-ready="1"]')
    page.wait_for_selector("body[data-ready='1']")
    # Training runs first, then the uploads; both on the first screen of a laptop.
    runs_y = page.locator("#runs-h").bounding_box()["y"]
    uploads_y = page.locator("#batches-h").bounding_box()["y"]
    assert runs_y < uploads_y < 900
    rows = page.locator("#runs-table tbody tr")
    assert rows.count() == 2
    names = [rows.nth(i).locator("td").first.text_content() for i in range(2)]
    assert sorted(names) == sorted([BUGGY, CLEAN])
    bug_row = rows.filter(has_text=BUGGY)
    cells = bug_row.locator("td").all_text_contents()
    assert cells[1] == str(demo_runs.STEPS) and cells[2] == str(demo_runs.STEPS - 1)
    assert cells[5] == str(demo["runs"][BUGGY])  # its id
    # Sparklines: one point per step; the buggy run's |A| off policy rises only on its bug steps.
    spark = bug_row.locator('td.spark[data-metric="nonpolicy_advantage_share"] polyline')
    points = spark.get_attribute("points").split()
    assert len(points) == demo_runs.STEPS
    ys = [float(p.split(",")[1]) for p in points]
    low = max(ys)  # the baseline (0) is drawn lowest, at the largest y
    assert [s for s, y in enumerate(ys) if y < low] == list(demo_runs.BUG_STEPS)
    # Run steps are not in the batch list; the "run steps" choice lists them.
    batches = page.locator("#batches tbody tr td:first-child").all_text_contents()
    assert batches and not any(" step " in b for b in batches)
    page.select_option("#source", "steps")
    page.wait_for_function("() => /^\\d+ batch/.test(document.getElementById('batches-status').textContent)")
    steps = page.locator("#batches tbody tr td:first-child").all_text_contents()
    assert len(steps) == 2 * demo_runs.STEPS and all(" step " in b for b in steps)
    assert "source=steps" in page.url
    # Start here: the demo run with the bug is one click away; "Hide this" is remembered.
    page.get_by_role("link", name="demo run with a credit bug").click()
    page.wait_for_url(f"**/r/{demo['runs'][BUGGY]}")
    page.go_back()
    page.get_by_role("button", name="Hide this").click()
    assert page.locator("#start-here").is_hidden()
    page.reload()
    page.wait_for_selector('#runs-table[data-ready="1"]')
    assert page.locator("#start-here").is_hidden()
    assert page.probe.errors == [] and page.failed == []


def _with_advantages(ep: dict, values: dict[int, float], base: float = 0.1) -> dict:
    """``ep`` with the trainer's advantages: ``base`` on its policy tokens, ``values`` at positions."""
    adv = [base if k == "policy" else 0.0 for k in ep["kinds"]]
    for i, v in values.items():
        adv[i] = v
    return {**ep, "advantages": adv}


def test_the_most_credited_token_from_the_batch_table(page, server):
    # Three attempts of the hand-built row (policy tokens 0, 1, 5, 6, 9); the second gives its
    # token 5 ("edit") an advantage of -1.5, the largest |A| of the batch (a negative one).
    eps = [
        _with_advantages({**data.handbuilt(), "group": "g"}, {9: 0.9}),
        _with_advantages({**data.handbuilt(), "group": "g"}, {5: -1.5, 6: 1.2}),
        _with_advantages(
            {**data.handbuilt(), "group": "g", "tokens": [*data.handbuilt()["tokens"][:9], "x"]}, {0: 0.3}
        ),
    ]
    body = httpx.post(
        f"{server}/api/uploads",
        files={"file": ("ranked.jsonl", data.jsonl(eps), "application/x-ndjson")},
        data={"name": "ranked"},
        timeout=60,
    ).json()
    slugs = [e["slug"] for e in body["episodes"]]
    page.goto(f"/b/{body['batch_id']}")
    page.wait_for_selector("body[data-ready='1']")
    # Sorted by max |A| by default: the second upload first, its largest |A| 1.5.
    first = page.locator("#episodes tbody tr").first
    assert first.locator("td").first.text_content() == slugs[1]
    assert page.locator("#episodes th[aria-sort='descending']").text_content().startswith("max |A|")
    cells = page.locator("#episodes tbody tr td:last-child").all_text_contents()
    assert cells == ["1.500", "0.900", "0.300"]
    # Every column sorts: tokens ascending after two clicks (the first sorts descending).
    tokens = page.locator("#episodes button[data-sort='n_tokens']")
    tokens.click()
    tokens.click()
    assert "sort=n_tokens" in page.url
    assert page.locator("#episodes th[aria-sort='ascending'] button").get_attribute("data-sort") == "n_tokens"
    page.locator("#episodes button[data-sort='max_abs_adv']").click()
    # The number opens the episode on that token.
    page.locator("#episodes tbody tr").first.locator("a.top-token").click()
    wait_ready(page)
    assert page.evaluate("window.__strip.cursor") == 5
    assert page.evaluate("window.__strip.cellAt(5).rows[0].value") == pytest.approx(-1.5)
    # The list of the most-credited tokens, and t / T to walk it by token.
    tops = page.locator("#top-list button")
    assert tops.first.get_attribute("data-tok") == "5" and "-1.500" in tops.first.text_content()
    assert tops.nth(1).get_attribute("data-tok") == "6"
    tops.nth(1).click()
    assert page.evaluate("window.__strip.cursor") == 6
    page.keyboard.press("t")
    assert page.evaluate("window.__strip.cursor") != 6  # #3: one of the 0.1 tokens
    page.keyboard.press("T")
    assert page.evaluate("window.__strip.cursor") == 6
    page.keyboard.press("T")
    assert page.evaluate("window.__strip.cursor") == 5
    assert "by |advantage|" in page.text_content("#overview-status")
    assert page.probe.errors == []


ATROPOS = ROOT / "fixtures" / "formats" / "atropos"  # token ids + the tokenizer.json they came with


def test_upload_with_a_tokenizer_through_the_form(page, tmp_path):
    page.goto("/")
    page.set_input_files("#file", str(ATROPOS / "groups.jsonl"))
    page.set_input_files("#up-tokenizer", str(ATROPOS / "tokenizer.json"))
    page.fill("#up-name", "with tokenizer")
    page.click("#upload-btn")
    page.wait_for_selector(".file-item.good a.episode-link")
    assert "Token text from tokenizer.json" in page.text_content(".file-item.good")
    page.click(".file-item.good a.episode-link >> nth=0")
    wait_ready(page)
    tokens = page.evaluate("window.__strip.data.tokens")
    # The ids 0, 1, 4, 2 of the file's first row are these pieces of its tokenizer.json.
    assert tokens[:4] == ["<|begin_of_text|>", "<|start_header_id|>", "system", "<|end_header_id|>"]
    assert not any(t.startswith("⟨") for t in tokens)
    assert page.locator("#no-text").is_hidden()
    # Without it the ids are drawn as ⟨id⟩, and the page says how to see text.
    bare = httpx.post(
        f"{page.url.split('/e/')[0]}/api/uploads",
        files={"file": ("groups.jsonl", (ATROPOS / "groups.jsonl").read_bytes())},
        timeout=60,
    ).json()
    page.goto(bare["episodes"][0]["url"])
    wait_ready(page)
    assert page.evaluate("window.__strip.data.tokens[0]") == "⟨0⟩"
    assert (
        "tokenizer.json" in page.locator("#no-text").text_content() and page.locator("#no-text").is_visible()
    )
    # The API's checks answer through the form: a JSON file that is no tokenizer is refused,
    # next to the file, naming the field; nothing is stored.
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"vocab": {"a": 0}}')
    page.goto("/")
    page.set_input_files("#file", str(ATROPOS / "groups.jsonl"))
    page.set_input_files("#up-tokenizer", str(bad))
    page.click("#upload-btn")
    error = page.locator(".file-item.bad .file-error")
    error.wait_for()
    assert "tokenizer" in error.text_content()
    assert page.probe.errors == []


def _open(page, url: str) -> None:
    """Go to ``url`` and wait until its first screen is drawn (every page marks page:open)."""
    page.goto(url)
    page.wait_for_function("() => performance.getEntriesByName('page:open').length > 0")


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1400, 390])
def test_every_page_at_a_laptops_and_a_phones_width_light_and_dark(browser, demo, width, scheme):
    base = demo["base"]
    bug = demo["runs"][BUGGY]
    step = httpx.get(f"{base}/api/runs/{bug}", timeout=30).json()["steps"][18]
    batch = httpx.get(f"{base}/api/batches/{step['batch_ref']}", timeout=30).json()
    ep = batch["episodes"][0]
    pages = {
        "home": "/",
        "run": f"/r/{bug}",
        "batch": f"/b/{step['batch_ref']}",
        "group": f"/b/{step['batch_ref']}/g/{ep['group']}",
        "episode": f"/e/{ep['slug']}",
        "compare": f"/r/compare?runs={demo['runs'][CLEAN]},{bug}",
    }
    ctx = browser.new_context(viewport={"width": width, "height": 900}, base_url=base, color_scheme=scheme)
    ctx.set_default_timeout(60_000)
    page = ctx.new_page()
    probe = PageProbe(page)
    outside: list[str] = []
    page.on(
        "request", lambda r: outside.append(r.url) if not r.url.startswith((base, "data:", "blob:")) else None
    )
    for name, url in pages.items():
        _open(page, url)
        # No sideways scrolling of the page: wide tables and strips scroll in their own box.
        assert page.evaluate("document.documentElement.scrollWidth") <= width, name
        # The dark page is dark, the light page light.
        bg = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        lum = sum(int(c) for c in re.findall(r"\d+", bg)[:3])
        assert (lum < 150) if scheme == "dark" else (lum > 600), (name, bg)
        shot(page, f"journey-{name}-{width}-{scheme}")
    # Titles name the thing; dates are for people.
    _open(page, pages["episode"])
    assert page.title().startswith(f"{ep['task']} · {BUGGY}, step 18")
    _open(page, pages["batch"])
    assert page.title().startswith(f"{BUGGY} step 18")
    assert "T" not in page.text_content("#b-meta").split("created")[1]
    assert outside == [] and probe.errors == [] and probe.csp_violations() == []
    ctx.close()


def test_redoc_and_talk_mode(page):
    outside: list[str] = []
    page.on(
        "request",
        lambda r: (
            outside.append(r.url) if not r.url.startswith(("http://127.0.0.1", "blob:", "data:")) else None
        ),
    )
    page.goto("/redoc")
    page.wait_for_selector("text=API docs by Redocly")
    assert outside == []
    # Talk mode cites nothing it does not show: no book, no figure number.
    for step in range(1, 11):
        text = httpx.get(f"{page.url.split('/redoc')[0]}/talk/{step}?format=json", timeout=30).json()
        words = " ".join(text["paragraphs"])
        assert "book" not in words and "Figure" not in words, step


MANY = "uploaded,outcome,token_gae,turn_gae,gigpo,returns,td,oracle,audit_reference"


@pytest.mark.parametrize("width", [1400, 390])
def test_many_rows_stay_readable(browser, demo, width):
    bug = demo["runs"][BUGGY]
    rows = httpx.get(
        f"{demo['base']}/api/runs/{bug}/episodes", params={"step__eq": 18, "limit": 1}, timeout=30
    ).json()
    ctx = browser.new_context(viewport={"width": width, "height": 900}, base_url=demo["base"])
    page = ctx.new_page()
    page.goto(f"/e/{rows[0]['slug']}?scheme={MANY}&critic=zero")
    wait_ready(page)
    strip = page.evaluate(
        "(() => { const s = window.__strip; return {labelW: s.labelW, charW: s.charW, width: s.width,"
        " labels: s.rows.map(r => r.label), kinds: s.data.kinds}; })()"
    )
    assert len(strip["labels"]) == 9
    fits = [len(lab) <= (strip["labelW"] - 12) // strip["charW"] for lab in strip["labels"]]
    if width == 1400:
        assert all(fits), strip  # every label whole
    assert strip["labelW"] <= 0.3 * strip["width"] + 1  # never more than 30% of a phone's strip
    # The prompt is read once: its cells below the first row are pale and carry no text.
    p = strip["kinds"].index("prompt")
    assert page.evaluate(f"window.__strip.pixelAt({p}, 0)")[:3] == [196, 196, 196]
    assert page.evaluate(f"window.__strip.pixelAt({p}, 3)")[:3] == [232, 232, 232]
    # The per-call table scrolls in its box instead of squeezing the call.
    call = page.locator("#calls td.call-text").first.bounding_box()
    assert call["width"] >= 14 * 12
    wrap = page.evaluate(
        "(() => { const w = document.querySelector('.calls .table-wrap'); return [w.scrollWidth, w.clientWidth]; })()"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    if width == 390:
        assert wrap[0] > wrap[1]
    # The controls say where they do not apply: GiGPO has its own γ; outcome rows have no steps.
    note = page.text_content("#gamma-note")
    assert "gigpo uses its own γ (0.95)" in note and "outcome" in note
    assert "token_gae" not in page.text_content("#lam-note")
    shot(page, f"journey-many-rows-{width}")
    ctx.close()


def test_charts_label_every_group_and_keep_blue_red_for_the_sign(page, server):
    # 20 groups of 3 attempts; groups 0-4 all fail (zero variance, pass rate 0), the rest mixed.
    eps = [
        {**data.handbuilt(), "group": f"task{g:02d}", "reward": float(g >= 5 and a == 0)}
        for g in range(20)
        for a in range(3)
    ]
    body = httpx.post(
        f"{server}/api/uploads",
        files={"file": ("twenty.jsonl", data.jsonl(eps), "application/x-ndjson")},
        timeout=60,
    ).json()
    page.goto(f"/b/{body['batch_id']}")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector('#loss-box[data-ready="1"]')
    names = [f"task{g:02d}" for g in range(20)]
    groups = page.evaluate(
        "document.getElementById('fig-groups').data.map(t => ({name: t.name, y: t.y, x: t.x}))"
    )
    assert sorted(groups[0]["y"] + groups[1]["y"]) == names  # every group on the axis
    zero = next(t for t in groups if t["name"].startswith("zero variance"))
    assert sorted(zero["y"]) == names[:5] and min(zero["x"]) > 0  # visible although the pass rate is 0
    ticks = page.evaluate("document.getElementById('fig-whiten').layout.xaxis.ticktext")
    assert ticks == names
    # Blue and red mean the sign: no figure of the page uses them for anything else.
    colours = page.evaluate(
        "[...document.querySelectorAll('.js-plotly-plot')].flatMap(p => p.data.map(t => t.marker && t.marker.color))"
    )
    assert not {"rgb(33,102,172)", "rgb(178,24,43)"} & {c for c in colours if isinstance(c, str)}
    # The attempts table on the group page carries its colour key.
    page.goto(f"/b/{body['batch_id']}/g/task07")
    page.wait_for_selector("body[data-ready='1']")
    assert "blue positive" in page.text_content("#attempts caption")
    # No advantages uploaded: no empty "what the gradient sees" frame.
    page.goto(f"/b/{body['batch_id']}")
    page.wait_for_selector('#loss-box[data-ready="1"]')
    assert page.locator("#fig-loss").is_hidden()


def test_the_lambda_lab_puts_lambda_on_a_titled_number_line(page):
    page.goto("/lab/lambda?seed=7&episodes=2000")
    page.wait_for_selector("body[data-lab-ready='1']", timeout=120_000)
    for fig in ("fig-bias", "fig-var"):
        axis = page.evaluate(f"document.getElementById('{fig}').layout.xaxis")
        assert axis["title"]["text"] == "λ" and axis["type"] == "linear"
        xs = page.evaluate(f"document.getElementById('{fig}').data[0].x")
        assert all(isinstance(x, (int, float)) for x in xs) and xs == sorted(xs)


def _ema(ys: list[float], a: float) -> list[float]:
    out, s = [], None
    for y in ys:
        s = y if s is None else a * s + (1 - a) * y
        out.append(s)
    return out


def test_compare_the_two_demo_runs_by_name(dpage, demo):
    page = dpage
    page.goto(f"/r/{demo['runs'][CLEAN]}")
    page.wait_for_selector('#r-compare-with[data-ready="1"]')
    # The picker offers the other run by its name (with its id), not a box for a number.
    options = page.locator("#r-compare-with option").all_text_contents()
    assert any(o.startswith(BUGGY) and f"id {demo['runs'][BUGGY]}" in o for o in options)
    page.select_option("#r-compare-with", label=next(o for o in options if o.startswith(BUGGY)))
    page.get_by_role("button", name="Compare").click()
    page.wait_for_selector('#c-figs[data-ready="1"]')
    assert f"runs={demo['runs'][CLEAN]},{demo['runs'][BUGGY]}" in page.url
    assert page.title().startswith(f"{CLEAN} vs {BUGGY}")
    # The summary: each metric's last value per run and the difference.
    api = httpx.get(
        f"{demo['base']}/api/runs/compare", params={"runs": f"{CLEAN},{BUGGY}"}, timeout=30
    ).json()  # by name, as the page's address may say
    assert [r["id"] for r in api["runs"]] == [demo["runs"][CLEAN], demo["runs"][BUGGY]]
    last = [s[-1][1] for s in api["metrics"]["pass_rate"]]
    row = page.locator('#c-summary tr[data-metric="pass_rate"] td').all_text_contents()
    assert row == [
        f"{100 * last[0]:.1f}%",
        f"{100 * last[1]:.1f}%",
        f"{'+' if last[1] > last[0] else '−'}{100 * abs(last[1] - last[0]):.1f}%",
    ]
    # A metric equal everywhere gets no figure (the first panel is not a constant).
    assert page.locator("#fig-n_episodes").count() == 0 and "n_episodes" in page.text_content("#c-constant")
    assert page.locator("#c-figs .plot").first.get_attribute("id") == "fig-pass_rate"
    # Smoothing: an exponential moving average of the stored points; the URL keeps it.
    page.select_option("#c-smooth", "0.8")
    page.wait_for_function("() => document.getElementById('c-figs').dataset.smooth === '0.8'")
    assert "smooth=0.8" in page.url
    ys = page.evaluate("document.getElementById('fig-pass_rate').data[1].y")
    want = _ema([p[1] for p in api["metrics"]["pass_rate"][1]], 0.8)
    assert ys == pytest.approx(want, abs=1e-12)
    # Names work in the address too.
    page.goto(f"/r/compare?runs={BUGGY},{CLEAN}")
    page.wait_for_selector('#c-figs[data-ready="1"]')
    assert page.locator("#error").is_hidden()
    assert page.probe.errors == [] and page.failed == []


def test_compare_names_a_run_by_name_once(server):
    for _ in range(2):
        data.post_run(server, "twin", {0: [data.handbuilt()]})
    solo = data.post_run(server, "solo run", {0: [data.handbuilt()]})
    r = httpx.get(f"{server}/api/runs/compare", params={"runs": f"twin,{solo['id']}"}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["code"] == "ambiguous_run"
    assert r.json()["error"]["field"] == "runs" and "2 runs are named 'twin'" in r.json()["error"]["message"]
    r = httpx.get(f"{server}/api/runs/compare", params={"runs": f"solo run,{solo['id']}"}, timeout=30)
    assert r.status_code == 422 and "twice" in r.json()["error"]["message"]
    r = httpx.get(f"{server}/api/runs/compare", params={"runs": "no such run,solo run"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["field"] == "runs"


def test_pages_leave_no_request_in_flight_and_none_fails(dpage, demo):
    page = dpage
    requests: list[str] = []
    aborted: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("requestfailed", lambda r: aborted.append(f"{r.url} {r.failure}"))
    bug = demo["runs"][BUGGY]
    step = httpx.get(f"{demo['base']}/api/runs/{bug}", timeout=30).json()["steps"][18]
    group = httpx.get(f"{demo['base']}/api/batches/{step['batch_ref']}", timeout=30).json()["episodes"][0][
        "group"
    ]
    for url in ("/", f"/r/{bug}", f"/b/{step['batch_ref']}", f"/b/{step['batch_ref']}/g/{group}"):
        requests.clear()
        _open(page, url)
        if "/g/" in url:
            # The group page draws what each attempt did from its one answer: no request per attempt.
            assert page.locator("#calls-table tbody tr").count() >= 2
            assert not [u for u in requests if "/api/episodes/" in u]
        # Leaving the page as soon as it says it is open aborts nothing (every request answered).
        page.goto("about:blank")
        assert aborted == [], url
    assert page.failed == [] and page.probe.errors == []
