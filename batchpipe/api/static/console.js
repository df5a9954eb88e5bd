// The batchpipe console: everything it shows comes from the JSON API with the signed-in
// key (sessionStorage, sent as "Authorization: Bearer", never in a URL). Text from the
// API is only ever set as textContent, never parsed as HTML.
"use strict";

const KEY_ITEM = "batchpipe.apiKey";
const POLL_MS = 1500;
const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const ERROR_SUMMARY_BYTES = 4 * 1024 * 1024; // an error file is summarised from its start
const FIRST_LINES = 3;
const LATEST_ANSWERS = 20; // of a batch's answered lines, shown newest first
const ANSWER_CHARS = 200; // of an answer's text shown in the table

const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
const OPEN = meta("batchpipe-auth") === "open";
const PRICE = Number(meta("batchpipe-price-per-1k"));
const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function key() {
  return OPEN ? null : sessionStorage.getItem(KEY_ITEM);
}

async function api(method, path, body) {
  const headers = {};
  const k = key();
  if (k) headers.Authorization = `Bearer ${k}`;
  let payload;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload, cache: "no-store" });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error.message || message;
    } catch (_) {
      // not an OpenAI error object: the status says enough
    }
    if (response.status === 401 && !OPEN) signOut(message);
    throw new ApiError(response.status, message);
  }
  return response;
}

const getJson = async (path) => (await api("GET", path)).json();

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function announce(text) {
  $("announce").textContent = text;
}

// -- formatting ------------------------------------------------------------------------

function when(seconds) {
  if (!seconds) return el("span", { text: "—" });
  const date = new Date(seconds * 1000);
  const text = date.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  return el("time", { datetime: date.toISOString(), "data-unix": String(seconds), text });
}

function finishedAt(batch) {
  return batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at;
}

function tokens(batch) {
  const u = batch.usage;
  return u ? { input: u.input_tokens, output: u.output_tokens, total: u.total_tokens } : null;
}

function cost(batch) {
  const t = tokens(batch);
  if (!t || !(PRICE > 0)) return "—";
  return ((t.total / 1000) * PRICE).toFixed(4);
}

function counts(batch) {
  const c = batch.request_counts || { total: 0, completed: 0, failed: 0 };
  return { ...c, done: c.completed + c.failed };
}

function progressBar(batch, label) {
  const c = counts(batch);
  const bar = el("progress", { max: String(Math.max(c.total, 1)), value: String(c.done) });
  bar.setAttribute("aria-label", label);
  return bar;
}

// -- sign-in ---------------------------------------------------------------------------

function signOut(reason) {
  sessionStorage.removeItem(KEY_ITEM);
  showSignIn(reason || "");
}

function showSignIn(reason) {
  $("main").hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = reason;
  $("api-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const candidate = $("api-key").value.trim();
  if (!candidate) {
    $("sign-in-error").textContent = "Enter an API key.";
    return;
  }
  sessionStorage.setItem(KEY_ITEM, candidate);
  try {
    await getJson("/v1/batches?limit=1"); // a wrong key answers 401 and signs out again
  } catch (error) {
    if (error.status !== 401) $("sign-in-error").textContent = error.message;
    return;
  }
  $("api-key").value = "";
  start();
}

function start() {
  $("sign-in").hidden = true;
  $("main").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = OPEN ? "Local (no API keys)" : "Signed in with an API key";
  $("sign-out").hidden = OPEN;
  if (document.body.dataset.page === "batch") batchPage();
  else batchesPage();
}

// -- the list of batches ------------------------------------------------------------------

// the service tier a batch runs in (docs/api.md "Service tiers")
function tier(batch) {
  return (batch.batchpipe && batch.batchpipe.tier) || "default";
}

function batchRow(batch) {
  const c = counts(batch);
  const t = tokens(batch);
  const link = el("a", { href: `/batches/${encodeURIComponent(batch.id)}`, text: batch.id });
  return el(
    "tr",
    { "data-batch-id": batch.id, "data-status": batch.status },
    el("td", {}, link),
    el("td", {}, el("span", { class: `status ${batch.status}`, text: batch.status })),
    el("td", { text: tier(batch) }),
    el("td", { class: "progress" }, progressBar(batch, `progress of ${batch.id}`), ` ${c.done} / ${c.total}`),
    el("td", { class: "num", text: `${c.completed} / ${c.failed} / ${c.total}` }),
    el("td", { class: "num", text: t ? `${t.input} / ${t.output}` : "—" }),
    el("td", { class: "num", text: cost(batch) }),
    el("td", {}, when(batch.created_at)),
    el("td", {}, when(finishedAt(batch))),
  );
}

function batchesPage() {
  $("price-note").textContent =
    PRICE > 0
      ? `Cost at ${PRICE} per 1k tokens (input and output).`
      : "No price is set (api.price_per_1k_tokens), so no cost is shown.";
  let pages = 1;
  const seen = new Map(); // batch id → status, to announce changes
  let timer = null;

  async function refresh() {
    clearTimeout(timer);
    try {
      const batches = [];
      let after = null;
      let more = false;
      for (let page = 0; page < pages; page++) {
        const query = after ? `&after=${encodeURIComponent(after)}` : "";
        const list = await getJson(`/v1/batches?limit=20${query}`);
        batches.push(...list.data);
        more = list.has_more;
        after = list.last_id;
        if (!more) break;
      }
      $("list-error").textContent = "";
      $("batches").tBodies[0].replaceChildren(...batches.map(batchRow));
      $("empty").hidden = batches.length > 0;
      $("more").hidden = !more;
      for (const b of batches) {
        if (seen.has(b.id) && seen.get(b.id) !== b.status) announce(`Batch ${b.id} is ${b.status}.`);
        seen.set(b.id, b.status);
      }
      if (batches.some((b) => !TERMINAL.has(b.status))) timer = setTimeout(refresh, POLL_MS);
    } catch (error) {
      if (error.status === 401) return;
      $("list-error").textContent = `Could not list batches: ${error.message}`;
      timer = setTimeout(refresh, POLL_MS * 4);
    }
  }

  $("more").addEventListener("click", () => {
    pages += 1;
    refresh();
  });
  $("create-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const status = $("create-status");
    const file = $("batch-file").files[0];
    if (!file) {
      status.textContent = "Choose a batch file first.";
      return;
    }
    $("create").disabled = true;
    try {
      status.textContent = `Uploading ${file.name}…`;
      const form = new FormData();
      form.append("purpose", "batch");
      form.append("file", file, file.name);
      const inputExpiry = policy($("input-expiry").value);
      if (inputExpiry) {
        // as the OpenAI SDK sends it in a multipart upload
        form.append("expires_after[anchor]", inputExpiry.anchor);
        form.append("expires_after[seconds]", String(inputExpiry.seconds));
      }
      const uploaded = await (await api("POST", "/v1/files", form)).json();
      status.textContent = `Uploaded ${uploaded.id}; creating the batch…`;
      const request = {
        input_file_id: uploaded.id,
        endpoint: $("endpoint").value,
        completion_window: $("window").value,
      };
      const outputExpiry = policy($("output-expiry").value);
      if (outputExpiry) request.output_expires_after = outputExpiry;
      if ($("tier").value !== "default") request.metadata = { batchpipe_tier: $("tier").value };
      const batch = await (await api("POST", "/v1/batches", request)).json();
      status.textContent = `Created batch ${batch.id}.`;
      $("create-form").reset();
      refresh();
    } catch (error) {
      status.textContent = `Not created: ${error.message}`;
    } finally {
      $("create").disabled = false;
    }
  });
  refresh();
}

function policy(seconds) {
  // an expiry policy from a select's value; "" keeps the server's default
  return seconds ? { anchor: "created_at", seconds: Number(seconds) } : null;
}

// -- one batch ---------------------------------------------------------------------------

async function fileState(fileId) {
  // a file's object, or null when it is gone (expired or deleted)
  try {
    return await getJson(`/v1/files/${encodeURIComponent(fileId)}`);
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}

async function showFiles(batch) {
  const rows = [
    ["Input file", batch.input_file_id],
    ["Output file", batch.output_file_id],
    ["Error file", batch.error_file_id],
  ].filter(([, id]) => id);
  const found = await Promise.all(rows.map(([, id]) => fileState(id)));
  $("batch-files").replaceChildren(
    ...rows.flatMap(([name, id], i) => {
      const file = found[i];
      let text;
      if (!file) text = el("span", { text: `${id}: gone (expired or deleted)` });
      else if (!file.expires_at) text = `${file.filename} (${file.bytes} bytes), kept until deleted`;
      else text = el("span", {}, `${file.filename} (${file.bytes} bytes), expires `, when(file.expires_at));
      return field(name, text);
    }),
  );
  return new Set(found.filter(Boolean).map((file) => file.id)); // the files still there
}

async function download(fileId, fallbackName) {
  const [file, response] = await Promise.all([
    getJson(`/v1/files/${encodeURIComponent(fileId)}`),
    api("GET", `/v1/files/${encodeURIComponent(fileId)}/content`),
  ]);
  const url = URL.createObjectURL(await response.blob());
  const link = el("a", { href: url, download: file.filename || fallbackName });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

async function readStart(response, limit) {
  // the first `limit` bytes of a body, and whether there was more
  const reader = response.body.getReader();
  const parts = [];
  let size = 0;
  while (size < limit) {
    const { done, value } = await reader.read();
    if (done) return { text: new TextDecoder().decode(concat(parts, size)), cut: false };
    parts.push(value);
    size += value.length;
  }
  reader.cancel();
  return { text: new TextDecoder().decode(concat(parts, size)), cut: true };
}

function concat(parts, size) {
  const all = new Uint8Array(size);
  let at = 0;
  for (const part of parts) {
    all.set(part, at);
    at += part.length;
  }
  return all;
}

async function errorSummary(fileId) {
  // codes × counts and each code's first lines, from the error file
  const response = await api("GET", `/v1/files/${encodeURIComponent(fileId)}/content`);
  const { text, cut } = await readStart(response, ERROR_SUMMARY_BYTES);
  const lines = text.split("\n");
  if (cut) lines.pop(); // the last line may be cut short
  const byCode = new Map();
  let read = 0;
  for (const line of lines) {
    if (!line.trim()) continue;
    read += 1;
    let parsed;
    try {
      parsed = JSON.parse(line);
    } catch (_) {
      continue;
    }
    const error = parsed.error || {};
    const code = String(error.code ?? "unknown");
    const entry = byCode.get(code) || { count: 0, first: [] };
    entry.count += 1;
    if (entry.first.length < FIRST_LINES) entry.first.push(`${parsed.custom_id}: ${error.message}`);
    byCode.set(code, entry);
  }
  return { byCode, read, cut };
}

function showErrorSummary({ byCode, read, cut }) {
  const rows = [...byCode.entries()]
    .sort((a, b) => b[1].count - a[1].count)
    .map(([code, entry]) =>
      el(
        "tr",
        {},
        el("th", { scope: "row", text: code }),
        el("td", { class: "num", text: String(entry.count) }),
        el("td", {}, el("ul", {}, ...entry.first.map((line) => el("li", { text: line })))),
      ),
    );
  $("error-summary").tBodies[0].replaceChildren(...rows);
  $("error-summary").hidden = rows.length === 0;
  const where = cut ? `the first ${read} lines of the error file` : "the error file";
  $("errors-note").textContent = `${read} failed requests, from ${where}.`;
}

function answerText(line) {
  // a chat or completion's text, else the response body's JSON; cut to ANSWER_CHARS
  const body = (line.response || {}).body || {};
  const choice = (body.choices || [])[0] || {};
  const text = choice.message ? choice.message.content : (choice.text ?? body.output_text);
  const shown = typeof text === "string" ? text : JSON.stringify(body);
  return shown.length > ANSWER_CHARS ? `${shown.slice(0, ANSWER_CHARS)}…` : shown;
}

async function latestAnswers(path, batch) {
  // the batch's latest answered lines (GET …/partial?last=N), newest first
  let text;
  try {
    text = await (await api("GET", `${path}/partial?last=${LATEST_ANSWERS}`)).text();
  } catch (error) {
    if (error.status === 401) throw error;
    $("answers-note").textContent = `Answers cannot be shown here: ${error.message}`;
    return;
  }
  const rows = text
    .split("\n")
    .filter((line) => line.trim())
    .reverse()
    .map((raw) => {
      const line = JSON.parse(raw);
      const failed = line.error != null;
      return el(
        "tr",
        { "data-custom-id": line.custom_id, "data-outcome": failed ? "error" : "completed" },
        el("td", { text: line.custom_id }),
        el("td", { text: failed ? `error ${line.error.code}` : "completed" }),
        el("td", { text: failed ? line.error.message : answerText(line) }),
      );
    });
  $("latest-answers").tBodies[0].replaceChildren(...rows);
  $("latest-answers").hidden = rows.length === 0;
  const live = TERMINAL.has(batch.status) ? "" : ", refreshed while the batch runs";
  $("answers-note").textContent = rows.length
    ? `The latest ${rows.length} answers and errors, newest first${live}.`
    : "No request is answered yet.";
}

// batchpipe.spend (docs/api.md "Cost caps"): what the batch spent against its caps
function spend(batch) {
  const s = batch.batchpipe ? batch.batchpipe.spend : null;
  if (!s) return "—";
  const share = (used, cap) => `${Math.floor((100 * used) / cap)} %`;
  const parts = [
    s.max_tokens != null
      ? `${s.tokens} of ${s.max_tokens} tokens (${share(s.tokens, s.max_tokens)})`
      : `${s.tokens} tokens, no token cap`,
  ];
  if (s.cost_usd != null) {
    parts.push(
      s.max_cost_usd != null
        ? `${s.cost_usd} of ${s.max_cost_usd} USD (${share(s.cost_usd, s.max_cost_usd)})`
        : `${s.cost_usd} USD, no cost cap`,
    );
  }
  const shown = el("span", { id: "spend", text: parts.join("; ") });
  if (s.cap_reached_at != null) {
    const rest = ": the lines not run are in the error file (4008)";
    shown.append("; cap reached ", when(s.cap_reached_at), rest);
  }
  return shown;
}

function field(name, value) {
  return [el("dt", { text: name }), el("dd", {}, value)];
}

function showBatch(batch) {
  const c = counts(batch);
  const t = tokens(batch);
  $("batch-status").textContent = batch.status;
  $("bar").max = Math.max(c.total, 1);
  $("bar").value = c.done;
  $("bar-text").textContent = `${c.done} of ${c.total} requests answered`;
  $("batch-fields").replaceChildren(
    ...field("Endpoint", batch.endpoint),
    ...field("Model", batch.model || "—"),
    ...field("Tier", tier(batch)),
    ...field("Requests", `${c.completed} completed, ${c.failed} failed, ${c.total} in all`),
    ...field("Tokens", t ? `${t.input} in, ${t.output} out, ${t.total} in all` : "—"),
    ...field("Cost", PRICE > 0 ? `${cost(batch)} (at ${PRICE} per 1k tokens)` : "no price set"),
    ...field("Spend against cap", spend(batch)),
    ...field("Created", when(batch.created_at)),
    ...field("Finished", when(finishedAt(batch))),
    ...field("Window ends", when(batch.expires_at)),
    ...field("Metadata", Object.keys(batch.metadata || {}).length ? JSON.stringify(batch.metadata) : "—"),
  );
  $("cancel").disabled = !CANCELLABLE.has(batch.status);
  $("retry").disabled = !(TERMINAL.has(batch.status) && c.failed > 0);
  const validation = batch.errors ? batch.errors.data : [];
  $("batch-errors").replaceChildren(
    ...validation.map((e) =>
      el("li", { text: `${e.line ? `line ${e.line}: ` : ""}${e.code} ${e.message}` }),
    ),
  );
}

function batchPage() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  $("batch-id").textContent = id;
  document.title = `${id} · batchpipe`;
  let current = null;
  let summarised = null;
  let timer = null;
  const path = `/v1/batches/${encodeURIComponent(id)}`;

  async function refresh() {
    clearTimeout(timer);
    try {
      const batch = await getJson(path);
      if (current && current.status !== batch.status) announce(`Batch ${id} is ${batch.status}.`);
      current = batch;
      $("batch-error").textContent = "";
      showBatch(batch);
      await latestAnswers(path, batch);
      const present = await showFiles(batch);
      $("download-output").disabled = !present.has(batch.output_file_id);
      $("download-errors").disabled = !present.has(batch.error_file_id);
      if (present.has(batch.error_file_id) && summarised !== batch.error_file_id) {
        summarised = batch.error_file_id;
        showErrorSummary(await errorSummary(batch.error_file_id));
      } else if (batch.error_file_id && !present.has(batch.error_file_id)) {
        $("errors-note").textContent = "The error file is gone (expired or deleted).";
      } else if (!batch.error_file_id) {
        $("errors-note").textContent = TERMINAL.has(batch.status)
          ? "No request failed."
          : "Failed requests are listed once the batch has ended.";
      }
      if (!TERMINAL.has(batch.status)) timer = setTimeout(refresh, POLL_MS);
    } catch (error) {
      if (error.status === 401) return;
      $("batch-error").textContent = `Could not read the batch: ${error.message}`;
      if (error.status !== 404) timer = setTimeout(refresh, POLL_MS * 4);
    }
  }

  async function act(button, work, done) {
    button.disabled = true;
    try {
      await work();
      $("action-status").textContent = done;
    } catch (error) {
      $("action-status").textContent = error.message;
    } finally {
      refresh();
    }
  }

  $("download-output").addEventListener("click", (e) =>
    act(e.currentTarget, () => download(current.output_file_id, `${id}_output.jsonl`), "Output downloaded."),
  );
  $("download-errors").addEventListener("click", (e) =>
    act(e.currentTarget, () => download(current.error_file_id, `${id}_errors.jsonl`), "Errors downloaded."),
  );
  $("cancel").addEventListener("click", (e) =>
    act(e.currentTarget, () => api("POST", `${path}/cancel`), "Cancel requested."),
  );
  $("retry").addEventListener("click", async (e) => {
    e.currentTarget.disabled = true;
    try {
      const answer = await (await api("POST", `${path}/retry`)).json();
      const kept = answer.not_retried.map((l) => `${l.custom_id} (${l.code}): ${l.reason}`);
      const why = kept.length ? ` Not retried: ${kept.slice(0, 5).join("; ")}${kept.length > 5 ? ` and ${kept.length - 5} more` : ""}.` : "";
      const status = $("action-status");
      if (!answer.batch) {
        status.textContent = `No line failed in the engine; nothing to retry.${why}`;
        return;
      }
      const link = el("a", { href: `/batches/${encodeURIComponent(answer.batch.id)}`, text: answer.batch.id });
      const what = answer.already_retried ? "Already retried as batch " : `${answer.retried} lines retried as batch `;
      status.replaceChildren(what, link, `.${why}`);
    } catch (error) {
      $("action-status").textContent = error.message;
    }
  });
  refresh();
}

// -- start -------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut("Signed out."));
  if (OPEN || key()) start();
  else showSignIn("");
});
