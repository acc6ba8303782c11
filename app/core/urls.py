"""Every URL of the service, built in one place (URLs are public contracts: links people share).

Python code imports these functions; templates call them as ``urls.<name>(...)`` (a Jinja global,
app/http/templating.py); scripts use the ``urls`` object of static/util.js, which builds the same paths.
Path segments taken from data (slugs, group labels) are percent-encoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from app.core.views import EpisodeView


def _seg(x: object) -> str:
    """One path segment, percent-encoded (a group label may hold "/", "?" or spaces)."""
    return quote(str(x), safe="")


# A batch or run in a URL: its integer id when public, its random slug when unlisted (app/storage/store.py
# batch_ref, app/storage/runs.py run_ref).
Ref = int | str


def _ref(x: Ref) -> str:
    """A batch's or run's URL segment: an id stays an integer, a slug is percent-encoded."""
    return str(int(x)) if isinstance(x, int) else _seg(x)


def _with_query(path: str, query: str | dict[str, str] | None) -> str:
    """``path`` plus ``?query`` (a string as is, a dict without its empty values), or ``path``."""
    if isinstance(query, dict):
        query = urlencode({k: v for k, v in query.items() if v not in (None, "")})
    return f"{path}?{query}" if query else path


# ---- pages (and the fixed paths of the API) ---------------------------------------------------------

HOME = "/"
RUNS = "/#runs"  # the home page's list of training runs (runs have no list page of their own)
SAMPLE = "/sample"
DOCS = "/docs"
PLOTLY = "/vendor/plotly.min.js"
# Plotly's "basic" bundle (scatter, bar, pie; a quarter of the size): pages that draw only those.
PLOTLY_BASIC = "/vendor/plotly-basic.min.js"
API_UPLOADS = "/api/uploads"
API_EPISODE_SCHEMA = "/api/schema/episode"
API_SAMPLES = "/api/samples"
API_SAMPLE_OPTIONS = "/api/samples/options"
SIGN_IN = "/sign-in"  # a private server's sign-in page (app/http/access.py)
SIGN_OUT = "/sign-out"
TRAINERS = "/trainers"  # every trainer's dialects on the canonical episodes
API_TRAINERS = "/api/trainers"


def episode(slug: str, view: EpisodeView | None = None) -> str:
    """One episode's page, with the view's canonical query string when given."""
    return _with_query(f"/e/{_seg(slug)}", view.query() if view else None)


def batch(batch_id: Ref) -> str:
    """One batch's page."""
    return f"/b/{_ref(batch_id)}"


def group(batch_id: Ref, group: str) -> str:
    """One group's page."""
    return f"/b/{_ref(batch_id)}/g/{_seg(group)}"


def episode_preview(slug: str) -> str:
    """An episode's link-preview image (1200×630 PNG)."""
    return f"/e/{_seg(slug)}/preview.png"


def batch_preview(batch_id: Ref) -> str:
    """A batch's link-preview image (1200×630 PNG)."""
    return f"/b/{_ref(batch_id)}/preview.png"


def talk(step: int | None = None) -> str:
    """Talk mode, or one of its steps (``/talk`` redirects to the first)."""
    return "/talk" if step is None else f"/talk/{int(step)}"


def lab(figure: str | None = None) -> str:
    """The lab's index, or one figure's page."""
    return "/lab" if figure is None else f"/lab/{_seg(figure)}"


def static(path: str) -> str:
    """A file of static/ (scripts, styles)."""
    return f"/static/{path}"


# ---- JSON API --------------------------------------------------------------------------------------


def api_batches(q: str = "", source: str = "", steps: bool | None = None) -> str:
    """The batch list (search ``q``, filter ``source``; ``steps``: only runs' steps, or none)."""
    flag = "" if steps is None else str(steps).lower()
    return _with_query("/api/batches", {"q": q, "source": source, "steps": flag})


# The home page's "Show" choices: value -> the batch list's (source, steps) filters.
HOME_SHOWS: dict[str, tuple[str, bool | None]] = {
    "": ("", False),
    "upload": ("upload", False),
    "sample": ("sample", False),
    "demo": ("demo", False),
    "steps": ("", True),
    "all": ("", None),
}


def api_batch(batch_id: Ref, limit: int | None = None, offset: int | None = None) -> str:
    """One batch with its diagnostics (one page of its episodes: ``limit``, ``offset``)."""
    query = {"limit": "" if limit is None else str(limit), "offset": "" if offset is None else str(offset)}
    return _with_query(f"/api/batches/{_ref(batch_id)}", query)


def api_audit(batch_id: Ref) -> str:
    """The audit of a batch's uploaded advantages."""
    return f"/api/batches/{_ref(batch_id)}/audit"


def api_group(batch_id: Ref, group: str) -> str:
    """One group's outcome advantages under every baseline."""
    return f"/api/batches/{_ref(batch_id)}/groups/{_seg(group)}"


def api_episode(slug: str) -> str:
    """One episode as stored (native format)."""
    return f"/api/episodes/{_seg(slug)}"


def api_advantages(slug: str, view: EpisodeView | None = None) -> str:
    """One episode's advantages for a view (its numbers' parameters only); no view: the episode's
    default view (the server picks the rows the episode has the inputs for)."""
    if view is None:
        return f"{api_episode(slug)}/advantages"
    return f"{api_episode(slug)}/advantages?{view.api_query()}"


def api_lab(figure: str, query: str = "", fmt: str | None = None) -> str:
    """A lab figure's JSON (or ``fmt="csv"``) for a raw query string."""
    if fmt:
        query = f"{query}&format={fmt}" if query else f"format={fmt}"
    return _with_query(f"/api/lab/{_seg(figure)}", query)


# ---- runs ------------------------------------------------------------------------------------------

API_RUNS = "/api/runs"


def run(run_id: Ref) -> str:
    """One training run's page (its timeline)."""
    return f"/r/{_ref(run_id)}"


def run_preview(run_id: Ref) -> str:
    """A run's link-preview image (1200×630 PNG): its main metrics per step."""
    return f"/r/{_ref(run_id)}/preview.png"


def api_run(run_id: Ref) -> str:
    """One run with every step's metrics."""
    return f"/api/runs/{_ref(run_id)}"


def api_run_metrics(run_id: Ref) -> str:
    """One run's metrics as series: {"metric": [[step, value], ...]}."""
    return f"/api/runs/{_ref(run_id)}/metrics"


def run_prompt(run_id: Ref, key: str) -> str:
    """One prompt of a run followed across its steps (pass rate, credit, links to each group)."""
    return f"/r/{_ref(run_id)}/prompts/{_seg(key)}"


def api_run_prompts(run_id: Ref) -> str:
    """A run's prompts, the most often seen first, each with its steps."""
    return f"/api/runs/{_ref(run_id)}/prompts"


def api_run_prompt(run_id: Ref, key: str) -> str:
    """One prompt of a run with every step it was in."""
    return f"/api/runs/{_ref(run_id)}/prompts/{_seg(key)}"


def api_run_episodes(run_id: Ref) -> str:
    """Search a run's kept episodes."""
    return f"/api/runs/{_ref(run_id)}/episodes"


RUN_COMPARE = "/r/compare"
API_RUNS_COMPARE = "/api/runs/compare"


def compare(refs: list[Ref]) -> str:
    """Runs side by side: each metric's series, one colour per run."""
    return f"{RUN_COMPARE}?runs={','.join(_ref(r) for r in refs)}"


def api_compare(refs: Sequence[Ref]) -> str:
    """Each metric's series per run, for the compare page."""
    return f"{API_RUNS_COMPARE}?runs={','.join(_ref(r) for r in refs)}"


def api_run_step(run_id: Ref, step: int) -> str:
    """Where one step of a run is posted."""
    return f"/api/runs/{_ref(run_id)}/steps/{int(step)}"
