// The /sample page: POST /api/samples?async=true, poll the job, draw the progress bar, link the batch.
import { $ } from "./page.js";
import { el, readInitial, ApiError, urls } from "./util.js";

const state = readInitial();

function body() {
  const f = $("sample-form");
  const num = (id) => Number($(id).value);
  const policy = {};
  for (const k of Object.keys(state.policy || {})) {
    const v = $(`knob-${k}`).value;
    if (v !== "" && Number(v) !== state.policy[k]) policy[k] = Number(v);
  }
  const out = {
    env: "bugfix",
    n_tasks: num("n_tasks"),
    n_per_task: num("n_per_task"),
    seed: num("seed"),
    call_cost: num("call_cost"),
    max_calls: num("max_calls"),
    critic: $("critic").checked,
    truth: $("truth").value,
    n_rollouts: num("n_rollouts"),
    policy,
  };
  const name = f.elements.name.value.trim();
  if (name) out.name = name;
  if ($("visibility").value) out.visibility = $("visibility").value;
  return out;
}

function headers() {
  const h = { "content-type": "application/json", accept: "application/json" };
  const t = $("token").value;
  if (t) h.authorization = `Bearer ${t}`;
  return h;
}

async function json(resp) {
  let b = null;
  try { b = await resp.json(); } catch { /* not JSON */ }
  if (!resp.ok) throw new ApiError(resp.status, b);
  return b;
}

const fmt = (x, d = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(0)}%`);

function showResult(job) {
  const d = job.diagnostics || {};
  const rows = [
    ["episodes", d.n_episodes],
    ["pass rate", pct(d.pass_rate)],
    ["zero-variance share (episodes in all-pass or all-fail groups)", pct(d.zero_variance_share)],
    ["positive outcome credit on calls that neither fixed nor submitted", pct(d.useless_credit_share)],
    ["mean calls per episode", fmt(d.mean_calls, 1)],
  ];
  if (d.critic) {
    rows.push(["critic explained variance, training episodes", fmt(d.critic.explained_variance_train, 3)]);
    rows.push(["critic explained variance, fresh episodes", fmt(d.critic.explained_variance_fresh, 3)]);
  }
  const first = (job.episodes || [])[0];
  $("sample-result").replaceChildren(
    el("h2", {}, "Stored"),
    el("p", {}, el("a", { href: job.url, id: "batch-link" }, `Open batch ${job.batch_id}`),
      first ? [" · ", el("a", { href: first.url }, "first episode")] : null),
    job.delete_token ? el("p", { class: "hint" }, "Delete token (keep it to delete this batch later): ", el("code", {}, job.delete_token)) : null,
    el("table", { class: "diag" }, el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", { class: "num" }, String(v ?? "–")))))),
  );
}

async function poll(url) {
  for (;;) {
    const job = await json(await fetch(url, { headers: { accept: "application/json" } }));
    $("sample-progress").value = job.progress ?? 0;
    $("sample-msg").textContent = `${job.state} · ${Math.round(100 * (job.progress ?? 0))}%`;
    if (job.state === "done") return job;
    if (job.state === "error") throw new ApiError(job.error?.status || 500, { error: job.error });
    await new Promise((r) => setTimeout(r, 300));
  }
}

$("sample-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const go = $("sample-go");
  go.disabled = true;
  $("sample-error").replaceChildren();
  $("sample-result").replaceChildren();
  $("sample-progress").hidden = false;
  $("sample-progress").value = 0;
  $("sample-msg").textContent = "queued";
  try {
    const started = await json(await fetch(urls.apiSamples("async=true"), { method: "POST", headers: headers(), body: JSON.stringify(body()) }));
    const job = await poll(started.url);
    $("sample-msg").textContent = "done";
    showResult(job);
  } catch (e) {
    $("sample-msg").textContent = "";
    $("sample-progress").hidden = true;
    const msg = e instanceof ApiError && e.describe ? e.describe() : String(e.message || e);
    $("sample-error").replaceChildren(el("p", { class: "error" }, msg));
  } finally {
    go.disabled = false;
  }
});
