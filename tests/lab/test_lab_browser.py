"""The lab pages in headless Chromium against a real uvicorn server: progress, plots, cache, errors."""

from __future__ import annotations

import pytest

from tests.live_server import Server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    with Server(tmp / "lab.db", tmp / "server.log") as srv:
        yield srv.base


@pytest.fixture(scope="module")
def page(chromium):
    pg = chromium.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    pg.close()


def _open(page, url: str) -> None:
    page.errors.clear()
    page.goto(url)
    page.wait_for_selector("body[data-lab-ready='1']", timeout=60_000)


def test_lambda_page_computes_then_hits_the_cache(server, page):
    # The figure's JSON request is held until the page has been looked at, so the progress
    # indicator is seen however fast the server computes (no race with a quick machine).
    held = []

    def hold(route):
        held.append(route)

    page.route("**/api/lab/**", hold)
    try:
        page.goto(f"{server}/lab/lambda?seed=7&episodes=20000")
        page.wait_for_selector(".lab-spinner", timeout=5_000)
        assert "Computing" in page.inner_text("#lab-status")
        assert len(held) == 1 and "episodes=20000" in held[0].request.url
        held[0].continue_()
    finally:
        page.unroute("**/api/lab/**")
    page.wait_for_selector("body[data-lab-ready='1']", timeout=60_000)
    assert page.inner_text("#lab-status").startswith("Computed in")
    assert (
        page.locator("#fig-bias .main-svg").count() >= 1 and page.locator("#fig-var .main-svg").count() >= 1
    )
    # 3 critics + 3 floors on the bias plot, 3 series on the variance plot.
    assert page.evaluate("document.getElementById('fig-bias').data.length") == 6
    assert page.evaluate("document.getElementById('fig-var').data.length") == 3
    assert page.locator("table.lab-table tbody tr").count() == 8
    _open(page, f"{server}/lab/lambda?seed=7&episodes=20000")
    assert page.inner_text("#lab-status").startswith("Loaded from the cache")
    assert page.errors == []


def test_form_keeps_state_in_the_url(server, page):
    _open(page, f"{server}/lab/difficulty")
    page.fill("#p-G", "16")
    page.click("form.lab-form button[type=submit]")
    page.wait_for_selector("body[data-lab-ready='1']", timeout=60_000)
    assert "G=16" in page.url
    assert page.locator("table.lab-table tbody tr").count() == 15  # k = 1..15
    assert page.get_attribute("#csv-link", "href").endswith("format=csv")
    assert page.errors == []


def test_horizon_page_draws(server, page):
    _open(page, f"{server}/lab/horizon")
    for pid in ("fig-token", "fig-turn"):
        assert page.locator(f"#{pid} .main-svg").count() >= 1, pid
    assert page.errors == []


def test_recovery_page_table_and_plot(server, page):
    _open(page, f"{server}/lab/recovery?verl=off&batch=2000&seed=0")
    assert page.locator("#fig-credit .main-svg").count() >= 1
    rows = page.locator("table.lab-table").first.locator("tbody tr")
    assert rows.count() == 10
    first = rows.nth(0).inner_text()
    assert "oracle (exact A)" in first and "-0.25" in first and "0.50" in first and "0%" in first
    assert page.errors == []


def test_recovery_page_with_seeds_draws_error_bars(server, page):
    _open(page, f"{server}/lab/recovery?verl=off&batch=300&seed=0&seeds=3")
    bars = page.evaluate("document.getElementById('fig-credit').data.map(t => t.error_y.visible)")
    assert bars == [True, True]
    first = page.locator("table.lab-table").first.locator("tbody tr").nth(1).inner_text()
    assert "±" in first
    assert page.errors == []


def test_delayed_horizon_page_draws_leakage_and_cosine_with_error_bars(server, page):
    _open(
        page, f"{server}/lab/delayed_horizon?horizons=2,4,8&estimators=oracle,grpo,turn_loo&seeds=3&batch=200"
    )
    for pid in ("fig-leakage", "fig-cosine"):
        assert page.locator(f"#{pid} .main-svg").count() >= 1, pid
    traces = page.evaluate(
        "document.getElementById('fig-leakage').data.map(t => [t.name, t.x, t.error_y.visible])"
    )
    assert traces == [[e, [2, 4, 8], True] for e in ("oracle", "grpo", "turn_loo")]
    assert page.locator("table.lab-table tbody tr").count() == 9
    assert "per_timestep" in page.inner_text("#lab-cards")
    assert page.errors == []


def test_variable_horizon_page_draws_one_bias_plot_per_turn(server, page):
    _open(
        page,
        f"{server}/lab/variable_horizon?stop_probabilities=0.2,0.5,0.8&estimators=oracle,rloo&seeds=2&batch=200",
    )
    # H = 5 turns, each reached at these p: one plot per turn, one trace per estimator.
    for t in range(5):
        assert page.evaluate(f"document.getElementById('fig-bias-t{t}').data.length") == 2, t
    # The oracle's bias is exactly 0 at every turn.
    ys = page.evaluate("document.getElementById('fig-bias-t2').data[0].y")
    assert ys == [0, 0, 0]
    assert page.errors == []


def test_api_error_is_shown_on_the_page(server, page):
    page.errors.clear()
    page.goto(f"{server}/lab/lambda?horizon=1&cost=0&logit_scale=0")
    page.wait_for_selector("#lab-error:not([hidden])", timeout=30_000)
    assert "gradient is zero" in page.inner_text("#lab-error")
